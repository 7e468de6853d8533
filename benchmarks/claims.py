"""Which figures of which result file back which claim: the sections of docs/results.md (``benchmarks.report``).

One ``Claim`` per current result file under benchmarks/results/: its title, what it shows and where that is
claimed, and the tables of its figures (paths into the JSON, ``report.get``). A result file that backs no claim is
not kept (git keeps it); docs/benchmarks.md lists the scripts that write these files.
"""

from __future__ import annotations

from benchmarks.report import (
    Claim,
    Custom,
    Figures,
    Rows,
    Section,
    get,
    long_context_lines,
    long_context_summary,
    pct,
    router_dev_lines,
    secs,
    table,
)

QWEN = "models/qwen2.5-coder-1.5b-instruct"
S2 = "{:.2f} s"
S1 = "{:.1f} s"
MS = "{:.1f} ms"
X2 = "{:.2f}x"
F2 = "{:.2f}"
F3 = "{:.3f}"
P0 = "{:.0%}"
GB = "{:.1f} GB"


def mib_gb(x: float) -> str:
    return f"{x / 1024:.1f} GB"


def mb_gb(x: float) -> str:
    return f"{x / 1000:.1f} GB"


def bytes_mb(x: float) -> str:
    return f"{x / 1e6:.1f} MB"


def _long_context(src, name):
    return [*long_context_lines(src, name), "", long_context_summary(src, name)]


# -------------------------------------------------------------------------------------------------- sections
ROUTER = Section(
    "The router (method auto)",
    'The default method against standard RAG: README "Results", docs/method.md "The router".',
    (
        Claim(
            "eval_dev100_auto",
            "Dev 100: auto against standard RAG",
            "`auto` answers as standard RAG does (the exact path) in less time on the 100 dev questions; the "
            "held-out and train rows split the same run by the dev file's hash split.",
            (Custom(lambda src, name: router_dev_lines(src, name)),),
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

_CHOICE_COLS = (
    ("selection alone", "?selection_alone_accuracy", pct),
    ("best tau_min", "tau_min", F2),
    ("cascade accuracy", "accuracy", pct),
    ("accepted", "acceptance_rate", pct),
    ("accepted right", "accepted_accuracy", pct),
)
_CHOICE_FIGURES = (
    ("questions", "n", "{}"),
    ("standard RAG", "standard_accuracy", pct),
    ("random_draft", "baselines/random_draft", pct),
    ("drafter_only", "baselines/drafter_only", pct),
    ("oracle (some draft right)", "oracle", pct),
    ("chosen selection", "chosen/selection", "{}"),
    ("chosen tau_min (rounded)", "chosen_rounded/tau_min", "{}"),
    ("chosen cascade's accuracy", "chosen_rounded/accuracy", pct),
)


def _choice(name: str, title: str, backs: str, eval_input: str) -> Claim:
    return Claim(
        name,
        title,
        backs,
        (
            Figures(_CHOICE_FIGURES),
            Rows("best_per_selection", _CHOICE_COLS[1:], key="selection", caption="The best cascade per selection:"),
            Rows("selection_alone", (("accuracy", "", pct),), key="selection alone"),
        ),
        extra_files=(eval_input,),
    )


DEFAULTS = Section(
    "How the defaults were chosen",
    'The choices in docs/method.md "Options and how the defaults were chosen": each on the dev file\'s train split '
    "(or its train-calibrate part, which the shipped drafter never saw), then reported held out.",
    (
        _choice(
            "cascade_choice_ground.json",
            "Selection and tau_min: rho+ground at 0.41",
            "`choose_cascade.py` over every selection on the 20 train-calibrate questions (drafts of the train-fit "
            "adapter): `rho+ground` at 0.41 is the best cascade, the default (`rag_config.DEFAULT_SELECTION`, "
            "`DEFAULT_TAU_MIN`).",
            "eval_calib20_fit/predictions.jsonl",
        ),
        _choice(
            "cascade_choice_train.json",
            "Consensus off; the earlier evidence default",
            "The same choice on the 70 train questions (the shipped adapter's own): the consensus fast path cost "
            "accuracy, so it is off by default; the draft's token probability under its passages hurt `evidence` "
            "(`pipeline/selection.py`).",
            "eval_train70_selection/predictions.jsonl",
        ),
        _choice(
            "cascade_choice_calibrate.json",
            "The train-fit adapter's cascade (not adopted)",
            "The choice among the selections without `+ground` on train-calibrate (`specrag_jax/adapters/README.md`: "
            "`smollm2-rag-drafter-fit`).",
            "eval_calib20_fit/predictions.jsonl",
        ),
        Claim(
            "clustering_train.json",
            "Clustering: lexical",
            "The cascade answers the same with the drafter's embeddings and with hashed TF-IDF on the 70 train "
            "questions, at a fraction of the cost: `--clustering lexical` is the default.",
            (
                Rows(
                    "clusterings",
                    (
                        ("cascade", "cascade_default/accuracy", pct),
                        ("accepted", "cascade_default/acceptance_rate", pct),
                        ("oracle", "oracle", pct),
                        ("random_draft", "baselines/random_draft", pct),
                        ("clustering s per question", "clustering_s", S2),
                    ),
                    key="clustering",
                ),
            ),
            extra_files=("eval_train70_lexical", "eval_train70_selection"),
        ),
        Claim(
            "eval_train70_selection",
            "Train 70, drafter clustering (the choice's input)",
            "Every draft scored by both passes on the train questions: the input of `cascade_choice_train.json` "
            "and the drafter side of `clustering_train.json`.",
            eval_run=True,
        ),
        Claim(
            "eval_train70_lexical",
            "Train 70, lexical clustering (the choice's input)",
            "The lexical side of `clustering_train.json`, and the train half of `draft_grounding.json`.",
            eval_run=True,
        ),
        Claim(
            "eval_calib20_fit",
            "Train-calibrate 20, train-fit adapter (the choice's input)",
            "Drafts of `smollm2-rag-drafter-fit` on questions it never saw, every draft scored by both passes: the "
            "input of `cascade_choice_ground.json` and `cascade_choice_calibrate.json`.",
            eval_run=True,
        ),
        Claim(
            "eval_heldout30_lexical",
            "Held-out 30, the earlier evidence default",
            "`evidence`, tau_min 0.5, lexical clustering: one question behind standard RAG; the held-out half of "
            "`draft_grounding.json`, whose finding made `+ground` (docs/training.md).",
            eval_run=True,
        ),
        Claim(
            "eval_heldout30_fit",
            "Held-out 30, the train-fit adapter's cascade (not adopted)",
            "`smollm2-rag-drafter-fit` with `evidence` at 0.37 held out (`specrag_jax/adapters/README.md`). The run "
            "loaded it from the folder of `smollm2-rag-drafter`, so its config names that adapter (the run folder's "
            "README.md).",
            eval_run=True,
        ),
        Claim(
            "eval_heldout30_cascade",
            "Held-out 30, the evidence cascade with drafter clustering",
            "The evidence default with the drafter's clustering; its recorded drafts, with those of the two runs "
            "above, replay the `rho+ground` choice on held-out drafts.",
            eval_run=True,
        ),
    ),
)

DRAFTER = Section(
    "The drafter: tuning, grounding, more data, a larger drafter",
    "docs/training.md: what tuning changed, and what more data or a larger drafter did not.",
    (
        Claim(
            "draft_ceiling.json",
            "Tuning: the drafting ceiling",
            "On the 30 held-out questions, a gold answer occurs in some passage, in some draft's subset, and in some "
            "draft (the oracle): the untuned drafter, 60 and 150 tuning steps (150 shipped).",
            (
                Rows(
                    "results",
                    (
                        ("answer in any passage", "answer_in_any_passage", "{}"),
                        ("in some subset", "answer_in_some_subset", "{}"),
                        ("oracle", "oracle", "{}"),
                    ),
                    key="run",
                ),
            ),
            extra_files=("eval_heldout30_untuned", "eval_heldout30_tuned60", "eval_heldout30_tuned150"),
        ),
        Claim(
            "eval_heldout30_untuned",
            "Held-out 30, untuned drafter",
            "SmolLM2-135M-Instruct without an adapter (docs/training.md, `specrag_jax/adapters/README.md`); it shared "
            "the CPU with data generation, so its latencies are not comparable.",
            eval_run=True,
        ),
        Claim(
            "eval_heldout30_tuned60",
            "Held-out 30, tuned 60 steps",
            "The adapter after 60 steps (two epochs): the format learned, the oracle unchanged.",
            eval_run=True,
        ),
        Claim(
            "eval_heldout30_tuned150",
            "Held-out 30, tuned 150 steps (shipped)",
            "The shipped `smollm2-rag-drafter` (five epochs).",
            eval_run=True,
        ),
        Claim(
            "drafter_training/run150_train.json",
            "The shipped adapter's training run",
            "LoRA rank 8, 150 steps on teacher data from the 70 train questions (docs/training.md); "
            "`drafter_training/` also holds the data summary, the 60-step run and both loss histories.",
            (
                Figures(
                    (
                        ("steps", "steps/1", "{}"),
                        ("seconds", "seconds", "{:.0f}"),
                        ("tokens/s", "tokens_per_s", "{:.1f}"),
                        ("final train loss", "final_train_loss", F3),
                        ("final eval loss", "final_eval_loss", F3),
                        ("train examples", "examples/train", "{}"),
                    )
                ),
            ),
            extra_files=(
                "drafter_training/data_train_split.summary.json",
                "drafter_training/run60_train.json",
                "drafter_training/run150_history.json",
                "drafter_training/run60_history.json",
                "drafter_training/run150_loss.png",
                "drafter_training/run60_loss.png",
            ),
        ),
        Claim(
            "train_step_smollm2_lora.json",
            "Training step throughput: SmolLM2-135M, LoRA",
            "`benchmarks/train_step.py` on the drafter (docs/training.md).",
            (
                Figures(
                    (
                        ("rows", "batch_rows", "{}"),
                        ("row length", "row_length", "{}"),
                        ("tokens/s", "tokens_per_s", "{:,.1f}"),
                        ("first step (compile)", "first_step_s", S2),
                    )
                ),
            ),
        ),
        Claim(
            "train_step_tiny_lora.json",
            "Training step throughput: the tiny test model, LoRA",
            "The same benchmark on the tiny model (the training loop's own overhead).",
            (
                Figures(
                    (
                        ("rows", "batch_rows", "{}"),
                        ("row length", "row_length", "{}"),
                        ("tokens/s", "tokens_per_s", "{:,.1f}"),
                    )
                ),
            ),
        ),
        Claim(
            "draft_grounding.json",
            "Grounded drafts",
            "Drafts whose answer does not occur in their own passages were right 0 times held out "
            "(docs/training.md; the `+ground` selections, `pipeline/selection.py`).",
            (
                Rows(
                    "runs",
                    (
                        ("grounded drafts", "grounded_drafts", "{}"),
                        ("right", "grounded_right", "{}"),
                        ("ungrounded drafts", "ungrounded_drafts", "{}"),
                        ("right", "ungrounded_right", "{}"),
                    ),
                    key="run",
                ),
            ),
            extra_files=("eval_train70_lexical", "eval_heldout30_lexical"),
        ),
        Claim(
            "draft_quality_curve.json",
            "More drafter data: 92, 133 and 226 examples",
            "Drafts right and the oracle on the 20 train-calibrate questions as the adapter's data grows (train-fit, "
            "synthetic, all records): flat within a question (docs/training.md).",
            (Custom(lambda src, name: _draft_runs(src, name)),),
        ),
        Claim(
            "draft_quality_synth.json",
            "Synthetic questions (smollm2-rag-drafter-synth)",
            "The synthetic-data adapter against the train-fit one (`specrag_jax/adapters/README.md`).",
            (Custom(lambda src, name: _draft_runs(src, name)),),
        ),
        Claim(
            "draft_quality_k.json",
            "More passages per draft: k = 2, 3, 4",
            "`--k 3` and `--k 4` with the train-fit adapter: no gain, k stays 2.",
            (Custom(lambda src, name: _draft_runs(src, name)),),
        ),
        Claim(
            "draft_quality_drafters.json",
            "A larger drafter: Gemma 3 270M",
            "Gemma 3 270M tuned with the same recipe against SmolLM2 (and untuned): about the same questions "
            "answered (docs/training.md).",
            (Custom(lambda src, name: _draft_runs(src, name)),),
        ),
        *(
            Claim(run, title, backs, eval_run=True)
            for run, title, backs in (
                (
                    "eval_calib20_synth_drafts",
                    "Train-calibrate 20, synthetic-data adapter",
                    "Input of the two draft-quality files above (`specrag_jax/adapters/README.md`).",
                ),
                (
                    "eval_calib20_all_drafts",
                    "Train-calibrate 20, adapter on all records",
                    "The 226-record adapter (`specrag_jax/drafter_data/drafter_records/README.md`): input of "
                    "`draft_quality_curve.json`.",
                ),
                ("eval_calib20_fit_k3", "Train-calibrate 20, k = 3", "Input of `draft_quality_k.json`."),
                ("eval_calib20_fit_k4", "Train-calibrate 20, k = 4", "Input of `draft_quality_k.json`."),
                (
                    "eval_calib20_gemma_tuned",
                    "Train-calibrate 20, Gemma 3 270M tuned",
                    "Input of `draft_quality_drafters.json`.",
                ),
                (
                    "eval_calib20_gemma_untuned",
                    "Train-calibrate 20, Gemma 3 270M untuned",
                    "Input of `draft_quality_drafters.json` (empty rationales).",
                ),
            )
        ),
    ),
)


def _draft_runs(src, name):
    """Per eval run of a draft_grounding.py file: drafts right, the oracle and the baselines (of questions)."""
    data, where = src.json(name), src.shown(name)
    rows = []
    for run, r in get(data, "runs", where).items():
        at = f"{where}: runs/{run}"
        g, u = get(r, "grounded_drafts", at), get(r, "ungrounded_drafts", at)
        gr, ur = get(r, "grounded_right", at), get(r, "ungrounded_right", at)
        rows.append(
            [
                run,
                get(r, "questions", at),
                f"{get(r, 'drafts_right', at)} of {g + u}",
                get(r, "oracle", at),
                get(r, "random_draft_right", at),
                get(r, "drafter_only_right", at),
                f"{g} ({gr} right)",
                f"{u} ({ur} right)",
            ]
        )
    header = (
        "run",
        "questions",
        "drafts right",
        "oracle",
        "random_draft right",
        "drafter_only right",
        "grounded drafts",
        "ungrounded drafts",
    )
    return table(header, rows)


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
                Figures(
                    (
                        ("answers compared to plain greedy", "answers_workload/exactness/compared", "{}"),
                        ("mismatches", "answers_workload/exactness/mismatches", "{}"),
                    )
                ),
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
                Figures(
                    (
                        ("answers compared to plain greedy", "answers_workload/exactness/compared", "{}"),
                        ("mismatches", "answers_workload/exactness/mismatches", "{}"),
                    )
                ),
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

RERANK = Section(
    "Reranking and progressive prefill",
    'docs/method.md "Reranking and progressive prefill": reranking is off by default because the drafter '
    "reranker lowered recall and accuracy; progressive prefill is off because on 2 cores it moves work instead of "
    "removing it.",
    (
        Claim(
            "rerank_quality.json",
            "Accuracy with and without the drafter reranker",
            "The first 30 dev questions, each retrieving from the whole pooled corpus (the CPU shared with other "
            "jobs, so every stage's seconds are inflated alike).",
            (
                Rows(
                    "configs/bm25/methods",
                    (("accuracy", "accuracy", pct), ("recall of own passages", "recall_own_passages", F2)),
                    key="BM25 top 10",
                ),
                Rows(
                    "configs/rerank_drafter/methods",
                    (("accuracy", "accuracy", pct), ("recall of own passages", "recall_own_passages", F2)),
                    key="BM25 top 50, drafter rerank to 10",
                ),
            ),
        ),
        Claim(
            "rerank_early_stop.json",
            "Recall after the drafter reranker, and early termination",
            "BM25 top 50 of the pooled corpus, every candidate scored by SmolLM2-135M, the stopping rule replayed.",
            (
                Figures(
                    (
                        ("questions", "summary/questions", "{}"),
                        ("recall, BM25 top 10", "summary/recall_own_passages/bm25_top_n_docs", F2),
                        ("recall, full rerank top 10", "summary/recall_own_passages/full_rerank_top_n_docs", F2),
                        ("recall ceiling (BM25 top 50)", "summary/recall_own_passages/bm25_top_n_coarse (ceiling)", F2),
                        ("fine scoring s per question", "summary/fine_s_per_question", S1),
                    )
                ),
                Rows(
                    "summary/early_termination",
                    (("saved", "saved_fraction", pct), ("same top 10 as full", "same_set_as_full_fraction", pct)),
                    key="patience",
                ),
            ),
        ),
        Claim(
            "rerank_early_stop_verifier.json",
            "Recall with the verifier as reranker",
            "The same replay with Qwen2.5-Coder-1.5B-Instruct scoring (first 10 questions): recall about BM25's, at "
            "minutes per question on this CPU.",
            (
                Figures(
                    (
                        ("questions", "summary/questions", "{}"),
                        ("recall, BM25 top 10", "summary/recall_own_passages/bm25_top_n_docs", F2),
                        ("recall, full rerank top 10", "summary/recall_own_passages/full_rerank_top_n_docs", F2),
                        ("fine scoring s per question", "summary/fine_s_per_question", S1),
                    )
                ),
                Rows(
                    "summary/early_termination",
                    (("saved", "saved_fraction", pct), ("same top 10 as full", "same_set_as_full_fraction", pct)),
                    key="patience",
                ),
            ),
        ),
        Claim(
            "rerank_kv.json",
            "Stored document K/V against recomputing",
            "`--rerank kv` (documents' K/V from `specrag index`) against `recompute`: the same scores, several times "
            "the pairs per second (SmolLM2-135M, 8 candidates x 3 questions).",
            (
                Rows(
                    "results",
                    (
                        ("recompute pairs/s", "recompute/pairs_per_s", "{:.2f}"),
                        ("stored K/V pairs/s", "kv_store/pairs_per_s", "{:.2f}"),
                        ("speed-up", "speedup_kv_store", X2),
                        ("speed-up, K/V in memory", "speedup_kv_cached", X2),
                    ),
                    key="document tokens",
                ),
            ),
        ),
        Claim(
            "progressive_prefill.json",
            "Progressive prefill, 25 passages",
            "Serving path, recompute reranker on the drafter, Gemma 3 270M verifier; off against on per question "
            "(the machine shared with other jobs).",
            (
                Rows(
                    "summary",
                    (
                        ("first draft token", "first_draft_token_s", S2),
                        ("after reranking", "after_rerank_s", S2),
                        ("total", "total_s", S2),
                        ("cached prompt tokens", "drafting_cache_hit_tokens", "{:.0f}"),
                        ("triggered", "triggered", "{}"),
                    ),
                    key="progressive prefill",
                    keys=("off", "on"),
                ),
            ),
        ),
        Claim(
            "progressive_prefill_16passages.json",
            "Progressive prefill, 16 passages",
            "With four rerank groups the trigger never fired (the file's recorded command wrote "
            "progressive_prefill.json; its note says it was renamed).",
            (
                Rows(
                    "summary",
                    (("first draft token", "first_draft_token_s", S2), ("triggered", "triggered", "{}")),
                    key="progressive prefill",
                    keys=("off", "on"),
                ),
            ),
        ),
        Claim(
            "ask_progressive.json",
            "Progressive prefill in `ask`",
            "`specrag ask ... --rerank kv` with and without `--progressive-prefill`, each a new process over one "
            "K/V store: the same answer, documents and drafts, and no time saved.",
            (
                Rows("mean", (("answer s", "total_s", S2), ("rerank s", "rerank_s", S2)), key="progressive"),
                Figures(
                    (
                        ("on / off", "on_over_off_total", F3),
                        ("identical answers, documents and drafts", "identical_answers_documents_drafts", "{}"),
                    )
                ),
            ),
        ),
    ),
)

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
            (
                Rows(
                    "workloads",
                    (
                        ("packed / lockstep decode time", "packed_over_lockstep_decode_total", F2),
                        ("tokens identical", "tokens_identical", "{}"),
                    ),
                    key="workload",
                ),
            ),
        ),
        Claim(
            "decode_stacked_heads.json",
            "Stacked heads in decode",
            "`kernels/decode_blocked.py` (`STACKED_HEADS`): the stacked head form against the grouped one.",
            (
                Rows(
                    "workloads",
                    (
                        ("stacked / grouped decode time", "stacked_over_grouped_decode_total", F2),
                        ("tokens identical", "tokens_identical", "{}"),
                    ),
                    key="workload",
                ),
            ),
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
            (
                Rows(
                    "summary",
                    (
                        ("verification in the answer", "verification_s_median", S2),
                        ("first again", "first_again_s_median", S2),
                    ),
                    key="side",
                    keys=("padded", "pad_free"),
                ),
                Figures((("speed-up, verification in the answer", "summary/speedup_verification", X2),)),
            ),
        ),
        Claim(
            "verification_inline_prefix.json",
            "The tree's prefix inside its own step",
            "`models/engine/engine.py` (`INLINE_TREE_PREFIX`): the verification prefix scored inside the tree's "
            "step against a step of its own.",
            (
                Rows(
                    "summary",
                    (
                        ("verification in the answer", "verification_s_median", S2),
                        ("first again", "first_again_s_median", S2),
                    ),
                    key="side",
                    keys=("prefix_step", "inline_prefix"),
                ),
                Figures((("speed-up, repeated pass", "summary/speedup_first_again", X2),)),
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

ROOFLINE = Section(
    "Roofline",
    'Every stage against its FLOP and byte bound (docs/usage.md "Every stage against its bound").',
    (
        Claim(
            "roofline.json",
            "Each stage against its bound",
            "Held-out questions, each stage bound part by part at the run's measured peaks, and the same stages' "
            "bounds at an H200's and a TPU v5e's published peaks; the router's stage ratios come from this file.",
            tuple(
                Rows(
                    f"methods/{m}/stages",
                    (
                        ("measured", "measured_s", S2),
                        ("bound", "bound_s", S2),
                        ("measured / bound", "ratio", X2),
                        ("H200 bound", "predicted_bound_ms/h200", MS),
                        ("TPU v5e bound", "predicted_bound_ms/tpu-v5e", MS),
                    ),
                    key=f"{m}: stage",
                )
                for m in ("speculative", "standard", "lossless")
            ),
        ),
        Claim(
            "drafting_floor.json",
            "How close drafting can get on this CPU",
            "Drafting's steps replayed with attention stubbed out: the floor of everything but attention, against "
            "each part's bound.",
            (
                Rows(
                    "mean_by_part",
                    (
                        ("measured", "measured_s", S2),
                        ("without attention (floor)", "floor_s", S2),
                        ("bound", "bound_s", S2),
                        ("measured / bound", "measured_over_bound", X2),
                        ("floor / bound", "floor_over_bound", X2),
                    ),
                    key="part",
                ),
            ),
        ),
    ),
)

LOADING = Section(
    "Loading, host memory and compilation",
    "docs/architecture.md: converted weights, streamed loading, host memory of long runs, step programs loaded ahead.",
    (
        Claim(
            "convert_gguf.json",
            "GGUF conversion from an empty cache",
            "Old and new conversions (`models/loading/gguf_plan.py`), sha256 over every leaf identical; the machine "
            "was shared (load average 6-7), so wall times are upper bounds.",
            (
                Rows(
                    "models",
                    (
                        ("old wall s", "old/total_s", "{:.1f}"),
                        ("new wall s", "new/total_s", "{:.1f}"),
                        ("new compute alone s", "new/phases_s/compute_only_no_file", "{:.1f}"),
                        ("warm load s", "new/phases_s/warm_load", "{:.3f}"),
                        ("identical", "identical", "{}"),
                    ),
                    key="model",
                ),
            ),
        ),
        Claim(
            "convert_gguf_qwen_new_idle.json",
            "Qwen conversion on an idle machine",
            "The new conversion of the 1.5B verifier alone, load average under 1.",
            (
                Figures(
                    (
                        ("wall s", f"{QWEN}/new/total_s", "{:.1f}"),
                        ("user s", f"{QWEN}/new/user_s", "{:.1f}"),
                        ("sys s", f"{QWEN}/new/sys_s", "{:.1f}"),
                        ("warm load s", f"{QWEN}/new/phases_s/warm_load", "{:.3f}"),
                    )
                ),
            ),
        ),
        Claim(
            "load_memory.json",
            "Streamed Hugging Face loading",
            "`models/loading/streaming.py`: peak RSS over the start against the bound checkpoint + 2 x the largest "
            "tensor (a 1.4 GB float32 checkpoint in 3 shards); `tests/models/loading/test_streaming_memory.py`.",
            (
                Figures((("bound MB", "bound_mb", "{:.0f}"),)),
                Rows(
                    "rows",
                    (
                        ("mode", "mode", "{}"),
                        ("devices", "devices", "{}"),
                        ("peak over start MB", "peak_minus_before_mb", "{:.0f}"),
                        ("seconds", "seconds", "{:.2f}"),
                        ("within bound", "within_bound", "{}"),
                    ),
                    key=None,
                ),
            ),
        ),
        *(
            Claim(
                name,
                title,
                backs,
                (
                    Rows(
                        "arms",
                        (
                            ("peak RSS", "peak_rss_mib", mib_gb),
                            ("RSS at the end", "host_memory/rss_mib", mib_gb),
                            ("heap released", "host_memory/heap_released_mib", mib_gb),
                        ),
                        key="arm",
                    ),
                    Rows("final_anon_mib", (("anonymous memory at the end", "", mib_gb),), key="arm"),
                    Figures((("same answers", "same_answers", "{}"),)),
                ),
            )
            for name, title, backs in (
                (
                    "eval_memory.json",
                    "Host memory of a long eval",
                    "Held step programs bounded and free heap "
                    'released after each question ("on") against neither ("off"): the first 10 held-out questions.',
                ),
                (
                    "eval_memory_release_only.json",
                    "Host memory, the release alone",
                    "Releasing free heap after each question without the program bound (8 questions).",
                ),
            )
        ),
        Claim(
            "ask_prefetch.json",
            "Step programs loaded ahead",
            "A second `ask` with `SPECRAG_PREFETCH_STEPS=0` against the default: XLA work moves off the answering "
            "thread.",
            (
                Rows(
                    "mean",
                    (
                        ("process s", "process_s", S1),
                        ("answer s", "total_s", S1),
                        ("XLA on the answering thread s", "xla_answer_thread_s", S2),
                        ("XLA in the background s", "xla_background_s", S2),
                    ),
                    key="prefetch",
                ),
                Figures((("identical answers and drafts", "identical_answers_and_drafts", "{}"),)),
            ),
        ),
    ),
)

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
                        ("differing predictions", "differing_predictions", lambda v: str(len(v))),
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
                        ("differing eval predictions", "eval/differing_predictions", lambda v: str(len(v))),
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

SHARDING = Section(
    "Sharding",
    "Collectives per compiled step on 8 host CPU devices (docs/scaling.md; `parallel/checks.py` guards the "
    "counts): a sharding regression shows as a changed count or byte total.",
    tuple(
        Claim(
            name,
            title,
            "Float32; prefill 256 tokens, tree score 5 x 24-token branches, decode 8 sequences.",
            (Custom(lambda src, n: _collectives(src, n)),),
        )
        for name, title in (
            ("collectives.json", "Dense models"),
            ("collectives_moe.json", "Mixtral-8x7B's shapes, 2 layers"),
        )
    ),
)


def _collectives(src, name):
    data, where = src.json(name), src.shown(name)
    rows = []
    for model, m in get(data, "models", where).items():
        for i, mesh in enumerate(get(m, "meshes", where)):
            at = f"{where}: models/{model}/meshes/{i}"
            cells = []
            for step in ("prefill", "tree_score", "decode"):
                total = get(mesh, f"steps/{step}/collectives/total", at)
                cells.append(f"{get(total, 'count', at)} / {bytes_mb(get(total, 'bytes', at))}")
            rows.append([model, get(mesh, "mesh", at), *cells])
    return table(("model", "mesh", "prefill: count / bytes", "tree score", "decode"), rows)


SUITE = Section(
    "The paper's table, a 3-question slice",
    'docs/usage.md "The paper\'s Table 1 in one command": `eval --suite` over the dev rows written as Self-RAG '
    "and MuSiQue files. Three questions say nothing about accuracy; the run shows one command reading both "
    "formats with each task's settings (a shared machine, load average 6-9).",
    (
        Claim(
            "suite_dev3/table.json",
            "Accuracy and latency per task",
            "Standard RAG, the cascade and drafter_only per file.",
            (
                Rows(
                    "rows",
                    (("musique", "musique/latency_s", secs), ("triviaqa", "triviaqa/latency_s", secs)),
                    key="mean latency",
                ),
                Rows(
                    "rows",
                    (("musique", "musique/accuracy", pct), ("triviaqa", "triviaqa/accuracy", pct)),
                    key="accuracy",
                ),
            ),
            extra_files=("suite_dev3/table.md", "suite_dev3/musique", "suite_dev3/triviaqa"),
        ),
    ),
)

SECTIONS = (ROUTER, CASCADE, DEFAULTS, DRAFTER, LOSSLESS, RERANK, ENGINE, ROOFLINE, LOADING, SERVING, SHARDING, SUITE)
