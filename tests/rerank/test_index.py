"""build_index / ``specrag index``: idempotent, resumable, never a half-written store after an interruption."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from specrag_jax.cli import main
from specrag_jax.rerank import kv_store
from specrag_jax.rerank.index import build_index
from specrag_jax.rerank.kv_store import DocKVStore
from specrag_jax.serving.tiny import tiny_text_model

CORPUS = [
    {"id": f"d{i}", "title": f"Title {i}", "text": f"Passage {i} says {i * 7} apples. " * (1 + i % 4)}
    for i in range(40)
]


@pytest.fixture(scope="module")
def model():
    return tiny_text_model("tiny:llama", num_pages=256, page_size=16)


def _all_entries_whole(store: DocKVStore) -> int:
    """Every entry file loads with its CRC checked (a key mismatch would also fail: read the key back)."""
    files = sorted(store.directory.glob("*.safetensors"))
    for p in files:
        meta, tensors, data = kv_store._read_safetensors(p)
        key = json.loads(meta["key"])
        assert store.path(key) == p
        assert store.load(key) is not None
    return len(files)


def test_index_is_idempotent(model, tmp_path):
    store = DocKVStore(tmp_path, model)
    seen = []
    first = build_index(
        model, CORPUS, store, token_budget=512, batch_docs=16, progress=lambda done, total: seen.append((done, total))
    )
    assert (first["computed"], first["skipped"]) == (len(CORPUS), 0)
    assert seen[-1] == (len(CORPUS), len(CORPUS))
    assert store.bytes_per_token() <= first["bytes_per_token"] < store.bytes_per_token() + 100
    assert json.loads(open(first["manifest"]).read())["documents"] == len(CORPUS)
    again = build_index(model, CORPUS, store, token_budget=512)
    assert (again["computed"], again["skipped"]) == (0, len(CORPUS))
    assert _all_entries_whole(store) == len(CORPUS)


def test_interrupted_write_leaves_no_partial_entry(model, tmp_path, monkeypatch):
    store = DocKVStore(tmp_path, model)
    real, calls = kv_store.write_atomic, []

    def interrupted(path, writer):
        calls.append(path)
        if len(calls) == 7:

            def half(fh):
                fh.write(b"\0" * 100)
                raise KeyboardInterrupt

            return real(path, half)
        return real(path, writer)

    monkeypatch.setattr(kv_store, "write_atomic", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build_index(model, CORPUS, store, token_budget=512)
    monkeypatch.undo()
    assert _all_entries_whole(store) == 6
    assert not list(store.directory.glob(".tmp-*"))
    assert model.runner.allocator.num_free == model.runner.allocator.num_usable
    resumed = build_index(model, CORPUS, store, token_budget=512)
    assert (resumed["computed"], resumed["skipped"]) == (len(CORPUS) - 6, 6)
    assert _all_entries_whole(store) == len(CORPUS)


_CHILD = textwrap.dedent("""
    import sys, time
    from specrag_jax.rerank import kv_store
    from specrag_jax.rerank.index import build_index
    from specrag_jax.serving.tiny import tiny_text_model
    from tests.rerank.test_index import CORPUS

    real = kv_store.write_atomic

    class Slow:
        def __init__(self, fh): self.fh = fh
        def write(self, data):
            self.fh.write(data[: len(data) // 2]); self.fh.flush(); time.sleep(0.05)
            self.fh.write(data[len(data) // 2:])

    kv_store.write_atomic = lambda path, writer: real(path, lambda fh: writer(Slow(fh)))
    model = tiny_text_model("tiny:llama", num_pages=256, page_size=16)
    build_index(model, CORPUS, kv_store.DocKVStore(sys.argv[1], model), token_budget=512, batch_docs=4)
""")


def test_killed_index_leaves_whole_entries_and_resumes(model, tmp_path):
    store = DocKVStore(tmp_path, model)  # the child builds the same tiny model: the same directory
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path)], cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.time() + 240
        while len(list(store.directory.glob("*.safetensors"))) < 3:
            assert child.poll() is None, child.stderr.read().decode()[-2000:]
            assert time.time() < deadline, "the child wrote nothing"
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(30)
    done = _all_entries_whole(store)
    assert 3 <= done < len(CORPUS)
    resumed = build_index(model, CORPUS, store, token_budget=512)
    assert (resumed["computed"], resumed["skipped"]) == (len(CORPUS) - done, done)
    assert _all_entries_whole(store) == len(CORPUS)


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert (
        main(
            [
                "index",
                "--corpus",
                str(tmp_path / "missing.jsonl"),
                "--kv-for",
                "smollm2-135m-instruct",
                "--store",
                str(tmp_path / "s"),
                "-q",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith("specrag: error:") and "\n" not in err
    assert main(["index", "--corpus", "x", "--kv-for", "m", "--max-doc-tokens", "0", "-q"]) == 2
    assert "must be >= 1" in capsys.readouterr().err


def test_cli_index_runs_resumes_and_reports_interrupts(tmp_path, capsys, monkeypatch):
    from specrag_jax.models.text_model import TextModel
    from specrag_jax.rerank import index as index_mod
    from specrag_jax.retrieval.corpus import write_jsonl

    corpus = tmp_path / "c.jsonl"
    write_jsonl(CORPUS[:20], corpus)
    monkeypatch.setattr(
        TextModel,
        "load",
        classmethod(
            lambda cls, name, **kw: tiny_text_model("tiny:llama", num_pages=kw["num_pages"], page_size=kw["page_size"])
        ),
    )
    argv = ["index", "--corpus", str(corpus), "--kv-for", "tiny", "--store", str(tmp_path / "s"), "-q", "--json"]
    real, calls = index_mod.Reranker.ensure_stored, []

    def interrupt_third(self, docs):
        calls.append(len(docs))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, docs)

    monkeypatch.setattr(index_mod.Reranker, "ensure_stored", interrupt_third)
    assert main(argv) == 130
    assert "interrupted (16 of 20 documents done)" in capsys.readouterr().err
    monkeypatch.setattr(index_mod.Reranker, "ensure_stored", real)
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["computed"], summary["skipped"], summary["documents"]) == (4, 16, 20)
