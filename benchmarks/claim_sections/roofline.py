"""Roofline: every stage against its FLOP and byte bound, and how close drafting can get."""

from __future__ import annotations

from benchmarks.claim_sections.formats import MS, S2, X2
from benchmarks.report_specs import Claim, Rows, Section

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
