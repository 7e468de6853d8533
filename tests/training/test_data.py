"""The prompt/target format, its refusals, packing into buckets and the target-only loss mask."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.models.decoder.transformer import unstack_layers
from specrag_jax.serving.tiny import CharTokenizer
from specrag_jax.training.batching import BatchPlan, BatchStream, bucket_lengths, make_batch, pack_rows
from specrag_jax.training.data import Example, load_examples, split_holdout
from specrag_jax.training.objective import batch_nll, row_logits
from tests.training.conftest import BATCH_KEYS, counting_examples

TOK = CharTokenizer()


def write_lines(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_loads_prompt_and_target_with_eos_and_optional_ids(tmp_path):
    f = write_lines(
        tmp_path / "d.jsonl",
        [
            {"prompt": "Q: hi\n## Rationale:", "target": " ok", "id": 1},
            "",
            {"prompt": "x", "prompt_ids": [1, 5, 6], "target": "ab"},
        ],
    )
    data = load_examples(f, TOK, eos_id=2, max_len=64)
    a, b = data.examples
    assert a.prompt_ids.tolist() == TOK.encode_rendered("Q: hi\n## Rationale:")
    assert a.prompt_ids[0] == TOK.bos_id and a.target_ids.tolist() == TOK.encode(" ok") + [2]
    assert b.prompt_ids.tolist() == [1, 5, 6] and b.line == 3  # file line numbers (the blank line counts)


@pytest.mark.parametrize(
    "row, message",
    [
        ({"target": "x"}, "d.jsonl:2: missing field 'prompt'"),
        ({"prompt": "x"}, "d.jsonl:2: missing field 'target'"),
        ({"prompt": "x", "target": 3}, "d.jsonl:2: field 'target' must be a string"),
        ({"prompt": "x", "target": "  "}, "d.jsonl:2: field 'target' is empty"),
        ({"prompt": "x", "target": "y", "prompt_ids": [1, 999]}, "d.jsonl:2: field 'prompt_ids' must be a list"),
        ("{not json", "d.jsonl:2: not valid JSON"),
        ("[1, 2]", "d.jsonl:2: expected a JSON object"),
    ],
)
def test_bad_lines_are_refused_naming_file_line_and_field(tmp_path, row, message):
    f = write_lines(tmp_path / "d.jsonl", [{"prompt": "a", "target": "b"}, row])
    with pytest.raises(SpecRagError, match=message.replace("[", r"\[")) as exc:
        load_examples(f, TOK, 2, 64)
    assert "\n" not in str(exc.value)


def test_over_long_examples_are_skipped_and_named_or_refused(tmp_path):
    rows = [{"prompt": "a" * 10, "target": "b"}, {"prompt": "a" * 100, "target": "b"}, {"prompt": "c", "target": "d"}]
    f = write_lines(tmp_path / "d.jsonl", rows)
    data = load_examples(f, TOK, 2, max_len=32)
    assert len(data.examples) == 2 and data.skipped_long == [2]
    assert "skipped 1 over-long (lines 2)" in data.summary()
    with pytest.raises(SpecRagError, match=r"d.jsonl:2: example has 103 tokens, over the limit of 32"):
        load_examples(f, TOK, 2, max_len=32, on_long="refuse")
    with pytest.raises(SpecRagError, match="all 3 are longer than 3 tokens"):
        load_examples(f, TOK, 2, max_len=3)


def test_holdout_split_is_seeded_and_disjoint():
    exs = counting_examples(50)
    train, held = split_holdout(exs, 0.2, seed=3)
    assert len(held) == 10 and len(train) == 40
    assert split_holdout(exs, 0.2, seed=3)[1][0] is held[0]
    assert {id(e) for e in train}.isdisjoint({id(e) for e in held})


def test_packing_buckets_and_epoch_order():
    exs = counting_examples(60, max_prompt=100)
    plan = BatchPlan(rows=4, buckets=bucket_lengths(128, (32, 64)), max_segments=3)
    batches = plan.batches(exs, seed=0, epoch=0)
    assert {b.shape for b in batches} <= {(4, 32), (4, 64), (4, 128)}
    assert sum(b.num_targets for b in batches) == sum(len(e.target_ids) for e in exs)  # every target once
    assert all((b.segments.max(axis=1) < 3).all() for b in batches)
    again = plan.batches(exs, seed=0, epoch=0)
    assert all((a.tokens == b.tokens).all() for a, b in zip(batches, again))
    assert any((a.tokens != b.tokens).any() for a, b in zip(batches, plan.batches(exs, seed=0, epoch=1)))
    stream = BatchStream(plan, exs, seed=0, epoch=0, index=len(batches) - 1)
    stream.next()
    assert stream.next().tokens.tolist() == plan.batches(exs, 0, 1)[0].tokens.tolist()
    assert stream.position == {"epoch": 1, "index": 1}


def test_mask_covers_exactly_the_targets():
    ex = Example(np.array([1, 10, 11, 12], np.int32), np.array([20, 21, 2], np.int32))
    b = make_batch(pack_rows([ex, ex], 16, 4), 1, 16)
    row = b.mask[0]
    # label i is token i+1: targets are tokens 4..6 and 11..13, so labels 3..5 and 10..12
    assert np.flatnonzero(row).tolist() == [3, 4, 5, 10, 11, 12]
    assert b.labels[0, [3, 4, 5]].tolist() == [20, 21, 2]
    assert b.segments[0].tolist() == [0] * 7 + [1] * 7 + [-1] * 2
    assert b.positions[0, 7:14].tolist() == list(range(7))


def test_loss_equals_cross_entropy_on_target_tokens_only(tiny):
    cfg, params = tiny
    params = unstack_layers(params, cfg.num_layers)
    exs = counting_examples(5, seed=2)
    rows = pack_rows(exs, 64, 4)
    batch = make_batch(rows, len(rows) + 1, 64)  # and one all-padding row
    arrays = {k: jnp.asarray(getattr(batch, k)) for k in BATCH_KEYS}
    kw = dict(mode="full", lora_scale=1.0, max_segments=4)
    nll = jax.jit(lambda p, b: batch_nll(p, None, cfg, b, **kw))
    log_probs = jax.jit(lambda p, b: jax.nn.log_softmax(row_logits(p, None, cfg, b, **kw), -1))
    total, count = nll(params, arrays)
    logp = log_probs(params, arrays)
    manual = []
    for e in exs:  # each example alone: log p(target_j | prompt, target_<j)
        one = make_batch([[e]], 1, 64)
        lp = np.asarray(log_probs(params, {k: jnp.asarray(getattr(one, k)) for k in BATCH_KEYS}))[0]
        n_p = len(e.prompt_ids)
        manual += [-lp[n_p - 1 + j, t] for j, t in enumerate(e.target_ids)]
    assert int(count) == len(manual) == batch.num_targets
    np.testing.assert_allclose(float(total), np.sum(manual), rtol=1e-5)
    np.testing.assert_allclose(
        float(total),
        -np.sum(np.take_along_axis(np.asarray(logp), batch.labels[..., None], -1)[..., 0] * batch.mask),
        rtol=1e-5,
    )
    # prompt tokens change the context but carry no loss: corrupting a prompt-only *label* changes nothing
    labels = batch.labels.copy()
    labels[batch.mask == 0] = 7
    same = nll(params, {**arrays, "labels": jnp.asarray(labels)})[0]
    assert float(same) == float(total)


def test_training_forward_matches_inference_logits(tiny):
    """The packed training row computes what the inference runner computes (same reference attention)."""
    from specrag_jax.models.executor.runner import Chunk, ModelRunner

    cfg, params = tiny
    ex = counting_examples(1, seed=4)[0]
    ids = np.concatenate([ex.prompt_ids, ex.target_ids])
    runner = ModelRunner(cfg, params, num_pages=16, page_size=8, max_seq_len=128)
    pages = runner.allocator.allocate(-(-len(ids) // 8))
    want = runner.logits(runner.pack([Chunk(pages, 0, ids.tolist(), rows=list(range(len(ids))))]))
    batch = make_batch([[counting_examples(3, seed=9)[0], ex]], 1, 128)  # packed behind another example
    got = np.asarray(
        row_logits(
            unstack_layers(params, cfg.num_layers),
            None,
            cfg,
            {k: jnp.asarray(getattr(batch, k)) for k in BATCH_KEYS},
            mode="full",
            lora_scale=1.0,
            max_segments=2,
        )
    )[0]
    start = int((batch.segments[0] == 0).sum())
    np.testing.assert_allclose(got[start : start + len(ids)], want, atol=2e-5)
