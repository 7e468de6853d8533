"""Drafter examples stored by reference, so teacher work built from evaluation data can be kept and rebuilt.

A record holds what the teacher wrote and what it read: the question, its answers, the rationale, the checks it
passed, and the ids of the passages of its subset with a fingerprint of each passage's text, but never the passages
themselves. ``replay_examples`` rebuilds the exact training examples (``prompt_ids`` from
``drafting.draft_prompts``, ``target_ids`` from ``examples.draft_target``, both through
``examples.training_example``) from the records and the passages they name: a question row of ``--data`` (ids
``ctx<i>``, the row's own passages) or a ``--corpus`` passage (its corpus id). So hours of teacher time survive as a
small file in the repository, while the evaluation data it was built from stays outside (``specrag make-drafter-data
--replay``). A passage whose text no longer matches its fingerprint (another data file, another pool) is a one-line
error, never a silently different example.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from specrag_jax.drafter_data.examples import REQUIRE, passes, training_example
from specrag_jax.errors import SpecRagError
from specrag_jax.models.text_model import TextModel
from specrag_jax.pipeline.drafting import draft_prompts, truncate_docs
from specrag_jax.pipeline.prompts import RESPONSE_TAG
from specrag_jax.retrieval.corpus import iter_json_lines
from specrag_jax.retrieval.pooling import own_passages

RECORD_FIELDS = ("question", "answers", "rationale", "checks", "doc_ids", "doc_fingerprints", "source")
PROVENANCE = ("question_id", "teacher")


def passage_fingerprint(doc: Mapping[str, Any]) -> str:
    """A short hash of a passage's title and text (as given, before any truncation)."""
    text = f"{doc.get('title') or ''}\n{doc.get('text') or ''}"
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]


def rationale_of(example: Mapping[str, Any]) -> str:
    """The teacher's rationale of an example (its ``rationale`` field, else parsed from its target)."""
    if example.get("rationale"):
        return str(example["rationale"])
    target = str(example["target"])
    cut = target.rfind(f"\n{RESPONSE_TAG}")
    if cut < 0:
        raise SpecRagError(f"example target has no {RESPONSE_TAG!r} line: {target[:60]!r}")
    return target[:cut].strip()


def passages_by_source(
    data_rows: Sequence[dict] = (), corpus: Sequence[dict] = ()
) -> dict[str, dict[str, dict[str, dict]]]:
    """Passage lookup for records: ``{"data": {question key: {ctx id: doc}}, "corpus": {"": {id: doc}}}``.

    A data row is keyed by its ``question_id`` and by its question text (records of rows without ids)."""
    data: dict[str, dict[str, dict]] = {}
    for row in data_rows:
        docs = {d["id"]: d for d in own_passages(row)}
        for key in (row.get("question_id"), str(row.get("question", "")).strip()):
            if key:
                data[str(key)] = docs
    return {"data": data, "corpus": {"": {str(d["id"]): d for d in corpus}} if corpus else {}}


def _row_key(example: Mapping[str, Any]) -> str:
    if example.get("source") == "corpus":
        return ""
    return str(example.get("question_id") or str(example["question"]).strip())


def records_from_examples(examples: Iterable[Mapping[str, Any]], passages: Mapping[str, Mapping]) -> list[dict]:
    """The records of ``examples`` (``make-drafter-data`` output lines); ``passages`` from ``passages_by_source``."""
    records = []
    for ex in examples:
        docs = _lookup(ex, passages)
        record = {
            "question": ex["question"],
            "answers": list(ex["answers"]),
            "rationale": rationale_of(ex),
            "checks": list(ex.get("checks", [])),
            "doc_ids": list(ex["doc_ids"]),
            "doc_fingerprints": [passage_fingerprint(d) for d in docs],
            "source": ex.get("source", "data"),
        }
        records.append({**record, **{k: ex.get(k) for k in (*PROVENANCE, "drafter")}})
    return records


def _lookup(record: Mapping[str, Any], passages: Mapping[str, Mapping]) -> list[dict]:
    source = record.get("source", "data")
    if source not in ("data", "corpus"):
        raise SpecRagError(f"record source must be 'data' or 'corpus' (got {source!r})")
    rows = passages.get(source, {})
    key = _row_key(record)
    if key not in rows:
        given = "--corpus" if source == "corpus" else "--data"
        what = "no corpus was given" if source == "corpus" else f"question {key!r} is not in the data file"
        raise SpecRagError(f"a record from {source} names passages of {given}, but {what}")
    docs = rows[key]
    missing = [i for i in record["doc_ids"] if str(i) not in docs]
    if missing:
        raise SpecRagError(f"record of {record['question'][:50]!r}: passage ids {missing} are not in the {source}")
    return [docs[str(i)] for i in record["doc_ids"]]


def replay_examples(
    drafter: TextModel,
    records: Iterable[Mapping[str, Any]],
    passages: Mapping[str, Mapping],
    *,
    max_doc_tokens: int = 160,
    max_tokens: int = 1024,
    require: str | None = None,
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The training examples the records stand for, built as ``DrafterDataBuilder`` builds them for ``drafter``
    (same prompts, targets and fields), keeping only records whose checks pass ``require`` (``REQUIRE``; None:
    all); also how many were skipped, by reason."""
    if require is not None and require not in REQUIRE:
        raise SpecRagError(f"require must be one of {', '.join(REQUIRE)} (got {require!r})")
    examples: list[dict[str, Any]] = []
    skipped: dict[str, int] = {}
    for n, r in enumerate(records, 1):
        missing = [f for f in RECORD_FIELDS if f not in r]
        if missing:
            raise SpecRagError(f"record {n} lacks {', '.join(missing)}")
        if require is not None and not passes(r["checks"], require):
            skipped[f"fails {require}"] = skipped.get(f"fails {require}", 0) + 1
            continue
        docs = _lookup(r, passages)
        changed = [i for i, d, fp in zip(r["doc_ids"], docs, r["doc_fingerprints"]) if passage_fingerprint(d) != fp]
        if changed or len(r["doc_fingerprints"]) != len(docs):
            raise SpecRagError(
                f"record {n} ({r['question'][:50]!r}): the text of passage(s) {changed} differs from when it was "
                "written (another data file or corpus than the records were made from)"
            )
        subset = truncate_docs(drafter, docs, max_doc_tokens, [])
        prefix_ids, [suffix] = draft_prompts(drafter, r["question"], [subset])
        example = training_example(
            drafter,
            prefix_ids + suffix,
            r["rationale"],
            max_tokens,
            question=r["question"],
            answers=list(r["answers"]),
            doc_ids=list(r["doc_ids"]),
            checks=list(r["checks"]),
            source=r["source"],
            question_id=r.get("question_id"),
            teacher=r.get("teacher"),
        )
        if example is None:
            skipped["longer than max_tokens"] = skipped.get("longer than max_tokens", 0) + 1
            continue
        examples.append(example)
    return examples, skipped


def read_records(path: str | Path) -> list[dict]:
    """Records from a JSON-lines file (one object per line)."""
    p = Path(path)
    if not p.is_file():
        raise SpecRagError(f"records file does not exist: {path}")
    out = [obj for _, obj in iter_json_lines(p)]
    if not out or not all(isinstance(r, dict) for r in out):
        raise SpecRagError(f"records file must hold one JSON object per line: {path}")
    return out


def record_lines(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Records as JSON lines (keys sorted, so regenerated files diff cleanly)."""
    return [json.dumps(dict(r), ensure_ascii=False, sort_keys=True) + "\n" for r in records]


def write_records(records: Sequence[Mapping[str, Any]], path: str | Path) -> None:
    """Write records one JSON object per line (``record_lines``)."""
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(record_lines(records))
