"""SpecRAG: the Python API of the whole pipeline and its baselines.

auto (the default method): the router (``router.py``) decides per question, before drafting, between the exact path
(standard RAG's answer through lossless decoding with n-gram proposals) and the speculative cascade.
speculative (the cascade): retrieve -> passage vectors (``clustering.py``) -> k-means -> m subsets -> m drafts
in one batched generation -> one packed verifier pass (by default the paper's rho without documents, among the
drafts whose answer occurs in their own passages; or evidence-aware, each draft with its own passages;
``selection.py``) -> the selected draft, accepted when its confidence reaches
tau_min, else the cascade's fallback (standard RAG through the lossless path, reusing the drafts: exactly the
standard answer). Baselines in the same API: standard (all documents in the verifier's prompt), closed_book,
drafter_only (best rho_draft), random_draft (no verification). lossless: the standard answer decoded with
token-tree speculation over the drafts and n-grams (``lossless.py``): the same output, fewer verifier steps.
"""

from __future__ import annotations

import copy
import functools
import random
import time
from typing import Any, Callable, Sequence

from specrag_jax.compile_time import CompileClock
from specrag_jax.errors import SpecRagError
from specrag_jax.machine_peaks import platform_peaks
from specrag_jax.models.deferred_model import ensure_loaded
from specrag_jax.models.text_model import TextModel
from specrag_jax.pipeline.answer_generation import generate_answer, one_line
from specrag_jax.pipeline.answer_stream import AnswerStream
from specrag_jax.pipeline.closed_set import ClosedSet
from specrag_jax.pipeline.clustering import SubsetFn
from specrag_jax.pipeline.drafting import Draft, truncate_docs, write_drafts
from specrag_jax.pipeline.lossless import lossless_speculation, needs_drafts
from specrag_jax.pipeline.progressive import ProgressivePrefill, require_prefix_cache
from specrag_jax.pipeline.rag_answer import RAGAnswer
from specrag_jax.pipeline.rag_config import RAGConfig
from specrag_jax.pipeline.reranking import Scorer, rerank_documents
from specrag_jax.pipeline.router import EXACT_PROPOSER, Route, decide
from specrag_jax.pipeline.selection import (
    ScoreOptions,
    best,
    candidates,
    certain_fallback,
    consensus,
    eligible,
    grounds,
    needs_verification,
    score_drafts,
    select,
    selection_confidence,
    selection_for,
    selection_scores,
)
from specrag_jax.pipeline.shared_vocab import uses_shared_ids
from specrag_jax.pipeline.verification import verification_passes
from specrag_jax.pipeline.verifier_prompts import answer_prompt, use_chat
from specrag_jax.progress import NO_PROGRESS, Progress

METHODS = ("auto", "speculative", "standard", "closed_book", "drafter_only", "random_draft", "lossless")
DEFAULT_METHOD = "auto"
SearchFn = Callable[[str, int], list[dict]]
_AFTER_SEARCH = ("rerank_s", "prefill_wait_s")  # the stages of the retrieval span that are not the search


class SpecRAG:
    """Speculative RAG with a drafter and a verifier (TextModels), plus the baselines."""

    def __init__(
        self,
        drafter: TextModel,
        verifier: TextModel,
        *,
        subsets: SubsetFn,
        search: SearchFn | None = None,
        config: RAGConfig | None = None,
        progress: Progress | None = None,
        reranker: Scorer | None = None,
    ) -> None:
        self.drafter, self.verifier, self.reranker = drafter, verifier, reranker
        self.progress = progress or NO_PROGRESS  # stage callbacks (specrag_jax.progress); silent by default
        self.subsets_fn, self.search = subsets, search
        self.config = config or RAGConfig()
        self.config.check()
        if self.config.rerank != "none" and reranker is None:
            raise SpecRagError(
                f"rerank {self.config.rerank!r} needs a reranker (SpecRAG(..., reranker=...); build_specrag builds one)"
            )
        self._progressive = ProgressivePrefill(self, "", ())  # replaced per question (pipeline/progressive.py)
        self.drafter_adapter: str | None = None  # the adapter merged into the drafter (build_specrag sets it)
        if self.config.shared_vocab == "require":  # a one-line error now, not at the first question
            uses_shared_ids(drafter, verifier, "require")
        self._on_text: Callable[[str], None] | None = None  # answer(on_text=...) while it runs
        self._streamed: AnswerStream | None = None  # the answer that went to _on_text

    def answer(
        self,
        question: str,
        docs: Sequence[dict | str] | None = None,
        method: str = DEFAULT_METHOD,
        *,
        closed_set: ClosedSet | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> RAGAnswer:
        """Answer ``question`` from ``docs`` (or the search function's top ``n_docs``) with ``method``
        (``closed_set``: a closed-set question's choices; the answer is then its label, see closed_set).

        ``on_text``: the answer's text as the verifier decodes it, piece by piece (an accepted draft's answer, or a
        closed set's label, arrives whole at the end); the pieces joined are the answer as decoded (the returned answer
        strips its ends)."""
        self._on_text, self._streamed = on_text, None
        try:
            result = self.answer_methods(question, docs, [method], closed_set=closed_set)[method]
        finally:
            self._on_text, streamed, self._streamed = None, self._streamed, None
        if on_text is not None and streamed is None and result.answer:
            on_text(result.answer)
        return result

    def answer_methods(
        self,
        question: str,
        docs: Sequence[dict | str] | None = None,
        methods: Sequence[str] = (DEFAULT_METHOD,),
        *,
        closed_set: ClosedSet | None = None,
    ) -> dict[str, RAGAnswer]:
        """Answer with several methods; speculative, drafter_only and random_draft share one set of drafts.

        Each answer's ``trace["total_s"]`` is the time its own method needs: the shared stages (retrieval,
        clustering, drafting) plus its own selection; ``trace["compile_s"]`` is the one-time XLA compilation
        inside that time (``specrag eval`` reports latency without it).
        """
        if not isinstance(question, str) or not question.strip():
            raise SpecRagError("empty question")
        unknown = [m for m in methods if m not in METHODS]
        if unknown or not methods:
            raise SpecRagError(f"unknown method {(unknown or [''])[0]!r}; choose one of {', '.join(METHODS)}")
        out: dict[str, RAGAnswer] = {}
        if "closed_book" in methods:
            self.progress.start("closed-book answer")
            with CompileClock() as clock:
                t0 = time.perf_counter()
                trace: dict[str, Any] = {"notes": [], "retrieval_s": 0.0}
                out["closed_book"] = self._generate_answer(question, [], "closed_book", trace, t0, closed=closed_set)
            trace["compile_s"] = clock.seconds
            self._report_answer("closed-book answer", trace)
        rest = [m for m in methods if m != "closed_book"]
        if not rest:
            return out
        if "auto" in rest:
            platform_peaks()  # measured once per process on a CPU (~1 s), before the clock starts
        given = docs is not None
        self.progress.start("retrieval")
        with CompileClock() as clock:
            t0 = time.perf_counter()
            shared: dict[str, Any] = {"notes": []}
            docs = self._documents(question, docs, shared["notes"], shared, rest, closed_set)
            shared["retrieval_s"] = time.perf_counter() - t0 - sum(shared.get(k, 0.0) for k in _AFTER_SEARCH)
        shared["compile_s"] = clock.seconds
        self.progress.end(
            "retrieval", shared["retrieval_s"], f"{len(docs)} {'given' if given else 'retrieved'} passages"
        )
        if "standard" in rest:
            self.progress.start("standard RAG answer")
            out["standard"] = self._timed(
                lambda tr, t: self._generate_answer(question, docs, "standard", tr, t, closed=closed_set), shared, t0
            )
            self._report_answer("standard RAG answer", out["standard"].trace)
        if "lossless" in rest and not needs_drafts(self.config.proposer):
            out["lossless"] = self._timed(
                lambda tr, t: self._lossless(question, docs, [], tr, t, closed_set), shared, t0
            )
        before = shared["retrieval_s"] + sum(shared.get(k, 0.0) for k in _AFTER_SEARCH)  # the shared stages' time
        route = self._route(question, docs, closed_set) if "auto" in rest else None  # decided before any drafting
        if route is not None and route.path == "exact":
            run_exact = lambda tr, t: self._exact(question, docs, route, tr, t, closed_set)  # noqa: E731
            out["auto"] = self._timed(run_exact, shared, time.perf_counter() - before - route.decide_s)
        drafting = [m for m in rest if m != "standard" and m not in out]
        if drafting:
            if load_s := ensure_loaded(self.drafter):  # deferred until now (factory): a one-time load, not latency
                shared["drafter_load_s"] = load_s
                self.progress.note(f"drafter {self.drafter.name} loaded on first use: {load_s:.1f} s")
            with CompileClock() as clock:
                t = time.perf_counter()
                drafts = self._draft(question, docs, shared, closed_set)
            shared["compile_s"] += clock.seconds
            spent = time.perf_counter() - t + before
            shared["first_draft_token_s"] = before + shared["clustering_s"] + shared["drafter_first_token_s"]
            for m in drafting:
                own = copy.deepcopy(drafts) if len(drafting) > 1 else drafts
                if m == "lossless":
                    run = functools.partial(self._lossless, closed=closed_set)
                elif m == "auto":
                    run = functools.partial(self._cascade, route=route, closed=closed_set)
                else:
                    run = functools.partial(self._select, method=m, closed=closed_set)
                own_s = spent + (route.decide_s if m == "auto" and route is not None else 0.0)
                out[m] = self._timed(
                    lambda tr, t, run=run, own=own: run(question, docs, own, tr, t), shared, time.perf_counter() - own_s
                )
        return {m: out[m] for m in methods}

    @property
    def verifier_chat(self) -> bool:
        """Whether the verifier's prompts go through its chat template (RAGConfig.verifier_prompt)."""
        return use_chat(self.config.verifier_prompt, getattr(self.verifier, "instruct", False))

    # ------------------------------------------------------------------ stages
    @property
    def shared_ids(self) -> bool:
        """Drafts travel as the drafter's token ids (it shares the verifier's vocabulary; ``config.shared_vocab``)."""
        return uses_shared_ids(self.drafter, self.verifier, self.config.shared_vocab)

    def _report_answer(self, stage: str, trace: dict, more: str = "") -> None:
        self.progress.end(
            stage,
            trace.get("generation_s", 0.0),
            f"{trace.get('verifier_prefill_tokens', 0)} prompt + {trace.get('verifier_decode_tokens', 0)} new tokens"
            + more,
        )

    def _timed(self, fn: Callable[[dict, float], RAGAnswer], shared: dict, t0: float) -> RAGAnswer:
        """Run one method's own stage on a copy of the shared trace; its compile time is added to the trace."""
        trace = copy.deepcopy(shared)
        with CompileClock() as clock:
            result = fn(trace, t0)
        result.trace["compile_s"] = shared["compile_s"] + clock.seconds
        if "route" in (tr := result.trace):  # the predicted stages' measured time: no compile, search or decision
            shared_s = tr["retrieval_s"] + sum(tr.get(k, 0.0) for k in _AFTER_SEARCH) + tr["route"]["decide_s"]
            tr["route"]["measured_s"] = round(tr["total_s"] - tr["compile_s"] - shared_s, 4)
        return result

    def _documents(
        self,
        question: str,
        docs: Sequence[dict | str] | None,
        notes: list[str],
        trace: dict | None = None,
        methods: Sequence[str] = ("speculative",),
        closed: ClosedSet | None = None,
    ) -> list[dict]:
        """The ``n_docs`` documents the methods read: given or searched, reranked when ``config.rerank``."""
        cfg = self.config
        if docs is None:
            if self.search is None:
                raise SpecRagError("no documents given and no corpus to search")
            docs = self.search(question, cfg.n_docs if cfg.rerank == "none" else cfg.n_coarse)
        docs = [d if isinstance(d, dict) else {"id": str(i), "title": "", "text": d} for i, d in enumerate(docs)]
        docs = [{**d, "id": str(d.get("id", i))} for i, d in enumerate(docs)]
        if not docs:
            raise SpecRagError("no documents: the question came without passages and the search found none")
        trace = {} if trace is None else trace
        require_prefix_cache(cfg.progressive_prefill, self.drafter, self.verifier)
        progressive = self._progressive = ProgressivePrefill(self, question, methods, closed)
        with progressive:  # closing it cancels what is in flight (errors included)
            if cfg.rerank != "none":  # with progressive prefill, the prompts prefill while reranking goes on
                docs = rerank_documents(question, docs, self.reranker, cfg, trace, self.progress, progressive)
            trace["documents"] = [d["id"] for d in docs[: cfg.n_docs]]
            docs = truncate_docs(self.drafter, docs[: cfg.n_docs], cfg.max_doc_tokens, notes)
            progressive.settle(docs, trace)  # when on, trace gets "progressive" and "prefill_wait_s"
        return docs

    def _generate_answer(
        self,
        question: str,
        docs: list[dict],
        method: str,
        trace: dict,
        t0: float,
        drafts: Sequence[Draft] | None = None,
        closed: ClosedSet | None = None,
        proposer: str | None = None,
    ) -> RAGAnswer:
        """The verifier's answer from all ``docs``; with ``drafts`` (lossless) decoded with speculation (``proposer``,
        default the config's); with ``closed`` the answer is the label it gives (its first line when it gives none)."""
        prompt = answer_prompt(self.verifier.tokenizer, question, docs, self.verifier_chat, closed)
        speculation = None
        if drafts is not None:
            speculation = lossless_speculation(
                self.verifier.tokenizer,
                drafts,
                proposer or self.config.proposer,
                self.config.tree_budget,
                bool(drafts) and self.shared_ids,
            )
        stream = None
        if self._on_text is not None and closed is None:  # only one of answer()'s answers is generated here
            stream = self._streamed = AnswerStream(self._on_text, one_line(self.config))
        answer = generate_answer(self.verifier, self.config, prompt, trace, speculation, closed, stream)
        trace["total_s"] = time.perf_counter() - t0
        return RAGAnswer(answer, "", [d["id"] for d in docs], [], trace, method, docs)

    def _draft(self, question: str, docs: list[dict], trace: dict, closed: ClosedSet | None = None) -> list[Draft]:
        cfg = self.config
        t = time.perf_counter()
        self.progress.start("clustering")
        subsets, info = self._progressive.subsets(question, docs, cfg.k, cfg.m, cfg.seed)  # memoised subsets_fn
        trace.update(clustering_s=time.perf_counter() - t, num_subsets=len(subsets), **info)
        self.progress.end(
            "clustering",
            trace["clustering_s"],
            f"{len(docs)} docs -> k={info.get('clusters', cfg.k)} clusters, {len(subsets)} subsets",
        )
        self.progress.start("drafting")
        drafts, stats = write_drafts(
            self.drafter,
            question,
            [[docs[i] for i in s] for s in subsets],
            max_rationale_tokens=cfg.max_draft_tokens,
            max_answer_tokens=cfg.max_draft_answer_tokens,
            closed=closed,
        )
        trace.update(stats)
        trace["parsed_drafts"] = sum(d.parsed for d in drafts)
        self.progress.end(
            "drafting",
            stats.get("drafting_s", 0.0),
            f"{len(drafts)} drafts ({trace['parsed_drafts']} "
            f"parsed), {stats.get('drafter_prefill_tokens', 0)} prompt + "
            f"{stats.get('drafter_decode_tokens', 0)} new tokens",
        )
        return drafts

    def _lossless(
        self,
        question: str,
        docs: list[dict],
        drafts: list[Draft],
        trace: dict,
        t0: float,
        closed: ClosedSet | None = None,
    ) -> RAGAnswer:
        result = self._speculated("lossless answer", question, docs, drafts, trace, t0, "lossless", closed)
        result.drafts = drafts
        return result

    def _speculated(
        self,
        stage: str,
        question: str,
        docs: list[dict],
        drafts: list[Draft],
        trace: dict,
        t0: float,
        method: str,
        closed: ClosedSet | None = None,
        proposer: str | None = None,
    ) -> RAGAnswer:
        """The verifier's standard answer through lossless decoding (proposals from ``drafts`` and n-grams, or
        ``proposer``), reported as ``stage``."""
        self.progress.start(stage)
        result = self._generate_answer(
            question, docs, method, trace, t0, drafts=drafts, closed=closed, proposer=proposer
        )
        steps, per_step = trace["speculation"]["steps"], trace["speculation"]["accepted_tokens_per_step"]
        self._report_answer(stage, trace, f" in {steps} decode steps ({per_step:.2f} per step)")
        return result

    def _route(self, question: str, docs: list[dict], closed: ClosedSet | None) -> Route:
        """The router's decision for this question (``router.decide`` on the running platform)."""
        cfg = self.config
        options = dict(
            m=cfg.m, k=cfg.k, max_loss=cfg.router_max_loss, margin=cfg.router_margin, answer_stop=cfg.answer_stop
        )
        route = decide(self.drafter, self.verifier, question, docs, chat=self.verifier_chat, closed=closed, **options)
        self.progress.note(f"route: {route.path}: {route.reason}")
        return route

    def _exact(
        self, question: str, docs: list[dict], route: Route, trace: dict, t0: float, closed: ClosedSet | None = None
    ) -> RAGAnswer:
        """The router's exact path: standard RAG's answer through lossless decoding with n-gram proposals."""
        trace.update(route=route.to_dict(), path="exact")
        return self._speculated("exact answer", question, docs, [], trace, t0, "auto", closed, EXACT_PROPOSER)

    def _cascade(
        self,
        question: str,
        docs: list[dict],
        drafts: list[Draft],
        trace: dict,
        t0: float,
        *,
        route: Route,
        closed: ClosedSet | None = None,
    ) -> RAGAnswer:
        """The router's cascade path: the speculative method's answer, recorded as ``auto`` with its route."""
        trace["route"] = route.to_dict()
        result = self._select(question, docs, drafts, trace, t0, method="speculative", closed=closed)
        result.method = "auto"
        return result

    def _select(
        self,
        question: str,
        docs: list[dict],
        drafts: list[Draft],
        trace: dict,
        t0: float,
        *,
        method: str,
        closed: ClosedSet | None = None,
    ) -> RAGAnswer:
        cfg = self.config
        # closed-set questions: the drafts' labels always pool their scores (answer-level aggregation)
        selection = selection_for(cfg.selection, closed is not None)
        if method == "random_draft":
            chosen = random.Random(cfg.seed).choice(drafts)
        elif method == "drafter_only":
            score_drafts(drafts, ScoreOptions(cfg.scores.normalize, ("draft",), cfg.scores.sr))
            chosen = best(drafts)
        elif cfg.consensus and consensus(drafts, grounded=grounds(selection)):
            trace["consensus"] = True
            trace["path"] = "consensus"
            self.progress.note("verification: skipped, all drafts agree")
            score_drafts(drafts, ScoreOptions(cfg.scores.normalize, ("draft",), cfg.scores.sr))
            chosen = best(candidates(drafts, selection))  # consensus under +ground: some draft is eligible
        else:
            trace["selection"] = selection
            bound = certain_fallback(drafts, selection, cfg.tau_min) if cfg.early_fallback else None
            if bound is not None:  # no draft can be accepted, whatever the verifier says: skip verifying
                trace["confidence_bound"] = bound
                why = f"at most {bound:.0%} of the drafts agree, support <= {bound:.2f} < tau_min {cfg.tau_min}"
                if grounds(selection) and not any(eligible(d) for d in drafts):
                    why = "no draft's answer occurs in its own passages"
                self.progress.note(f"verification skipped: {why}")
                return self._fall_back(question, docs, drafts, trace, t0, method, closed)
            self.verify(
                question,
                docs,
                drafts,
                trace,
                *needs_verification(selection_scores(selection, cfg.scores)),
                closed_set=closed,
            )
            chosen = select(drafts, selection, cfg.scores)
            conf = selection_confidence(chosen, drafts, selection)
            trace["confidence"] = conf
            trace["chosen_draft"] = chosen.index  # also on the fallback path: the draft that was not accepted
            if cfg.tau_min is not None and conf < cfg.tau_min:
                self.progress.note(f"confidence {conf:.2f} < tau_min {cfg.tau_min}: {cfg.fallback} fallback")
                return self._fall_back(question, docs, drafts, trace, t0, method, closed)
        trace["chosen_draft"] = chosen.index
        trace.setdefault("path", "verified_draft" if method == "speculative" else method)
        trace["total_s"] = time.perf_counter() - t0
        return RAGAnswer(chosen.answer, chosen.rationale, chosen.doc_ids, drafts, trace, method, docs)

    def _fall_back(
        self,
        question: str,
        docs: list[dict],
        drafts: list[Draft],
        trace: dict,
        t0: float,
        method: str,
        closed: ClosedSet | None,
    ) -> RAGAnswer:
        """The cascade's fallback: standard RAG (through the lossless path over the drafts: the same answer) or
        "unanswerable"."""
        trace["fallback"] = self.config.fallback
        trace["path"] = "fallback"
        if self.config.fallback == "standard":
            reuse = drafts if self.config.lossless_fallback else None
            fb = self._generate_answer(question, docs, method, trace, t0, drafts=reuse, closed=closed)
            fb.drafts = drafts
            return fb
        trace["total_s"] = time.perf_counter() - t0
        return RAGAnswer("unanswerable", "", [], drafts, trace, method, docs)

    def verify(
        self,
        question: str,
        docs: list[dict],
        drafts: list[Draft],
        trace: dict,
        plain: bool = True,
        evidence: bool = False,
        closed_set: ClosedSet | None = None,
    ) -> None:
        """Run the verification passes asked for on ``drafts`` (``plain``: question + draft, rho's terms;
        ``evidence``: each draft's own passages from ``docs`` + draft); their stage times go into ``trace``
        (``closed_set``: the question's choices, as in ``answer``)."""
        verification_passes(
            self.verifier,
            self.progress,
            question,
            docs,
            drafts,
            trace,
            chat=self.verifier_chat,
            shared_ids=self.shared_ids,
            plain=plain,
            evidence=evidence,
            closed=closed_set,
        )
