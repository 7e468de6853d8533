"""The roofline: FLOP and byte counts from configs and token counts, and the per-stage table of a trace."""

from __future__ import annotations

import pytest

from specrag_jax.machine_peaks import DEVICE_PEAKS, MachinePeaks, device_peaks, measure_peaks
from specrag_jax.models.config import tiny_config
from specrag_jax.models.executor.cost import Cost, ModelCost, causal_pairs, decode_cost, prefill_cost, tree_cost
from specrag_jax.pipeline.roofline import mean_roofline, predicted_bound_s, roofline, stage_costs

PEAKS = MachinePeaks(flops_per_s=1e11, bytes_per_s=1e10, source="test")
PEAKS_ARGS = (PEAKS.flops_per_s, PEAKS.bytes_per_s)


def _cost(**kw) -> ModelCost:
    return ModelCost.of(tiny_config("llama", **kw), weight_bytes=1e6)


def test_model_cost_counts_every_projection():
    cfg = tiny_config("llama")
    mc = ModelCost.of(cfg, weight_bytes=123.0)
    h, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * cfg.intermediate_size
    assert mc.body_params == cfg.num_layers * per_layer
    assert mc.head_params == cfg.vocab_size * h
    assert mc.attn_flops_per_pair == 4 * cfg.num_layers * q
    assert mc.kv_bytes_per_token == 2 * cfg.num_layers * kv * 4


def test_moe_counts_only_the_routed_experts():
    dense = _cost()
    moe = ModelCost.of(tiny_config("llama", num_experts=8, experts_per_token=2), weight_bytes=1e6)
    cfg = tiny_config("llama")
    extra = cfg.num_layers * (3 * cfg.hidden_size * cfg.intermediate_size + cfg.hidden_size * 8)
    assert moe.body_params == dense.body_params + extra


def test_prefill_in_chunks_sees_the_same_pairs_as_one_causal_pass():
    mc = _cost()
    whole = prefill_cost(mc, 1000, 10_000)
    chunked = prefill_cost(mc, 1000, 128)
    assert whole.steps == 1 and chunked.steps == 8
    assert chunked.flops == pytest.approx(whole.flops)
    assert chunked.bytes > whole.bytes  # the weights are read once per chunk
    assert causal_pairs(3, 2) == 3 * 2 + 6


def test_decode_is_memory_bound_and_scales_with_steps():
    mc = _cost()
    one, ten = decode_cost(mc, 1, 1, 100), decode_cost(mc, 10, 1, 100)
    assert ten.flops == pytest.approx(10 * one.flops) and ten.bytes == pytest.approx(10 * one.bytes)
    assert one.bound_s(1e15, 1e9) == one.bytes / 1e9


def test_tree_pairs_grow_with_the_prefix():
    mc = _cost()
    assert tree_cost(mc, 100, 500, 5).flops > tree_cost(mc, 10, 500, 5).flops


def test_tree_cost_counts_scored_rows_and_skips_the_cached_prefix():
    """Every scored row pays the head; a cached prefix token is read (K/V bytes), not multiplied."""
    mc = _cost()
    base = tree_cost(mc, 100, 500, 5)
    assert tree_cost(mc, 100, 500, 5, scored_rows=5) == base
    assert tree_cost(mc, 100, 500, 5, scored_rows=125).flops - base.flops == pytest.approx(2 * mc.head_params * 120)
    cached = tree_cost(mc, 100, 500, 5, cached=64)
    saved_pairs = causal_pairs(100) - causal_pairs(36, 64)
    assert base.flops - cached.flops == pytest.approx(2 * mc.body_params * 64 + mc.attn_flops_per_pair * saved_pairs)
    assert cached.bytes == pytest.approx(base.bytes)  # a cached token's K/V is read where it was written
    assert tree_cost(mc, 100, 500, 5, cached=900) == tree_cost(mc, 100, 500, 5, cached=100)  # at most the prefix


def test_verification_stages_count_the_prefix_and_the_scored_rows_of_the_trace():
    """The trace's tree tokens are the branches' (the prefix is counted apart): the bound's pass is prefix + tree,
    less the prefix tokens the cache served, with a head row for every scored row."""
    mc = _cost()
    trace = _trace(verifier_prefix_tokens=60, verifier_tree_tokens=400, verification_s=5.0)
    plain = roofline(trace, mc, mc, "speculative", PEAKS)["verification"]
    assert plain["gflop"] == pytest.approx(tree_cost(mc, 60, 460, 5).flops / 1e9, rel=1e-4)
    full = {**trace, "verifier_scored_rows": 205, "verifier_prefix_cached_tokens": 48}
    table = roofline(full, mc, mc, "speculative", PEAKS)["verification"]
    assert table["gflop"] == pytest.approx(tree_cost(mc, 60, 460, 5, 205, 48).flops / 1e9, rel=1e-4)


def _trace(**extra):
    return {
        "clustering_s": 1.0,
        "clustering_tokens": 300,
        "clustering_steps": 1,
        "clustering_question_tokens": 20,
        "clustering_docs": 10,
        "num_subsets": 5,
        "drafting_s": 2.0,
        "drafter_prefill_tokens": 900,
        "drafter_shared_prefix_tokens": 50,
        "drafter_decode_tokens": 200,
        "drafter_decode_steps": 45,
        "evidence_verification_s": 3.0,
        "evidence_prefix_tokens": 40,
        "evidence_tree_tokens": 1200,
        **extra,
    }


def test_stage_table_of_a_speculative_trace():
    mc = _cost()
    table = roofline(
        _trace(generation_s=4.0, verifier_prefill_tokens=800, verifier_decode_tokens=10, verifier_decode_s=1.0),
        mc,
        mc,
        "speculative",
        PEAKS,
    )
    assert set(table) == {
        "clustering",
        "drafting",
        "evidence_verification",
        "fallback",
        "fallback.prefill",
        "fallback.decode",
    }
    for row in table.values():
        assert row["bound_s"] > 0 and row["ratio"] == pytest.approx(row["measured_s"] / row["bound_s"], rel=1e-2)
        assert max(row["compute_s"], row["memory_s"]) * (1 - 1e-4) <= row["bound_s"]
        assert row["bound_s"] <= (row["compute_s"] + row["memory_s"]) * (1 + 1e-4)
    single = table["evidence_verification"]  # one pass: the larger of its two times
    assert single["bound_s"] == pytest.approx(max(single["compute_s"], single["memory_s"]), rel=1e-3)
    assert table["fallback.prefill"]["measured_s"] == pytest.approx(3.0)


def test_standard_and_lossless_name_their_generation_stage():
    mc = _cost()
    trace = {"generation_s": 2.0, "verifier_prefill_tokens": 500, "verifier_decode_tokens": 20}
    assert set(stage_costs(trace, mc, mc, "standard")) == {"standard"}
    spec = {**trace, "speculation": {"counts": {"steps": 5, "proposed": 40}}}
    costs = stage_costs(spec, mc, mc, "lossless")
    plain = stage_costs(trace, mc, mc, "lossless")
    assert costs["lossless"][1].steps == plain["lossless"][1].steps - 19 + 5  # 5 tree steps, not 19 decode steps


def test_serial_parts_are_bound_one_after_another():
    """A compute-bound prefill then a memory-bound decode: the sum of their own bounds, not the larger of the sums
    (the decode cannot read weights while the prefill computes); repeats of one step kind stay one part."""
    prefill, decode = Cost(flops=3e11, bytes=1e9, steps=1), Cost(flops=1e9, bytes=2e10, steps=1).times(4)
    both = prefill + decode
    assert (both.flops, both.bytes, both.steps) == (3e11 + 4e9, 1e9 + 8e10, 5)
    assert both.bound_s(1e11, 1e10) == pytest.approx(3.0 + 8.0)  # max of sums: 8.04
    assert decode.bound_s(1e11, 1e10) == pytest.approx(8.0) and Cost().bound_s(1e11, 1e10) == 0.0
    mc = _cost()
    pre, dec = prefill_cost(mc, 1000, 256), decode_cost(mc, 10, 5, 1000)
    parts = sum(c.bound_s(*PEAKS_ARGS) for c in (prefill_cost(mc, 256, 256), dec))
    assert (pre + dec).bound_s(*PEAKS_ARGS) >= max(pre.bound_s(*PEAKS_ARGS), dec.bound_s(*PEAKS_ARGS))
    assert (prefill_cost(mc, 256, 256) + dec).bound_s(*PEAKS_ARGS) == pytest.approx(parts)


def test_device_bounds_are_each_answers_parts_at_the_devices_peaks():
    """Drafting's prefill and decode on an H200 or a TPU: bound part by part per answer, averaged over answers;
    ``predicted_bound_s`` reads it, and falls back to the one-part figure for a row without it."""
    mc = ModelCost(1e8, 1e7, 4e8, 1e4, 1e3)  # a 100M model: on an H200 its prefill is compute-, its decode memory-bound
    rows = [roofline(_trace(drafter_decode_steps=steps), mc, mc, "speculative", PEAKS) for steps in (45, 90)]
    h200 = device_peaks("h200")
    for row in rows:
        d = row["drafting"]
        one_part = max(d["gflop"] * 1e9 / h200.flops_per_s, d["gbytes"] * 1e9 / h200.bytes_per_s)
        assert d["device_bound_s"]["h200"] > one_part * 1.01 and set(d["device_bound_s"]) == set(DEVICE_PEAKS)
    mean = mean_roofline(rows)["drafting"]
    want = (rows[0]["drafting"]["device_bound_s"]["h200"] + rows[1]["drafting"]["device_bound_s"]["h200"]) / 2
    assert mean["device_bound_s"]["h200"] == pytest.approx(want, rel=1e-4)
    assert predicted_bound_s(mean, h200) == mean["device_bound_s"]["h200"]
    bare = {k: v for k, v in mean.items() if k != "device_bound_s"}
    assert predicted_bound_s(bare, h200) < mean["device_bound_s"]["h200"]


def test_mean_roofline_is_the_ratio_of_means():
    rows = [{"s": {"measured_s": 2.0, "bound_s": 1.0}}, {"s": {"measured_s": 4.0, "bound_s": 1.0}}]
    assert mean_roofline(rows) == {
        "s": {"measured_s": 3.0, "bound_s": 1.0, "ratio": 3.0, "questions": 2, "compile_s": 0.0}
    }


def test_a_stage_is_measured_without_its_own_compile_time():
    """``<stage>_compile_s`` (one-time XLA work on the stage's thread) is taken out of the stage's measured time and
    reported beside it, as an answer's latency leaves compilation out; never below zero."""
    mc = _cost()
    plain = roofline(_trace(), mc, mc, "speculative", PEAKS)
    table = roofline(_trace(drafting_compile_s=0.5, evidence_verification_compile_s=9.0), mc, mc, "speculative", PEAKS)
    assert plain["drafting"]["compile_s"] == 0.0 and plain["drafting"]["measured_s"] == pytest.approx(2.0)
    assert table["drafting"]["measured_s"] == pytest.approx(1.5) and table["drafting"]["compile_s"] == 0.5
    assert table["drafting"]["ratio"] == pytest.approx(1.5 / table["drafting"]["bound_s"], rel=1e-3)
    assert table["evidence_verification"]["measured_s"] == 0.0  # clamped: the stage's 3.0 s, all of it compiling
    assert table["clustering"] == plain["clustering"]  # a stage without its own compile count is unchanged
    assert mean_roofline([table, plain])["drafting"]["compile_s"] == pytest.approx(0.25)


@pytest.mark.parametrize("method, name", [("speculative", "fallback"), ("standard", "standard")])
def test_the_verifiers_answer_is_measured_without_its_phases_compile_time(method, name):
    """The answer's prefill and decode each lose their own compile seconds, the whole stage both."""
    mc = _cost()
    gen = dict(generation_s=4.0, verifier_prefill_tokens=800, verifier_decode_tokens=10, verifier_decode_s=1.0)
    compiled = dict(verifier_prefill_compile_s=0.75, verifier_decode_compile_s=0.25)
    plain = roofline(_trace(**gen), mc, mc, method, PEAKS)
    table = roofline(_trace(**gen, **compiled), mc, mc, method, PEAKS)
    assert table[f"{name}.prefill"]["measured_s"] == pytest.approx(2.25) and plain[f"{name}.prefill"]["compile_s"] == 0
    assert table[f"{name}.decode"]["measured_s"] == pytest.approx(0.75)
    assert table[name]["measured_s"] == pytest.approx(3.0) and table[name]["compile_s"] == pytest.approx(1.0)
    assert table["drafting"] == plain["drafting"]  # other stages keep their own counts


def test_measured_peaks_are_positive_and_devices_are_known():
    p = measure_peaks(repeats=1, m=64, k=64, n=64, mib=4)
    assert p.flops_per_s > 0 and p.bytes_per_s > 0 and p.source == "measured"
    for name in DEVICE_PEAKS:
        assert device_peaks(name).flops_per_s > 1e13
    assert Cost(2e11, 0).bound_s(1e11, 1e9) == 2.0


def test_eval_json_carries_the_roofline_of_every_method():
    """Tiny models, three questions: every method's stages get measured/bound/ratio; compiled answers are left
    out (so the first question usually is)."""
    from pathlib import Path

    from specrag_jax.evaluation.run import evaluate, load_questions
    from specrag_jax.pipeline.clustering import clustered_subsets
    from specrag_jax.pipeline.specrag import RAGConfig, SpecRAG
    from specrag_jax.retrieval import Embedder
    from specrag_jax.serving.tiny import tiny_text_model

    drafter = tiny_text_model("tiny:llama", seed=1, num_pages=96, page_size=16, max_seq_len=1024)
    verifier = tiny_text_model("tiny:llama", seed=2, num_pages=96, page_size=16, max_seq_len=1024)
    # the evidence pass timed (the default, rho+ground, skips verification when no random draft is grounded)
    sizes = dict(n_docs=2, m=2, k=1, max_draft_tokens=4, max_answer_tokens=3, max_doc_tokens=40)
    config = RAGConfig(**sizes, selection="evidence", tau_min=None)
    rag = SpecRAG(drafter, verifier, subsets=clustered_subsets(Embedder(drafter)), config=config)
    rows = load_questions(Path(__file__).parent / "data" / "mini_eval.jsonl")
    rows = (rows * 3)[:4]  # repeats compile nothing new
    res = evaluate(rag, rows, ["speculative", "standard"], progress=False)
    spec = res["methods"]["speculative"]["roofline"]
    assert {"clustering", "drafting", "evidence_verification"} <= set(spec)
    assert "standard.prefill" in res["methods"]["standard"]["roofline"]
    for row in res["roofline"].values():
        assert {"measured_s", "bound_s", "ratio", "questions", "method"} <= set(row)
        assert row["bound_s"] > 0 and row["questions"] >= 1
    assert res["roofline_peaks"]["matmul_gflops"] > 0


def test_answers_beside_background_loading_are_left_out_of_the_roofline(monkeypatch):
    """An answer during which the step prefetch loaded programs on its own thread (sharing the CPU) is not judged
    by its bound; its prediction says how long that loading took."""
    from pathlib import Path

    import specrag_jax.evaluation.run as evaluation
    from specrag_jax.compile_time import CompileStats
    from specrag_jax.pipeline.clustering import lexical_subsets
    from specrag_jax.pipeline.specrag import RAGConfig, SpecRAG
    from specrag_jax.serving.tiny import tiny_text_model

    drafter = tiny_text_model("tiny:llama", seed=1, num_pages=96, page_size=16, max_seq_len=1024)
    verifier = tiny_text_model("tiny:llama", seed=2, num_pages=96, page_size=16, max_seq_len=1024)
    sizes = dict(n_docs=2, m=2, k=1, max_draft_tokens=4, max_answer_tokens=3, max_doc_tokens=40)
    rag = SpecRAG(drafter, verifier, subsets=lexical_subsets(), config=RAGConfig(**sizes))
    rows = evaluation.load_questions(Path(__file__).parent / "data" / "mini_eval.jsonl")[:1] * 2
    calls = iter(range(100))
    monkeypatch.setattr(evaluation, "background_stats", lambda: CompileStats(backend_s=60.0 * next(calls)))
    res = evaluation.evaluate(rag, rows, ["standard"], progress=False)
    assert res["methods"]["standard"]["roofline"] == {}  # 60 s of loading beside every answer
    assert [p["background_load_s"] for p in res["predictions"]] == [60.0] * 2
    monkeypatch.undo()
    quiet = evaluation.evaluate(rag, rows, ["standard"], progress=False)  # repeats: nothing compiles or loads
    assert quiet["methods"]["standard"]["roofline"]["standard.prefill"]["questions"] == 2
    assert all(p["background_load_s"] == 0.0 for p in quiet["predictions"])
