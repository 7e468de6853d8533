"""ModelRunner: owns parameters, the KV page pool and the jitted steps (the executor the pipeline calls).

Steps arrive as packed chunks (``packing.py``); the pool is donated so it updates in place.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.kernels import ATTENTION_IMPLS, KVPool, PageAllocator, make_pool
from specrag_jax.models.config import ModelConfig
from specrag_jax.models.decoder.scoring import token_logprobs
from specrag_jax.models.decoder.transformer import Decoder, logits_at, unstack_layers
from specrag_jax.models.executor.packing import Chunk, PackedStep, bucket, pack_chunks
from specrag_jax.models.executor.placement_api import StepPlacement
from specrag_jax.models.executor.step_export import ExportedSteps, export_dir
from specrag_jax.models.executor.step_prefetch import prefetch_limit
from specrag_jax.models.sampling.batch import SamplingBatch
from specrag_jax.models.sampling.penalties import PenaltyTable
from specrag_jax.models.sampling.sampler import SampleOut, sample_tokens
from specrag_jax.models.speculative.tree import TokenTree
from specrag_jax.models.speculative.verify_step import pad_trees, speculate_body


def _decoder(cfg, dtype, impl, tree, decode, attention_mesh=None) -> Decoder:
    """The Decoder of a step; ``attention_mesh`` (sharded Pallas runs) puts the attention kernel in shard_map."""
    extra = {} if attention_mesh is None else {"attention_mesh": attention_mesh}
    return Decoder(cfg, jnp.dtype(dtype), impl, tree, decode, **extra)


def _sample_body(
    params,
    pool,
    tokens,
    meta,
    rows,
    batch,
    penalties,
    *,
    cfg,
    impl,
    tree,
    decode,
    greedy_only,
    dtype,
    attention_mesh=None,
):
    hidden, pool = _decoder(cfg, dtype, impl, tree, decode, attention_mesh).apply(
        {"params": params}, tokens, meta, pool
    )
    logits = logits_at(params, cfg, hidden[rows])
    return (*sample_tokens(logits, batch, penalties, greedy_only=greedy_only), pool)


def _score_body(params, pool, tokens, meta, rows, targets, *, cfg, impl, tree, decode, dtype):
    hidden, pool = Decoder(cfg, jnp.dtype(dtype), impl, tree, decode).apply({"params": params}, tokens, meta, pool)
    return token_logprobs(params, cfg, hidden[rows], targets), pool


def _logits_body(params, pool, tokens, meta, rows, *, cfg, impl, tree, decode, dtype, attention_mesh=None):
    hidden, pool = _decoder(cfg, dtype, impl, tree, decode, attention_mesh).apply(
        {"params": params}, tokens, meta, pool
    )
    return logits_at(params, cfg, hidden[rows]), pool


def _score_body_vocab_parallel(
    params, pool, tokens, meta, rows, targets, *, cfg, impl, tree, decode, dtype, attention_mesh=None
):
    """Sharded scoring: full logits [rows, vocab] split over the vocabulary, then log-softmax (small all-reduces).

    The chunked scan of ``token_logprobs`` would gather a vocabulary-sharded output table on every device."""
    hidden, pool = _decoder(cfg, dtype, impl, tree, decode, attention_mesh).apply(
        {"params": params}, tokens, meta, pool
    )
    logp = jax.nn.log_softmax(logits_at(params, cfg, hidden[rows]), axis=-1)
    return jnp.take_along_axis(logp, targets[:, None], axis=-1)[:, 0], pool


_STATIC = ("cfg", "impl", "tree", "decode", "dtype")
_sample_step = jax.jit(_sample_body, static_argnames=_STATIC + ("greedy_only",), donate_argnames=("pool",))
_score_step = jax.jit(_score_body, static_argnames=_STATIC, donate_argnames=("pool",))
_logits_step = jax.jit(_logits_body, static_argnames=_STATIC, donate_argnames=("pool",))
_speculate_step = jax.jit(speculate_body, static_argnames=_STATIC + ("greedy_only",), donate_argnames=("pool",))
# Sharded runs: the body, the number of per-step inputs after (params, pool), the number of outputs before the pool.
_BODIES = {
    "sample": (_sample_body, 5, 4),
    "score": (_score_body_vocab_parallel, 4, 1),
    "logits": (_logits_body, 3, 1),
    "speculate": (speculate_body, 5, 6),
}
# Single-device runs through stored exports: the same, with the chunked-vocabulary scoring of ``_score_step``.
_BODIES_UNSHARDED = {**_BODIES, "score": (_score_body, 4, 1)}


def _host_views(params: dict, device) -> dict:
    """On a CPU device, numpy views of the parameter buffers (no copy), so that slicing stacked layers into
    per-layer arrays and ``device_put`` share memory instead of copying every weight (6.2 GB for Qwen 1.5B).
    Elsewhere the arrays are returned as they are (``np.asarray`` would copy from the accelerator)."""
    if device.platform != "cpu":
        return params

    def view(a):
        on_cpu = isinstance(a, np.ndarray) or (
            isinstance(a, jax.Array) and a.is_fully_addressable and all(d.platform == "cpu" for d in a.devices())
        )
        return np.asarray(a) if on_cpu else a

    return jax.tree_util.tree_map(view, params)


class ModelRunner:
    """Executes packed steps of one model over its page pool (the small executor the pipeline calls)."""

    def __init__(
        self,
        cfg: ModelConfig,
        params: dict,
        *,
        num_pages: int = 512,
        page_size: int = 16,
        max_seq_len: int = 2048,
        attention_impl: str = "reference",
        min_token_bucket: int = 16,
        min_page_bucket: int = 16,
        placement: StepPlacement | None = None,
    ) -> None:
        """``placement``: optional ``StepPlacement`` (``specrag_jax.parallel.Placement``); when given, the
        parameters and the pool are sharded over its mesh and every step is compiled with explicit in/out
        shardings. ``self.device`` is then the mesh's replicated sharding (a ``device_put`` target).
        MoE configs use ``min_token_bucket=1``: a padded token is routed like a real one, so a 16-token bucket
        would make a one-sequence decode step gather 32 experts' weights instead of 2 (benchmarks/moe_decode.py)."""
        if attention_impl not in ATTENTION_IMPLS:
            raise SpecRagError(f"unknown attention_impl {attention_impl!r}; choose one of {ATTENTION_IMPLS}")
        self.cfg = cfg
        # Commit parameters and pool to one device: jit keys its cache on placement, and the steps' outputs
        # are committed, so uncommitted inputs would compile every program a second time.
        self.placement = placement
        self.dtype = str(jax.tree_util.tree_leaves(params)[0].dtype)
        if placement is None:
            self.device = jax.devices()[0]
            self.params = jax.device_put(unstack_layers(_host_views(params, self.device), cfg.num_layers), self.device)
        else:
            self.device = placement.replicated
            self.params = placement.put_params(cfg, unstack_layers(params, cfg.num_layers))
            self._param_shardings = placement.param_shardings(cfg, self.params)
            self._pool_shardings = placement.pool_shardings(cfg, num_pages)
            self._sharded_steps: dict = {}
        self.page_size = page_size
        self.max_seq_len = min(max_seq_len, cfg.max_position_embeddings)
        self.max_pages_per_seq = -(-self.max_seq_len // page_size)
        self.attention_impl = attention_impl
        if cfg.num_experts:  # padded tokens would route (and gather experts) too
            min_token_bucket = 1
        self.min_token_bucket = min_token_bucket
        self.min_page_bucket = min(min_page_bucket, bucket(self.max_pages_per_seq))
        if placement is None:
            self.pool: KVPool = jax.device_put(
                make_pool(cfg.num_layers, num_pages, page_size, cfg.num_kv_heads, cfg.head_dim, jnp.dtype(self.dtype)),
                self.device,
            )
        else:
            self.pool = placement.make_pool(cfg, num_pages, page_size, self.dtype)
        self.allocator = PageAllocator(num_pages)
        self.penalties = PenaltyTable(cfg.vocab_size, self.max_seq_len, self.device)  # engines reserve their slots
        self._exported: ExportedSteps | None = None
        if prefetch_limit() and placement is None and attention_impl in ("reference", "dense"):
            exported = self._exported_steps()  # load recently used steps while the caller goes on (step_prefetch)
            if exported is not None:
                exported.prefetch(prefetch_limit())

    # ---------------------------------------------------------------- packing
    def pack(self, chunks: Sequence[Chunk], *, token_bucket: int | None = None, min_seqs: int = 1) -> PackedStep:
        """Pad and pack chunks into one step's arrays (see ``packing.pack_chunks``)."""
        return pack_chunks(
            chunks,
            page_size=self.page_size,
            num_slots=self.pool.num_pages * self.page_size,
            min_token_bucket=self.min_token_bucket,
            min_page_bucket=self.min_page_bucket,
            max_page_bucket=bucket(self.max_pages_per_seq),
            token_bucket=token_bucket,
            min_seqs=min_seqs,
        )

    # ---------------------------------------------------------------- execution
    def sample(self, step: PackedStep, sampling: SamplingBatch) -> SampleOut:
        """Run the step and sample one token per wanted row with its row of ``sampling``; returns numpy
        ``SampleOut`` for the real rows. Rows with a penalty slot count their token on device."""
        batch = sampling.padded(step.rows.shape[0])
        *out, self.pool = self._run(
            "sample",
            step.tokens,
            step.meta,
            step.rows,
            batch,
            self.penalties.state,
            cfg=self.cfg,
            impl=self.attention_impl,
            tree=step.tree,
            decode=step.decode,
            greedy_only=batch.greedy_only(step.num_rows),
            dtype=self.dtype,
        )
        if batch.penalized:
            self.penalties.record(batch.slots, out[0])
        return SampleOut(*(np.asarray(x)[: step.num_rows] for x in out))

    def score(self, step: PackedStep, targets: Sequence[int]) -> np.ndarray:
        """Run the step; log p(targets[i]) at each wanted row i (no full logits array)."""
        tgt = np.zeros(step.rows.shape[0], np.int32)
        tgt[: len(targets)] = targets
        logprobs, self.pool = self._run(
            "score",
            step.tokens,
            step.meta,
            step.rows,
            tgt,
            cfg=self.cfg,
            impl=self.attention_impl,
            tree=step.tree,
            decode=step.decode,
            dtype=self.dtype,
        )
        return np.asarray(logprobs)[: step.num_rows]

    def logits(self, step: PackedStep) -> np.ndarray:
        """Run the step; full float32 logits [rows, vocab] at the wanted rows only (tests, parity checks)."""
        logits, self.pool = self._run(
            "logits",
            step.tokens,
            step.meta,
            step.rows,
            cfg=self.cfg,
            impl=self.attention_impl,
            tree=step.tree,
            decode=step.decode,
            dtype=self.dtype,
        )
        return np.asarray(logits)[: step.num_rows]

    def speculate(self, step: PackedStep, trees: TokenTree, sampling: SamplingBatch):
        """Verify stacked token trees [S, B] packed back to back in ``step`` (``S * B`` tokens, sequence s at
        rows ``s * B ..``), accept per sequence, compact the accepted path's K/V (``speculative.verify_step``).
        ``sampling``: one row per tree; penalised rows see, at each node, their counts plus the node's path.

        Returns numpy (path, num_accepted, tokens, logprobs, top_ids, top_logprobs) for the real sequences."""
        s, b = trees.tokens.shape
        s_pad = step.meta.page_table.shape[0]
        if step.tokens.shape[0] != s_pad * b:
            raise SpecRagError(f"a speculation step packs {s_pad} trees of {b} tokens, got {step.tokens.shape[0]}")
        batch = sampling.padded(s_pad)
        *out, self.pool = self._run(
            "speculate",
            step.tokens,
            step.meta,
            pad_trees(trees, s_pad),
            batch,
            self.penalties.state,
            cfg=self.cfg,
            impl=self.attention_impl,
            tree=True,
            decode=False,
            greedy_only=batch.greedy_only(s),
            dtype=self.dtype,
        )
        if batch.penalized:
            self.penalties.record_tree(batch.slots, out[1], out[2])
        return tuple(np.asarray(x)[:s] for x in out)

    # ---------------------------------------------------------------- sharded execution
    @property
    def pool_shardings(self) -> KVPool | None:
        """The pool's shardings under a placement (where writes into the pool must land), else None."""
        return self._pool_shardings if self.placement is not None else None

    def _run(self, kind: str, *args, **statics):
        """One step: the shared jitted function, or (with a placement) this runner's sharded compilation."""
        if self.placement is None:
            no_custom_calls = statics.get("impl") in ("reference", "dense")
            exported = self._exported_steps() if no_custom_calls else None
            if exported is not None:
                body, _, n_out = _BODIES_UNSHARDED[kind]
                out = exported.call(kind, body, n_out, statics, self.params, self.pool, args)
                if out is not None:
                    return out
            fn = {"sample": _sample_step, "score": _score_step, "logits": _logits_step, "speculate": _speculate_step}[
                kind
            ]
            return fn(self.params, self.pool, *args, **statics)
        fn, in_shardings = self._sharded_step(kind, args, statics)
        if not self.placement.replicated.is_fully_addressable:  # multi-process: every input as a global array
            args = jax.tree_util.tree_map(  # a sharding may cover a whole subtree (the sampling batch)
                lambda sh, sub: jax.tree_util.tree_map(lambda x: self.placement.put(x, sh), sub),
                tuple(in_shardings[2:]),
                tuple(args),
            )
            *outs, pool = fn(self.params, self.pool, *args)
            return (*(o.addressable_data(0) for o in outs), pool)  # replicated: every process has all of it
        return fn(self.params, self.pool, *args)

    def _exported_steps(self) -> ExportedSteps | None:
        """The stored-export path for this runner's steps (None while no persistent cache is set)."""
        directory = export_dir()
        if directory is None:
            return None
        if self._exported is None or self._exported.directory != directory:
            self._exported = ExportedSteps(directory, self.params, self.pool, self.device.platform)
        return self._exported

    def _sharded_step(self, kind: str, args: tuple, statics: dict):
        """A jit of the step body with explicit in/out shardings, one per (kind, token bucket, statics)."""
        key = (kind, int(np.shape(args[0])[0]), tuple(sorted(statics.items())))
        if key not in self._sharded_steps:
            body, n_in, n_out = _BODIES[kind]
            if kind == "score" and not self._vocab_sharded():
                body = _score_body  # a whole output table: the chunked scan never holds [rows, vocab] logits
            pl = self.placement
            in_shardings = (
                self._param_shardings,
                self._pool_shardings,
                pl.token_sharding(key[1]),
                pl.meta_shardings(args[1]),
            ) + (pl.replicated,) * (n_in - 2)
            out_shardings = (pl.replicated,) * n_out + (self._pool_shardings,)
            if statics["impl"] == "pallas" and "attention_mesh" in getattr(Decoder, "__dataclass_fields__", {}):
                statics = {**statics, "attention_mesh": pl.mesh}  # each device runs the kernel on its own heads
            fn = jax.jit(
                functools.partial(body, **statics),
                in_shardings=in_shardings,
                out_shardings=out_shardings,
                donate_argnums=(1,),
            )
            self._sharded_steps[key] = (fn, in_shardings)
        return self._sharded_steps[key]

    def _vocab_sharded(self) -> bool:
        """Whether the output table (tied embedding or LM head) is split over its vocabulary axis."""
        table = ("embed", "embedding") if self.cfg.tie_embeddings else ("lm_head", "kernel")  # both [vocab, hidden]
        spec = self._param_shardings[table[0]][table[1]].spec
        return len(spec) > 0 and spec[0] is not None

    def lower_step(self, kind: str, step: PackedStep, *extra):
        """The lowered (not yet compiled) sharded step for ``step`` (``kind``: sample, score, logits); used to
        read the collectives a sharding compiles to. ``extra``: that kind's inputs after rows."""
        if self.placement is None:
            raise SpecRagError("lower_step needs a runner with a placement")
        statics = dict(cfg=self.cfg, impl=self.attention_impl, tree=step.tree, decode=step.decode, dtype=self.dtype)
        if kind == "sample":
            statics["greedy_only"] = True
        args = (step.tokens, step.meta, step.rows, *extra)
        fn, _ = self._sharded_step(kind, args, statics)
        return fn.lower(self.params, self.pool, *args)
