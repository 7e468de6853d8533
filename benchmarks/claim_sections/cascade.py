"""The cascade (method speculative): the dev and held-out runs, and the early fallback."""

from __future__ import annotations

from benchmarks.claim_sections.formats import X2
from benchmarks.report_specs import Claim, Figures, Rows, Section
from benchmarks.report_text import pct, secs

CASCADE = Section(
    "The cascade (method speculative)",
    'Drafting, one verification pass and the fallback to the exact answer: README "Set-up" (its 1.72x), '
    'docs/method.md "The cascade".',
    (
        Claim(
            "eval_dev100_ground",
            "Dev 100 with the cascade's defaults",
            "The cascade (`rho+ground`, tau_min 0.41) against standard RAG on the 100 dev questions; the held-out "
            "rows are the honest ones (the adapter and the defaults were chosen on the train questions).",
            eval_run=True,
        ),
        Claim(
            "eval_heldout30_speculative",
            "Held-out 30: the cascade and its baselines",
            "The default cascade on the 30 held-out questions with lossless (equal to standard's answers), "
            "random_draft and drafter_only; its outcomes are the router predictor's held-out check.",
            eval_run=True,
        ),
        Claim(
            "early_fallback.json",
            "Early fallback",
            "Falling back before the verification pass when no draft can reach tau_min: the same answers, less "
            'time (docs/method.md "The cascade"; measured with the evidence cascade, where it fires most).',
            (
                Rows(
                    "methods",
                    (
                        ("accuracy", "accuracy", pct),
                        ("mean latency", "latency_s", secs),
                        ("fallbacks", "?paths/fallback", "{}"),
                    ),
                    key="method",
                ),
                Figures(
                    (
                        ("verification passes skipped", "skipped_verification", "{}"),
                        ("early / full cascade latency", "ratio_early_vs_full", X2),
                        ("identical answers", "identical_answers", "{}"),
                    )
                ),
            ),
        ),
    ),
)
