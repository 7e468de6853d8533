"""Stage progress on stderr (``specrag ask`` / ``generate``), ``--quiet``, and no library debug logging."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specrag_jax.cli import main
from specrag_jax.models.text_model import TextModel
from specrag_jax.progress import NO_PROGRESS, StderrProgress, stage
from specrag_jax.retrieval.lexical import LexicalIndex
from specrag_jax.serving.tiny import tiny_text_model

DOCS = [
    {"id": "a", "title": "loops", "text": "break leaves the loop early"},
    {"id": "b", "title": "files", "text": "open reads a file"},
]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_pipe_gets_finished_stages_only():
    out = io.StringIO()
    p = StderrProgress(out)
    p.start("drafting")
    p.end("drafting", 1.234, "5 drafts")
    p.start("loading")
    with pytest.raises(ValueError), stage(p, "loading x"):
        raise ValueError
    with stage(p, "loading y"):
        pass
    p.note("done")
    assert out.getvalue() == "drafting: 5 drafts 1.23 s\nloading y ... 0.00 s\ndone\n"


def test_terminal_shows_running_stage_and_erases_a_failed_one():
    out = _Tty()
    p = StderrProgress(out)
    with pytest.raises(ValueError), stage(p, "loading"):
        raise ValueError
    p.start("retrieval")
    p.end("retrieval", 0.5, "3 passages")
    assert out.getvalue() == "loading ...\r\033[Kretrieval ...\r\033[Kretrieval: 3 passages 0.50 s\n"


def test_no_progress_is_silent(capsys):
    NO_PROGRESS.start("x")
    NO_PROGRESS.end("x", 1.0, "y")
    NO_PROGRESS.note("z")
    assert capsys.readouterr() == ("", "")


def test_bm25s_debug_records_are_dropped(caplog):
    logging.getLogger("bm25s").setLevel(logging.DEBUG)  # what a (re-)import of bm25s does
    caplog.set_level(logging.DEBUG)
    LexicalIndex.build(DOCS)
    assert [r for r in caplog.records if r.name.startswith("bm25s")] == []


def test_no_debug_line_after_absl_configured_logging():
    # orbax's import logs through absl, which runs logging.basicConfig(): a root handler that passes DEBUG.
    code = (
        "import absl.logging; absl.logging.info('x')\n"
        "from specrag_jax.retrieval.lexical import LexicalIndex\n"
        f"LexicalIndex.build({DOCS!r})\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "bm25s" not in proc.stderr and "DEBUG" not in proc.stderr, proc.stderr


def test_cli_root_handler_drops_library_debug_records():
    code = (
        "from specrag_jax.progress import quiet_library_logs; quiet_library_logs()\n"
        "import logging, absl.logging; absl.logging.info('x')\n"
        "lib = logging.getLogger('lib'); lib.setLevel(logging.DEBUG); lib.debug('hidden'); lib.warning('shown')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == (0, "WARNING:lib:shown\n")


@pytest.fixture
def tiny_cli(monkeypatch):
    """The CLI on tiny random models (``tiny:llama`` / ``tiny:gemma3``), without the on-disk XLA cache."""
    models = {
        "tiny:llama": tiny_text_model("tiny:llama", seed=1, num_pages=192, page_size=16),
        "tiny:gemma3": tiny_text_model("tiny:gemma3", seed=2, num_pages=192, page_size=16),
    }
    monkeypatch.setattr(TextModel, "load", classmethod(lambda cls, name, **kw: models[name]))
    monkeypatch.setattr("specrag_jax.cli.enable_compilation_cache", lambda: None)


def _cli(capsys, *args: str) -> tuple[str, str]:
    assert main(list(args)) == 0
    return capsys.readouterr()


def test_ask_reports_stages_and_quiet_silences_them(capsys, tiny_cli):
    args = [
        "ask",
        "How do I leave a loop early?",
        "--method",
        "speculative",
        "--drafter",
        "tiny:llama",
        "--verifier",
        "tiny:gemma3",
        "--m",
        "2",
        "--n-docs",
        "4",
        "--no-consensus",
        "--selection",
        "rho",
        "--tau-min",
        "none",
        "--json",
    ]
    out, err = _cli(capsys, *args)
    lines = err.splitlines()
    assert len(lines) == 6, err
    assert [line.split(":")[0] for line in lines[:5]] == [
        "loading",
        "retrieval",
        "clustering",
        "drafting",
        "verification",
    ], err
    assert lines[0].startswith("loading: drafter tiny:llama") and "verifier tiny:gemma3" in lines[0]
    assert lines[1].startswith("retrieval: 4 retrieved passages ")
    assert lines[2].startswith("clustering: 4 docs -> k=") and "2 subsets" in lines[2]
    assert lines[3].startswith("drafting: 2 drafts (") and " new tokens " in lines[3]
    assert lines[4].startswith("verification: 2 drafts, ") and " tree tokens " in lines[4]
    assert lines[5].startswith("answer in ") and "programs from the disk cache" in lines[5]
    obj = json.loads(out)
    assert set(obj) == {"answer", "rationale", "citations", "drafts", "trace", "method"}
    quiet_out, quiet_err = _cli(capsys, *args, "--quiet")
    assert quiet_err == ""
    assert json.loads(quiet_out)["answer"] == obj["answer"]
    cascade = [*args[:-5], "--selection", "evidence", "--tau-min", "1.0", "--json"]  # the cascade's stages
    _, err = _cli(capsys, *cascade, "--no-early-fallback")
    lines = err.splitlines()
    assert lines[4].startswith("evidence verification: 2 drafts with their passages, ") and "tree tokens" in lines[4]
    assert "< tau_min 1.0: standard fallback" in lines[5], err
    out, err = _cli(capsys, *cascade)  # early fallback (the default): verification skipped unless both drafts agree
    skipped = "confidence_bound" in json.loads(out)["trace"]
    assert err.splitlines()[4].startswith("verification skipped: " if skipped else "evidence verification: "), err


def test_ask_reports_the_route_it_took(capsys, tiny_cli):
    """The default method (auto): the router's decision and reason, then the path's own stages."""
    args = ["ask", "How do I leave a loop early?", "--drafter", "tiny:llama", "--verifier", "tiny:gemma3"]
    out, err = _cli(capsys, *args, "--m", "2", "--n-docs", "4", "--json")
    route = json.loads(out)["trace"]["route"]
    lines = err.splitlines()
    assert lines[2].startswith(f"route: {route['path']}: "), err
    assert lines[3].startswith("exact answer: " if route["path"] == "exact" else "clustering: "), err


def test_generate_reports_stages_and_quiet_silences_them(capsys, tiny_cli):
    args = ["generate", "--model", "tiny:llama", "--prompt", "hello", "--max-new-tokens", "3"]
    out, err = _cli(capsys, *args)
    lines = err.splitlines()
    assert len(lines) == 3 and lines[0].startswith("loading tiny:llama ... "), err
    assert re.match(r"generation: 6 prompt \+ [1-3] new tokens, prefill [0-9.]+ s, decode ", lines[1]), err
    assert lines[2].startswith("  of which XLA "), err
    quiet_out, quiet_err = _cli(capsys, *args, "-q")
    assert (quiet_out, quiet_err) == (out, "")
    obj = json.loads(_cli(capsys, *args, "--json", "--quiet")[0])
    assert set(obj) == {
        "model",
        "text",
        "token_ids",
        "num_prompt_tokens",
        "num_generated_tokens",
        "finish_reason",
        "timings",
    }


def test_eval_loading_line_and_quiet(capsys, tiny_cli):
    data = Path(__file__).parent / "pipeline" / "data" / "mini_eval.jsonl"
    args = [
        "eval",
        "--data",
        str(data),
        "--limit",
        "1",
        "--methods",
        "closed_book",
        "--drafter",
        "tiny:llama",
        "--verifier",
        "tiny:gemma3",
        "--json",
    ]
    out, err = _cli(capsys, *args)
    assert err.startswith("loading: drafter tiny:llama") and len(err.splitlines()) == 1, err
    assert list(json.loads(out)["methods"]) == ["closed_book"]
    assert _cli(capsys, *args, "--quiet")[1] == ""


_CACHED_RUN = """
from specrag_jax.cli import enable_compilation_cache
enable_compilation_cache()
from specrag_jax.compile_time import compile_stats
import jax, jax.numpy as jnp
compile_stats()
jax.jit(lambda x: x * 2 + 1)(jnp.arange(3.0)).block_until_ready()
s = compile_stats()
print(s.cache_hits, s.programs)
"""


def test_second_process_loads_even_small_programs_from_the_disk_cache(tmp_path):
    env = {**os.environ, "SPECRAG_CACHE_DIR": str(tmp_path)}
    runs = [
        subprocess.run([sys.executable, "-c", _CACHED_RUN], capture_output=True, text=True, timeout=300, env=env)
        for _ in range(2)
    ]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr
    (hits1, programs1), (hits2, programs2) = (map(int, r.stdout.split()) for r in runs)
    assert hits1 == 0 and programs1 >= 1
    assert hits2 == programs2 == programs1


def test_ask_on_a_terminal_streams_the_answer_once(capsys, tiny_cli, monkeypatch):
    """stdout a terminal: the answer is written as it is decoded, once, on lines of its own (stage lines on stderr
    never continue it); --json is unchanged."""
    import sys

    args = ["ask", "How do I leave a loop early?", "--drafter", "tiny:llama", "--verifier", "tiny:gemma3"]
    args += ["--method", "standard", "--n-docs", "4", "--max-answer-tokens", "24"]
    plain_out, _ = _cli(capsys, *args)  # not a terminal: the answer printed whole at the end
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    out, err = _cli(capsys, *args)
    answer = plain_out.split("\ncitations: ")[0]
    assert out == plain_out  # the same text, the answer once
    assert "answer:\n" in err and err.index("answer:\n") < err.index("standard RAG answer: ")
    assert json.loads(_cli(capsys, *args, "--json")[0])["answer"] == answer
