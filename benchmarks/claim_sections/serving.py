"""Serving and concurrency: the load benchmark, and several questions at once."""

from __future__ import annotations

from benchmarks.claim_sections.formats import F2, F3, S1, X2
from benchmarks.report_specs import Claim, Figures, Rows, Section
from benchmarks.report_text import pct


def how_many(items: list) -> str:
    """A list of differing predictions shown as its length."""
    return str(len(items))


SERVING = Section(
    "Serving and concurrency",
    "docs/serving.md: the load benchmark, and answering several questions at once on this 2-core CPU.",
    (
        *(
            Claim(
                name,
                title,
                backs,
                (
                    Rows(
                        f"runs/{run}",
                        (
                            ("requests/s", "requests_per_s", "{:.3f}"),
                            ("tokens/s", "tokens_per_s", "{:.1f}"),
                            ("p50 s", "latency_s/p50", "{:.1f}"),
                            ("p95 s", "latency_s/p95", "{:.1f}"),
                        ),
                        key="clients",
                        keys=("sequential", "concurrent"),
                    ),
                    Figures(
                        (
                            ("speed-up, concurrent / one at a time", f"runs/{run}/speedup", X2),
                            (
                                "highest offered rate with p95 under the bound (req/s)",
                                f"?runs/{run}/max_rate_with_p95_under_bound",
                                "{}",
                            ),
                            ("p95 bound s", "p95_bound_s", "{:g}"),
                        )
                    ),
                    Rows(
                        f"?runs/{run}/rate_sweep",
                        (
                            ("offered req/s", "offered_rate", "{}"),
                            ("served req/s", "requests_per_s", "{:.2f}"),
                            ("p50 s", "latency_s/p50", "{:.1f}"),
                            ("p95 s", "latency_s/p95", "{:.1f}"),
                            ("held", "held", "{}"),
                        ),
                        key=None,
                        caption="Open-loop rate sweep:",
                    ),
                ),
            )
            for name, title, backs, run in (
                (
                    "serve_load.json",
                    "/v1/rag under load",
                    "`specrag serve` with Gemma 3 270M verifying (the "
                    "benchmark's default), 8 requests one at a time and from 8 clients, with backpressure.",
                    "backpressure",
                ),
                (
                    "serve_load_chat.json",
                    "/v1/chat/completions under load",
                    "48-token greedy chat completions.",
                    "backpressure",
                ),
            )
        ),
        Claim(
            "serve_load_sampling_cost.json",
            "Log-probabilities and penalties cost",
            "The same chat requests with `logprobs`, `top_logprobs: 5` and all three penalties against without "
            "(a shared machine).",
            (
                Rows(
                    "runs/backpressure/sampling_cost/best_tokens_per_s",
                    (("best tokens/s", "", "{:.1f}"),),
                    key="extras",
                ),
                Figures((("on / off", "runs/backpressure/sampling_cost/tokens_per_s_on_over_off", F2),)),
            ),
        ),
        Claim(
            "eval_concurrency.json",
            "Two questions at once in eval",
            "`specrag eval --concurrency 2` against one at a time (standard + speculative on 6 dev questions): the "
            "same answers, no gain on 2 cores beyond the first run's compilation.",
            (
                Rows("process_s_mean", (("process s (mean)", "", S1),), key="concurrency"),
                Figures(
                    (
                        ("throughput speed-up", "speedup", X2),
                        ("differing predictions", "differing_predictions", how_many),
                    )
                ),
            ),
        ),
        Claim(
            "one_core.json",
            "One engine core: before and after",
            "The refactor onto one engine core (against 3ce80da): `ask` time per question and `eval` throughput, "
            "identical answers.",
            (
                Figures(
                    (
                        ("ask, after / before", "ask/after_over_before", F3),
                        ("eval throughput, after / before", "eval/after_over_before_throughput", F3),
                        ("differing eval predictions", "eval/differing_predictions", how_many),
                    )
                ),
            ),
        ),
        Claim(
            "dev_table_answers.json",
            "One engine core: the whole dev table",
            "The same refactor over the 100 dev questions, prediction by prediction (answer, chosen draft, all "
            "drafts); both sides' eval runs are kept in `dev_table_answers_runs/`.",
            (
                Rows(
                    "methods",
                    (
                        ("questions", "questions", "{}"),
                        ("identical", "identical", "{}"),
                        ("accuracy before", "accuracy/before", pct),
                        ("accuracy after", "accuracy/after", pct),
                    ),
                    key="method",
                ),
            ),
            extra_files=("dev_table_answers_runs/before", "dev_table_answers_runs/after"),
        ),
    ),
)
