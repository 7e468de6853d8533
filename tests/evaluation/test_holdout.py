"""The stratified train / held-out split shared by make-drafter-data and eval."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrag_jax.errors import SpecRagError
from specrag_jax.evaluation.holdout import CALIBRATION_FRACTION, heldout_indices, split_rows


def _rows(counts: dict[str, int]) -> list[dict]:
    return [
        {"question_id": f"{s}_{i}", "data_source": s, "question": f"q {s} {i}"}
        for s, n in counts.items()
        for i in range(n)
    ]


def test_sorted_file_splits_every_source():
    rows = _rows({s: 20 for s in ("a", "b", "c", "d", "e")})  # sorted by source, like the dev file
    held, train = split_rows(rows, "heldout"), split_rows(rows, "train")
    assert len(held) == 30 and len(train) == 70
    assert Counter(r["data_source"] for r in held) == {s: 6 for s in "abcde"}
    assert not {r["question_id"] for r in held} & {r["question_id"] for r in train}
    assert split_rows(rows, "all") == rows


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 30), min_size=1),
    st.floats(0.0, 1.0),
    st.integers(0, 5),
    st.randoms(use_true_random=False),
)
def test_partition_order_free_and_stratified(counts, fraction, seed, rnd: random.Random):
    rows = _rows(counts)
    held = split_rows(rows, "heldout", fraction, seed)
    train = split_rows(rows, "train", fraction, seed)
    assert sorted(r["question_id"] for r in held + train) == sorted(r["question_id"] for r in rows)
    for s, n in counts.items():  # each source holds out round(fraction * n) of its rows
        assert sum(r["data_source"] == s for r in held) == int(round(fraction * n))
    shuffled = list(rows)
    rnd.shuffle(shuffled)  # membership depends on the rows, not on the file order
    assert {r["question_id"] for r in split_rows(shuffled, "heldout", fraction, seed)} == {
        r["question_id"] for r in held
    }
    assert [r for r in rows if r in held] == held  # original order kept


def test_seed_changes_the_split_and_bad_arguments_are_named():
    rows = _rows({"a": 40})
    assert heldout_indices(rows, 0.3, 0) != heldout_indices(rows, 0.3, 1)
    with pytest.raises(SpecRagError, match="unknown split 'test'"):
        split_rows(rows, "test")
    with pytest.raises(SpecRagError, match="holdout-fraction must be in"):
        split_rows(rows, "train", 1.5)


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 30), min_size=1),
    st.integers(0, 5),
    st.randoms(use_true_random=False),
)
def test_fit_and_calibrate_partition_train_per_source(counts, seed, rnd: random.Random):
    rows = _rows(counts)
    ids = lambda split, rs=rows: [r["question_id"] for r in split_rows(rs, split, 0.3, seed)]  # noqa: E731
    fit, calibrate, train = ids("train-fit"), ids("train-calibrate"), ids("train")
    assert sorted(fit + calibrate) == sorted(train) and not set(fit) & set(calibrate)
    assert not set(calibrate) & set(ids("heldout"))  # choosing defaults never reads the held-out questions
    for s in counts:  # each source calibrates round(CALIBRATION_FRACTION * its train rows)
        n_train = sum(i.startswith(f"{s}_") for i in train)
        assert sum(i.startswith(f"{s}_") for i in calibrate) == int(round(CALIBRATION_FRACTION * n_train))
    shuffled = list(rows)
    rnd.shuffle(shuffled)
    assert set(ids("train-calibrate", shuffled)) == set(calibrate)  # identity, not file order


def test_dev_file_calibration_split_sizes():
    rows = _rows({s: 20 for s in ("a", "b", "c", "d", "e")})
    assert len(split_rows(rows, "train-fit")) == 50 and len(split_rows(rows, "train-calibrate")) == 20
