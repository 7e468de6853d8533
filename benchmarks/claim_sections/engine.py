"""Engine: decoding against transformers, kernels, layouts and step programs."""

from __future__ import annotations

from benchmarks.claim_sections.formats import F2, P0, QWEN, S2, X2
from benchmarks.report_specs import Claim, Figures, Rows, Section

_STEP_KINDS = ("decode_1", "decode_5", "tree_16", "prefill_512")


def _knob(name: str, title: str, backs: str, model: str) -> Claim:
    return Claim(
        name,
        title,
        backs,
        (
            Rows(
                f"steps/{model}/speedup",
                (("speed-up (switch on)", "", "{:.3f}x"),),
                key="step",
                keys=_STEP_KINDS,
            ),
            Figures((("greedy tokens equal", f"steps/{model}/greedy_tokens_equal", "{}"),)),
        ),
    )


def _workloads(label: str, ratio: str) -> Rows:
    """A decode_schedule.py file: the switch's decode time over the other side's, per workload."""
    return Rows("workloads", ((label, ratio, F2), ("tokens identical", "tokens_identical", "{}")), key="workload")


def _verification(sides: tuple[str, str], speedup: tuple) -> tuple:
    """A verification_pass.py file: the two sides' medians, and the speed-up the claim is about."""
    cols = (("verification in the answer", "verification_s_median", S2), ("first again", "first_again_s_median", S2))
    return (Rows("summary", cols, key="side", keys=sides), Figures((speedup,)))


ENGINE = Section(
    "Engine: decoding, kernels and step programs",
    "Figures the package's comments cite for its kernel and layout choices, and the engine against transformers.",
    (
        Claim(
            "generate_qwen.json",
            "Qwen2.5-Coder-1.5B-Instruct decode against transformers",
            "Greedy decode, float32, the same GGUF weights, in one run; the bandwidth bound is the measured read "
            "bandwidth over the weight bytes a token reads.",
            (
                Figures(
                    (
                        ("ours, batch 1 decode tok/s", f"{QWEN}/ours/batches/1/decode_tokens_per_s/best", F2),
                        ("transformers, batch 1", f"{QWEN}/transformers/batches/1/decode_tokens_per_s/best", F2),
                        ("speed-up, batch 1", f"{QWEN}/comparison/decode_speedup_batch1", X2),
                        ("share of the bandwidth bound", f"{QWEN}/comparison/ours_decode_fraction_of_bound_batch1", P0),
                        ("batch 5 aggregate, ours", f"{QWEN}/ours/batches/5/decode_tokens_per_s/best", "{:.1f}"),
                        (
                            "batch 5 aggregate vs transformers' batch 5",
                            f"{QWEN}/comparison/decode_speedup_batch5_aggregate_vs_transformers_batch5_aggregate",
                            X2,
                        ),
                        ("prefill tok/s, ours", f"{QWEN}/ours/batches/1/prefill_tokens_per_s/best", "{:.0f}"),
                        (
                            "prefill tok/s, transformers",
                            f"{QWEN}/transformers/batches/1/prefill_tokens_per_s/best",
                            "{:.0f}",
                        ),
                        ("greedy tokens equal (batch 1)", f"{QWEN}/comparison/greedy_prefix_match_batch1", "{}"),
                    )
                ),
            ),
        ),
        Claim(
            "generate.json",
            "Gemma 3 270M and SmolLM2-135M decode against transformers",
            "The same comparison for the two small models (`make bench`).",
            (
                Rows(
                    "models",
                    (
                        ("batch 1 speed-up", "comparison/decode_speedup_batch1", X2),
                        ("share of the bandwidth bound", "comparison/ours_decode_fraction_of_bound_batch1", P0),
                        (
                            "batch 5 aggregate vs transformers' batch 1",
                            "comparison/decode_speedup_batch5_aggregate_vs_transformers_batch1",
                            X2,
                        ),
                        ("greedy tokens equal", "comparison/greedy_prefix_match_batch1", "{}"),
                    ),
                    key="model",
                ),
            ),
        ),
        Claim(
            "kernels.json",
            "Verification in one packed tree pass; paged decode",
            "5 x 64-token branches after a 512-token prefix, the reference attention path (`make bench`); the "
            "Pallas kernels' block skipping for that tree; paged against contiguous decode.",
            (
                Rows(
                    "models",
                    (
                        ("packed tree vs separate passes", "verification/speedup_vs_separate", X2),
                        (
                            "prefix then one tree pass vs separate",
                            "verification/prefix_then_tree_speedup_vs_separate",
                            X2,
                        ),
                        ("forward only", "verification/forward_only_speedup_vs_separate", X2),
                        ("paged / contiguous decode step", "decode/paged_over_contiguous", F2),
                    ),
                    key="model",
                ),
                Rows("block_skipping", (("blocks skipped", "skipped_fraction", P0),), key="Pallas block table"),
            ),
        ),
        Claim(
            "kernel_layout.json",
            "Kernels stored [out, in] and the few-rows form",
            "`models/decoder/linear.py`: a few rows times an [out, in] matrix against the [in, out] layout it "
            "replaced, per projection shape, and whole steps with the form on against off.",
            (
                Rows(
                    "steps",
                    tuple((k, f"speedup/{k}", "{:.3f}x") for k in _STEP_KINDS),
                    key="model (steps, form on / off)",
                ),
                Rows(
                    "matrices",
                    (
                        ("model", "model", "{}"),
                        ("matrix", "matrix", "{}"),
                        ("rows", "rows", "{}"),
                        ("[in, out] ms", "before_ms", "{:.3f}"),
                        ("[out, in] ms", "after_ms", "{:.3f}"),
                    ),
                    key=None,
                    caption="Matrix level at 1, 5, 8 and 16 rows (the file holds 1-512), best of the repeats:",
                    when=lambda m: m.get("rows") in (1, 5, 8, 16),
                ),
            ),
        ),
        _knob(
            "kernel_layout_small_kernel_rows.json",
            "Small matrices take the few-rows form up to 8 rows",
            "`linear.SMALL_KERNEL_ROWS` against the form at one row only (SmolLM2's 576-wide matrices).",
            "smollm2-135m-instruct",
        ),
        _knob(
            "kernel_layout_head_form.json",
            "The output head's form",
            "`linear.HEAD_FEW_ROWS_FORM` on Qwen2.5-Coder-1.5B-Instruct's head.",
            "qwen2.5-coder-1.5b-instruct",
        ),
        _knob(
            "kernel_layout_pad_rows_qwen.json",
            "5-7 rows padded to 8: Qwen2.5-Coder-1.5B-Instruct",
            "`linear.PAD_FEW_ROWS` (`PADDED_ROWS`).",
            "qwen2.5-coder-1.5b-instruct",
        ),
        _knob(
            "kernel_layout_pad_rows_smollm2.json",
            "5-7 rows padded to 8: SmolLM2-135M",
            "`linear.PAD_FEW_ROWS` on the drafter.",
            "smollm2-135m-instruct",
        ),
        Claim(
            "attention_paths.json",
            "Attention paths against the reference",
            "`kernels/decode_blocked.py`: each dispatched attention path against the dense reference on one layer's "
            "shapes, with its bound.",
            (
                Rows(
                    "cases",
                    (
                        ("case", "case", "{}"),
                        ("reference ms", "reference_ms", "{:.3f}"),
                        ("dispatched ms", "dispatched_ms", "{:.3f}"),
                        ("speed-up", "speedup", X2),
                        ("dispatched / bound", "dispatched_over_bound", "{:.1f}x"),
                    ),
                    key=None,
                ),
            ),
        ),
        Claim(
            "decode_schedule.json",
            "Packed decode schedule",
            "`kernels/decode_blocked.py` (`PACKED_DECODE`): whole SmolLM2 decode steps, packed (row, block) pairs "
            "against every row reading the longest row's blocks.",
            (_workloads("packed / lockstep decode time", "packed_over_lockstep_decode_total"),),
        ),
        Claim(
            "decode_stacked_heads.json",
            "Stacked heads in decode",
            "`kernels/decode_blocked.py` (`STACKED_HEADS`): the stacked head form against the grouped one.",
            (_workloads("stacked / grouped decode time", "stacked_over_grouped_decode_total"),),
        ),
        *(
            Claim(
                name,
                title,
                backs,
                (
                    Rows(over, ((f"{side} / other side", "", "{:.3f}x"),), key="part"),
                    Figures((("drafts identical", "drafts_identical", "{}"),)),
                ),
            )
            for name, title, backs, over, side in (
                (
                    "drafting_stacked_heads.json",
                    "Stacked heads in drafting",
                    "`kernels/decode_blocked.py`: drafting's short rows unchanged by the stacked form.",
                    "stacked_heads_over_grouped_heads",
                    "stacked heads",
                ),
                (
                    "drafting_prefix_segments.json",
                    "Prefix read sequence by sequence in drafting",
                    "`kernels/blocked.py` (`SEGMENTED_PREFIX`) in the drafter's multi-sequence prefill.",
                    "segmented_over_one_hot",
                    "segmented",
                ),
                (
                    "drafting_packed_decode.json",
                    "Packed decode in drafting",
                    "`PACKED_DECODE` in drafting's decode steps.",
                    "packed_over_lockstep",
                    "packed",
                ),
                (
                    "drafting_padded_rows.json",
                    "Padded rows in drafting",
                    "`linear.PAD_FEW_ROWS` in drafting's decode steps.",
                    "padded_rows_over_exact_rows",
                    "padded",
                ),
            )
        ),
        Claim(
            "verification_pass.json",
            "Verification's vocabulary chunks without padding",
            "`models/decoder/scoring.py` (`PAD_FREE_CHUNKS`): Qwen's 151,936-row table scored in chunks that divide "
            "it, against padding it (a 0.93 GB copy per pass).",
            _verification(
                ("padded", "pad_free"), ("speed-up, verification in the answer", "summary/speedup_verification", X2)
            ),
        ),
        Claim(
            "verification_inline_prefix.json",
            "The tree's prefix inside its own step",
            "`models/engine/engine.py` (`INLINE_TREE_PREFIX`): the verification prefix scored inside the tree's "
            "step against a step of its own.",
            _verification(
                ("prefix_step", "inline_prefix"), ("speed-up, repeated pass", "summary/speedup_first_again", X2)
            ),
        ),
        Claim(
            "moe_decode.json",
            "MoE decode step on CPU",
            "`models/executor/runner.py`: a decode step gathers only the chosen experts; `ragged_dot` on CPU is a "
            "masked dense matmul over every expert (hidden 512, 4 layers, 8 experts, top-2; a shared machine).",
            (
                Rows(
                    "rows",
                    (
                        ("sequences", "batch", "{}"),
                        ("dense, same active params ms", "dense_same_active/median_ms", "{:.1f}"),
                        ("MoE (auto) ms", "moe_auto/median_ms", "{:.1f}"),
                        ("MoE ragged ms", "moe_ragged/median_ms", "{:.1f}"),
                        ("auto / dense", "moe_auto_over_dense", F2),
                    ),
                    key=None,
                ),
            ),
        ),
        Claim(
            "moe_step.json",
            "MoE layer implementations on CPU",
            "`models/decoder/moe.py`: ragged, gather and dense-reference expert products per step size.",
            (
                Rows(
                    "rows",
                    (
                        ("tokens", "tokens", "{}"),
                        ("ragged ms", "moe_ragged/median_ms", "{:.1f}"),
                        ("gather ms", "?moe_gather/median_ms", "{:.1f}"),
                        ("dense reference ms", "moe_dense_reference/median_ms", "{:.1f}"),
                        ("dense MLP of the active size ms", "dense_active_mlp/median_ms", "{:.1f}"),
                    ),
                    key=None,
                ),
            ),
        ),
    ),
)
