"""``RAGConfig``: every setting of one SpecRAG pipeline, checked in one place, and the cascade's defaults."""

from __future__ import annotations

import dataclasses

from specrag_jax.errors import SpecRagError
from specrag_jax.models.speculative.tree import default_tree_budget
from specrag_jax.pipeline.clustering import check_clustering, check_subsets
from specrag_jax.pipeline.lossless import check_lossless
from specrag_jax.pipeline.progressive import check_progressive
from specrag_jax.pipeline.reranking import check_rerank
from specrag_jax.pipeline.router import check_router
from specrag_jax.pipeline.selection import ScoreOptions, check_selection
from specrag_jax.pipeline.shared_vocab import check_shared_vocab
from specrag_jax.pipeline.verifier_prompts import check_prompt_form

# the cascade's defaults, chosen on the train-calibrate split with a drafter that never saw it
# (benchmarks/choose_cascade.py --candidates all --smooth 2: benchmarks/results/cascade_choice_ground.json)
DEFAULT_SELECTION = "rho+ground"
DEFAULT_TAU_MIN: float | None = 0.41
DEFAULT_CLUSTERING = "lexical"  # tied the drafter's embeddings on the train split, no model pass (clustering_train)
DEFAULT_CONSENSUS = False  # the all-agree fast path (accepting unanimous drafts unverified) lost accuracy there

# The answer a person reads runs to the verifier's end of turn ("turn"); the budget is a cap, chosen on the train split
# as twice its longest answer (88 tokens; benchmarks/answer_length.py: benchmarks/results/answer_length.json).
# The paper's short-answer benchmarks keep their setting ("line": the first line, 32 tokens); `specrag eval` uses it.
ANSWER_STOPS = ("turn", "line")
DEFAULT_ANSWER_TOKENS = 192
PAPER_ANSWER_TOKENS = 32
DRAFT_ANSWER_TOKENS = 32  # a draft's answer is one short line, whatever the final answer's form


def check_answer(max_answer_tokens: int, answer_stop: str, max_draft_answer_tokens: int) -> None:
    """One-line errors for the answer's budget and form."""
    if max_answer_tokens < 1:
        raise SpecRagError(f"max_answer_tokens must be >= 1 (got {max_answer_tokens})")
    if max_draft_answer_tokens < 1:
        raise SpecRagError(f"max_draft_answer_tokens must be >= 1 (got {max_draft_answer_tokens})")
    if answer_stop not in ANSWER_STOPS:
        raise SpecRagError(f"answer_stop must be one of {', '.join(ANSWER_STOPS)} (got {answer_stop!r})")


@dataclasses.dataclass
class RAGConfig:
    n_docs: int = 10
    m: int = 5
    k: int = 2
    max_draft_tokens: int = 64  # a draft's rationale budget
    max_draft_answer_tokens: int = DRAFT_ANSWER_TOKENS  # a draft's answer budget
    max_answer_tokens: int = DEFAULT_ANSWER_TOKENS  # the final answer's budget (a cap: "turn" ends at end of turn)
    answer_stop: str = "turn"  # "turn": the whole reply up to end of turn | "line": its first line (paper tasks)
    max_doc_tokens: int = 160
    scores: ScoreOptions = ScoreOptions()
    selection: str = DEFAULT_SELECTION  # selection.SELECTIONS: rho | evidence [+agg] [+ground]
    tau_min: float | None = DEFAULT_TAU_MIN
    fallback: str = "standard"  # or "unanswerable"
    consensus: bool = DEFAULT_CONSENSUS
    seed: int = 0
    verifier_prompt: str = "auto"  # "chat" | "plain" | "auto" (chat for an instruction-tuned verifier)
    proposer: str = "both"  # lossless mode's proposer: "ngram" | "drafts" | "both"
    # lossless mode's (and the lossless fallback's) largest token tree per verifier step: 8, 16, 32 or 64
    tree_budget: int = dataclasses.field(default_factory=default_tree_budget)  # 8 on CPU, 16 on GPU / TPU
    lossless_fallback: bool = True  # the tau_min "standard" fallback decodes through the lossless path
    # fall back before verifying when no draft's support can reach tau_min (selection.certain_fallback): the same
    # answer without the verification pass
    early_fallback: bool = True
    rerank: str = "none"  # "none" | "kv" (stored document K/V) | "recompute" (pipeline/reranking.py)
    reranker: str | None = None  # the reranker's model name; None = the drafter
    n_coarse: int = 50  # coarse (BM25) candidates reranked when the question comes without passages
    rerank_group: int = 10  # candidates the fine reranker scores per group
    rerank_patience: int = 2  # stop once the fine top-n_docs set is unchanged this many groups (math.inf: never)
    progressive_prefill: int = 0  # N > 0: prefill once the top set is stable N groups (pipeline/progressive.py)
    clustering: str = DEFAULT_CLUSTERING  # "drafter" | "lexical": the vectors k-means groups (pipeline/clustering.py)
    subsets: str = "sample"  # "sample" (one passage per cluster per draft) | "cover" (the drafts hold every passage)
    # the router (method "auto", pipeline/router.py): the cascade's largest expected accuracy loss against standard
    # RAG it accepts, and how much faster than the exact path it must be expected to be (a fraction)
    router_max_loss: float = 0.0
    router_margin: float = 0.0
    # drafts as the drafter's token ids when it shares the verifier's vocabulary (pipeline/shared_vocab.py):
    # "auto" | "require" (an error at build when the vocabularies differ) | "off" (always re-tokenise the text)
    shared_vocab: str = "auto"

    def check(self) -> None:
        if self.n_docs < 1:
            raise SpecRagError(f"n_docs must be >= 1 (got {self.n_docs})")
        if self.m < 1:
            raise SpecRagError(f"m (number of drafts) must be >= 1 (got {self.m})")
        if self.k < 1:
            raise SpecRagError(f"k (number of clusters) must be >= 1 (got {self.k})")
        if self.fallback not in ("standard", "unanswerable"):
            raise SpecRagError(f"fallback must be 'standard' or 'unanswerable' (got {self.fallback!r})")
        check_answer(self.max_answer_tokens, self.answer_stop, self.max_draft_answer_tokens)
        check_prompt_form(self.verifier_prompt)
        check_selection(self.selection)
        check_clustering(self.clustering)
        check_subsets(self.subsets)
        check_lossless(self.proposer, self.tree_budget)
        check_rerank(self.rerank, self.reranker, self.n_coarse, self.rerank_group, self.rerank_patience)
        check_progressive(self.progressive_prefill, self.rerank, self.rerank_patience)
        check_router(self.router_max_loss, self.router_margin)
        check_shared_vocab(self.shared_vocab)
        if self.tau_min is not None and not 0.0 <= self.tau_min <= 1.0:
            raise SpecRagError(f"tau_min must be in [0, 1] (got {self.tau_min})")
