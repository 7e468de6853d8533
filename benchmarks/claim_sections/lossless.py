"""Lossless decoding (token trees): exactness and speed-up per proposer and tree budget."""

from __future__ import annotations

from benchmarks.claim_sections.formats import F2, S2, X2
from benchmarks.report_specs import Claim, Figures, Rows, Section


def _spec_rows(over: str, speedup: str) -> Rows:
    return Rows(
        over,
        (
            ("runs", "runs", "{}"),
            ("tokens per verifier step", "speculation/accepted_tokens_per_step", F2),
            ("decode tokens/s", "decode_tokens_per_s", "{:.1f}"),
            ("decode speed-up vs plain", speedup, X2),
            ("answer s (mean)", "answer_s_mean", S2),
        ),
        key="proposer@budget",
    )


_EXACTNESS = Figures(
    (
        ("answers compared to plain greedy", "answers_workload/exactness/compared", "{}"),
        ("mismatches", "answers_workload/exactness/mismatches", "{}"),
    )
)

LOSSLESS = Section(
    "Lossless decoding (token trees)",
    'docs/method.md "Lossless mode": the verifier\'s own answer, token for token, in fewer steps; '
    "`benchmarks/speculative.py` on the dev questions with their passages and the drafts.",
    (
        Claim(
            "speculative_qwen.json",
            "Qwen2.5-Coder-1.5B-Instruct: RAG answers",
            "Exactness and speed-up of each proposer and tree budget (budget 8 is the CPU default, "
            "`tree.default_tree_budget`); the router's calibration reads its n-gram rate.",
            (
                _EXACTNESS,
                _spec_rows("answers_workload/answers", "?paired/decode_speedup_vs_plain"),
                Rows(
                    "step_costs/tree_vs_decode",
                    (("tree step / decode step", "", X2),),
                    key="tree tokens",
                    caption="A tree step against a one-token decode step (317 cached tokens):",
                ),
            ),
        ),
        Claim(
            "speculative_qwen_copy.json",
            "Qwen2.5-Coder-1.5B-Instruct: copy-heavy answers",
            "Answers that quote the evidence (128 new tokens), on a quiet machine.",
            (_spec_rows("copy_heavy", "?paired/decode_speedup_vs_plain"),),
        ),
        Claim(
            "speculative_gemma.json",
            "Gemma 3 270M",
            "The small verifier: exact, but slower than plain decoding on RAG answers on this CPU (its 262k-row "
            "output table is most of a tree step).",
            (
                _EXACTNESS,
                _spec_rows("answers_workload/answers", "?decode_speedup_vs_plain"),
                Rows(
                    "copy_heavy",
                    (
                        ("tokens per verifier step", "speculation/accepted_tokens_per_step", F2),
                        ("decode speed-up vs plain", "?decode_speedup_vs_plain", X2),
                    ),
                    key="copy-heavy",
                    keys=("plain", "ngram", "drafts", "both"),
                ),
            ),
        ),
    ),
)
