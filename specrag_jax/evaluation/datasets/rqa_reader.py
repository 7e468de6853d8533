"""RetrievalQA rows (``question``, ``ground_truth``, ``context``, ``data_source``): already the internal shape."""

from __future__ import annotations

from specrag_jax.errors import SpecRagError

FIELDS = ("ground_truth",)


def read_retrievalqa(obj: dict, where: str, task: str | None) -> dict:
    """The row itself (unchanged, as ``evaluation.load_questions`` returns it); with ``--task`` it gains ``task``."""
    if "question" not in obj or "ground_truth" not in obj:
        raise SpecRagError(f"{where}: a row needs 'question' and 'ground_truth'")
    return obj if task is None else {**obj, "task": task}
