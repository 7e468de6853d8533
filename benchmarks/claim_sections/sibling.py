"""The verifier's own sibling (Qwen2.5-Coder-0.5B-Instruct, one vocabulary with the verifier) as drafter, tuned, against
the tuned SmolLM2-135M: the drafter table and the decision it led to."""

from __future__ import annotations

from benchmarks.report_source import Source, get
from benchmarks.report_specs import Claim, Custom, Section
from benchmarks.report_text import table

SIBLING_FILE = "draft_quality_sibling.json"
DRAFTERS = {"smollm2": "SmolLM2-135M (tuned)", "qwen05": "Qwen2.5-Coder-0.5B (tuned)"}


def sibling_runs(src: Source, name: str) -> list[str]:
    """Per run: the drafts' quality, drafting's time and right drafts per second of drafting, lossless tokens/step."""
    data, where = src.json(name), src.shown(name)
    rows = []
    for run, r in get(data, "runs", where).items():
        at = f"{where}: runs/{run}"
        n, seconds = get(r, "questions", at), get(r, "draft_latency_s", at)
        right, grounded = get(r, "drafts_right", at), get(r, "grounded_drafts", at)
        rows.append(
            [
                run.split("_")[1],
                next((label for key, label in DRAFTERS.items() if run.endswith(key)), run),
                f"{get(r, 'drafts_parsed', at)} of {get(r, 'drafts', at)}",
                f"{right} ({right / get(r, 'drafts', at):.1%})",
                f"{get(r, 'grounded_right', at)} of {grounded}",
                f"{get(r, 'oracle', at)} of {n}",
                f"{get(r, 'drafter_only_right', at)} of {n}",
                f"{seconds:.2f} s",
                f"{right / (n * seconds):.3f}",
                f"{get(r, 'lossless_tokens_per_step', at):.2f}",
            ]
        )
    header = (
        "split",
        "drafter",
        "drafts parsed",
        "drafts right",
        "right when grounded",
        "a right draft among the five",
        "drafter_only right",
        "drafting s per question",
        "right drafts per drafting second",
        "lossless tokens per step (drafts proposed)",
    )
    return table(header, rows)


_RUNS = (
    ("eval_calib20_sibling_smollm2", "Train-calibrate 20, SmolLM2 (synthetic-data adapter)"),
    ("eval_calib20_sibling_qwen05", "Train-calibrate 20, Qwen2.5-Coder-0.5B (tuned)"),
    ("eval_heldout30_sibling_smollm2", "Held-out 30, SmolLM2 (the default adapter)"),
    ("eval_heldout30_sibling_qwen05", "Held-out 30, Qwen2.5-Coder-0.5B (tuned)"),
)

SIBLING = Section(
    "The verifier's sibling as drafter",
    "Qwen2.5-Coder-0.5B-Instruct shares the verifier's vocabulary, so its drafts go into verification and lossless "
    "decoding as token ids; tuned on the replayed teacher records (`make drafter-adapter-qwen05`) and measured "
    'beside the tuned SmolLM2 in one session (README "Results", docs/training.md "A drafter with the verifier\'s '
    'vocabulary").',
    (
        Claim(
            SIBLING_FILE,
            "The drafter table",
            "Drafts (m=5, k=2, 10 passages) on the train-calibrate split, which decides, and the held-out split, "
            "which reports; drafting seconds are a drafts-only method's latency without compilation, on the same "
            "machine in one session. The default stays SmolLM2: the sibling writes more right drafts but not per "
            "second of drafting.",
            (Custom(sibling_runs),),
        ),
        *(Claim(run, title, "Input of `draft_quality_sibling.json`.", eval_run=True) for run, title in _RUNS),
    ),
)
