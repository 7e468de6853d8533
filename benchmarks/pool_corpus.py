"""Pool every passage of a RetrievalQA-format file into one JSON-lines corpus (deduplicated by text).

    python benchmarks/pool_corpus.py --data ../shared/data/retrievalqa_dev.jsonl --out /tmp/dev_corpus.jsonl
    specrag eval --data ../shared/data/retrievalqa_dev.jsonl --corpus /tmp/dev_corpus.jsonl --rerank kv ...

``--split train`` pools the train split's passages only, leaving out every passage that a held-out question also
holds, so synthetic drafter data written from it (``specrag make-drafter-data --corpus``) never sees a held-out
passage. Write the corpus outside the repository: it is built from evaluation data.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from specrag_jax.evaluation.holdout import add_split_options, split_rows
from specrag_jax.evaluation.run import load_questions
from specrag_jax.retrieval.pooling import write_pool


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="RetrievalQA-format JSON lines (question rows with context)")
    p.add_argument("--out", required=True, help="corpus file to write (JSON lines: id, title, text)")
    add_split_options(p)
    args = p.parse_args(argv)
    rows = load_questions(args.data)
    kept = split_rows(rows, args.split, args.holdout_fraction)
    ids = {id(r) for r in kept}
    n = write_pool(kept, args.out, exclude=[r for r in rows if id(r) not in ids])
    print(f"{n} distinct passages of {len(kept)} questions ({args.split}) -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
