"""Loading, host memory and compilation."""

from __future__ import annotations

from benchmarks.claim_sections.formats import QWEN, S1, S2
from benchmarks.report_specs import Claim, Figures, Rows, Section


def mib_gb(x: float) -> str:
    return f"{x / 1024:.1f} GB"


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
