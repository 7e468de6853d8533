"""Drafter training data (issue 14): teacher-written rationales over document subsets sampled as at inference.

For each (question, passages, answers) row: the passages are cut to ``max_doc_tokens`` drafter tokens, the
drafter embeds them conditioned on the question, k-means picks ``k`` clusters and ``m`` subsets take one
document per cluster (``pipeline.clustering.clustered_subsets``, as ``SpecRAG`` drafts with ``--clustering
drafter``). For each subset the teacher (default: the verifier) is shown the subset, the question and the gold
answer and writes one short rationale grounded in the documents. An example is kept only if its rationale passes
a check:

- ``answer``: it mentions a gold answer (``normalize_answer`` of the answer occurs in the rationale's);
- ``citation``: it cites a document of the subset as ``[i]`` (1 <= i <= subset size);

and it is not a refusal (the teacher is told to write ``NONE`` when the documents do not support the answer).
``require`` says which must pass: ``"answer"`` (the default), ``"citation"``, ``"either"``, ``"both"`` or
``"grounded"`` (``answer``, and a gold answer occurs in the subset's passages as the drafter sees them: the
teacher is shown the answer and rarely refuses, so without it an example can teach the drafter to state an answer
its evidence does not hold; ``"grounded"`` is recorded in an example's checks whenever it holds, and under
``require="grounded"`` a subset without a gold answer is never shown to the teacher). The
default is ``answer`` because a citation alone keeps rationales that contradict the gold answer (measured on
dev questions with the Qwen verifier as teacher: "Yes, the stock is above $250 ... [1]" for the gold answer
"No", and a rationale naming another city than the gold one, both citing a document). Each kept example
records which checks it passed.

The output rows carry the drafter's exact prompt and target both as text and as token ids (``prompt_ids`` =
the shared prefix + the subset's evidence branch, built by ``drafting.draft_prompts``, the function drafting
itself uses; ``target_ids`` = the target text's ids), so training and inference prompts cannot drift apart.
The target is what drafting's two phases produce: ``" {rationale}\\n## Response: {answer}\\n"``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Sequence

from specrag_jax.errors import SpecRagError
from specrag_jax.models.sampling.params import SamplingParams
from specrag_jax.models.text_model import TextModel
from specrag_jax.pipeline.drafting import draft_prompts, truncate_docs
from specrag_jax.pipeline.prompts import (
    RESPONSE_TAG,
    first_line,
    format_document,
    normalize_answer,
    occurs_in_passages,
)
from specrag_jax.retrieval.pooling import own_passages

TEACHER_RATIONALE = (
    "Here are documents, a question and its correct answer.\n## Documents:\n{docs}## Question: {question}\n"
    "## Answer: {answer}\nIn one short sentence, explain why the answer is correct using only the documents, "
    "and cite the document you use by its number, like [1]. If the documents do not support the answer, "
    "write NONE."
)
REFUSAL = "NONE"
CHECKS = ("answer", "citation")
GROUNDED = "grounded"
REQUIRE = ("answer", "citation", "either", "both", GROUNDED)
NOT_HELD = "no gold answer in the subset's passages (not shown to the teacher)"
_CITATION = re.compile(r"\[(\d+)\]")

SubsetFn = Callable[[str, list[dict], int, int, int], tuple[list[list[int]], dict]]


@dataclasses.dataclass
class DataStats:
    """What happened to every candidate example (kept, or the reason it was not)."""

    rows: int = 0
    examples: int = 0  # candidate (question, subset) pairs shown to the teacher
    kept: int = 0
    rejected: dict[str, int] = dataclasses.field(default_factory=dict)
    skipped_rows: dict[str, int] = dataclasses.field(default_factory=dict)
    checks_passed: dict[str, int] = dataclasses.field(default_factory=dict)
    teacher_tokens: int = 0

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def skip(self, reason: str) -> None:
        self.skipped_rows[reason] = self.skipped_rows.get(reason, 0) + 1


def rationale_checks(rationale: str, answers: Sequence[str], n_docs: int) -> list[str]:
    """The checks (``CHECKS``) that ``rationale`` passes for the gold ``answers`` and a subset of ``n_docs``."""
    passed = []
    text = f" {normalize_answer(rationale)} "
    if any(normalize_answer(str(a)) and f" {normalize_answer(str(a))} " in text for a in answers):
        passed.append("answer")
    if any(1 <= int(i) <= n_docs for i in _CITATION.findall(rationale)):
        passed.append("citation")
    return passed


def example_checks(rationale: str, answers: Sequence[str], subset: Sequence[dict]) -> list[str]:
    """``rationale_checks`` plus ``GROUNDED`` when a gold answer occurs in the subset's passages."""
    passed = rationale_checks(rationale, answers, len(subset))
    return passed + [GROUNDED] if any(occurs_in_passages(str(a), subset) for a in answers) else passed


def passes(passed: Sequence[str], require: str) -> bool:
    """Whether the checks ``passed`` satisfy ``require`` (``REQUIRE``)."""
    if require == "either":
        return bool(set(CHECKS) & set(passed))
    if require == "both":
        return set(CHECKS) <= set(passed)
    if require == GROUNDED:
        return {"answer", GROUNDED} <= set(passed)
    return require in passed


def teacher_prompt(question: str, docs: Sequence[dict], answer: str) -> str:
    """The teacher's instruction for one subset (documents numbered from 1, as the drafter sees them)."""
    listed = "".join(format_document(i + 1, d) for i, d in enumerate(docs))
    return TEACHER_RATIONALE.format(docs=listed, question=question.strip(), answer=answer.strip())


def draft_target(rationale: str, answer: str) -> str:
    """The drafter's target text after its prompt's forced ``## Rationale:`` (both drafting phases)."""
    return f" {rationale.strip()}\n{RESPONSE_TAG} {answer.strip()}\n"


def training_example(
    drafter: TextModel,
    prompt_ids: list[int],
    rationale: str,
    max_tokens: int,
    *,
    question: str,
    answers: list[str],
    doc_ids: list[str],
    checks: list[str],
    source: str,
    question_id: str | None,
    teacher: str | None,
) -> dict[str, Any] | None:
    """One output line: the drafter's prompt and target (``draft_target`` of the first gold answer) as text and
    ids, with provenance; None when prompt + target exceed ``max_tokens``. The builder and the records' replay
    both write examples through it, so a replayed file equals the written one byte for byte."""
    tok = drafter.tokenizer
    target = draft_target(rationale, answers[0])
    target_ids = tok.encode(target, add_bos=False)
    if len(prompt_ids) + len(target_ids) > max_tokens:
        return None
    return {
        "prompt": tok.decode(prompt_ids, skip_special=False),
        "target": target,
        "prompt_ids": prompt_ids,
        "target_ids": target_ids,
        "question": question,
        "answers": answers,
        "doc_ids": doc_ids,
        "checks": checks,
        "source": source,
        "question_id": question_id,
        "drafter": drafter.name,
        "teacher": teacher,
        "rationale": rationale,
    }


def row_fields(row: dict) -> tuple[str, list[str], list[dict]] | str:
    """(question, answers, passages) of a data row, or the name of what is missing."""
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        return "missing question"
    answers = row.get("ground_truth", row.get("answers"))
    answers = [answers] if isinstance(answers, str) else answers
    if not isinstance(answers, list) or not [a for a in answers if str(a).strip()]:
        return "missing answers (ground_truth)"
    docs = own_passages(row)
    if not docs:
        return "missing passages (context)"
    return question.strip(), [str(a) for a in answers if str(a).strip()], docs


class DrafterDataBuilder:
    """Turns data rows into drafter examples with a teacher model (see the module docstring)."""

    def __init__(
        self,
        drafter: TextModel,
        teacher: TextModel,
        subsets: SubsetFn,
        *,
        k: int = 2,
        m: int = 5,
        max_doc_tokens: int = 160,
        max_rationale_tokens: int = 64,
        max_tokens: int = 1024,
        seed: int = 0,
        require: str = "answer",
    ) -> None:
        if require not in REQUIRE:
            raise SpecRagError(f"require must be one of {', '.join(REQUIRE)} (got {require!r})")
        self.require = require
        self.drafter, self.teacher, self.subsets = drafter, teacher, subsets
        self.k, self.m, self.max_doc_tokens, self.seed = k, m, max_doc_tokens, seed
        self.max_rationale_tokens, self.max_tokens = max_rationale_tokens, max_tokens
        self.stats = DataStats()

    def examples(self, row: dict, source: str = "data") -> list[dict[str, Any]]:
        """The kept examples of one row (possibly none; ``stats`` records why)."""
        self.stats.rows += 1
        fields = row_fields(row)
        if isinstance(fields, str):
            self.stats.skip(fields)
            return []
        question, answers, docs = fields
        docs = [{**d, "id": str(d.get("id", i))} for i, d in enumerate(docs)]
        docs = truncate_docs(self.drafter, docs, self.max_doc_tokens, [])
        picks, _ = self.subsets(question, docs, self.k, self.m, self.seed)
        subsets = [[docs[i] for i in s] for s in picks]
        if self.require == GROUNDED:  # a subset without a gold answer can never pass: spare the teacher
            held = [s for s in subsets if any(occurs_in_passages(a, s) for a in answers)]
            for _ in range(len(subsets) - len(held)):
                self.stats.reject(NOT_HELD)
            subsets = held
            if not subsets:
                return []
        answer = answers[0]
        prompts = [teacher_prompt(question, s, answer) for s in subsets]
        outs = self.teacher.generate(
            prompts, SamplingParams(), self.max_rationale_tokens, stop=["\n"], chat=self.teacher.instruct
        )
        prefix_ids, suffixes = draft_prompts(self.drafter, question, subsets)
        kept = []
        for subset, out, suffix in zip(subsets, outs, suffixes):
            self.stats.examples += 1
            self.stats.teacher_tokens += len(out.token_ids)
            rationale = first_line(out.text)
            checks = example_checks(rationale, answers, subset)
            reason = self._reject_reason(rationale, checks)
            if reason is None:
                example = self._example(question, answers, subset, rationale, checks, prefix_ids + suffix, row, source)
                reason = example if isinstance(example, str) else None
            if reason is not None:
                self.stats.reject(reason)
                continue
            kept.append(example)
        self.stats.kept += len(kept)
        return kept

    def _reject_reason(self, rationale: str, passed: list[str]) -> str | None:
        if not rationale:
            return "empty rationale"
        if rationale.strip().upper().startswith(REFUSAL):
            return "teacher said the documents do not support the answer"
        if not set(CHECKS) & set(passed):
            return "rationale neither mentions the answer nor cites a document"
        if not passes(passed, self.require):
            return f"rationale fails the required check ({self.require}; passed: {', '.join(passed)})"
        return None

    def _example(
        self,
        question: str,
        answers: list[str],
        subset: list[dict],
        rationale: str,
        checks: list[str],
        prompt_ids: list[int],
        row: dict,
        source: str,
    ) -> dict[str, Any] | str:
        example = training_example(
            self.drafter,
            prompt_ids,
            rationale,
            self.max_tokens,
            question=question,
            answers=answers,
            doc_ids=[d["id"] for d in subset],
            checks=checks,
            source=source,
            question_id=row.get("question_id"),
            teacher=self.teacher.name,
        )
        if example is None:
            return f"longer than max_tokens ({self.max_tokens})"
        for c in checks:
            self.stats.checks_passed[c] = self.stats.checks_passed.get(c, 0) + 1
        return example
