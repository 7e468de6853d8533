"""Single-pass verification: every draft's rho_SC and rho_SR from ONE verifier forward pass.

The verifier prefix (instruction + question) is written once into KV pages. All m branches
``[## Rationale: r_j, ## Response: a_j, reflection prompt, "Yes"]`` (plain text, or chat turns for an
instruction-tuned verifier: see verifier_prompts) are packed into one tree chunk: each
token sees the prefix and the earlier tokens of its own branch; positions restart at the prefix length.
The branch K/V is not stored (the chunk is scored and dropped); the prefix pages are released afterwards.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.models.text_model import TextModel
from specrag_jax.pipeline.drafting import Draft
from specrag_jax.pipeline.prompts import RATIONALE_TAG, RESPONSE_TAG
from specrag_jax.pipeline.verifier_prompts import scoring_prompt


def _branch(tok, draft: Draft, fixed: dict[str, list[int]]) -> tuple[list[int], list[int], int]:
    """Branch ids, indices of the rho_SC tokens, and the index of the "Yes" token (``fixed``: the ids of the
    pieces every branch shares, encoded once)."""
    pieces = [
        (fixed["rationale"], False),
        (tok.encode(" " + draft.rationale, add_bos=False), True),
        (fixed["response"], False),
        (tok.encode(" " + draft.answer, add_bos=False), True),
        (fixed["after"], False),
    ]
    ids: list[int] = []
    scored: list[int] = []
    for piece, is_scored in pieces:
        if is_scored:
            scored.extend(range(len(ids), len(ids) + len(piece)))
        ids.extend(piece)
    yes_index = len(ids)
    ids.append(fixed["yes"][0])
    return ids, scored, yes_index


def verify_drafts(verifier: TextModel, question: str, drafts: Sequence[Draft], chat: bool = False) -> dict:
    """Fill ``sc_logprob``/``sc_tokens``/``sr_logprob``/``sr_no_logprob`` of every draft in one packed pass.

    ``chat``: the question, each draft and the reflection prompt as chat turns (see verifier_prompts)."""
    t0 = time.perf_counter()
    tok, runner = verifier.tokenizer, verifier.runner
    form = scoring_prompt(tok, question, chat)
    prefix = tok.encode_rendered(form.prefix)
    no_id = tok.encode(form.no, add_bos=False)[0]
    fixed = {name: tok.encode(text, add_bos=False) for name, text in
             (("rationale", RATIONALE_TAG), ("response", "\n" + RESPONSE_TAG), ("after", form.after), ("yes", form.yes))}
    tokens, parents, positions, rows, targets = [], [], [], [], []
    spans = []
    longest = 0
    for d in drafts:
        ids, scored, yes_index = _branch(tok, d, fixed)
        longest = max(longest, len(ids))
        start = len(tokens)
        for i, t in enumerate(ids):
            tokens.append(t)
            parents.append(-1 if i == 0 else start + i - 1)
            positions.append(len(prefix) + i)
        sc_rows = [start + i - 1 for i in scored]  # token i is predicted at row i-1 (scored never starts at 0)
        spans.append((len(rows), len(sc_rows)))
        rows.extend(sc_rows + [start + yes_index - 1, start + yes_index - 1])
        targets.extend([ids[i] for i in scored] + [ids[yes_index], no_id])
    if len(prefix) + longest > runner.max_seq_len:
        raise SpecRagError(f"verification needs positions up to {len(prefix) + longest}; the verifier context "
                           f"is {runner.max_seq_len} tokens")
    logprobs = verifier.generator.score_tree(prefix, tokens, parents, positions, rows, targets)
    for d, (start, n) in zip(drafts, spans):
        d.sc_logprob = float(np.sum(logprobs[start: start + n]))
        d.sc_tokens = n
        d.sr_logprob = float(logprobs[start + n])
        d.sr_no_logprob = float(logprobs[start + n + 1])
    return {"verification_s": time.perf_counter() - t0, "verifier_prefix_tokens": len(prefix),
            "verifier_tree_tokens": len(tokens)}
