"""Text embeddings from one of our own decoders: mean-pooled, final-normed hidden states, L2-normalised.

Which embedding and why. The paper embeds documents with an instruction-aware encoder (InstructorXL,
"Represent this document for clustering given the question"). We use the *drafter's* mean-pooled final
hidden states instead: the model is already loaded for drafting, so embeddings cost no extra download, no
extra weights in memory and no extra framework. It is a weaker retriever than a trained encoder, which is
why the lexical (BM25) index is the default for retrieval; the dense index and, above all, the clustering
step (which only has to group the retrieved documents by content) are where these embeddings are used.

How. Token ids are packed into one bucketed step (``models.executor.packing``) with ``write=False`` chunks, so no KV
page is ever read or written: a 2-page dummy pool stands in for the runner's pool, whose state is left
untouched. ``Decoder.apply`` runs inside a jitted function that sums hidden states per segment
(``segment_sum``) with a per-token weight, so only ``[segments, hidden]`` leaves the device.

- Plain embeddings (``Embedder.embed``): each text is its own causal sequence; several per step. The first
  (BOS) token is left out of the mean: its state is a near-constant "attention sink" that would pull every
  embedding towards one direction.
- Question-conditioned embeddings (``Embedder.embed_for_question``): one tree chunk per step, the question
  once as the trunk and each document as a branch off it (a document token sees the question and its own
  document only; positions restart after the question). The mean runs over the document's tokens only,
  each of which has read the question, so the embedding is conditioned on it while the shared question
  tokens, identical for every document, do not dilute the differences between documents.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.kernels import make_pool
from specrag_jax.models.decoder.transformer import Decoder
from specrag_jax.models.executor.packing import Chunk, PackedStep, bucket, pack_chunks
from specrag_jax.retrieval.corpus import doc_text

DEFAULT_MAX_TOKENS = 256  # per text; longer texts are truncated (the head of a passage carries its topic)
DEFAULT_STEP_TOKENS = 1024  # tokens packed into one forward pass
MIN_SEQS = 8  # sequence-count bucket floor (fewer compiled programs)
MIN_TOKENS = 64  # token-count bucket floor


def _decoder_hidden(params, pool, tokens, meta, cfg, dtype, tree):
    # The reference attention: these steps read no cached pages, which is what the Pallas kernels speed up.
    decoder = Decoder(cfg, jnp.dtype(dtype), "reference", tree, False)
    hidden, _ = decoder.apply({"params": params}, tokens, meta, pool)  # the (unchanged) pool is dropped
    return hidden


@functools.partial(jax.jit, static_argnames=("cfg", "dtype", "tree", "num_segments"))
def _pooled_step(params, pool, tokens, meta, segments, weights, *, cfg, dtype, tree, num_segments):
    hidden = _decoder_hidden(params, pool, tokens, meta, cfg, dtype, tree)
    w = weights.astype(jnp.float32)
    sums = jax.ops.segment_sum(hidden.astype(jnp.float32) * w[:, None], segments, num_segments)
    counts = jax.ops.segment_sum(w, segments, num_segments)
    return sums / jnp.maximum(counts, 1e-6)[:, None]


@functools.partial(jax.jit, static_argnames=("cfg", "dtype", "tree"))
def _hidden_step(params, pool, tokens, meta, *, cfg, dtype, tree):
    return _decoder_hidden(params, pool, tokens, meta, cfg, dtype, tree)


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Rows scaled to unit L2 norm (all-zero rows stay zero)."""
    x = np.asarray(x, np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), eps)


class Embedder:
    """Embeds text with a loaded model's runner and tokenizer (a ``TextModel``, or anything with both)."""

    def __init__(
        self,
        model,
        *,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        step_tokens: int = DEFAULT_STEP_TOKENS,
        name: str | None = None,
    ) -> None:
        self.runner = model.runner
        self.tokenizer = model.tokenizer
        self.name = name or getattr(model, "name", "unknown")
        self.last_call: dict[str, int] = {}  # embed_for_question's token and step counts (the roofline's input)
        limit = self.runner.max_seq_len
        self.max_tokens = max(2, min(max_tokens, limit))
        self.step_tokens = max(step_tokens, 2 * self.max_tokens)
        cfg = self.runner.cfg
        page_size = self.runner.page_size
        # write=False chunks with kv_len 0 never touch the pool; a 2-page pool satisfies the Decoder's shapes.
        self._pool = jax.device_put(
            make_pool(cfg.num_layers, 2, page_size, cfg.num_kv_heads, cfg.head_dim, jnp.dtype(self.runner.dtype)),
            self.runner.device,
        )

    @property
    def dim(self) -> int:
        return int(self.runner.cfg.hidden_size)

    # ------------------------------------------------------------------ tokens
    def _ids(self, text: str, *, bos: bool, limit: int) -> list[int]:
        ids = self.tokenizer.encode(text, add_bos=bos and self.tokenizer.bos_id is not None)
        return ids[:limit]

    def _pack(self, chunks: Sequence[Chunk], min_seqs: int = MIN_SEQS) -> PackedStep:
        # Empty chunks pad the sequence count to >= min_seqs, so one program serves 1..8 texts.
        chunks = list(chunks) + [Chunk(pages=[], kv_len=0, tokens=[], write=False)] * (min_seqs - len(chunks))
        return pack_chunks(
            chunks,
            page_size=self.runner.page_size,
            num_slots=2 * self.runner.page_size,
            min_token_bucket=MIN_TOKENS,
            min_page_bucket=1,
            max_page_bucket=1,
        )

    def _run(self, step: PackedStep, segments: np.ndarray, weights: np.ndarray, num_segments: int) -> np.ndarray:
        r = self.runner
        out = _pooled_step(
            r.params,
            self._pool,
            step.tokens,
            step.meta,
            segments,
            weights,
            cfg=r.cfg,
            dtype=r.dtype,
            tree=step.tree,
            num_segments=num_segments,
        )
        return np.asarray(out)

    # ------------------------------------------------------------------ public
    def embed(self, texts: Sequence[str], *, normalize: bool = True) -> np.ndarray:
        """[N, H] float32 mean-pooled embeddings of independent texts (several texts per forward pass)."""
        texts = list(texts)
        out = np.zeros((len(texts), self.dim), np.float32)
        if not texts:
            return out
        bos = bool(self.tokenizer.add_bos_default)
        ids = [self._ids(t or " ", bos=bos, limit=self.max_tokens) for t in texts]
        for batch in _greedy_batches([len(x) for x in ids], self.step_tokens):
            chunks = [Chunk(pages=[], kv_len=0, tokens=ids[i], write=False) for i in batch]
            step = self._pack(chunks)
            segments = np.asarray(step.meta.token_seq, np.int32)
            weights = np.asarray(step.meta.token_valid, np.float32)
            start = 0
            for i in batch:  # leave out the BOS (attention sink) when the text has other tokens
                if bos and len(ids[i]) > 1 and ids[i][0] == self.tokenizer.bos_id:
                    weights[start] = 0.0
                start += len(ids[i])
            pooled = self._run(step, segments, weights, bucket(len(batch), MIN_SEQS))
            out[batch] = pooled[: len(batch)]
        return l2_normalize(out) if normalize else out

    def embed_for_question(self, question: str, docs: Sequence[dict | str], *, normalize: bool = True) -> np.ndarray:
        """[N, H] embeddings of each document read after the question (for clustering the retrieved set).

        ``docs``: documents (title + text are embedded) or plain strings. The question is computed once per
        step, the documents are branches off it, and only document tokens are pooled (module docstring).
        """
        texts = [d if isinstance(d, str) else doc_text(d) for d in docs]
        out = np.zeros((len(texts), self.dim), np.float32)
        if not texts:
            return out
        if not question.strip():
            raise SpecRagError("embed_for_question needs a non-empty question")
        bos = bool(self.tokenizer.add_bos_default)
        q_ids = self._ids(f"Question: {question.strip()}\nDocument:", bos=bos, limit=self.max_tokens // 2)
        limit = max(1, min(self.max_tokens, self.runner.max_seq_len - len(q_ids)))
        ids = [self._ids(" " + (t.strip() or "(empty)"), bos=False, limit=limit) for t in texts]
        budget = max(self.step_tokens - len(q_ids), limit)
        nq = len(q_ids)
        self.last_call = {"tokens": 0, "steps": 0, "question_tokens": nq, "docs": len(ids)}
        for batch in _greedy_batches([len(x) for x in ids], budget):
            tokens = list(q_ids)
            parents = list(range(-1, nq - 1))
            positions = list(range(nq))
            segs = [0] * nq
            weights = [0.0] * nq
            for j, i in enumerate(batch):
                n = len(ids[i])
                start = len(tokens)
                tokens += ids[i]
                parents += [nq - 1] + list(range(start, start + n - 1))
                positions += list(range(nq, nq + n))
                segs += [j] * n
                weights += [1.0] * n
            # One sequence (a tree): long steps then take the query-blocked attention (kernels/blocked.py).
            step = self._pack(
                [Chunk(pages=[], kv_len=0, tokens=tokens, parents=parents, positions=positions, write=False)],
                min_seqs=1,
            )
            self.last_call["tokens"] += len(tokens)
            self.last_call["steps"] += 1
            t_pad = step.tokens.shape[0]
            segments = np.zeros(t_pad, np.int32)
            segments[: len(segs)] = segs
            w = np.zeros(t_pad, np.float32)
            w[: len(weights)] = weights
            pooled = self._run(step, segments, w, bucket(len(batch), MIN_SEQS))
            out[batch] = pooled[: len(batch)]
        return l2_normalize(out) if normalize else out


def hidden_states(runner, step: PackedStep) -> np.ndarray:
    """Final-normed hidden states [T, H] of a packed step of ``write=False`` chunks with kv_len 0.

    Runs on a dummy pool (the runner's pages are not read or written); for prefix-attached chunks use the
    runner's own steps.
    """
    if np.any(np.asarray(step.meta.kv_lens) > 0):
        raise SpecRagError("hidden_states takes chunks without a cached prefix (kv_len 0)")
    cfg = runner.cfg
    pool = make_pool(cfg.num_layers, 2, runner.page_size, cfg.num_kv_heads, cfg.head_dim, jnp.dtype(runner.dtype))
    # Nothing is read or written: every slot points past the dummy pool, every page-table entry at page 0.
    meta = dataclasses.replace(
        step.meta,
        write_slots=np.full_like(np.asarray(step.meta.write_slots), 2 * runner.page_size),
        page_table=np.zeros_like(np.asarray(step.meta.page_table)),
    )
    hidden = _hidden_step(runner.params, pool, step.tokens, meta, cfg=cfg, dtype=runner.dtype, tree=step.tree)
    return np.asarray(hidden)


def _greedy_batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Consecutive index groups whose total length stays within ``budget`` (a longer item goes alone)."""
    batches: list[list[int]] = []
    cur: list[int] = []
    total = 0
    for i, n in enumerate(lengths):
        if cur and total + n > budget:
            batches.append(cur)
            cur, total = [], 0
        cur.append(i)
        total += n
    if cur:
        batches.append(cur)
    return batches
