"""The router's acceptance predictor: from what is known before drafting, how likely the cascade is to accept a draft.

Features (``route_features``) need no model: the passages' count and length, the question's length, and each
passage's lexical match with the question (BM25 within the retrieved set, and the share of the question's terms it
holds): the retrieval scores and their spread. Three L2-regularised logistic regressions on the standardised
features (``AcceptancePredictor``) give, for one question:

- ``accept``: the cascade accepts a draft (it skips the verifier's own answer);
- ``accept_right``: it accepts a draft and the draft is right;
- ``accept_standard_right``: it accepts a draft where standard RAG's answer would have been right.

``accept_right - accept_standard_right`` is the cascade's expected change of accuracy against standard RAG (the
fallback *is* standard RAG's answer, so only accepted drafts move it). They are fitted on a train split's eval
predictions (``benchmarks/calibrate_router.py``) and judged by ``calibration`` on questions they never saw.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.retrieval.corpus import doc_text
from specrag_jax.retrieval.lexical import LexicalIndex, tokenize

FEATURES = (
    "log_docs",
    "log_passage_words",
    "log_question_words",
    "bm25_max",
    "bm25_spread",
    "coverage_max",
    "coverage_mean",
)
TARGETS = ("accept", "accept_right", "accept_standard_right")


def route_features(question: str, docs: Sequence[dict]) -> dict[str, float]:
    """The predictor's inputs for ``question`` over its retrieved ``docs`` (no model pass; milliseconds)."""
    texts = [doc_text(d) for d in docs]
    words = sum(len(t.split()) for t in texts)
    terms = set(tokenize([question])[0])
    if texts and terms:
        scores = LexicalIndex.build(docs).scores(question).astype(np.float64)
        covered = [len(terms & set(toks)) / len(terms) for toks in tokenize(texts)]
    else:
        scores, covered = np.zeros(max(len(texts), 1)), [0.0]
    return {
        "log_docs": math.log1p(len(texts)),
        "log_passage_words": math.log1p(words),
        "log_question_words": math.log1p(len(question.split())),
        "bm25_max": float(scores.max()),
        "bm25_spread": float(scores.max() - scores.mean()),
        "coverage_max": float(max(covered)),
        "coverage_mean": float(np.mean(covered)),
    }


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1.0, iters: int = 100) -> tuple[np.ndarray, float]:
    """Coefficients and intercept of ``P(y=1|x) = sigmoid(x @ coef + b)`` by Newton's method, with ``l2 / 2 *
    |coef|^2`` added to the negative log-likelihood (the intercept is not penalised)."""
    n, d = x.shape
    if n == 0 or len(y) != n:
        raise SpecRagError(f"fit_logistic needs as many labels as rows (got {n} rows, {len(y)} labels)")
    a = np.hstack([x, np.ones((n, 1))])
    w = np.zeros(d + 1)
    penalty = np.full(d + 1, l2)
    penalty[-1] = 0.0
    for _ in range(iters):
        p = _sigmoid(a @ w)
        grad = a.T @ (p - y) + penalty * w
        hess = (a * (p * (1 - p))[:, None]).T @ a + np.diag(penalty) + 1e-9 * np.eye(d + 1)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.max(np.abs(step)) < 1e-10:
            break
    return w[:-1], float(w[-1])


@dataclasses.dataclass(frozen=True)
class AcceptancePredictor:
    """``TARGETS``' logistic models over ``FEATURES`` standardised by ``mean`` and ``scale``."""

    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: Mapping[str, tuple[float, ...]]
    intercept: Mapping[str, float]
    low: tuple[float, ...]  # each feature's training range: a question outside it (more passages than any training
    high: tuple[float, ...]  # question had) is predicted at the range's edge, never extrapolated

    def predict(self, features: Mapping[str, float]) -> dict[str, float]:
        """Each target's probability for one question's ``route_features``."""
        x = np.clip([features[f] for f in FEATURES], self.low, self.high)
        z = (x - np.array(self.mean)) / np.array(self.scale)
        return {t: float(_sigmoid(z @ np.array(self.coef[t]) + self.intercept[t])) for t in TARGETS}

    @classmethod
    def fit(
        cls,
        rows: Sequence[Mapping[str, float]],
        labels: Mapping[str, Sequence[bool]],
        l2: float | Mapping[str, float] = 1.0,
    ):
        """Fit every target on the same questions' features (``labels[target][i]`` is question i's outcome), with
        one L2 penalty or one per target."""
        missing = [t for t in TARGETS if t not in labels]
        if missing:
            raise SpecRagError(f"labels for {missing[0]!r} are missing (need {', '.join(TARGETS)})")
        x = np.array([[r[f] for f in FEATURES] for r in rows], np.float64)
        mean = x.mean(axis=0)
        scale = np.where(x.std(axis=0) > 1e-12, x.std(axis=0), 1.0)
        z = (x - mean) / scale
        coef, intercept = {}, {}
        for t in TARGETS:
            c, b = fit_logistic(z, np.asarray(labels[t], np.float64), l2 if isinstance(l2, (int, float)) else l2[t])
            coef[t], intercept[t] = tuple(float(v) for v in c), b
        floats = lambda v: tuple(float(a) for a in v)  # noqa: E731
        return cls(floats(mean), floats(scale), coef, intercept, floats(x.min(axis=0)), floats(x.max(axis=0)))

    def to_dict(self) -> dict:
        return {
            "features": list(FEATURES),
            "mean": list(self.mean),
            "scale": list(self.scale),
            "coef": {t: list(v) for t, v in self.coef.items()},
            "intercept": dict(self.intercept),
            "low": list(self.low),
            "high": list(self.high),
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> "AcceptancePredictor":
        if list(d.get("features", [])) != list(FEATURES):
            raise SpecRagError(f"router calibration has features {d.get('features')}, this code reads {FEATURES}")
        vectors = [d["mean"], d["scale"], d["low"], d["high"], *(d["coef"][t] for t in TARGETS)]
        if any(len(v) != len(FEATURES) or not all(math.isfinite(float(x)) for x in v) for v in vectors):
            raise SpecRagError(f"router calibration: every predictor vector needs {len(FEATURES)} finite numbers")
        return cls(
            tuple(d["mean"]),
            tuple(d["scale"]),
            {t: tuple(d["coef"][t]) for t in TARGETS},
            {t: float(d["intercept"][t]) for t in TARGETS},
            tuple(d["low"]),
            tuple(d["high"]),
        )


def loo_log_loss(rows: Sequence[Mapping[str, float]], labels: Sequence[bool], l2: float) -> float:
    """Leave-one-out log loss of one target's fit at penalty ``l2``: how it predicts questions it did not see
    (standardised on the other questions, as ``AcceptancePredictor.fit`` does)."""
    x = np.array([[r[f] for f in FEATURES] for r in rows], np.float64)
    y = np.asarray(labels, np.float64)
    losses = []
    for i in range(len(x)):
        keep = np.arange(len(x)) != i
        mean, std = x[keep].mean(axis=0), x[keep].std(axis=0)
        scale = np.where(std > 1e-12, std, 1.0)
        coef, b = fit_logistic((x[keep] - mean) / scale, y[keep], l2)
        z = (np.clip(x[i], x[keep].min(axis=0), x[keep].max(axis=0)) - mean) / scale
        p = float(np.clip(_sigmoid(z @ coef + b), 1e-6, 1 - 1e-6))
        losses.append(-math.log(p if y[i] else 1 - p))
    return float(np.mean(losses))


def calibration(predicted: Sequence[float], observed: Sequence[bool], bins: int = 3) -> dict:
    """How well probabilities match outcomes: Brier score against always predicting the observed rate, log loss,
    and a reliability table (questions sorted by prediction into ``bins`` groups of near-equal size)."""
    p = np.clip(np.asarray(predicted, np.float64), 1e-6, 1 - 1e-6)
    y = np.asarray(observed, np.float64)
    if len(p) != len(y):
        raise SpecRagError(f"calibration needs one outcome per prediction ({len(p)} vs {len(y)})")
    if len(p) == 0:
        return {"n": 0}
    rate = float(y.mean())
    order = np.argsort(p, kind="stable")
    table = [
        {"n": int(len(g)), "predicted": float(p[g].mean()), "observed": float(y[g].mean())}
        for g in np.array_split(order, min(bins, len(p)))
        if len(g)
    ]
    return {
        "n": int(len(p)),
        "mean_predicted": float(p.mean()),
        "observed_rate": rate,
        "brier": float(np.mean((p - y) ** 2)),
        "brier_of_observed_rate": float(np.mean((rate - y) ** 2)),
        "log_loss": float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))),
        "reliability": table,
    }
