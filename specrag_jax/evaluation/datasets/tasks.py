"""The Speculative RAG paper's tasks: open-ended or closed-set, and their default retrieval/draft settings.

=========  ==========  ======  ===  ===
task       kind        n_docs  m    k
=========  ==========  ======  ===  ===
popqa      open        10      5    2
triviaqa   open        10      5    2
musique    open        15      10   6
pubhealth  closed-set  10      5    2
arc_c      closed-set  10      5    2
=========  ==========  ======  ===  ===

(``n_docs`` documents, ``m`` drafts, ``k`` clusters: Speculative RAG, Wang et al. 2024, section 4.)
"""

from __future__ import annotations

from dataclasses import dataclass

from specrag_jax.errors import SpecRagError


@dataclass(frozen=True)
class Task:
    name: str
    closed: bool  # scored by its exact label (pubhealth: true/false, arc_c: the choice), not substring match
    n_docs: int = 10
    m: int = 5
    k: int = 2


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task("popqa", closed=False),
        Task("triviaqa", closed=False),
        Task("musique", closed=False, n_docs=15, m=10, k=6),
        Task("pubhealth", closed=True),
        Task("arc_c", closed=True),
    )
}
GENERIC = Task("generic", closed=False)  # RetrievalQA and rows without a task


def get_task(name: str | None) -> Task:
    """The task called ``name`` (None: the generic open-ended task)."""
    if name is None:
        return GENERIC
    if name not in TASKS:
        raise SpecRagError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    return TASKS[name]


def task_defaults(name: str | None) -> dict[str, int]:
    """``{"n_docs", "m", "k"}`` the paper uses for the task (10, 5, 2 without one)."""
    t = get_task(name)
    return {"n_docs": t.n_docs, "m": t.m, "k": t.k}
