"""How long the verifier's answers are when they run to its end of turn, and the answer budget that cuts none.

Input: an eval of the exact path with a generous cap (lossless decoding with n-gram proposals gives standard RAG's
tokens, faster), e.g.::

    specrag eval --data ../shared/data/retrievalqa_dev.jsonl --methods lossless --proposer ngram \\
        --answer-stop turn --max-answer-tokens 512 --out benchmarks/results/eval_dev100_answers
    specrag ask "How do I leave a loop early in Python?" --json > /tmp/make_run_answer.json
    python benchmarks/answer_length.py --data ../shared/data/retrievalqa_dev.jsonl \\
        --predictions benchmarks/results/eval_dev100_answers/predictions.jsonl --ask /tmp/make_run_answer.json \\
        --also /tmp/python_q*.json  # each beside a .txt holding its question

The budget is chosen on the train split: the smallest candidate at least twice the longest train answer (a cap, not a
length: an answer ends at its end of turn, and the margin is for questions unlike the train split's, such as the
built-in corpus's Python questions, whose answers hold code). The share of answers it cuts is reported on the
held-out split and the whole dev set, beside the paper's short-answer setting (the
first line in 32 tokens; its cut share is the share of answers whose first line takes 32 tokens or more, counted by
re-encoding that line with the verifier's tokenizer). ``make run``'s answer (``--ask``) and further questions over
the built-in corpus (``--also``: ``specrag ask --json --max-answer-tokens 512`` outputs) are reported the same way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import RESULTS_DIR, run_header, write_results
from specrag_jax.evaluation.holdout import heldout_indices
from specrag_jax.evaluation.run import load_questions
from specrag_jax.models.tokenizer.load import load_tokenizer
from specrag_jax.pipeline.factory import DEFAULT_VERIFIER
from specrag_jax.pipeline.prompts import first_line
from specrag_jax.pipeline.rag_config import PAPER_ANSWER_TOKENS

CANDIDATES = (64, 96, 128, 192, 256, 384, 512)
MARGIN = 2  # the budget is at least this many times the longest train answer
SENTENCE_END = (".", "!", "?", ":", "`", ")", '"', "'")


def answer_row(answer: str, tokens: int, cut: bool, tok) -> dict:
    """One answer's lengths: its tokens (the end-of-turn token included), whether the cap cut it, and the paper
    setting's view of it (its first line's tokens, re-encoded)."""
    line_tokens = len(tok.encode(first_line(answer), add_bos=False))
    return {
        "tokens": tokens,
        "cut_at_cap": cut,
        "first_line_tokens": line_tokens,
        "cut_one_line_32": line_tokens >= PAPER_ANSWER_TOKENS,
        "ends_without_punctuation": not answer.rstrip().endswith(SENTENCE_END),
    }


def share_cut(rows: list[dict], budget: int) -> float:
    """The share of answers a ``budget`` cuts: they need more tokens (end of turn included) or the cap cut them."""
    return sum(r["cut_at_cap"] or r["tokens"] > budget for r in rows) / len(rows)


def summary(rows: list[dict]) -> dict:
    tokens = [r["tokens"] for r in rows]
    return {
        "n": len(rows),
        "tokens": {
            "mean": statistics.fmean(tokens),
            "median": statistics.median(tokens),
            "p90": sorted(tokens)[int(0.9 * (len(tokens) - 1))],
            "max": max(tokens),
        },
        "cut_at_cap": sum(r["cut_at_cap"] for r in rows) / len(rows),
        "cut_by_budget": {str(b): share_cut(rows, b) for b in CANDIDATES},
        "cut_one_line_32": sum(r["cut_one_line_32"] for r in rows) / len(rows),
        "ends_without_punctuation": sum(r["ends_without_punctuation"] for r in rows) / len(rows),
    }


def asked(path: Path, tok) -> dict:
    """One ``specrag ask --json`` output's answer, path and lengths (its question from ``<name>.txt`` beside it)."""
    ask = json.loads(path.read_text())
    trace = ask["trace"]
    question = path.with_suffix(".txt")
    return {
        "question": question.read_text().strip() if question.exists() else None,
        "answer": ask["answer"],
        "path": trace.get("path"),
        "total_s": trace.get("total_s"),
        **answer_row(ask["answer"], int(trace["verifier_decode_tokens"]), bool(trace["answer_cut"]), tok),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="the dev file the eval ran on (for the split)")
    parser.add_argument("--predictions", required=True, help="the eval's predictions.jsonl (one method)")
    parser.add_argument("--ask", default=None, help="`specrag ask --json` output of make run's question")
    parser.add_argument("--also", nargs="*", default=[], help="more `specrag ask --json` outputs (built-in corpus)")
    parser.add_argument("--verifier", default=DEFAULT_VERIFIER)
    parser.add_argument("--out", default=str(RESULTS_DIR / "answer_length.json"))
    args = parser.parse_args()
    tok = load_tokenizer(args.verifier)
    rows = load_questions(args.data)
    held = {str(rows[i].get("question_id")) for i in heldout_indices(rows)}
    preds = [json.loads(line) for line in Path(args.predictions).read_text().splitlines() if line.strip()]
    if len({p["method"] for p in preds}) != 1:
        raise SystemExit("the predictions must hold one method's answers")
    split: dict[str, list[dict]] = {"train": [], "heldout": []}
    for p in preds:
        row = answer_row(p["answer"], int(p["answer_tokens"]), bool(p["answer_cut"]), tok)
        split["heldout" if str(p["question_id"]) in held else "train"].append(row)
    longest = max(r["tokens"] for r in split["train"])
    budget = min((b for b in CANDIDATES if b >= MARGIN * longest), default=CANDIDATES[-1])
    out = {
        **run_header(),
        "predictions": args.predictions,
        "candidates": list(CANDIDATES),
        "chosen_budget": budget,
        "chosen_on": "train",
        "rule": f"the smallest candidate >= {MARGIN} x the longest train answer ({longest} tokens)",
        "splits": {name: summary(r) for name, r in split.items() if r},
        "dev": summary(split["train"] + split["heldout"]),
    }
    for name in ("heldout", "dev"):
        s = out["splits"].get(name) or out[name]
        s["cut_at_chosen"] = s["cut_by_budget"][str(budget)]
    if args.ask:
        out["make_run"] = asked(Path(args.ask), tok)
    if args.also:
        rows_also = [asked(Path(f), tok) for f in args.also]
        out["builtin_corpus"] = {
            "questions": rows_also,
            "max_tokens": max(r["tokens"] for r in rows_also),
            "cut_at_chosen": share_cut(rows_also, budget),
        }
    write_results(args.out, out)
    print(json.dumps({k: out[k] for k in ("chosen_budget", "splits", "dev")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
