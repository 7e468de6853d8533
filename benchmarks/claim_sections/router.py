"""The router (method auto): dev 100 against standard RAG, long context, the acceptance predictor."""

from __future__ import annotations

from benchmarks.claim_sections.formats import F2, F3, P0, S1, X2
from benchmarks.report_router import long_context_lines, long_context_summary, router_dev_lines
from benchmarks.report_specs import Claim, Custom, Figures, Rows, Section


def _long_context(src, name):
    return [*long_context_lines(src, name), "", long_context_summary(src, name)]


ROUTER = Section(
    "The router (method auto)",
    'The default method against standard RAG: README "Results", docs/method.md "The router".',
    (
        Claim(
            "eval_dev100_auto",
            "Dev 100: auto against standard RAG",
            "`auto` answers as standard RAG does (the exact path) in less time on the 100 dev questions; the "
            "held-out and train rows split the same run by the dev file's hash split.",
            (Custom(router_dev_lines),),
        ),
        Claim(
            "long_context.json",
            "Long context: 5 to 40 passages",
            "`auto` against standard RAG and the cascade as the context grows, and the route the same prompts take "
            "on an H200 and a TPU v5e (`router.route_on`). The plot is `long_context.png`.",
            (
                Custom(_long_context),
                Rows(
                    "sizes/3/subsets_alternatives",
                    (
                        ("the cascade: accuracy", "speculative/accuracy", P0),
                        ("latency", "speculative/latency_s", S1),
                        ("accepted", "speculative/cascade/accepted", "{}"),
                        ("oracle", "selection/oracle", P0),
                    ),
                    key="subsets at 40 passages",
                    caption="Covering subsets (`--subsets cover`, all 40 passages read by the five drafts) against "
                    "the default sampled subsets above:",
                ),
                Rows(
                    "sizes",
                    (
                        ("passages", "n_docs", "{}"),
                        ("plain speculative: accuracy", "plain_speculative/accuracy", P0),
                        ("latency", "plain_speculative/latency_s", S1),
                        ("/ standard", "ratio_plain_vs_standard", X2),
                    ),
                    key=None,
                    caption="The paper's plain method (the selected draft, no fallback) in the same run:",
                ),
            ),
            extra_files=("long_context.png",),
        ),
        Claim(
            "router_calibration.json",
            "The router's acceptance predictor",
            "The three logistic regressions' calibration in sample (train 70) and held out (30): calibrated in the "
            'mean, no sharper than the base rate (docs/method.md "The router"). The fit ships as '
            "`specrag_jax/pipeline/router_calibration.json`.",
            (
                Rows(
                    "calibration/heldout",
                    (
                        ("mean predicted", "mean_predicted", F3),
                        ("observed", "observed_rate", F3),
                        ("Brier", "brier", F3),
                        ("Brier of the observed rate", "brier_of_observed_rate", F3),
                    ),
                    key="held out",
                    keys=("accept", "accept_right", "accept_standard_right"),
                ),
                Figures(
                    (
                        ("train questions", "counts/questions", "{}"),
                        ("accepted (train)", "positives/accept", "{}"),
                        ("accepted and right (train)", "positives/accept_right", "{}"),
                        ("exact path tokens per step (train)", "workload/exact_tokens_per_step", F2),
                    )
                ),
            ),
        ),
    ),
)
