"""``specrag make-drafter-data``: drafter training examples written by a teacher (``drafter_data.examples``).

Input: ``--data F`` (JSON lines of question, passages (``context``) and answers (``ground_truth``), the dev
file's format) or ``--corpus C`` (documents only: the teacher writes a question and answer from each of
``--synthetic N`` passages first, ``drafter_data.synthetic_questions``). Output: JSON lines, one example per line
(``prompt``, ``target``, ``prompt_ids``, ``target_ids`` and provenance), written atomically (a temporary file
renamed into place), and a summary (kept, rejected by reason, skipped rows by reason, checks passed, wall
time) printed and written beside it as ``<out>.summary.json``, and the examples' records (``<out>.records.jsonl``:
what the teacher wrote and the ids and fingerprints of the passages it read, no passage text;
``drafter_data.records``). ``--replay RECORDS`` rebuilds a records file's examples from the passages of
``--data`` or ``--corpus`` with no teacher, so teacher work built from evaluation data is kept in the repository
without the data.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from specrag_jax.errors import SpecRagError
from specrag_jax.evaluation.holdout import add_split_options, split_rows


def add_drafter_data_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``make-drafter-data`` (its handler is ``args.drafter_data_main``)."""
    from specrag_jax.drafter_data.examples import REQUIRE
    from specrag_jax.pipeline.factory import DEFAULT_DRAFTER, DEFAULT_VERIFIER

    p = sub.add_parser("make-drafter-data", help="write drafter training examples with a teacher model")
    p.add_argument("--data", help="JSON lines with question, context (passages) and ground_truth (answers)")
    p.add_argument("--corpus", help="documents only: the teacher writes a question and answer per passage first")
    p.add_argument("--out", required=True, help="output JSON-lines file")
    p.add_argument("--drafter", default=DEFAULT_DRAFTER, help="the drafter whose prompts the examples use")
    p.add_argument("--teacher", default=DEFAULT_VERIFIER, help="the model that writes rationales (default: verifier)")
    p.add_argument("--offset", type=int, default=0, help="skip the first OFFSET rows (hold them out)")
    p.add_argument("--limit", type=int, default=None, help="use at most LIMIT rows after the offset")
    add_split_options(p)
    p.add_argument("--synthetic", type=int, default=100, help="--corpus: passages to write questions from")
    p.add_argument("--k", type=int, default=2, help="clusters (as RAGConfig.k)")
    p.add_argument("--m", type=int, default=5, help="subsets per question (as RAGConfig.m)")
    p.add_argument("--n-docs", type=int, default=10, help="--corpus: documents per synthetic question")
    p.add_argument("--max-doc-tokens", type=int, default=160)
    p.add_argument("--max-tokens", type=int, default=1024, help="longest example (prompt + target tokens) kept")
    p.add_argument(
        "--require",
        default="answer",
        choices=list(REQUIRE),
        help="the check an example must pass (answer: its rationale mentions a gold answer; citation: "
        "it cites a document of its subset; grounded: answer, and a gold answer occurs in the subset's "
        "passages); default answer (a citation alone keeps rationales that contradict the gold answer)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--replay",
        metavar="RECORDS",
        action="append",
        help="rebuild the examples of a records file (written beside every output as <out>.records.jsonl) from "
        "the passages of --data and/or --corpus, with no teacher (drafter_data.records); only records whose "
        "checks pass --require are kept; repeat it to write several files' examples into one output",
    )
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(drafter_data_main=drafter_data_main)


def _source_rows(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """(question rows of --data, passages of --corpus): read and checked before any model loads. Exactly one of
    the two is given, except with --replay (records of both kinds may be replayed together)."""
    from specrag_jax.evaluation.run import load_questions
    from specrag_jax.retrieval import load_corpus

    given = [a for a in (args.data, args.corpus) if a is not None]
    if not given or (len(given) == 2 and not args.replay):
        raise SpecRagError("give one of --data or --corpus (both only with --replay)")
    rows: list[dict] = []
    if args.data is not None:
        rows = split_rows(load_questions(args.data), args.split, args.holdout_fraction)[args.offset :]
        rows = rows if args.limit is None else rows[: args.limit]
        if not rows:
            raise SpecRagError(f"--split {args.split} --offset {args.offset} leaves no rows of {args.data}")
    return rows, load_corpus(args.corpus) if args.corpus is not None else []


def _write_atomic(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def records_path(out: Path) -> Path:
    """Where the records of an output file go (``<out>.records.jsonl``)."""
    return out.with_name(out.name + ".records.jsonl")


def _replay_main(args: argparse.Namespace, rows: list[dict], corpus: list[dict], out: Path, t0: float) -> int:
    """``--replay``: the examples of a records file, rebuilt from the given passages without a teacher."""
    from specrag_jax.drafter_data.records import passages_by_source, read_records, replay_examples
    from specrag_jax.models.text_model import TextModel

    records = [r for path in args.replay for r in read_records(path)]
    passages = passages_by_source(rows, corpus)
    drafter = TextModel.load(args.drafter, max_batch=1)
    examples, skipped = replay_examples(
        drafter,
        records,
        passages,
        max_doc_tokens=args.max_doc_tokens,
        max_tokens=args.max_tokens,
        require=args.require,
    )
    if not examples:
        raise SpecRagError(f"no record of {', '.join(args.replay)} is kept (skipped: {skipped})")
    _write_atomic(out, [json.dumps(e, ensure_ascii=False) + "\n" for e in examples])
    summary = {
        "out": str(out),
        "replay": args.replay,
        "source": [a for a in (args.data, args.corpus) if a is not None],
        "split": args.split,
        "holdout_fraction": args.holdout_fraction,
        "drafter": args.drafter,
        "records": len(records),
        "kept": len(examples),
        "require": args.require,
        "skipped": skipped,
        "wall_s": round(time.perf_counter() - t0, 2),
        "command": "specrag " + " ".join(sys.argv[1:]),
    }
    _write_atomic(out.with_name(out.name + ".summary.json"), [json.dumps(summary, indent=1) + "\n"])
    print(json.dumps(summary) if args.json else f"{len(examples)} examples from {len(records)} records -> {out}")
    return 0


def drafter_data_main(args: argparse.Namespace) -> int:
    import dataclasses

    from tqdm import tqdm

    from specrag_jax.drafter_data.examples import DrafterDataBuilder
    from specrag_jax.drafter_data.records import passages_by_source, record_lines, records_from_examples
    from specrag_jax.drafter_data.synthetic_questions import synthetic_rows
    from specrag_jax.models.text_model import TextModel
    from specrag_jax.pipeline.clustering import clustered_subsets
    from specrag_jax.pipeline.factory import lexical_search
    from specrag_jax.retrieval import Embedder, LexicalIndex

    if min(args.k, args.m, args.max_doc_tokens, args.max_tokens, args.n_docs) < 1 or args.offset < 0:
        raise SpecRagError("--k, --m, --n-docs, --max-doc-tokens and --max-tokens must be >= 1, --offset >= 0")
    if args.limit is not None and args.limit < 1:
        raise SpecRagError("--limit must be >= 1")
    out = Path(args.out)
    t0 = time.perf_counter()
    rows, corpus = _source_rows(args)
    if args.replay is not None:
        return _replay_main(args, rows, corpus, out, t0)
    drafter = TextModel.load(args.drafter, max_batch=args.m)
    teacher = drafter if args.teacher == args.drafter else TextModel.load(args.teacher, max_batch=args.m)
    dropped: dict[str, int] = {}
    if corpus:
        search = lexical_search(LexicalIndex.build(corpus))
        rows, dropped = synthetic_rows(
            teacher, corpus[args.offset :][: args.synthetic], search, args.n_docs, seed=args.seed
        )
    builder = DrafterDataBuilder(
        drafter,
        teacher,
        clustered_subsets(Embedder(drafter)),
        k=args.k,
        m=args.m,
        max_doc_tokens=args.max_doc_tokens,
        max_tokens=args.max_tokens,
        seed=args.seed,
        require=args.require,
    )
    lines, source = [], "corpus" if args.corpus else "data"
    for row in tqdm(rows, desc="questions", unit="q", disable=args.quiet, file=sys.stderr):
        lines += [json.dumps(e, ensure_ascii=False) + "\n" for e in builder.examples(row, source)]
    if not lines:
        raise SpecRagError(
            f"no example passed the checks ({builder.stats.rows} rows; rejected: "
            f"{builder.stats.rejected or 'none'}; skipped rows: {builder.stats.skipped_rows or 'none'})"
        )
    _write_atomic(out, lines)
    records = records_from_examples([json.loads(line) for line in lines], passages_by_source(rows, corpus))
    _write_atomic(records_path(out), record_lines(records))
    summary = {
        "out": str(out),
        "source": args.data or args.corpus,
        "drafter": args.drafter,
        "teacher": args.teacher,
        "offset": args.offset,
        "limit": args.limit,
        "split": args.split,
        "holdout_fraction": args.holdout_fraction,
        "require": args.require,
        **dataclasses.asdict(builder.stats),
        "synthetic_dropped": dropped,
        "wall_s": round(time.perf_counter() - t0, 2),
        "command": "specrag " + " ".join(sys.argv[1:]),
    }
    _write_atomic(out.with_name(out.name + ".summary.json"), [json.dumps(summary, indent=1) + "\n"])
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"{summary['kept']} examples from {summary['rows']} rows ({summary['examples']} shown to the teacher; "
            f"rejected: {summary['rejected'] or 'none'}) in {summary['wall_s']:.0f} s -> {out}"
        )
    return 0
