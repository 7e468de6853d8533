"""`--drafter-adapter`: a `specrag train` run merged into the drafter at load (``adapter_transform``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specrag_jax.cli import main
from specrag_jax.errors import SpecRagError
from specrag_jax.training.lora_merge import adapter_transform, load_adapter

ROWS = [
    {"prompt": f"## Instruction: what is {i}+1?\n## Rationale:", "target": f" {i}+1={i + 1}\n## Response: {i + 1}"}
    for i in range(8)
]


def test_no_adapter_means_no_transform():
    assert adapter_transform("smollm2-135m-instruct", None) is None


@pytest.mark.slow
def test_trained_adapter_is_merged_into_the_real_drafter_and_refused_for_another(tmp_path, capsys):
    from specrag_jax.models.text_model import TextModel

    data, out = tmp_path / "d.jsonl", tmp_path / "run"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    code = main(
        [
            "train",
            "--data",
            str(data),
            "--out",
            str(out),
            "--model",
            "smollm2-135m-instruct",
            "--steps",
            "2",
            "--batch",
            "2",
            "--max-len",
            "64",
            "--lora-rank",
            "2",
            "--lr",
            "1e-2",
            "--eval-every",
            "2",
            "--json",
            "-q",
        ]
    )
    assert code == 0, capsys.readouterr().err
    base = TextModel.load("smollm2-135m-instruct", max_batch=1)
    tuned = TextModel.load(
        "smollm2-135m-instruct", max_batch=1, transform_params=adapter_transform("smollm2-135m-instruct", out)
    )
    merged, _ = load_adapter(out, "smollm2-135m-instruct", base.runner.cfg, base.runner.params)
    import jax

    for a, b in zip(jax.tree_util.tree_leaves(tuned.runner.params), jax.tree_util.tree_leaves(merged)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # loaded = merged by hand
    assert any(
        not np.array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(jax.tree_util.tree_leaves(base.runner.params), jax.tree_util.tree_leaves(merged))
    )
    ids = [base.tokenizer.encode(ROWS[0]["prompt"], add_bos=True)]
    [plain], [adapted] = base.generate_ids(ids, max_new_tokens=4), tuned.generate_ids(ids, max_new_tokens=4)
    assert plain.logprobs != adapted.logprobs  # the adapters changed the drafter
    with pytest.raises(SpecRagError, match="smollm2-135m-instruct"):
        TextModel.load("gemma3-270m", max_batch=1, transform_params=adapter_transform("gemma3-270m", out))


@pytest.mark.slow
def test_a_foreign_shipped_adapter_is_one_line_naming_both_models(capsys):
    code = main(
        [
            "ask",
            "Who?",
            "--drafter",
            "gemma3-270m",
            "--verifier",
            "gemma3-270m",
            "--drafter-adapter",
            "smollm2-rag-drafter",
            "-q",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "smollm2-135m-instruct" in err[0] and "gemma3-270m" in err[0], err
