"""The Flax (Linen) decoder: building blocks, the layer stack, sparse MoE, and the output head.

``layers`` (RMSNorm, RoPE, gated MLP, the paged attention layer), ``transformer`` (``Decoder``: packed tokens in,
hidden states and KV pool out; ``logits_at``: logits at chosen rows only), ``moe`` (Mixtral's top-k router and
grouped expert matmuls), ``scoring`` (log-probabilities of chosen tokens through a vocabulary-chunked online
log-sum-exp, never a ``[tokens, vocab]`` array).
"""

from specrag_jax.lazy_exports import lazy_exports

_EXPORTS = {
    "layers": ("GatedMLP", "PagedAttention", "RMSNorm", "apply_rope"),
    "transformer": ("Decoder", "DecoderLayer", "init_params", "logits_at", "stack_layers", "unstack_layers"),
    "moe": ("SparseMoE", "moe_block", "route"),
    "scoring": ("token_logprobs",),
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
