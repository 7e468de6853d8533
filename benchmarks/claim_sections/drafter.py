"""The drafter: tuning, grounding, more data, a larger drafter."""

from __future__ import annotations

from benchmarks.claim_sections.formats import F3, S2
from benchmarks.report_source import Source, get
from benchmarks.report_specs import Claim, Custom, Figures, Rows, Section
from benchmarks.report_text import table


def _draft_runs(src: Source, name: str) -> list[str]:
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


_TRAIN_STEP = (  # figures of a train_step.py file
    ("rows", "batch_rows", "{}"),
    ("row length", "row_length", "{}"),
    ("tokens/s", "tokens_per_s", "{:,.1f}"),
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
            (Figures((*_TRAIN_STEP, ("first step (compile)", "first_step_s", S2))),),
        ),
        Claim(
            "train_step_tiny_lora.json",
            "Training step throughput: the tiny test model, LoRA",
            "The same benchmark on the tiny model (the training loop's own overhead).",
            (Figures(_TRAIN_STEP),),
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
            (Custom(_draft_runs),),
        ),
        Claim(
            "draft_quality_synth.json",
            "Synthetic questions (smollm2-rag-drafter-synth)",
            "The synthetic-data adapter against the train-fit one (`specrag_jax/adapters/README.md`).",
            (Custom(_draft_runs),),
        ),
        Claim(
            "draft_quality_k.json",
            "More passages per draft: k = 2, 3, 4",
            "`--k 3` and `--k 4` with the train-fit adapter: no gain, k stays 2.",
            (Custom(_draft_runs),),
        ),
        Claim(
            "draft_quality_drafters.json",
            "A larger drafter: Gemma 3 270M",
            "Gemma 3 270M tuned with the same recipe against SmolLM2 (and untuned): about the same questions "
            "answered (docs/training.md).",
            (Custom(_draft_runs),),
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
