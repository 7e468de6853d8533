"""Model configuration for the decoder families we serve (Gemma 3, Llama, Qwen2, Qwen3, Mistral and Mixtral).

Parameter tree (Linen, layers stacked on a leading axis of size ``num_layers``). Dense kernels are
``[out, in]``, the layout of GGUF, safetensors and torch (``y = x @ kernel.T``; see ``decoder/layers.Linear`` for
why: XLA:CPU multiplies a few rows by an ``[out, in]`` matrix 3-4x faster than by ``[in, out]``)::

    params = {
      "embed":      {"embedding": [vocab, hidden]},
      "layers": {
        "attn_norm":      {"scale": [L, hidden]},
        "attn": {
          "q": {"kernel": [L, num_heads * head_dim, hidden]},     # + "bias": [L, num_heads * head_dim]
          "k": {"kernel": [L, num_kv_heads * head_dim, hidden]},  #   with attention_bias (Qwen2)
          "v": {"kernel": [L, num_kv_heads * head_dim, hidden]},
          "o": {"kernel": [L, hidden, num_heads * head_dim]},
          "q_norm": {"scale": [L, head_dim]},      # qk_norm only (Gemma 3, Qwen3)
          "k_norm": {"scale": [L, head_dim]},      # qk_norm only (Gemma 3, Qwen3)
        },
        "post_attn_norm": {"scale": [L, hidden]},  # sandwich_norm only (Gemma 3)
        "mlp_norm":       {"scale": [L, hidden]},
        "mlp": {
          "gate": {"kernel": [L, intermediate, hidden]},
          "up":   {"kernel": [L, intermediate, hidden]},
          "down": {"kernel": [L, hidden, intermediate]},
        },
        "post_mlp_norm":  {"scale": [L, hidden]},  # sandwich_norm only (Gemma 3)
      },
      # num_experts > 0 (Mixtral): "mlp" is the sparse MoE block of moe.py instead, E = num_experts, its kernels
      # kept [in, out] (``kernel_in_out``): "router": {"kernel": [L, hidden, E]},
      #   "gate"/"up": {"kernel": [L, E, hidden, intermediate]}, "down": {"kernel": [L, E, intermediate, hidden]}
      "final_norm": {"scale": [hidden]},
      "lm_head":    {"kernel": [vocab, hidden]},   # only when not tie_embeddings
    }

Norm scales are *multiplicative* (``y = x_normed * scale``): GGUF Gemma files already store ``1 + w``;
Hugging Face Gemma checkpoints store ``w`` and the loader adds 1. Q/K kernels use the Hugging Face
"rotate-half" RoPE layout (llama.cpp's Llama GGUF files permute Q/K rows; the loader undoes that).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from specrag_jax.errors import SpecRagError

SUPPORTED_ARCHITECTURES = ("gemma3", "llama", "mistral", "mixtral", "qwen2", "qwen3")
MOE_IMPLS = ("auto", "ragged", "gather")  # see ModelConfig.moe_impl_for
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Static shape and behaviour of one decoder; hashable so it can be a jit static argument."""

    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_local_theta: float = 10000.0
    sliding_window: int | None = None
    sliding_window_pattern: int = 0
    layer_types: tuple[str, ...] = ()  # per layer, one of LAYER_TYPES; overrides sliding_window_pattern
    query_pre_attn_scalar: float | None = None
    max_position_embeddings: int = 8192
    tie_embeddings: bool = True
    embed_scale: bool = False
    qk_norm: bool = False
    attention_bias: bool = False  # biases on the q/k/v projections (Qwen2); o has none
    sandwich_norm: bool = False
    activation: str = "silu"
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    name: str = ""
    num_experts: int = 0  # > 0: sparse MoE feed-forward (Mixtral) with intermediate_size per expert
    experts_per_token: int = 0  # router top-k
    moe_impl: str = "auto"  # one of MOE_IMPLS

    def __post_init__(self) -> None:
        if self.arch not in SUPPORTED_ARCHITECTURES:
            raise SpecRagError(
                f"unsupported architecture {self.arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.num_heads % self.num_kv_heads:
            raise SpecRagError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.activation not in ("silu", "gelu_tanh"):
            raise SpecRagError(f"unsupported activation {self.activation!r}")
        if self.layer_types and (len(self.layer_types) != self.num_layers or set(self.layer_types) - set(LAYER_TYPES)):
            raise SpecRagError(
                f"layer_types must name {self.num_layers} layers, each one of {LAYER_TYPES}; "
                f"got {list(self.layer_types)}"
            )

        if self.num_experts < 0 or (self.num_experts and not 1 <= self.experts_per_token <= self.num_experts):
            raise SpecRagError(
                f"experts_per_token={self.experts_per_token} must be in 1..num_experts={self.num_experts}"
            )
        if self.moe_impl not in MOE_IMPLS:
            raise SpecRagError(f"unknown moe_impl {self.moe_impl!r}; expected one of {MOE_IMPLS}")

    def moe_impl_for(self, num_tokens: int) -> str:
        """The MoE implementation for a step of ``num_tokens`` (a static shape). ``auto``: "gather" while
        tokens * k <= experts (it copies only the chosen experts' weights: decode of a few sequences), else
        "ragged" (grouped matmul over tokens sorted by expert; each expert's weights read once)."""
        if self.moe_impl != "auto":
            return self.moe_impl
        return "gather" if num_tokens * self.experts_per_token <= self.num_experts else "ragged"

    @property
    def attn_scale(self) -> float:
        """Multiplier applied to q.k (Gemma uses query_pre_attn_scalar**-0.5)."""
        base = self.query_pre_attn_scalar if self.query_pre_attn_scalar else self.head_dim
        return float(base) ** -0.5

    def is_sliding_layer(self, layer: int) -> bool:
        """True for local (sliding-window) layers: per ``layer_types`` when given (Mistral: every layer;
        Qwen2/3 with use_sliding_window: layers from max_window_layers on), else every layer except each
        ``sliding_window_pattern``-th (Gemma 3)."""
        if self.sliding_window is None:
            return False
        if self.layer_types:
            return self.layer_types[layer] == "sliding_attention"
        if self.sliding_window_pattern <= 0:
            return False
        return (layer + 1) % self.sliding_window_pattern != 0

    def layer_windows(self) -> list[int]:
        """Per-layer window length in tokens (0 = no window)."""
        return [self.sliding_window if self.is_sliding_layer(i) else 0 for i in range(self.num_layers)]

    def layer_rope_thetas(self) -> list[float]:
        """Per-layer RoPE base: local layers use ``rope_local_theta`` (Gemma 3's differs; the loaders set
        it to ``rope_theta`` for every other family)."""
        return [self.rope_local_theta if self.is_sliding_layer(i) else self.rope_theta for i in range(self.num_layers)]

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


# Values the GGUF header does not carry, per architecture (documented in the README):
# Gemma 3: local RoPE base 10k, every 6th layer global, query_pre_attn_scalar = head_dim (true for
# 270M and 1B; 4B+ use hidden/num_heads and carry it in HF config.json), sandwich norms, QK-norm,
# GeGLU(tanh), sqrt(hidden) embedding scale, tied embeddings, EOS also at <end_of_turn> (id 106).
ARCH_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3": dict(
        rope_local_theta=10000.0,
        sliding_window_pattern=6,
        embed_scale=True,
        qk_norm=True,
        sandwich_norm=True,
        activation="gelu_tanh",
        tie_embeddings=True,
    ),
    "llama": dict(
        embed_scale=False,
        qk_norm=False,
        sandwich_norm=False,
        activation="silu",
        sliding_window=None,
        sliding_window_pattern=0,
    ),
}
# Qwen2 / Qwen2.5: Llama's block with biases on q/k/v (not o), rotate-half ("NEOX") RoPE as stored
# (llama.cpp does not permute qwen2's Q/K rows). Its sliding window is off in every released config.
ARCH_DEFAULTS["qwen2"] = dict(ARCH_DEFAULTS["llama"], attention_bias=True)
# Qwen3: Llama's block with an RMSNorm over each head's q and k (before RoPE), no q/k/v bias by default.
ARCH_DEFAULTS["qwen3"] = dict(ARCH_DEFAULTS["llama"], qk_norm=True)
# Mistral: Llama's block; its sliding window (config.json) covers every layer (``layer_types``).
ARCH_DEFAULTS["mistral"] = dict(ARCH_DEFAULTS["llama"])
# Mixtral: Mistral's attention (sliding window from config.json, none in GGUF) with a sparse MoE feed-forward;
# num_experts / experts_per_token come from config.json or the GGUF's llama.expert_count / expert_used_count.
ARCH_DEFAULTS["mixtral"] = dict(ARCH_DEFAULTS["llama"])


def tiny_config(arch: str = "llama", **overrides: Any) -> ModelConfig:
    """A small random-weight config for tests (any family)."""
    base: dict[str, Any] = dict(
        arch=arch,
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_ids=(2,),
        name=f"tiny-{arch}",
    )
    base.update(ARCH_DEFAULTS[arch])
    if arch == "gemma3":
        base.update(sliding_window=8, sliding_window_pattern=2, rope_theta=1e6, query_pre_attn_scalar=16)
    if arch == "mixtral":
        base.update(num_experts=8, experts_per_token=2, intermediate_size=32, sliding_window=8)
    base.update(overrides)
    if arch == "mixtral" and base["sliding_window"] and "layer_types" not in overrides:
        base["layer_types"] = ("sliding_attention",) * base["num_layers"]
    return ModelConfig(**base)


def param_shapes(cfg: ModelConfig) -> dict[str, Any]:
    """The exact parameter tree (shapes only) that loaders must produce for ``cfg``."""
    L, H, D, F = cfg.num_layers, cfg.hidden_size, cfg.head_dim, cfg.intermediate_size  # F: FFN width
    attn: dict[str, Any] = {
        "q": {"kernel": (L, cfg.num_heads * D, H)},
        "k": {"kernel": (L, cfg.num_kv_heads * D, H)},
        "v": {"kernel": (L, cfg.num_kv_heads * D, H)},
        "o": {"kernel": (L, H, cfg.num_heads * D)},
    }
    if cfg.attention_bias:
        attn["q"]["bias"] = (L, cfg.num_heads * D)
        attn["k"]["bias"] = (L, cfg.num_kv_heads * D)
        attn["v"]["bias"] = (L, cfg.num_kv_heads * D)
    if cfg.qk_norm:
        attn["q_norm"] = {"scale": (L, D)}
        attn["k_norm"] = {"scale": (L, D)}
    E = cfg.num_experts
    mlp: dict[str, Any] = {"gate": {"kernel": (L, F, H)}, "up": {"kernel": (L, F, H)}, "down": {"kernel": (L, H, F)}}
    if E:
        mlp = {
            "router": {"kernel": (L, H, E)},
            "gate": {"kernel": (L, E, H, F)},
            "up": {"kernel": (L, E, H, F)},
            "down": {"kernel": (L, E, F, H)},
        }
    layers: dict[str, Any] = {"attn_norm": {"scale": (L, H)}, "attn": attn, "mlp_norm": {"scale": (L, H)}, "mlp": mlp}
    if cfg.sandwich_norm:
        layers["post_attn_norm"] = {"scale": (L, H)}
        layers["post_mlp_norm"] = {"scale": (L, H)}
    tree: dict[str, Any] = {
        "embed": {"embedding": (cfg.vocab_size, H)},
        "layers": layers,
        "final_norm": {"scale": (H,)},
    }
    if not cfg.tie_embeddings:
        tree["lm_head"] = {"kernel": (cfg.vocab_size, H)}
    return tree


def kernel_in_out(leaf: str, cfg: ModelConfig) -> bool:
    """Whether leaf ``leaf`` ("layers/mlp/gate/kernel") is a kernel kept ``[.., in, out]``: the sparse MoE
    block's router and expert kernels. Every other kernel is ``[.., out, in]``, as stored on disk."""
    return leaf.endswith("kernel") and bool(cfg.num_experts) and leaf.startswith("layers/mlp/")
