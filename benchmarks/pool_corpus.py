"""Pool every passage of a RetrievalQA-format file into one JSON-lines corpus (deduplicated by text).

    python benchmarks/pool_corpus.py --data ../shared/data/retrievalqa_dev.jsonl --out /tmp/dev_corpus.jsonl
    specrag eval --data ../shared/data/retrievalqa_dev.jsonl --corpus /tmp/dev_corpus.jsonl --rerank kv ...

Write the corpus outside the repository: it is built from evaluation data.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from specrag_jax.retrieval.pooling import pool_file


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="RetrievalQA-format JSON lines (question rows with context)")
    p.add_argument("--out", required=True, help="corpus file to write (JSON lines: id, title, text)")
    args = p.parse_args(argv)
    n = pool_file(args.data, args.out)
    print(f"{n} distinct passages -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
