"""The decoder's projection: ``y = x @ kernel.T`` with the kernel stored ``[out, in]`` (as GGUF, safetensors and
torch store it).

Why ``[out, in]``: XLA:CPU multiplies a few rows (decode, a batch of drafts, a 16-token tree step) by an
``[out, in]`` matrix, producing ``[out, rows]``, 3-4x faster than by an ``[in, out]`` one (Qwen2.5-1.5B's
1536x8960 MLP matrix, 8 rows: 2.0 ms against 8.4 ms; 16 rows: 3.9 against 10.3; one row of the 8960x1536 down
projection: 1.3 against 2.5; ``benchmarks/kernel_layout.py``). Writing the product as ``[out, rows]`` and
transposing it behind an optimization barrier keeps XLA from folding the transpose back into the slow form.
From ``SMALL_ROWS`` rows up, a plain ``x @ kernel.T`` is as fast (prefill: 1024 rows within 1%); a smaller
matrix (SmolLM2's 576-wide ones) gains up to ``SMALL_KERNEL_ROWS`` rows when, as in a real step, it streams from
memory (30 layers' matrices, 5 rows: 57 ms against 71 ms; 10-12 rows equal; 16 rows 5% slower), so the form is
picked from the static row count and the kernel's size. Other platforms take the plain form (their matmul units
choose layouts).

In the few-rows form XLA:CPU's matmul is fastest at 8 and 16 rows: 5-7 rows cost more than 8, 9-15 more than 16
(the rows it cannot fill a panel with run a slower path), so those row counts are padded with zero rows to 8 or 16
and the padding sliced off; each row's result is bit-identical (measured: streamed layers of Qwen2.5-1.5B, 5 / 8
rows 67 / 53 ms, 12 / 16 rows 92 / 68 ms; SmolLM2, 5 / 8 rows 25.6 / 21.1 ms; ``PADDED_ROWS``).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

SMALL_ROWS = 48  # measured crossover on a 2-core x86 CPU: at 64 rows both forms cost the same
LARGE_KERNEL_BYTES = 4 << 20  # a matrix this large takes the form under SMALL_ROWS rows
SMALL_KERNEL_ROWS = 8  # a smaller one up to this many rows (streamed 576-wide matrices: crossover 10-12 rows)
FEW_ROWS_FORM = True  # benchmarks/kernel_layout.py switches it off for its A/B
HEAD_FEW_ROWS_FORM = True  # the output head's form (logits_at); kernel_layout.py's head-form A/B switches it
WIDE_HEAD_IN = 1024  # a head this wide gains from the form at 2-47 rows; a narrower one (576) loses from 8 rows
PADDED_ROWS = (8, 16)  # few-rows products of 5-7 rows run at 8, 9-15 at 16 (PAD_FEW_ROWS: the A/B switch)
PAD_FEW_ROWS = True
OUT_IN_INIT = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=-1, out_axis=-2)


def few_rows_form(rows: int, kernel_bytes: int) -> bool:
    """Whether a ``rows``-row product with a ``kernel_bytes`` kernel takes the transposed ``[out, rows]`` form:
    on CPU, up to ``SMALL_KERNEL_ROWS`` rows, or under ``SMALL_ROWS`` rows of a ``LARGE_KERNEL_BYTES`` matrix
    (measured in whole steps: SmolLM2's 5-row decode step at 300 cached tokens 114.9 -> 99.9 ms; kernel_layout.py)."""
    if not FEW_ROWS_FORM or jax.default_backend() != "cpu":
        return False
    return rows <= SMALL_KERNEL_ROWS or (rows < SMALL_ROWS and kernel_bytes >= LARGE_KERNEL_BYTES)


def head_few_rows_form(rows: int, hidden: int) -> bool:
    """Whether the output head (``[vocab, hidden]``, hundreds of MB) takes the few-rows form for ``rows`` rows:
    on CPU, 2 to ``SMALL_ROWS - 1`` rows of a ``WIDE_HEAD_IN``-wide head (measured, streamed: Qwen2.5-1.5B's
    151936x1536 head at 5 / 8 / 16 rows 71 / 66 / 70 ms against 175 / 116 / 153; SmolLM2's 49152x576 one at 8 /
    16 rows 12.7 / 17.9 against 10.5 / 13.2; one row equal for both)."""
    if not (FEW_ROWS_FORM and HEAD_FEW_ROWS_FORM) or jax.default_backend() != "cpu":
        return False
    return 1 < rows < SMALL_ROWS and hidden >= WIDE_HEAD_IN


def padded_rows(rows: int) -> int:
    """The row count a few-rows product of ``rows`` rows runs at: ``rows`` itself up to 4 and from 17, else the
    next of ``PADDED_ROWS``."""
    if not PAD_FEW_ROWS or rows <= 4:
        return rows
    return next((p for p in PADDED_ROWS if p >= rows), rows)


def head_logits(hidden: jax.Array, table: jax.Array) -> jax.Array:
    """float32 ``hidden [R, H] @ table[vocab, H].T`` (the table's dtype for the product, float32 accumulation)."""
    h = hidden.astype(table.dtype)
    few_rows = h.ndim == 2 and head_few_rows_form(h.shape[0], h.shape[1])
    return _times_transposed(h, table, few_rows, jnp.float32)


def project(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """``x [.., in] @ kernel[out, in].T`` -> ``[.., out]`` in ``x``'s dtype (the kernel cast to it)."""
    kernel = kernel.astype(x.dtype)
    few_rows = x.ndim == 2 and few_rows_form(x.shape[0], kernel.size * kernel.dtype.itemsize)
    return _times_transposed(x, kernel, few_rows)


def _times_transposed(x: jax.Array, w: jax.Array, few_rows: bool, out_dtype=None) -> jax.Array:
    """``x @ w.T`` for ``w [out, in]``: plain, or (``few_rows``) as ``[out, rows]`` transposed behind a barrier."""
    if few_rows:
        rows = x.shape[0]
        extra = padded_rows(rows) - rows
        if extra:
            x = jnp.pad(x, ((0, extra), (0, 0)))
        y = jnp.einsum("ti,oi->ot", x, w, preferred_element_type=out_dtype)
        return jax.lax.optimization_barrier(y).T[:rows]
    return jnp.einsum("...i,oi->...o", x, w, preferred_element_type=out_dtype)


class Linear(nn.Module):
    """A projection with an ``[out, in]`` kernel (``nn.Dense``'s parameters, transposed) and an optional bias."""

    features: int
    use_bias: bool = False
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.param("kernel", OUT_IN_INIT, (self.features, x.shape[-1]), self.param_dtype)
        y = project(x.astype(self.dtype), kernel)
        if self.use_bias:
            bias = self.param("bias", nn.initializers.zeros, (self.features,), self.param_dtype)
            y = y + bias.astype(self.dtype)
        return y
