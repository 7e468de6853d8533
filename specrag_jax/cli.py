"""The ``specrag`` command."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

from specrag_jax.errors import SpecRagError
from specrag_jax.evaluation.holdout import add_split_options, split_rows
from specrag_jax.models.loading.registry import DEFAULT_MODEL, KNOWN_MODELS
from specrag_jax.pipeline.rag_cli import add_quiet, add_rag_options, build_rag, rag_config_from_args
from specrag_jax.progress import NO_PROGRESS, Progress, StderrProgress, quiet_library_logs, stage
from specrag_jax.terminal_answer import TerminalAnswer


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text with one model")
    p.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"a known name ({', '.join(sorted(KNOWN_MODELS))}), a .gguf file or an HF directory",
    )
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--max-seq-len", type=int, default=2048)
    p.add_argument("--attention-impl", default="reference")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the converted-weights cache")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--speculative",
        default="none",
        metavar="PROPOSER",
        help="decode with token-tree speculation: none (default) or ngram (prompt lookup); the output "
        "is the model's own (greedy: identical), in fewer steps",
    )
    p.add_argument(
        "--spec-budget",
        type=int,
        default=None,
        help="largest token tree per step: 8, 16, 32 or 64 (default: 8 on CPU, 16 on a GPU or TPU)",
    )
    add_quiet(p)
    from specrag_jax.parallel.cli import add_mesh_arguments

    add_mesh_arguments(p, groups=False)


def _generate_speculation(args: argparse.Namespace):
    """The Speculation of ``specrag generate --speculative``, or None; bad flags fail before loading."""
    from specrag_jax.models.speculative.decode import Speculation
    from specrag_jax.models.speculative.ngram_proposer import NgramProposer
    from specrag_jax.models.speculative.tree import check_budget, default_tree_budget

    if args.speculative not in ("none", "ngram"):
        raise SpecRagError(
            f"unknown proposer {args.speculative!r} for --speculative (choose one of none, ngram; "
            f"draft proposals come from `specrag ask --method lossless`)"
        )
    if args.spec_budget is not None:
        check_budget(args.spec_budget)
    if args.speculative == "none":
        return None
    return Speculation(NgramProposer(), default_tree_budget() if args.spec_budget is None else args.spec_budget)


def _generate(args: argparse.Namespace) -> int:
    from specrag_jax.models.sampling.params import SamplingParams
    from specrag_jax.models.text_model import TextModel

    sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)  # validate before loading
    speculation = _generate_speculation(args)
    if args.max_new_tokens < 1:
        raise SpecRagError(f"--max-new-tokens must be >= 1 (got {args.max_new_tokens})")
    if not args.prompt:
        raise SpecRagError("empty prompt: nothing to generate from")
    from specrag_jax.parallel.cli import placement_from_args

    placement = placement_from_args(args)  # before loading: a bad --mesh fails fast
    progress: Progress = args.progress
    with stage(progress, f"loading {args.model}"):
        model = TextModel.load(
            args.model,
            dtype=args.dtype,
            max_seq_len=args.max_seq_len,
            max_batch=1,
            attention_impl=args.attention_impl,
            cache=not args.no_cache,
            placement=placement,
        )
        # bad input (a prompt too long) fails here, so its one error line is all that stderr shows
        model.generator.check_prompt(model.encode_prompt(args.prompt, args.chat), args.max_new_tokens)
        if speculation is not None:
            from specrag_jax.models.speculative.decode import check_can_speculate

            check_can_speculate(model.runner, speculation, args.model)
    from specrag_jax.compile_time import CompileClock, background_summary

    progress.start("generation")
    with CompileClock() as clock:
        ids = [model.encode_prompt(args.prompt, args.chat)]
        result = model.generate_ids(ids, sampling, args.max_new_tokens, args.stop, speculation=speculation)[0]
    n_decode = max(len(result.token_ids) - 1, 0)  # the first token comes from prefill
    rate = n_decode / result.decode_s if result.decode_s > 0 else 0.0
    progress.end(
        "generation",
        result.prefill_s + result.decode_s,
        f"{result.num_prompt_tokens} prompt + {len(result.token_ids)} new tokens, prefill "
        f"{result.prefill_s:.2f} s, decode {result.decode_s:.2f} s ({rate:.1f} tok/s), in all",
    )
    progress.note(f"  of which {clock.stats.summary()}{background_summary()}")
    spec = None
    if result.speculation is not None:
        from specrag_jax.models.speculative.decode import combine_stats

        spec = combine_stats([result.speculation])
        progress.note(
            f"  speculation: {spec['steps']} decode steps, {spec['accepted_tokens_per_step']:.2f} tokens "
            f"and {spec['proposed_tokens_per_step']:.1f} proposed per step"
        )
    if args.json:
        print(
            json.dumps(
                {
                    "model": args.model,
                    "text": result.text,
                    "token_ids": result.token_ids,
                    "num_prompt_tokens": result.num_prompt_tokens,
                    "num_generated_tokens": len(result.token_ids),
                    "finish_reason": result.finish_reason,
                    "timings": {
                        "load_s": round(model.load_s, 4),
                        "prefill_s": round(result.prefill_s, 4),
                        "decode_s": round(result.decode_s, 4),
                        "decode_tokens_per_s": round(rate, 3),
                    },
                    **({"speculation": spec} if spec is not None else {}),
                }
            )
        )
    else:
        print(result.text)
    return 0


def _add_ask(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ask", help="answer a question with Speculative RAG")
    p.add_argument("question")
    p.add_argument("--corpus", default=None, help="JSON-lines file or folder of text files (default: built-in)")
    p.add_argument(
        "--method",
        default="auto",
        help="auto (the router: exact standard RAG or the speculative cascade, per question), speculative (the "
        "cascade), standard, closed_book, drafter_only, random_draft or lossless",
    )
    p.add_argument("--json", action="store_true", help="print the answer object as JSON")
    add_rag_options(p)


def _ask(args: argparse.Namespace) -> int:
    if not args.question.strip():
        raise SpecRagError("empty question")
    from specrag_jax.pipeline.specrag import METHODS

    if args.method not in METHODS:
        raise SpecRagError(f"unknown method {args.method!r}; choose one of {', '.join(METHODS)}")
    from specrag_jax.compile_time import CompileClock, background_stats, background_summary
    from specrag_jax.machine_peaks import peaks_once
    from specrag_jax.pipeline.concurrent_answers import answer_rows
    from specrag_jax.pipeline.roofline import answer_roofline

    rag = build_rag(args, args.corpus, rag_config_from_args(args))
    rag.progress = args.progress
    terminal = None if args.json or not sys.stdout.isatty() else TerminalAnswer(args.progress)
    if terminal is not None:  # the answer appears as it is decoded
        rag.progress = terminal
    on_text = None if terminal is None else terminal.write
    with CompileClock() as clock:  # on started engines with --progressive-prefill (pipeline.concurrent_answers)
        (result,) = answer_rows(
            rag, [args.question], lambda pipeline, q: pipeline.answer(q, None, args.method, on_text=on_text)
        )
    if terminal is not None:
        terminal.end_line()
    args.progress.note(
        f"answer in {result.trace.get('total_s', 0.0):.2f} s, of which {clock.stats.summary()}{background_summary()}"
    )
    if args.json:
        ahead = background_stats()  # programs loaded ahead of need on the background thread (step_prefetch)
        result.trace["xla_background"] = {"seconds": round(ahead.total_s, 3), "programs": ahead.programs}
        result.trace["roofline"] = answer_roofline(rag, result.trace, args.method)  # measures this machine's peaks
        result.trace["roofline_peaks"] = peaks_once().to_dict()
        print(json.dumps(result.to_dict()))
    else:
        if terminal is None:
            print(result.answer)
        if result.rationale:
            print(f"rationale: {result.rationale}")
        print(f"citations: {', '.join(result.citations)}")
    return 0


def _add_eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="accuracy and latency of each method on a RetrievalQA, Self-RAG or MuSiQue file")
    p.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="FILE",
        help="evaluation file (RetrievalQA, Self-RAG or MuSiQue); repeat it to run a suite (Table 1)",
    )
    p.add_argument(
        "--suite",
        default=None,
        metavar="DIR",
        help="run every *.jsonl/*.json file in DIR (format and task of each inferred) and write Table 1 "
        "(table.json, table.md, and each file's results in a subfolder of --out)",
    )
    p.add_argument("--methods", default="closed_book,standard,speculative,auto,drafter_only,random_draft")
    p.add_argument(
        "--offset",
        type=int,
        default=0,
        help="skip the first OFFSET questions (e.g. the ones a drafter adapter was trained on)",
    )
    p.add_argument("--limit", type=int, default=None, help="evaluate at most LIMIT questions after the offset")
    p.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="questions answered at once on shared started engines (the serving path in process; latencies then "
        "include waiting for the other questions)",
    )
    add_split_options(p)
    p.add_argument("--json", action="store_true", help="print the results object as JSON")
    p.add_argument("--out", default=None, help="folder for results.json, predictions.jsonl and a plot")
    p.add_argument(
        "--corpus",
        default=None,
        help="retrieve from this corpus (BM25) instead of each question's own "
        "passages; reports recall_own_passages (benchmarks/pool_corpus.py pools a data file's passages)",
    )
    from specrag_jax.evaluation.datasets import FORMATS, TASKS

    p.add_argument(
        "--format",
        default="auto",
        choices=("auto",) + FORMATS,
        help="the data file's format (auto: from the first row's fields)",
    )
    p.add_argument(
        "--task",
        default=None,
        metavar="|".join(TASKS),
        help="the metric and the paper's --n-docs/--m/--k defaults (default: from the format and fields; "
        "an unknown task is a one-line error)",
    )
    add_rag_options(p)
    from specrag_jax.pipeline.rag_config import PAPER_ANSWER_TOKENS

    # n_docs, m, k: filled from the task's defaults in _eval; the answer: the paper's short-answer setting
    p.set_defaults(n_docs=None, m=None, k=None, max_answer_tokens=PAPER_ANSWER_TOKENS, answer_stop="line")


def _eval(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specrag_jax.evaluation.datasets import load_rows
    from specrag_jax.evaluation.run import evaluate, plot_accuracy_latency
    from specrag_jax.evaluation.suite import file_settings, write_results
    from specrag_jax.evaluation.suite_cli import eval_config, eval_suite
    from specrag_jax.retrieval import load_corpus

    if args.limit is not None and args.limit < 1:
        raise SpecRagError(f"--limit must be >= 1 (got {args.limit})")
    if args.offset < 0:
        raise SpecRagError(f"--offset must be >= 0 (got {args.offset})")
    if args.suite is None and not args.data:
        raise SpecRagError("eval needs --data FILE (repeat it for a suite) or --suite DIR")
    stop = None if args.limit is None or args.split != "all" else args.offset + args.limit  # read no further
    if args.suite is not None or len(args.data) > 1:  # Table 1 (evaluation/suite_cli.py)
        return eval_suite(
            args,
            stop,
            lambda: build_rag(args, None, rag_config_from_args(args)),
            lambda rows, path: _pick_rows(args, rows, path),
        )
    args.data = args.data[0]
    data = load_rows(args.data, args.format, args.task, stop)
    for name, value in file_settings(data.task, vars(args)).items():  # the paper's n_docs, m, k unless given
        setattr(args, name, value)
    rows = _pick_rows(args, data.rows, args.data)
    methods = [m for m in args.methods.split(",") if m]
    config = rag_config_from_args(args)
    corpus = None if args.corpus is None else load_corpus(args.corpus)  # a bad corpus fails before loading
    rag = build_rag(args, corpus, config)
    results = evaluate(
        rag, rows, methods, progress=not (args.json or args.quiet), corpus=corpus, concurrency=args.concurrency
    )
    predictions = results.pop("predictions")
    results["config"] = eval_config(args, args.data, data, rag, config)
    if args.out:
        out = Path(args.out)
        write_results(out, results, predictions)
        plot_accuracy_latency(results, out / "accuracy_vs_latency.png")
    if args.json:
        print(json.dumps(results))
    else:
        for name, m in results["methods"].items():
            print(
                f"{name:14s} acc {100 * m['accuracy']:5.1f}%  latency mean {m['latency_s']['mean']:.2f}s "
                f"p95 {m['latency_s']['p95']:.2f}s  tokens/q {m['tokens']['per_question']:.0f}"
            )
    return 0


def _pick_rows(args: argparse.Namespace, rows: list[dict], path) -> list[dict]:
    """The rows ``--split``, ``--offset`` and ``--limit`` keep (a one-line error when none)."""
    rows = split_rows(rows, args.split, args.holdout_fraction)[args.offset :]
    rows = rows if args.limit is None else rows[: args.limit]
    if not rows:
        raise SpecRagError(f"--split {args.split} --offset {args.offset} leaves no questions in {path}")
    return rows


PREFETCH_STEPS = 16  # stored step programs per model loaded ahead of need (step_prefetch; env overrides, 0: off)


def enable_compilation_cache() -> None:
    """Persist compiled XLA programs across runs (see ``xla_cache``; serve uses the same folder), and load each
    model's recently used ones in the background while it loads (``step_prefetch``)."""
    from specrag_jax.models.executor.step_prefetch import set_prefetch  # imports JAX: not at CLI start-up
    from specrag_jax.xla_cache import enable_xla_cache

    enable_xla_cache()
    value = os.environ.get("SPECRAG_PREFETCH_STEPS", "")
    if value and not value.isdigit():
        raise SpecRagError(f"SPECRAG_PREFETCH_STEPS must be a number of programs (0: off), got {value!r}")
    set_prefetch(int(value) if value else PREFETCH_STEPS)


def build_parser() -> argparse.ArgumentParser:
    """The ``specrag`` command line: every subcommand and its flags."""
    parser = argparse.ArgumentParser(prog="specrag", description="Speculative RAG engine in JAX")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    _add_ask(sub)
    _add_eval(sub)
    from specrag_jax.serving.cli import add_serve_parser

    add_serve_parser(sub)
    from specrag_jax.rerank.cli import add_index_parser

    add_index_parser(sub)
    from specrag_jax.drafter_data.cli import add_drafter_data_parser

    add_drafter_data_parser(sub)
    from specrag_jax.training.cli import add_export_parser, add_train_parser

    add_train_parser(sub)
    add_export_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.progress = NO_PROGRESS if getattr(args, "quiet", True) else StderrProgress()
    quiet_library_logs()
    try:
        enable_compilation_cache()
        if args.command == "generate":
            return _generate(args)
        if args.command == "ask":
            return _ask(args)
        if args.command == "eval":
            return _eval(args)
        if args.command == "serve":
            return args.serve_main(args)
        if args.command == "index":
            return args.index_main(args)
        if args.command == "make-drafter-data":
            return args.drafter_data_main(args)
        if args.command == "train":
            return args.train_main(args)
        if args.command == "export-adapter":
            return args.export_main(args)
    except SpecRagError as exc:
        args.progress.fail("")
        print(f"specrag: error: {exc}", file=sys.stderr)
        return 2
    finally:  # loading ahead belongs to this command (main may run in a longer-lived process)
        prefetch = sys.modules.get("specrag_jax.models.executor.step_prefetch")
        if prefetch is not None:
            prefetch.set_prefetch(0)
    return 1


if __name__ == "__main__":
    sys.exit(main())
