"""benchmarks/drafting_floor.py: steps classed as drafting's parts, each step's bound from its own chunks, and the
pass / measured (real replay) / floor (stub replay) / bound sums and ratios."""

from types import SimpleNamespace

import pytest

from benchmarks.drafting_floor import part_of, ratios, step_cost, summarise
from specrag_jax.machine_peaks import MachinePeaks
from specrag_jax.models.config import tiny_config
from specrag_jax.models.executor.cost import ModelCost, causal_pairs
from specrag_jax.models.executor.packing import Chunk


def work(chunks):
    decodes = all(len(c.tokens) == 1 and c.parents is None for c in chunks)
    return SimpleNamespace(chunks=chunks, decodes=decodes)


PROMPT = work([Chunk([1], 0, list(range(40)), rows=[39]), Chunk([2], 0, list(range(30)), rows=[29])])
TAG = work([Chunk([1], 45, [7, 8, 9], rows=[2])])
DECODE = work([Chunk([1], 50, [3], rows=[0]), Chunk([2], 60, [4], rows=[0])])
COST = ModelCost.of(tiny_config(), weight_bytes=4e6)
PEAKS = MachinePeaks(1e11, 1e10, "measured")


def test_steps_are_classed_as_prefill_tag_or_decode():
    assert [part_of(w) for w in (PROMPT, TAG, DECODE)] == ["prefill", "tag_prefill", "decode"]


def test_a_steps_bound_counts_its_own_tokens_pairs_context_and_logits_rows():
    got = step_cost(COST, DECODE)
    want = COST.step(2, causal_pairs(1, 50) + causal_pairs(1, 60), context=110, logits_rows=2)
    assert (got.flops, got.bytes) == (want.flops, want.bytes)
    prompt = step_cost(COST, PROMPT)
    assert prompt.flops == COST.step(70, causal_pairs(40) + causal_pairs(30), logits_rows=2).flops


def test_sums_by_part_and_ratios():
    kept = [[PROMPT, None, None, 0.5], [TAG, None, None, 0.1], [DECODE, None, None, 0.2], [DECODE, None, None, 0.3]]
    out = summarise(kept, [0.45, 0.1, 0.2, 0.35], [0.4, 0.05, 0.1, 0.1], COST, PEAKS)
    assert out["by_part"]["decode"]["steps"] == 2
    assert out["by_part"]["decode"]["pass_s"] == pytest.approx(0.5)  # the timed pass
    assert out["by_part"]["decode"]["measured_s"] == pytest.approx(0.55)  # the real replay
    assert out["by_part"]["decode"]["floor_s"] == pytest.approx(0.2)
    bound = sum(step_cost(COST, w).bound_s(1e11, 1e10) for w, *_ in kept)
    assert out["total"]["bound_s"] == pytest.approx(bound)
    assert out["total"]["measured_s"] == pytest.approx(1.1) and out["total"]["floor_s"] == pytest.approx(0.65)
    r = ratios(out["total"])
    assert r["measured_over_bound"] == pytest.approx(1.1 / bound)
    assert r["floor_over_bound"] == pytest.approx(0.65 / bound)
    assert r["attention_share"] == pytest.approx(0.45 / 1.1)
