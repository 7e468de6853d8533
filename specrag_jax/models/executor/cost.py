"""What a forward step must cost: FLOPs and bytes from the model config and token counts (the roofline's input).

Counts are the work any implementation has to do, not what ours happens to do: matmul FLOPs of the active
weights (2 per weight per token; MoE counts its router top-k experts), attention FLOPs of the visible
query-key pairs (4 * heads * head_dim per pair: QK^T and PV), and bytes of the weights read once per step
plus the KV read and written. Score materialisation, padding and masked pairs are the implementation's
overhead, so they show up as a ratio above 1, not in the bound.
"""

from __future__ import annotations

import dataclasses

from specrag_jax.models.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Cost:
    """FLOPs and bytes of some work, and the time it needs on a machine (``bound_s``).

    Work added with ``+`` runs after the work before it (a prefill chunk, then the next, then the decode steps):
    ``phases`` keeps each part's (FLOPs, bytes), so a compute-bound prefill and a memory-bound decode are each
    bound by their own larger term, not by the larger of their sums (which would let the prefill's arithmetic
    overlap the decode's weight reads, which no implementation can: the decode needs the prefill's K/V)."""

    flops: float = 0.0
    bytes: float = 0.0
    steps: int = 0
    phases: tuple[tuple[float, float], ...] = ()  # (FLOPs, bytes) of each serial part; () = one part, the totals

    def parts(self) -> tuple[tuple[float, float], ...]:
        return self.phases or ((self.flops, self.bytes),)

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(
            self.flops + other.flops, self.bytes + other.bytes, self.steps + other.steps, self.parts() + other.parts()
        )

    def times(self, steps: int) -> "Cost":
        """``steps`` repeats of this cost (each part ``steps`` times as much: repeats of one step kind)."""
        scaled = tuple((f * steps, b * steps) for f, b in self.phases)
        return Cost(self.flops * steps, self.bytes * steps, self.steps * steps, scaled)

    def bound_s(self, flops_per_s: float, bytes_per_s: float) -> float:
        """Seconds at the machine's peaks: each serial part compute- or memory-bound per the larger of its two
        times, the parts one after another."""
        return sum(max(f / flops_per_s, b / bytes_per_s) for f, b in self.parts())


@dataclasses.dataclass(frozen=True)
class ModelCost:
    """Per-token constants of one loaded model."""

    body_params: float  # weights multiplied per token in the layers (the embedding lookup is free)
    head_params: float  # the output projection's weights, multiplied only for rows that need logits
    weight_bytes: float  # bytes of every weight read by a step (MoE: all experts)
    attn_flops_per_pair: float  # FLOPs per visible (query, key) pair, all layers
    kv_bytes_per_token: float  # K and V of one token, all layers

    @classmethod
    def of(cls, cfg: ModelConfig, weight_bytes: float, kv_itemsize: int = 4) -> "ModelCost":
        """From a config and the loaded weights' byte count (their dtype is whatever was loaded)."""
        h, layers = cfg.hidden_size, cfg.num_layers
        q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        attn = h * q_dim + 2 * h * kv_dim + q_dim * h
        experts = cfg.experts_per_token if cfg.num_experts else 1
        mlp = 3 * h * cfg.intermediate_size * experts + (h * cfg.num_experts if cfg.num_experts else 0)
        return cls(
            body_params=float(layers * (attn + mlp)),
            head_params=float(cfg.vocab_size * h),
            weight_bytes=float(weight_bytes),
            attn_flops_per_pair=4.0 * layers * q_dim,
            kv_bytes_per_token=2.0 * layers * kv_dim * kv_itemsize,
        )

    def step(self, tokens: int, pairs: float, *, context: float = 0.0, logits_rows: int | None = None) -> Cost:
        """One forward step over ``tokens`` new tokens with ``pairs`` visible (query, key) pairs and ``context``
        cached tokens read. ``logits_rows``: rows that go through the head (default every token)."""
        rows = tokens if logits_rows is None else logits_rows
        flops = 2.0 * (self.body_params * tokens + self.head_params * rows) + self.attn_flops_per_pair * pairs
        data = self.weight_bytes + self.kv_bytes_per_token * (context + tokens)
        return Cost(flops, data, 1)


def causal_pairs(tokens: int, context: int = 0) -> float:
    """Visible pairs of a causal chunk of ``tokens`` after ``context`` cached tokens."""
    return tokens * context + tokens * (tokens + 1) / 2


def prefill_cost(model: ModelCost, prompt: int, chunk: int, *, cached: int = 0) -> Cost:
    """A prompt prefilled in chunks of ``chunk`` tokens (after ``cached`` tokens already in pages); only the
    last row of the last chunk needs logits."""
    total, done = Cost(), cached
    while done < prompt:
        n = min(chunk, prompt - done)
        total += model.step(n, causal_pairs(n, done), context=done, logits_rows=int(done + n == prompt))
        done += n
    return total


def decode_cost(model: ModelCost, steps: int, batch: int, context: float) -> Cost:
    """``steps`` decode steps of ``batch`` sequences, each reading ``context`` cached tokens on average."""
    return model.step(batch, batch * (context + 1), context=batch * context).times(steps)


def tree_cost(
    model: ModelCost,
    prefix: int,
    tree_tokens: int,
    branches: int,
    scored_rows: int | None = None,
    cached: int = 0,
) -> Cost:
    """One packed pass over a shared prefix and ``branches`` branches (``tree_tokens`` in all, prefix included):
    every branch token sees the prefix and, on average, half of its own branch. ``scored_rows``: the rows whose
    logits the pass reads (a log-probability needs the whole vocabulary's row: every scored draft token and each
    branch's Yes/No row, not the passages'); unknown (an older trace): one a branch, a lower bound. ``cached``:
    prefix tokens whose K/V the prefix cache served (read, not computed). One pass, one weight read: a caching
    engine that prefills the rest of the prefix in a step of its own reads the weights twice (a lower bound)."""
    cached = min(max(cached, 0), prefix)
    branch = max(tree_tokens - prefix, 0)
    per_branch = branch / max(branches, 1)
    pairs = causal_pairs(prefix - cached, cached) + branch * (prefix + (per_branch + 1) / 2)
    rows = branches if scored_rows is None else scored_rows
    return model.step(tree_tokens - cached, pairs, context=cached, logits_rows=rows)
