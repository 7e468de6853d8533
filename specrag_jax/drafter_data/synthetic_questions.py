"""Corpus-only drafter data: the teacher writes a question and its answer from one passage first.

A passage becomes a data row ``{"question", "ground_truth": [answer], "context": [...]}`` whose context is the
passage itself plus the corpus's other BM25 hits for the question (``n_docs`` in all), so the drafter learns
to find the supporting document among distractors, as at inference. A generated pair is kept only if it
parses (``Question: ...`` / ``Answer: ...`` lines), the answer is short (at most ``MAX_ANSWER_WORDS`` words)
and occurs in the passage (normalised), so the answer is grounded in the text the question came from, and the
answer does not occur in the question itself (18% of the first grounded pairs did: "When is NeurIPS 2023?" ->
"2023").
"""

from __future__ import annotations

import random
import re
from typing import Callable, Sequence

from specrag_jax.models.sampling.params import SamplingParams
from specrag_jax.models.text_model import TextModel
from specrag_jax.pipeline.prompts import normalize_answer, occurs_in_passages

TEACHER_QUESTION = (
    "Read the passage and write one factual question that the passage answers, and the question's short "
    "answer (a few words copied from the passage).\n## Passage:\n{title}{text}\n"
    "Reply in exactly two lines:\nQuestion: <the question>\nAnswer: <the short answer>"
)
MAX_ANSWER_WORDS = 8
_Q = re.compile(r"^\s*\**\s*question\s*\**\s*:\s*(.+)$", re.IGNORECASE | re.MULTILINE)
_A = re.compile(r"^\s*\**\s*answer\s*\**\s*:\s*(.+)$", re.IGNORECASE | re.MULTILINE)

SearchFn = Callable[[str, int], list[dict]]


def parse_question_answer(text: str) -> tuple[str, str] | None:
    """(question, answer) from the teacher's two lines, or None when either is missing."""
    q, a = _Q.search(text), _A.search(text)
    if not q or not a:
        return None
    question, answer = q.group(1).strip(), a.group(1).strip().rstrip(".")
    return (question, answer) if question and answer else None


def grounded(answer: str, passage: dict) -> bool:
    """The answer is short and occurs (normalised, on word boundaries) in the passage's title or text."""
    return len(normalize_answer(answer).split()) <= MAX_ANSWER_WORDS and occurs_in_passages(answer, [passage])


def answer_in_question(question: str, answer: str) -> bool:
    """The answer occurs (normalised, whole words) in its own question ("What is Jay Silva's full name?" -> "Jay
    Silva"): such a pair teaches the drafter to restate the question, and every subset trivially "holds" it."""
    return occurs_in_passages(answer, [{"text": question}])


def synthetic_rows(
    teacher: TextModel,
    passages: Sequence[dict],
    search: SearchFn,
    n_docs: int,
    batch: int = 4,
    max_new_tokens: int = 64,
    seed: int = 0,
) -> tuple[list[dict], dict[str, int]]:
    """Question rows written by ``teacher`` from ``passages``; also counts of what was dropped and why.

    Each row's context (the passage and its BM25 neighbours) is shuffled with a key of ``seed`` and the
    passage id, so the answering passage is not always first. The context keeps the corpus's passage ids, so an
    example's ``doc_ids`` name corpus passages (``drafter_records`` stores examples by them)."""
    rows: list[dict] = []
    dropped: dict[str, int] = {}
    for start in range(0, len(passages), batch):
        chunk = list(passages[start : start + batch])
        prompts = [
            TEACHER_QUESTION.format(title=f"{p['title']}\n" if p.get("title") else "", text=p.get("text", ""))
            for p in chunk
        ]
        outs = teacher.generate(prompts, SamplingParams(), max_new_tokens, chat=teacher.instruct)
        for passage, out in zip(chunk, outs):
            pair = parse_question_answer(out.text)
            reason = (
                "no 'Question:' and 'Answer:' lines"
                if pair is None
                else "answer not short or not in the passage"
                if not grounded(pair[1], passage)
                else "answer occurs in the question"
                if answer_in_question(*pair)
                else None
            )
            if reason is not None:
                dropped[reason] = dropped.get(reason, 0) + 1
                continue
            question, answer = pair
            others = [d for d in search(question, n_docs) if d.get("id") != passage.get("id")][: n_docs - 1]
            context = [passage, *others]
            random.Random(f"{seed}:{passage.get('id')}").shuffle(context)  # no "first passage answers" bias
            rows.append(
                {
                    "question": question,
                    "ground_truth": [answer],
                    "question_id": f"synthetic-{passage['id']}",
                    "source_passage": passage.get("id"),
                    "context": [
                        {"id": d.get("id"), "title": d.get("title", ""), "text": d.get("text", "")} for d in context
                    ],
                }
            )
    return rows, dropped
