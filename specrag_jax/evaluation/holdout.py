"""A stratified, reproducible train / held-out split of question rows (drafter training vs evaluation).

Within each ``data_source`` the rows are ranked by a hash of ``(seed, question_id or question)`` and the last
``round(fraction * n)`` of each source are held out, so both parts span every source (the dev file is sorted by
source: a plain offset would hold out two sources and train on none of their questions). The split depends only
on the rows' identities, not on file order, and ``make-drafter-data`` and ``eval`` take the same flags, so the
questions an adapter was trained on can never leak into its evaluation.

The train part splits once more the same way (a second hash, ``CALIBRATION_FRACTION`` of each source): the
drafter learns from ``train-fit`` and the defaults (selection, thresholds) are chosen on ``train-calibrate``,
questions the drafter never saw, so a threshold is not set on the answers it memorised; ``heldout`` is untouched.
"""

from __future__ import annotations

import argparse
import hashlib
from typing import Sequence

from specrag_jax.errors import SpecRagError

SPLITS = ("all", "train", "heldout", "train-fit", "train-calibrate")
DEFAULT_HOLDOUT_FRACTION = 0.3
CALIBRATION_FRACTION = 0.3  # of the train part, per source
_CALIBRATION_SEED_OFFSET = 1  # the second split ranks by another hash


def _rank_key(row: dict, seed: int) -> str:
    ident = row.get("question_id")
    ident = str(row.get("question", "") if ident is None else ident)
    return hashlib.sha1(f"{seed}:{ident}".encode("utf-8")).hexdigest()


def heldout_indices(rows: Sequence[dict], fraction: float = DEFAULT_HOLDOUT_FRACTION, seed: int = 0) -> set[int]:
    """Indices of the held-out rows: per source, the ``round(fraction * n)`` rows with the largest hash rank."""
    if not 0.0 <= fraction <= 1.0:
        raise SpecRagError(f"--holdout-fraction must be in [0, 1] (got {fraction})")
    by_source: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_source.setdefault(str(row.get("data_source", "")), []).append(i)
    held: set[int] = set()
    for indices in by_source.values():
        ranked = sorted(indices, key=lambda i: _rank_key(rows[i], seed))
        n_held = int(round(fraction * len(ranked)))
        held.update(ranked[len(ranked) - n_held :])
    return held


def split_rows(
    rows: Sequence[dict], split: str, fraction: float = DEFAULT_HOLDOUT_FRACTION, seed: int = 0
) -> list[dict]:
    """The rows of ``split`` (one of ``SPLITS``) in their original order.

    ``train-fit`` and ``train-calibrate`` partition ``train``: per source, ``CALIBRATION_FRACTION`` of its train
    rows (by a second hash rank) calibrate, the rest fit."""
    if split not in SPLITS:
        raise SpecRagError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    if not 0.0 <= fraction <= 1.0:
        raise SpecRagError(f"--holdout-fraction must be in [0, 1] (got {fraction})")
    if split == "all":
        return list(rows)
    held = heldout_indices(rows, fraction, seed)
    if split == "heldout":
        return [row for i, row in enumerate(rows) if i in held]
    train = [row for i, row in enumerate(rows) if i not in held]
    if split == "train":
        return train
    calibrate = heldout_indices(train, CALIBRATION_FRACTION, seed + _CALIBRATION_SEED_OFFSET)
    keep_calibrate = split == "train-calibrate"
    return [row for i, row in enumerate(train) if (i in calibrate) == keep_calibrate]


def add_split_options(parser: argparse.ArgumentParser) -> None:
    """``--split`` and ``--holdout-fraction``, shared by ``make-drafter-data`` and ``eval``."""
    parser.add_argument(
        "--split",
        default="all",
        choices=SPLITS,
        help="rows to use: all, or the train / heldout part of a stratified split (per data_source, "
        "by a hash of question_id; make-drafter-data --split train pairs with eval --split "
        "heldout); train-fit / train-calibrate split train again (drafter data / choosing defaults)",
    )
    parser.add_argument(
        "--holdout-fraction",
        type=float,
        default=DEFAULT_HOLDOUT_FRACTION,
        help=f"share of each source held out by --split (default {DEFAULT_HOLDOUT_FRACTION})",
    )
