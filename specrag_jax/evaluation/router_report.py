"""The eval JSON's ``methods.auto.router``: which path the router took, its predicted against its measured time,
and (when the same eval ran the cascade and standard RAG) how well its acceptance predictions are calibrated."""

from __future__ import annotations

import statistics
from typing import Mapping, Sequence

from specrag_jax.pipeline.route_predictor import TARGETS, calibration
from specrag_jax.pipeline.router import ROUTE_PATHS


def cascade_outcome(cascade_path: str | None, cascade_right: bool, standard_right: bool) -> dict[str, bool]:
    """One question's ``route_predictor.TARGETS`` from the cascade's path and both methods' correctness."""
    accepted = cascade_path is not None and cascade_path != "fallback"
    return {
        "accept": accepted,
        "accept_right": accepted and cascade_right,
        "accept_standard_right": accepted and standard_right,
    }


def router_summary(routes: Sequence[Mapping], outcomes: Sequence[Mapping[str, bool]] | None = None) -> dict:
    """``routes``: each question's trace ``route`` (with ``measured_s``); ``outcomes``: each question's
    ``cascade_outcome`` (None when the eval did not run both the cascade and standard RAG)."""
    if not routes:
        return {"n": 0}
    taken = [r["path"] for r in routes]
    predicted = [float(r["predicted_s"][r["path"]]) for r in routes]
    measured = [float(r.get("measured_s", 0.0)) for r in routes]
    out: dict = {
        "n": len(routes),
        "paths": {p: taken.count(p) for p in ROUTE_PATHS},
        "predicted_s_mean": statistics.fmean(predicted),
        "measured_s_mean": statistics.fmean(measured),
        "measured_over_predicted": statistics.fmean(measured) / statistics.fmean(predicted) if any(predicted) else None,
        "predicted_cascade_over_exact": statistics.fmean(
            r["predicted_s"]["cascade"] / r["predicted_s"]["exact"] for r in routes
        ),
        "break_even_accept_mean": statistics.fmean(float(r["break_even_accept"]) for r in routes),
        "mean_acceptance": {t: statistics.fmean(float(r["acceptance"][t]) for r in routes) for t in TARGETS},
    }
    if outcomes is not None and len(outcomes) == len(routes):
        out["calibration"] = {
            t: calibration([float(r["acceptance"][t]) for r in routes], [o[t] for o in outcomes]) for t in TARGETS
        }
    return out
