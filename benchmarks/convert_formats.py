"""Write evaluation rows (RetrievalQA or any format ``specrag eval`` reads) as a Self-RAG or MuSiQue file.

    python benchmarks/convert_formats.py --data ../shared/data/retrievalqa_dev.jsonl --to selfrag \
        --out /tmp/dev_selfrag.jsonl
    specrag eval --data /tmp/dev_selfrag.jsonl --format selfrag --task triviaqa ...

Write outside the repository: the output is built from evaluation data. The tests use the writers to check that
the Self-RAG and MuSiQue readers give the questions, gold answers and passages of the RetrievalQA reader.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Iterable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from specrag_jax.evaluation.datasets import load_rows


def _passage(p: str | dict) -> dict:
    """A RetrievalQA passage (a string, or an object with title and/or text) as ``{title, text}``."""
    if isinstance(p, str):
        return {"title": "", "text": p}
    text = p.get("text")
    return {"title": p.get("title") or "", "text": (p.get("contents") or "") if text is None else text}


def selfrag_row(row: dict) -> dict:
    """A Self-RAG eval row: ``id``, ``question``, ``answers``, ``ctxs``."""
    return {
        "id": row.get("question_id"),
        "question": row["question"],
        "answers": list(row["ground_truth"]),
        "ctxs": [_passage(p) for p in row.get("context") or []],
    }


def musique_row(row: dict) -> dict:
    """A MuSiQue row: ``id``, ``question``, ``answer`` (the first gold), ``answer_aliases`` (the rest),
    ``paragraphs`` (every passage, none marked supporting)."""
    gold = list(row["ground_truth"])
    paragraphs = [
        {"idx": i, "title": p["title"], "paragraph_text": p["text"], "is_supporting": False}
        for i, p in enumerate(map(_passage, row.get("context") or []))
    ]
    return {
        "id": row.get("question_id"),
        "question": row["question"],
        "answer": gold[0],
        "answer_aliases": gold[1:],
        "answerable": True,
        "paragraphs": paragraphs,
    }


def _write(objs: Iterable[dict], path: str | Path, array: bool) -> None:
    objs = list(objs)
    with open(path, "w", encoding="utf-8") as f:
        if array:
            json.dump(objs, f, ensure_ascii=False, indent=1)
        else:
            f.writelines(json.dumps(o, ensure_ascii=False) + "\n" for o in objs)


def write_selfrag(rows: Iterable[dict], path: str | Path, array: bool = False) -> None:
    """Rows as a Self-RAG eval file (JSON lines, or one JSON array)."""
    _write(map(selfrag_row, rows), path, array)


def write_musique(rows: Iterable[dict], path: str | Path, array: bool = False) -> None:
    """Rows as a MuSiQue file (JSON lines, or one JSON array)."""
    _write(map(musique_row, rows), path, array)


WRITERS = {"selfrag": write_selfrag, "musique": write_musique}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="an evaluation file (RetrievalQA, Self-RAG or MuSiQue)")
    p.add_argument("--to", required=True, choices=sorted(WRITERS))
    p.add_argument("--out", required=True, help="file to write")
    p.add_argument("--limit", type=int, default=None, help="write at most LIMIT rows (after --every)")
    p.add_argument(
        "--every",
        type=int,
        default=1,
        metavar="N",
        help="keep every N-th row (1, 1+N, ...): a slice across a file sorted by source",
    )
    p.add_argument("--array", action="store_true", help="one JSON array instead of JSON lines")
    args = p.parse_args(argv)
    if args.every < 1 or (args.limit is not None and args.limit < 1):
        p.error(f"--every and --limit must be >= 1 (got {args.every}, {args.limit})")
    stop = None if args.limit is None else args.every * (args.limit - 1) + 1
    rows = load_rows(args.data, limit=stop).rows[:: args.every]
    WRITERS[args.to](rows, args.out, args.array)
    print(f"{len(rows)} rows -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
