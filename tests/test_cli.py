"""`specrag generate`: the JSON contract and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import gguf
import numpy as np
import pytest

from specrag_jax.cli import main
from specrag_jax.models.loading.registry import resolve_model_path

SMOL = "smollm2-135m-instruct"


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_generate_json_contract(capsys):
    code, out, err = run_cli(
        capsys, "generate", "--model", SMOL, "--prompt", "Name a colour.", "--chat", "--max-new-tokens", "6", "--json"
    )
    assert code == 0, err
    obj = json.loads(out)
    assert obj["model"] == SMOL
    assert isinstance(obj["text"], str) and obj["text"]
    assert 1 <= len(obj["token_ids"]) <= 6 and all(isinstance(t, int) for t in obj["token_ids"])
    assert obj["num_prompt_tokens"] > 5
    assert set(obj["timings"]) >= {"load_s", "prefill_s", "decode_s", "decode_tokens_per_s"}


@pytest.mark.slow
def test_generate_speculative_ngram_equals_plain(capsys):
    prompt = "List the days of the week: Monday, Tuesday, Wednesday, Thursday, Friday. Again: Monday,"
    args = ["generate", "--model", SMOL, "--prompt", prompt, "--max-new-tokens", "24", "--json"]
    plain = json.loads(run_cli(capsys, *args)[1])
    code, out, err = run_cli(capsys, *args, "--speculative", "ngram", "--spec-budget", "8")
    assert code == 0, err
    spec = json.loads(out)
    assert spec["token_ids"] == plain["token_ids"] and "speculation" not in plain
    assert spec["speculation"]["steps"] < len(spec["token_ids"]) - 1  # several tokens per verifier step
    assert spec["speculation"]["accepted_tokens_per_step"] > 1.0


@pytest.mark.slow
def test_sampling_with_seed_is_reproducible(capsys):
    args = [
        "generate",
        "--model",
        SMOL,
        "--prompt",
        "Once upon a time",
        "--max-new-tokens",
        "5",
        "--temperature",
        "0.8",
        "--top-p",
        "0.9",
        "--seed",
        "11",
        "--json",
    ]
    first = json.loads(run_cli(capsys, *args)[1])["token_ids"]
    assert json.loads(run_cli(capsys, *args)[1])["token_ids"] == first


def test_console_entry_point_help():
    proc = subprocess.run(
        [sys.executable, "-m", "specrag_jax.cli", "generate", "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "--max-new-tokens" in proc.stdout


def write_gguf(path, arch: str) -> None:
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def truncated_smollm(tmp_path):
    src = resolve_model_path(SMOL)
    dst = tmp_path / "cut.gguf"
    with open(src, "rb") as f:
        dst.write_bytes(f.read(40_000_000))
    return dst


@pytest.mark.parametrize(
    "case, extra, expected",
    [
        ("missing", ["--model", "/nonexistent/model.gguf"], "model path does not exist"),
        ("arch", None, "unsupported architecture 'mamba'"),
        ("truncated", None, "blk."),
        ("empty", ["--model", SMOL, "--prompt", ""], "empty prompt"),
        ("temperature", ["--model", SMOL, "--temperature", "-1"], "temperature must be >= 0"),
        ("top_p", ["--model", SMOL, "--top-p", "0"], "top_p must be in (0, 1]"),
        ("top_k", ["--model", SMOL, "--top-k", "-3"], "top_k must be >= 0"),
        ("max_new", ["--model", SMOL, "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
        (
            "too_long",
            ["--model", SMOL, "--max-seq-len", "16", "--prompt", "word " * 40],
            "exceeds the context of 16 tokens",
        ),
        ("spec_proposer", ["--model", SMOL, "--speculative", "medusa"], "unknown proposer 'medusa' for --speculative"),
        (
            "spec_budget",
            ["--model", SMOL, "--speculative", "ngram", "--spec-budget", "12"],
            "tree budget must be one of 8, 16, 32, 64",
        ),
        ("spec_context", ["--model", SMOL, "--speculative", "ngram", "--max-seq-len", "8"], "cannot speculate"),
    ],
)
def test_bad_input_is_one_clear_line(capsys, tmp_path, case, extra, expected):
    if case == "arch":
        write_gguf(tmp_path / "m.gguf", "mamba")
        extra = ["--model", str(tmp_path / "m.gguf")]
    elif case == "truncated":
        extra = ["--model", str(truncated_smollm(tmp_path))]
    args = ["generate", "--prompt", "hello", "--max-new-tokens", "2", "--no-cache"] + extra
    code, out, err = run_cli(capsys, *args)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specrag: error: "), err
    assert expected in lines[0]
    if case == "too_long":
        assert "40" in lines[0] or "41" in lines[0]  # the prompt's own length is named too
