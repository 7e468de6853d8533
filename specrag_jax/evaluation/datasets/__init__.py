"""Readers for the Speculative RAG paper's benchmark formats and their metrics.

``load_rows(path, fmt, task, limit)`` reads Self-RAG eval files (PopQA, TriviaQA, PubHealth, ARC-Challenge),
MuSiQue or RetrievalQA (JSON lines or one JSON array) into the rows ``specrag eval`` uses::

    {"question", "ground_truth": [str, ...], "context": [{"title", "text"}, ...] or [], "data_source",
     "question_id", "task"}   # + "choices": [{"label", "text"}] for arc_c; RetrievalQA rows stay as in the file

``score_answer(row, answer)`` applies the task's metric; ``task_defaults(task)`` gives the paper's n_docs, m, k.
"""

from specrag_jax.evaluation.datasets.loader import FORMATS, Dataset, detect_format, load_rows
from specrag_jax.evaluation.datasets.metrics import score_answer
from specrag_jax.evaluation.datasets.tasks import TASKS, task_defaults

__all__ = ["FORMATS", "TASKS", "Dataset", "detect_format", "load_rows", "score_answer", "task_defaults"]
