"""Single-pass verification: every draft's scores from ONE verifier forward pass over a packed tree.

The verifier prefix (instruction + question) is written once into KV pages. All m branches
``[## Rationale: r_j, ## Response: a_j, reflection prompt, "Yes"]`` (plain text, or chat turns for an
instruction-tuned verifier: see verifier_prompts) are packed into one tree chunk: each
token sees the prefix and the earlier tokens of its own branch; positions restart at the prefix length.
The branch K/V is not stored (the chunk is scored and dropped); the prefix pages are released afterwards.

Evidence-aware verification (``evidence=``) is the same single pass with each branch starting with the draft's
own passages (``[passages_j, rationale_j, answer_j, evidence reflection prompt, "Yes"]``): the verifier reads the
evidence the draft was written from and scores whether it supports the answer (``ev_sc``: the draft's tokens given
its passages; ``ev_sr``: "Yes" to the evidence reflection prompt). The tree then holds m*k passages, not all n.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from specrag_jax.compile_time import thread_compile_stats
from specrag_jax.errors import SpecRagError
from specrag_jax.models.text_model import TextModel
from specrag_jax.pipeline.closed_set import ClosedSet
from specrag_jax.pipeline.drafting import Draft
from specrag_jax.pipeline.prompts import RATIONALE_TAG, RESPONSE_TAG, evidence_block
from specrag_jax.pipeline.verifier_prompts import evidence_scoring_prompt, scoring_prompt
from specrag_jax.progress import Progress


def _branch(
    tok, draft: Draft, fixed: dict[str, list[int]], head: list[int] = (), shared: bool = False
) -> tuple[list[int], list[int], int]:
    """Branch ids, indices of the scored (rationale and answer) tokens, and the index of the "Yes" token
    (``fixed``: the ids of the pieces every branch shares, encoded once; ``head``: the branch's own passages;
    ``shared``: the drafter's own ids where the draft has them, not its text re-encoded)."""
    own = draft.shared_ids() if shared else None
    rationale, answer = own or (
        tok.encode(" " + draft.rationale, add_bos=False),
        tok.encode(" " + draft.answer, add_bos=False),
    )
    pieces = [
        (list(head), False),
        (fixed["rationale"], False),
        (list(rationale), True),
        (fixed["response"], False),
        (list(answer), True),
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


def verify_drafts(
    verifier: TextModel,
    question: str,
    drafts: Sequence[Draft],
    chat: bool = False,
    evidence: Sequence[Sequence[dict]] | None = None,
    closed: ClosedSet | None = None,
    shared_ids: bool = False,
) -> dict:
    """Score every draft in one packed pass: ``sc_logprob``/``sc_tokens``/``sr_logprob``/``sr_no_logprob``, or
    with ``evidence`` (each draft's passages) ``ev_sc_logprob``/``ev_sc_tokens``/``ev_sr_logprob``/
    ``ev_sr_no_logprob``. Returns the stage's trace entries.

    ``chat``: the question, each draft and the reflection prompt as chat turns (see verifier_prompts); ``closed``:
    a closed-set question's choices/instruction follow the question in the prefix (each draft's answer is its label);
    ``shared_ids``: the drafter shares the verifier's vocabulary, so drafts go into the tree as the drafter's ids."""
    t0, compile_start = time.perf_counter(), thread_compile_stats()
    if evidence is not None and len(evidence) != len(drafts):
        raise SpecRagError(
            f"evidence-aware verification needs one passage list per draft ({len(evidence)} for {len(drafts)} drafts)"
        )
    tok, runner = verifier.tokenizer, verifier.runner
    form = (scoring_prompt if evidence is None else evidence_scoring_prompt)(tok, question, chat, closed)
    prefix = tok.encode_rendered(form.prefix)
    no_id = tok.encode(form.no, add_bos=False)[0]
    fixed = {
        name: tok.encode(text, add_bos=False)
        for name, text in (
            ("rationale", RATIONALE_TAG),
            ("response", "\n" + RESPONSE_TAG),
            ("after", form.after),
            ("yes", form.yes),
        )
    }
    heads = (
        [[]] * len(drafts)
        if evidence is None
        else [tok.encode(evidence_block(list(docs)) + form.before_draft, add_bos=False) for docs in evidence]
    )
    tokens, parents, positions, rows, targets = [], [], [], [], []
    spans = []
    longest = 0
    for d, head in zip(drafts, heads):
        ids, scored, yes_index = _branch(tok, d, fixed, head, shared_ids)
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
        raise SpecRagError(
            f"verification needs positions up to {len(prefix) + longest}; the verifier context "
            f"is {runner.max_seq_len} tokens (raise --max-seq-len)"
        )
    counts: dict = {}
    logprobs = verifier.generator.score_tree(prefix, tokens, parents, positions, rows, targets, counts)
    field = "sc" if evidence is None else "ev_sc"
    reflection = "sr" if evidence is None else "ev_sr"
    for d, (start, n) in zip(drafts, spans):
        setattr(d, f"{field}_logprob", float(np.sum(logprobs[start : start + n])))
        setattr(d, f"{field}_tokens", n)
        setattr(d, f"{reflection}_logprob", float(logprobs[start + n]))
        setattr(d, f"{reflection}_no_logprob", float(logprobs[start + n + 1]))
    # one-time XLA work inside the stage: on this thread, or on a started engine's (the larger: the same work when
    # this thread drives the engine)
    compile_s = max((thread_compile_stats() - compile_start).total_s, counts.get("compile_s", 0.0))
    if evidence is None:
        return {
            "verification_s": time.perf_counter() - t0,
            "verification_compile_s": compile_s,
            "verifier_prefix_tokens": len(prefix),
            "verifier_tree_tokens": len(tokens),
            "verifier_scored_rows": len(set(rows)),
            "verifier_prefix_cached_tokens": counts.get("cached_tokens", 0),
        }
    return {
        "evidence_verification_s": time.perf_counter() - t0,
        "evidence_verification_compile_s": compile_s,
        "evidence_prefix_tokens": len(prefix),
        "evidence_tree_tokens": len(tokens),
        "evidence_scored_rows": len(set(rows)),
        "evidence_prefix_cached_tokens": counts.get("cached_tokens", 0),
    }


def verification_passes(
    verifier: TextModel,
    progress: Progress,
    question: str,
    docs: list[dict],
    drafts: Sequence[Draft],
    trace: dict,
    *,
    chat: bool,
    shared_ids: bool = False,
    plain: bool = True,
    evidence: bool = False,
    closed: ClosedSet | None = None,
) -> None:
    """The passes a selection needs on ``drafts`` (``plain``: question + draft, rho's terms; ``evidence``: each
    draft's own passages from ``docs`` + draft), each reported to ``progress``; their entries go into ``trace``."""
    if plain:
        progress.start("verification")
        trace.update(verify_drafts(verifier, question, drafts, chat=chat, closed=closed, shared_ids=shared_ids))
        progress.end(
            "verification",
            trace.get("verification_s", 0.0),
            f"{len(drafts)} drafts, {trace.get('verifier_tree_tokens', 0)} tree tokens",
        )
    if evidence:
        by_id = {str(d["id"]): d for d in docs}
        passages = [[by_id[str(i)] for i in d.doc_ids if str(i) in by_id] for d in drafts]
        progress.start("evidence verification")
        trace.update(
            verify_drafts(
                verifier, question, drafts, chat=chat, evidence=passages, closed=closed, shared_ids=shared_ids
            )
        )
        progress.end(
            "evidence verification",
            trace.get("evidence_verification_s", 0.0),
            f"{len(drafts)} drafts with their passages, {trace.get('evidence_tree_tokens', 0)} tree tokens",
        )
