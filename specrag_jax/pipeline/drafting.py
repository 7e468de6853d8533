"""Batched drafting: m drafts, one per document subset, generated together with a shared prompt prefix."""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

from specrag_jax.compile_time import thread_compile_stats
from specrag_jax.models.generation import Phase
from specrag_jax.models.sampling.params import SamplingParams
from specrag_jax.models.text_model import TextModel
from specrag_jax.pipeline.closed_set import ClosedSet
from specrag_jax.pipeline.prompts import (
    RATIONALE_TAG,
    RESPONSE_TAG,
    drafter_evidence,
    drafter_prefix,
    first_line,
    occurs_in_passages,
)

_SPLIT = "\x00EVIDENCE\x00"


@dataclasses.dataclass
class Draft:
    """One draft and its scores (log-probabilities; verification fills sc/sr)."""

    index: int
    doc_ids: list[str]
    text: str
    rationale: str
    answer: str
    parsed: bool
    draft_logprob: float
    draft_tokens: int
    sc_logprob: float = 0.0
    sc_tokens: int = 0
    sr_logprob: float = 0.0  # log P("Yes")
    sr_no_logprob: float = 0.0  # log P("No"), for the Yes-vs-No normalised variant
    # evidence-aware verification (the verifier reads the draft's own passages; verification.py)
    ev_sc_logprob: float = 0.0
    ev_sc_tokens: int = 0
    ev_sr_logprob: float = 0.0
    ev_sr_no_logprob: float = 0.0
    score: float = 0.0
    # does the answer occur in the draft's own passages (``prompts.occurs_in_passages``)? None: not checked
    # (closed-set labels, or drafts recorded before the check existed)
    grounded: bool | None = None
    # the drafter's own token ids of the rationale and the answer (None: their text is not what the ids decode to);
    # a verifier with the same vocabulary reads them as they are (``shared_ids``)
    rationale_ids: list[int] | None = None
    answer_ids: list[int] | None = None

    def to_dict(self) -> dict:
        """The draft's fields, without the token ids (the text says the same)."""
        out = dataclasses.asdict(self)
        del out["rationale_ids"], out["answer_ids"]
        return out

    def shared_ids(self) -> tuple[list[int], list[int]] | None:
        """(rationale ids, answer ids) as the drafter wrote them, when both are known."""
        if self.rationale_ids is None or self.answer_ids is None:
            return None
        return self.rationale_ids, self.answer_ids


def split_chat_prompt(model: TextModel, prefix: str, suffix: str) -> tuple[list[int], list[int]]:
    """Token ids of (shared prefix, per-draft suffix), wrapped in the model's chat template if it has one.

    The suffix ends with the forced start of the answer, "## Rationale:".
    """
    tok = model.tokenizer
    if tok.chat_template:  # a template may write BOS itself (Gemma's does): never doubled
        rendered = tok.apply_chat_template([{"role": "user", "content": prefix + _SPLIT}])
        head, tail = rendered.split(_SPLIT, 1)
        head_ids = tok.encode_rendered(head)
    else:
        head, tail = prefix, "\n"
        head_ids = tok.encode(head, add_bos=tok.add_bos_default)
    return head_ids, tok.encode(suffix + tail + RATIONALE_TAG, add_bos=False)


def truncate_docs(model: TextModel, docs: Sequence[dict], max_doc_tokens: int, notes: list[str]) -> list[dict]:
    """Cut every document's text to ``max_doc_tokens`` tokens (noted in the trace)."""
    out = []
    for d in docs:
        ids = model.tokenizer.encode(d.get("text") or "", add_bos=False)
        if len(ids) > max_doc_tokens:
            notes.append(f"document {d.get('id')!r} truncated from {len(ids)} to {max_doc_tokens} tokens")
            d = {**d, "text": model.tokenizer.decode(ids[:max_doc_tokens])}
        out.append(d)
    return out


def _stop_at_line_end(model: TextModel):
    """Stop a branch once it has written some text and then a newline."""

    def stop(_row: int, out: list[int]) -> bool:
        text = model.tokenizer.decode(out).lstrip()
        return "\n" in text and bool(text.split("\n", 1)[0].strip())

    return stop


def _line_end(model: TextModel, token_ids: list[int]) -> int:
    """Index of the token that ends the first non-empty line (EOS counts), or len(token_ids) if none does."""
    eos = set(model.generator.eos_ids)
    for i, t in enumerate(token_ids):
        if t in eos:
            return i
        text = model.tokenizer.decode(token_ids[: i + 1]).lstrip()
        if "\n" in text and text.split("\n", 1)[0].strip():
            return i
    return len(token_ids)


def _kept(model: TextModel, token_ids: list[int], logprobs: list[float]) -> tuple[str, float, int]:
    """(first line of the text, summed log-prob and count of its tokens, the line-ending token included)."""
    end = _line_end(model, token_ids)
    n = end + 1 if end < len(token_ids) and token_ids[end] not in set(model.generator.eos_ids) else end
    return first_line(model.tokenizer.decode(token_ids[:n])), float(sum(logprobs[:n])), n


def _text_ids(model: TextModel, token_ids: list[int]) -> list[int]:
    """The ids of the first line, without the token that ends it."""
    return list(token_ids[: _line_end(model, token_ids)])


def _ids_of(model: TextModel, ids: list[int], text: str) -> list[int] | None:
    """``ids`` when they decode to ``text`` (surrounding space aside), else None: the draft's text was cut from them
    (a '##' section, a blank first line) and only re-encoding the text says what it holds."""
    return ids if ids and model.tokenizer.decode(ids).strip() == text else None


def draft_prompts(
    drafter: TextModel, question: str, subsets: Sequence[Sequence[dict]], closed: ClosedSet | None = None
) -> tuple[list[int], list[list[int]]]:
    """Token ids of drafting's shared prefix and of each subset's evidence branch (progressive prefill too)."""
    prefix = drafter_prefix(question, closed)
    prefix_ids, _ = split_chat_prompt(drafter, prefix, "")
    suffixes = [split_chat_prompt(drafter, prefix, drafter_evidence(list(s), closed))[1] for s in subsets]
    return prefix_ids, suffixes


def write_drafts(
    drafter: TextModel,
    question: str,
    subsets: Sequence[Sequence[dict]],
    *,
    max_rationale_tokens: int = 64,
    max_answer_tokens: int = 24,
    sampling: SamplingParams = SamplingParams(),
    closed: ClosedSet | None = None,
) -> tuple[list[Draft], dict]:
    """One draft per subset, every phase batched over the m subsets with a shared prompt prefix.

    Phase 1 writes the rationale after the forced "## Rationale:" (P(beta | Q, docs)); phase 2 appends
    "## Response:" and writes the answer (P(alpha | Q, docs, beta)). Forcing the two tags makes the format
    hold for a drafter that was not fine-tuned on it; rho_draft is the sum of both phases' log-probs.
    ``closed``: the question's choices/instruction go into the prompt, and each answer becomes its exact label
    (a draft whose response gives no label keeps its text and counts as unparsed).
    """
    t0, compile_start = time.perf_counter(), thread_compile_stats()
    prefix_ids, suffixes = draft_prompts(drafter, question, subsets, closed)
    response_ids = drafter.tokenizer.encode("\n" + RESPONSE_TAG, add_bos=False)
    rationales: dict[int, tuple[str, float, int]] = {}
    rationale_ids: dict[int, list[int]] = {}
    refed: dict[int, int] = {}  # phase-2 tokens to prefill beyond the forced tag (a kept token never fed back)

    def between(_phase: int, row: int, res) -> tuple[int, list[int]]:
        # Keep the rationale's first line (without its line-ending token) and force "\n## Response:".
        keep = _line_end(drafter, res.token_ids)
        rationales[row] = (
            first_line(drafter.tokenizer.decode(res.token_ids[:keep])),
            float(sum(res.logprobs[:keep])),
            keep,
        )
        rationale_ids[row] = list(res.token_ids[:keep])
        refed[row] = int(keep == len(res.token_ids))
        return keep, response_ids

    gen = drafter.generator
    phases = [
        Phase(max_rationale_tokens, _stop_at_line_end(drafter)),
        Phase(max_answer_tokens, _stop_at_line_end(drafter)),
    ]
    # The branches keep their K/V between the phases: phase 2 prefills only the forced tag.
    t_submit = time.perf_counter()
    phase1, phase2 = gen.generate_phases(prefix_ids, suffixes, phases, between, sampling)
    phase2_prefill = len(response_ids) * len(suffixes) + sum(refed.values())
    drafts = []
    for i, (subset, res) in enumerate(zip(subsets, phase2)):
        rat, lp1, n1 = rationales[i]
        ans, lp2, n2 = _kept(drafter, res.token_ids, res.logprobs)
        label = ans if closed is None else closed.parse(ans)
        drafts.append(
            Draft(
                index=i,
                doc_ids=[str(d.get("id")) for d in subset],
                text=f"{RATIONALE_TAG} {rat}\n{RESPONSE_TAG} {ans}",
                rationale=rat,
                answer=label or ans,
                parsed=bool(rat and label),
                draft_logprob=lp1 + lp2,
                draft_tokens=n1 + n2,
                grounded=None if closed is not None else bool(rat and ans) and occurs_in_passages(ans, subset),
                rationale_ids=_ids_of(drafter, rationale_ids[i], rat),
                answer_ids=None if closed is not None else _ids_of(drafter, _text_ids(drafter, res.token_ids), ans),
            )
        )
    shared = phase1[0].shared_prefix_tokens if phase1 else 0
    stats = {
        "drafting_s": time.perf_counter() - t0,
        "drafting_compile_s": (thread_compile_stats() - compile_start).total_s,  # one-time XLA work inside it
        "drafter_prefill_tokens": sum(len(prefix_ids) + len(s) - shared for s in suffixes) + shared + phase2_prefill,
        "drafter_shared_prefix_tokens": shared,
        "drafter_decode_tokens": sum(len(r.token_ids) for r in phase1 + phase2),
        # the drafts decode together: each phase takes as many steps as its longest draft (the roofline's count)
        "drafter_decode_steps": max((len(r.token_ids) for r in phase1), default=0)
        + max((len(r.token_ids) for r in phase2), default=0),
        # the first draft token: the earliest branch's prefill end (executors time prefill from admission)
        "drafter_first_token_s": t_submit - t0 + min((r.prefill_s for r in phase1), default=0.0),
    }
    return drafts, stats
