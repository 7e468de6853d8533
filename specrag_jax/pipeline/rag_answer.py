"""``RAGAnswer``: what every method of ``SpecRAG`` returns (its ``to_dict`` is ``specrag ask --json``'s shape)."""

from __future__ import annotations

import dataclasses
from typing import Any

from specrag_jax.pipeline.drafting import Draft


@dataclasses.dataclass
class RAGAnswer:
    """What ``SpecRAG.answer`` returns (``to_dict`` is the JSON shape of ``specrag ask --json``)."""

    answer: str
    rationale: str
    citations: list[str]
    drafts: list[Draft]
    trace: dict[str, Any]
    method: str
    docs: list[dict] = dataclasses.field(default_factory=list)  # the passages the method read (not in to_dict)

    def to_dict(self) -> dict:
        return {
            "answer": self.answer,
            "rationale": self.rationale,
            "citations": self.citations,
            "drafts": [d.to_dict() for d in self.drafts],
            "trace": self.trace,
            "method": self.method,
        }
