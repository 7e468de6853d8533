"""The answer's form: how long the verifier's answers run to its end of turn, and the budget chosen on train."""

from __future__ import annotations

from benchmarks.claim_sections.formats import F2
from benchmarks.report_specs import Claim, Figures, Rows, Section
from benchmarks.report_text import pct

ANSWERS = Section(
    "Answers to the end of turn",
    "`ask`, `/v1/rag` and the Python API answer up to the verifier's end of turn; the budget is a cap chosen on the "
    'train questions (README "Set-up", docs/method.md "The answer").',
    (
        Claim(
            "answer_length.json",
            "Answer lengths and the budget",
            "The exact path's answers (standard RAG's tokens) run to the end of turn under a 512-token cap on the 100 "
            "dev questions: the budget is the smallest candidate at least twice the longest train answer; the share "
            "each budget cuts, and `specrag ask` on make run's and five more Python questions, beside the paper's "
            "setting (the first line in 32 tokens) that `ask` used before and `eval` keeps.",
            (
                Figures(
                    (
                        ("budget chosen on the train split", "chosen_budget", "{} tokens"),
                        ("held-out answers it cuts", "splits/heldout/cut_at_chosen", pct),
                        ("dev 100 answers it cuts", "dev/cut_at_chosen", pct),
                        ("dev 100 answers the paper's 32-token first line cuts", "dev/cut_one_line_32", pct),
                        ("make run's answer: tokens", "make_run/tokens", "{}"),
                        ("make run's answer: cut", "make_run/cut_at_cap", "{}"),
                        ("make run's answer under the 32-token first line: cut", "make_run/cut_one_line_32", "{}"),
                        ("more Python questions, built-in corpus: longest answer", "builtin_corpus/max_tokens", "{}"),
                        ("more Python questions, built-in corpus: cut", "builtin_corpus/cut_at_chosen", pct),
                    )
                ),
                Rows(
                    "splits",
                    (
                        ("questions", "n", "{}"),
                        ("mean tokens", "tokens/mean", F2),
                        ("p90", "tokens/p90", "{}"),
                        ("max", "tokens/max", "{}"),
                        ("cut at the 512 cap", "cut_at_cap", pct),
                        ("cut by 64", "cut_by_budget/64", pct),
                        ("cut by 192", "cut_by_budget/192", pct),
                        ("first line cut at 32", "cut_one_line_32", pct),
                    ),
                    key="split",
                ),
            ),
            extra_files=("eval_dev100_answers",),
        ),
    ),
)
