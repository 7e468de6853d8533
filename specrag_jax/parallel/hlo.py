"""Collectives in compiled (SPMD-partitioned) HLO text: count and bytes per kind.

Bytes are each collective's *result* size summed (all-gather: the gathered array; reduce-scatter: one
shard; all-reduce / all-to-all / collective-permute: the exchanged array). Async pairs count once (the
``-start`` op; its result tuple's last element is the output buffer).
"""

from __future__ import annotations

import re

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
_OP = re.compile(r"=\s*(?P<shape>.+?)\s+(?P<op>" + "|".join(KINDS) + r")(?P<start>-start)?\(")
_ARRAY = re.compile(r"(?P<dt>[a-z]+[0-9]*)\[(?P<dims>[0-9,]*)\]")


def _array_bytes(text: str) -> list[int]:
    out = []
    for m in _ARRAY.finditer(text):
        if m.group("dt") not in _DTYPE_BYTES:
            continue
        n = 1
        for d in filter(None, m.group("dims").split(",")):
            n *= int(d)
        out.append(n * _DTYPE_BYTES[m.group("dt")])
    return out


def collective_stats(hlo_text: str) -> dict[str, dict[str, int]]:
    """``{kind: {"count": n, "bytes": b}}`` for every collective kind (zeros included), plus ``"total"``."""
    stats = {k: {"count": 0, "bytes": 0} for k in KINDS}
    for line in hlo_text.splitlines():
        m = _OP.search(line)
        if not m:
            continue
        sizes = _array_bytes(m.group("shape"))
        if not sizes:
            continue
        # Sync ops: the result (a tuple for variadic ops: all of it). Async starts: the output buffer only.
        size = sizes[-1] if m.group("start") and m.group("shape").startswith("(") else sum(sizes)
        stats[m.group("op")]["count"] += 1
        stats[m.group("op")]["bytes"] += size
    stats["total"] = {
        "count": sum(v["count"] for v in stats.values()),
        "bytes": sum(v["bytes"] for v in stats.values()),
    }
    return stats
