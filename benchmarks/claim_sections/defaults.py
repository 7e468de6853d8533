"""How the defaults were chosen: selection, tau_min and clustering, and the eval runs they read."""

from __future__ import annotations

from benchmarks.claim_sections.formats import F2, S2
from benchmarks.report_specs import Claim, Figures, Rows, Section
from benchmarks.report_text import pct

_BEST_COLS = (  # the best cascade of each selection
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
            Rows("best_per_selection", _BEST_COLS, key="selection", caption="The best cascade per selection:"),
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
