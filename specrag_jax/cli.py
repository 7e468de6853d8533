"""The ``specrag`` command."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from specrag_jax.errors import SpecRagError
from specrag_jax.models.registry import DEFAULT_MODEL, KNOWN_MODELS


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text with one model")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"a known name ({', '.join(sorted(KNOWN_MODELS))}), a .gguf file or an HF directory")
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


def _generate(args: argparse.Namespace) -> int:
    from specrag_jax.models.sampling import SamplingParams
    from specrag_jax.models.text_model import TextModel

    sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)  # validate before loading
    if args.max_new_tokens < 1:
        raise SpecRagError(f"--max-new-tokens must be >= 1 (got {args.max_new_tokens})")
    if not args.prompt:
        raise SpecRagError("empty prompt: nothing to generate from")
    model = TextModel.load(args.model, dtype=args.dtype, max_seq_len=args.max_seq_len, max_batch=1,
                           attention_impl=args.attention_impl, cache=not args.no_cache)
    result = model.generate([args.prompt], sampling, args.max_new_tokens, args.stop, chat=args.chat)[0]
    n_decode = max(len(result.token_ids) - 1, 0)  # the first token comes from prefill
    if args.json:
        print(json.dumps({
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
                "decode_tokens_per_s": round(n_decode / result.decode_s, 3) if result.decode_s > 0 else 0.0,
            },
        }))
    else:
        print(result.text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specrag", description="Speculative RAG engine in JAX")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    args = parser.parse_args(argv)
    try:
        if args.command == "generate":
            return _generate(args)
    except SpecRagError as exc:
        print(f"specrag: error: {exc}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
