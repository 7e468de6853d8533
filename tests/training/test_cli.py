"""`specrag train` end to end on a tiny model: summary JSON, resume refusals, one-line errors for bad input."""

from __future__ import annotations

import json

import pytest

from specrag_jax.cli import main
from specrag_jax.models.config import tiny_config
from specrag_jax.models.decoder.transformer import init_params
from specrag_jax.serving.tiny import CharTokenizer
from specrag_jax.training import cli as train_cli
from specrag_jax.training.lora_merge import adapter_info, load_adapter

SEEDS = {"tiny-a": 1, "tiny-b": 2}


@pytest.fixture(autouse=True)
def tiny_bases(monkeypatch, tmp_path):
    """`--model tiny-a` / `tiny-b`: two tiny Llama-style models that differ only in their random weights."""
    cfg = tiny_config("llama")
    cache: dict[str, dict] = {}

    def load_base(name: str, dtype: str):
        if name not in cache:
            cache[name] = init_params(cfg, seed=SEEDS[name])
        return cfg, cache[name]

    monkeypatch.setattr(train_cli, "load_base", load_base)
    monkeypatch.setattr(train_cli, "load_tokenizer", lambda name: CharTokenizer(cfg.vocab_size))
    monkeypatch.setenv("SPECRAG_CACHE_DIR", str(tmp_path / "cache"))


def data_file(tmp_path, rows) -> str:
    path = tmp_path / "drafter.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


ROWS = [
    {"prompt": f"## Instruction: what is {i}+1?\n## Rationale:", "target": f" {i}+1={i + 1}\n## Response: {i + 1}"}
    for i in range(24)
]


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_train_then_resume_and_load_the_adapter(capsys, tmp_path):
    rows = ROWS + [{"prompt": "x" * 400, "target": "y"}]  # one over-long example: skipped and counted
    data, out = data_file(tmp_path, rows), str(tmp_path / "run")
    common = [
        "train",
        "--data",
        data,
        "--out",
        out,
        "--model",
        "tiny-a",
        "--batch",
        "2",
        "--max-len",
        "128",
        "--eval-every",
        "3",
        "--lora-rank",
        "2",
        "--lora-targets",
        "attn",
        "--lr",
        "1e-2",
        "--json",
        "-q",
    ]
    code, stdout, err = run(capsys, *common, "--steps", "6")
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["steps"] == [0, 6] and summary["mode"] == "lora" and summary["model"] == "tiny-a"
    assert summary["examples"] == {"train": 22, "eval": 2, "skipped_long": 1}
    assert summary["final_eval_loss"] is not None and summary["tokens_per_s"] > 0
    assert (tmp_path / "run" / "loss.png").exists()
    meta = adapter_info(out)
    assert meta["step"] == 6 and meta["lora"] == {"rank": 2, "alpha": 4.0, "targets": ["q", "k", "v", "o"]}

    code, _, err = run(capsys, *common, "--steps", "6")
    assert code == 2 and "already holds a training checkpoint (step 6); pass --resume" in err
    code, _, err = run(capsys, *common, "--steps", "6", "--resume", "--model", "tiny-b")
    assert code == 2 and err.count("\n") == 1, err
    assert "trained on base model 'tiny-a'" in err and "not on 'tiny-b'" in err
    code, stdout, err = run(capsys, *common, "--steps", "6", "--resume")  # nothing left to do: same summary
    assert code == 0 and json.loads(stdout)["steps"] == [6, 6], err

    cfg, params_b = train_cli.load_base("tiny-b", "float32")
    with pytest.raises(Exception, match="not on 'tiny-b'"):
        load_adapter(out, "tiny-b", cfg, params_b)
    _, params_a = train_cli.load_base("tiny-a", "float32")
    merged, meta = load_adapter(out, "tiny-a", cfg, params_a)
    assert set(merged) == set(params_a) and meta["base_model"] == "tiny-a"


@pytest.mark.parametrize(
    "rows, args, message",
    [
        (
            [{"prompt": "a", "target": "b"}, {"question": "q", "target": "b"}],
            [],
            "drafter.jsonl:2: missing field 'prompt'",
        ),
        ([{"prompt": "a" * 300, "target": "b"}], ["--refuse-long"], "drafter.jsonl:1: example has 303 tokens"),
        ([{"prompt": "a", "target": "b"}], ["--full", "--lora-rank", "4"], "--full trains every parameter"),
        ([{"prompt": "a", "target": "b"}], ["--lora-targets", "q,proj"], "unknown LoRA target 'proj'"),
        ([{"prompt": "a", "target": "b"}], ["--steps", "0"], "--steps must be >= 1"),
    ],
)
def test_bad_input_is_one_line(capsys, tmp_path, rows, args, message):
    code, _, err = run(
        capsys,
        "train",
        "--data",
        data_file(tmp_path, rows),
        "--out",
        str(tmp_path / "o"),
        "--model",
        "tiny-a",
        "--max-len",
        "128",
        "-q",
        *args,
    )
    assert code == 2 and err.startswith("specrag: error: ") and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_missing_data_file(capsys, tmp_path):
    code, _, err = run(capsys, "train", "--data", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "o"), "-q")
    assert code == 2 and "training data file not found" in err
