"""``specrag train``: fine-tune the drafter (LoRA or full) on prompt/target JSON lines (format: data.py)."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specrag_jax.errors import SpecRagError

if TYPE_CHECKING:
    from specrag_jax.training.config import TrainConfig

DEFAULT_BASE = "smollm2-135m-instruct"  # the pipeline's default drafter
TARGETS_HELP = "q,k,v,o,gate,up,down"  # lora.ALL_TARGETS (not imported: `specrag` starts without flax/optax)


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``train`` (dispatch through ``args.train_main``)."""
    p = sub.add_parser("train", help="fine-tune the drafter on prompt/target JSON lines (LoRA or full)")
    p.add_argument("--data", required=True, help="JSON lines with 'prompt' and 'target' (loss on target only)")
    p.add_argument("--out", required=True, help="folder for checkpoints, history.json and loss.png")
    p.add_argument("--model", default=DEFAULT_BASE, help="base model: a known name, a .gguf file or an HF folder")
    p.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA adapters")
    p.add_argument("--lora-rank", type=int, default=None, help="adapter rank (default 8)")
    p.add_argument(
        "--lora-alpha",
        type=float,
        default=None,
        help="adapter scale numerator: scale = alpha / rank (default 2 x rank)",
    )
    p.add_argument(
        "--lora-targets",
        default=None,
        help=f"projections with adapters: names from {TARGETS_HELP}, or attn, mlp, all (default)",
    )
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default 2e-4 LoRA, 2e-5 full)")
    p.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="linear warm-up steps, then cosine decay (default: a tenth of --steps, at most 20)",
    )
    p.add_argument("--batch", type=int, default=8, help="rows per step (examples are packed into rows)")
    p.add_argument("--max-len", type=int, default=1024, help="tokens per example at most (prompt + target)")
    p.add_argument("--refuse-long", action="store_true", help="refuse over-long examples instead of skipping them")
    p.add_argument("--eval-every", type=int, default=50, help="held-out loss every N steps")
    p.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps (default: with each eval)")
    p.add_argument("--eval-fraction", type=float, default=0.1, help="share of examples held out")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--clip", type=float, default=1.0, help="global gradient-norm clip")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    p.add_argument("--json", action="store_true", help="print one JSON summary")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    from specrag_jax.parallel.cli import add_mesh_arguments

    add_mesh_arguments(p, groups=False)
    p.set_defaults(train_main=run_train)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig of the flags (validated before anything is loaded)."""
    from specrag_jax.training.config import TrainConfig
    from specrag_jax.training.lora import ALL_TARGETS, LoraConfig, parse_targets
    from specrag_jax.training.step import OptimConfig

    lora_flags = [f for f in ("lora_rank", "lora_alpha", "lora_targets") if getattr(args, f) is not None]
    if args.full and lora_flags:
        raise SpecRagError(f"--full trains every parameter; drop --{lora_flags[0].replace('_', '-')}")
    rank = 8 if args.lora_rank is None else args.lora_rank
    lora = LoraConfig(
        rank,
        2.0 * rank if args.lora_alpha is None else args.lora_alpha,
        parse_targets(args.lora_targets) if args.lora_targets else ALL_TARGETS,
    )
    lr = args.lr if args.lr is not None else (2e-5 if args.full else 2e-4)
    warmup = min(20, args.steps // 10) if args.warmup is None else args.warmup
    optim = OptimConfig(lr=lr, warmup=warmup, steps=args.steps, clip=args.clip, weight_decay=args.weight_decay)
    return TrainConfig(
        mode="full" if args.full else "lora",
        lora=lora,
        optim=optim,
        batch=args.batch,
        max_len=args.max_len,
        eval_every=args.eval_every,
        save_every=args.save_every,
        eval_fraction=args.eval_fraction,
        seed=args.seed,
        dtype=args.dtype,
    )


def load_tokenizer(name: str) -> Any:
    """The base model's tokenizer (read first: bad data fails before the weights load)."""
    from specrag_jax.models.tokenizer.load import load_tokenizer as load

    return load(name)


def load_base(name: str, dtype: str) -> tuple[Any, dict]:
    """(ModelConfig, params) of a base model (tests substitute a tiny one)."""
    from specrag_jax.models.loading.load import load_model_params

    return load_model_params(name, dtype=dtype)


def eos_id(tokenizer: Any) -> int:
    """The id appended to every target: the tokenizer's first end-of-sequence id (end of turn for chat models)."""
    ids = list(getattr(tokenizer, "eos_ids", ()) or ())
    if not ids:
        raise SpecRagError("the base model's tokenizer defines no end-of-sequence token to end the targets with")
    return int(ids[0])


def file_id(path: str) -> str:
    """A short content hash of the data file (``--resume`` refuses other data)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


RUN_RECORD = "run.json"


def write_run_record(args: argparse.Namespace) -> None:
    """``OUT/run.json``: the command and the data it trained on (with ``DATA.summary.json`` from
    ``make-drafter-data`` when present: source, split, teacher), so an exported adapter can say what made it."""
    import sys

    summary = Path(str(args.data) + ".summary.json")
    record = {
        "command": "specrag " + " ".join(sys.argv[1:]),
        "data": str(args.data),
        "data_id": file_id(args.data),
        "data_summary": json.loads(summary.read_text()) if summary.is_file() else None,
    }
    from specrag_jax.training.history import write_json_atomic

    Path(args.out).mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(args.out) / RUN_RECORD, record)


def run_train(args: argparse.Namespace) -> int:
    from specrag_jax.parallel.cli import placement_from_args
    from specrag_jax.training.data import load_examples, split_holdout
    from specrag_jax.training.loop import train

    config = config_from_args(args)
    placement = placement_from_args(args)
    if not Path(args.data).is_file():
        raise SpecRagError(f"training data file not found: {args.data}")
    from specrag_jax.progress import stage

    progress = args.progress
    tokenizer = load_tokenizer(args.model)
    eos = eos_id(tokenizer)
    data = load_examples(args.data, tokenizer, eos, config.max_len, "refuse" if args.refuse_long else "skip")
    progress.note(data.summary())
    with stage(progress, f"loading {args.model}"):
        cfg, params = load_base(args.model, args.dtype)
    train_ex, eval_ex = split_holdout(data.examples, config.eval_fraction, config.seed)
    write_run_record(args)
    result = train(
        cfg,
        params,
        train_ex,
        eval_ex,
        config,
        args.out,
        base_name=args.model,
        resume=args.resume,
        placement=placement,
        progress=not (args.quiet or args.json),
        data_id=file_id(args.data),
    )
    summary = {
        **result.summary(),
        "model": args.model,
        "mode": config.mode,
        "out": args.out,
        "examples": {"train": len(train_ex), "eval": len(eval_ex), "skipped_long": len(data.skipped_long)},
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"trained steps {result.start_step}..{result.end_step} of {args.model} ({config.mode}, "
            f"{result.trainable_params} trainable parameters): train loss {summary['final_train_loss']}, "
            f"held-out loss {summary['final_eval_loss']}, {summary['tokens_per_s']} tokens/s; "
            f"checkpoints in {Path(args.out) / 'checkpoints'}"
        )
    return 0


def add_export_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``export-adapter`` (dispatch through ``args.export_main``)."""
    p = sub.add_parser("export-adapter", help="write a train run's adapters as adapter.safetensors + adapter.json")
    p.add_argument("--run", required=True, help="a `specrag train --out` folder")
    p.add_argument("--out", required=True, help="the adapter folder to write (must not exist)")
    p.add_argument(
        "--dtype",
        default="bfloat16",
        choices=["float32", "bfloat16"],
        help="stored dtype (merged into the base weights in float32 at load)",
    )
    p.add_argument("--step", type=int, default=None, help="the checkpoint step (default: the newest)")
    p.set_defaults(export_main=run_export)


def run_export(args: argparse.Namespace) -> int:
    """Export a run's newest (or ``--step``) adapters, with its ``run.json`` record, to ``--out``."""
    from specrag_jax.training.export import ADAPTER_FILE, export_adapter

    record = Path(args.run) / RUN_RECORD
    extra = {"training_run": json.loads(record.read_text())} if record.is_file() else None
    dest = export_adapter(args.run, args.out, dtype=args.dtype, step=args.step, extra=extra)
    size = (dest / ADAPTER_FILE).stat().st_size
    print(f"adapter of {args.run} -> {dest} ({size / 1e6:.1f} MB, {args.dtype})")
    return 0
