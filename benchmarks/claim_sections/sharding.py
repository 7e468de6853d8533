"""Sharding: collectives per compiled step on 8 host CPU devices."""

from __future__ import annotations

from benchmarks.report_source import Source, get
from benchmarks.report_specs import Claim, Custom, Section
from benchmarks.report_text import table


def bytes_mb(x: float) -> str:
    return f"{x / 1e6:.1f} MB"


def _collectives(src: Source, name: str) -> list[str]:
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


SHARDING = Section(
    "Sharding",
    "Collectives per compiled step on 8 host CPU devices (docs/scaling.md; `parallel/checks.py` guards the "
    "counts): a sharding regression shows as a changed count or byte total.",
    tuple(
        Claim(
            name,
            title,
            "Float32; prefill 256 tokens, tree score 5 x 24-token branches, decode 8 sequences.",
            (Custom(_collectives),),
        )
        for name, title in (
            ("collectives.json", "Dense models"),
            ("collectives_moe.json", "Mixtral-8x7B's shapes, 2 layers"),
        )
    ),
)
