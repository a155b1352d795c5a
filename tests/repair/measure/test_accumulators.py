"""Tests of the mergeable streaming accumulators against the batch metrics."""

import doctest
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import wasserstein_distance

from fairstream.repair.validation import RepairInputError, encode
from fairstream.repair.measure import accumulators as streaming
from fairstream.repair.measure.accumulators import (
    DamageAccumulator,
    HistogramDependenceAccumulator,
    PositiveRateAccumulator,
    RateAccumulator,
    WassersteinAccumulator,
)
from fairstream.repair.measure.metrics import (
    damage,
    demographic_parity,
    dependence_e,
    equal_width_edges,
    wasserstein_between_groups,
)

from .test_metrics import grouped_data

PROPERTY = settings(max_examples=50, deadline=None)


@st.composite
def stream_data(draw):
    """(X, s, u, y) plus cut points splitting it into three consecutive batches."""
    X, s, u = draw(grouped_data())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    y = rng.integers(0, 2, len(s))
    cuts = sorted(draw(st.lists(st.integers(0, len(s)), min_size=2, max_size=2)))
    return X, s, u, y, cuts


def narrow_edges(X, bins=5):
    """Edges over the middle of the data, so some values fall outside them."""
    lo, hi = np.quantile(X, [0.2, 0.8], axis=0)
    return [np.linspace(a, b if b > a else a + 1.0, bins + 1) for a, b in zip(lo, hi)]


def dependence_accumulator(X, s, u):
    return HistogramDependenceAccumulator(narrow_edges(X), groups=np.unique(s), strata=np.unique(u))


def assert_same_dependence(a, b):
    np.testing.assert_array_equal(a.per_stratum, b.per_stratum)
    np.testing.assert_array_equal(a.per_feature, b.per_feature)
    np.testing.assert_array_equal(a.weights, b.weights)
    assert a.total == b.total


def assert_same_dp(a, b):
    for field in ("rates", "stratum_rates", "stratum_difference", "stratum_ratio", "weights"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    for field in ("difference", "ratio", "conditional_difference", "conditional_difference_max",
                  "conditional_ratio", "conditional_ratio_min"):
        assert getattr(a, field) == getattr(b, field)


def test_docstring_examples_run():
    result = doctest.testmod(streaming)
    assert result.attempted > 0 and result.failed == 0


# ---------------------------------------------------------------------------------------------
# HistogramDependenceAccumulator
# ---------------------------------------------------------------------------------------------


@PROPERTY
@given(stream_data())
def test_dependence_accumulator_equals_batch_with_the_same_edges(data):
    X, s, u, _, _ = data
    acc = dependence_accumulator(X, s, u).update(X, s, u)
    assert_same_dependence(acc.value(), dependence_e(X, s, u, edges=acc.edges))


@PROPERTY
@given(stream_data())
def test_dependence_merge_of_parts_equals_one_pass(data):
    X, s, u, _, (i, j) = data
    parts = [dependence_accumulator(X, s, u).update(X[a:b], s[a:b], u[a:b]) for a, b in [(0, i), (i, j), (j, None)]]
    whole = dependence_accumulator(X, s, u).update(X, s, u)
    left_first = parts[0].merge(parts[1]).merge(parts[2])
    right_first = parts[0].merge(parts[1].merge(parts[2]))
    for merged in (left_first, right_first):
        for got, want in zip(merged.counts_, whole.counts_):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(merged.out_of_range_, whole.out_of_range_)
        assert_same_dependence(merged.value(), whole.value())


@PROPERTY
@given(stream_data())
def test_dependence_updates_in_batches_equal_one_update(data):
    X, s, u, _, (i, j) = data
    acc = dependence_accumulator(X, s, u)
    for a, b in [(0, i), (i, j), (j, None)]:
        acc.update(X[a:b], s[a:b], u[a:b])
    assert_same_dependence(acc.value(), dependence_accumulator(X, s, u).update(X, s, u).value())


def test_merge_leaves_its_inputs_unchanged():
    X = np.array([[0.1], [0.6], [0.2]])
    a = HistogramDependenceAccumulator([[0.0, 0.5, 1.0]], groups=[0, 1]).update(X, [0, 1, 1])
    b = HistogramDependenceAccumulator([[0.0, 0.5, 1.0]], groups=[0, 1]).update(X, [1, 1, 0])
    before = [c.copy() for c in a.counts_]
    a.merge(b)
    np.testing.assert_array_equal(a.counts_[0], before[0])


def test_out_of_range_values_go_to_end_bins_and_are_counted():
    acc = HistogramDependenceAccumulator([[0.0, 1.0, 2.0], [0.0, 1.0]], groups=["a", "b"], strata=[0, 1])
    X = np.array([[-5.0, 0.5], [0.5, 3.0], [2.0, 0.5], [9.0, 0.5]])
    acc.update(X, s=["a", "b", "a", "b"], u=[0, 0, 1, 1])
    np.testing.assert_array_equal(acc.counts_[0][0], [[1, 0], [1, 0]])  # -5 clipped into bin 0
    np.testing.assert_array_equal(acc.counts_[0][1], [[0, 1], [0, 1]])  # 2.0 (right edge) and 9 in bin 1
    np.testing.assert_array_equal(acc.out_of_range_, [[1, 1], [1, 0]])  # 2.0 is in range
    np.testing.assert_allclose(acc.out_of_range_fraction(), [[0.5, 0.5], [0.5, 0.0]])


def test_from_reference_uses_the_reference_range_and_reset_empties():
    rng = np.random.default_rng(0)
    X_ref = rng.normal(size=(200, 2))
    acc = HistogramDependenceAccumulator.from_reference(X_ref, groups=[0, 1], bins=8)
    for got, want in zip(acc.edges, equal_width_edges(X_ref, bins=8)):
        np.testing.assert_array_equal(got, want)
    acc.update(X_ref + np.arange(200)[:, None] % 2, s=np.arange(200) % 2)
    assert acc.value().total > 0
    assert acc.reset().value().total == 0.0
    assert all(c.sum() == 0 for c in acc.counts_) and acc.out_of_range_.sum() == 0


def test_dependence_accumulator_rejects_unknown_labels_naming_them():
    acc = HistogramDependenceAccumulator([[0.0, 1.0]], groups=["f", "m"], strata=["low", "high"])
    with pytest.raises(RepairInputError, match="'x'"):
        acc.update([[0.5], [0.5]], s=["f", "x"], u=["low", "low"])
    with pytest.raises(RepairInputError, match="'mid'"):
        acc.update([[0.5], [0.5]], s=["f", "m"], u=["low", "mid"])
    assert acc.counts_[0].sum() == 0  # a refused batch leaves no partial counts


def test_dependence_accumulator_rejects_bad_configuration_and_input():
    with pytest.raises(RepairInputError, match="one array of bin edges per feature"):
        HistogramDependenceAccumulator([0.0, 1.0, 2.0], groups=[0, 1])
    with pytest.raises(RepairInputError, match="duplicate"):
        HistogramDependenceAccumulator([[0.0, 1.0]], groups=[0, 1, 1])
    with pytest.raises(RepairInputError, match="alpha"):
        HistogramDependenceAccumulator([[0.0, 1.0]], groups=[0, 1], alpha=-1.0)
    acc = HistogramDependenceAccumulator([[0.0, 1.0], [0.0, 1.0]], groups=[0, 1], strata=[0, 1])
    with pytest.raises(RepairInputError, match="feature columns"):
        acc.update(np.zeros((2, 3)), s=[0, 1], u=[0, 1])
    with pytest.raises(RepairInputError, match="s must have one value per row"):
        acc.update(np.zeros((2, 2)), s=[0, 1, 0], u=[0, 1])
    with pytest.raises(RepairInputError, match="u is required"):
        acc.update(np.zeros((2, 2)), s=[0, 1])
    with pytest.raises(RepairInputError, match="different settings"):
        acc.merge(HistogramDependenceAccumulator([[0.0, 2.0], [0.0, 1.0]], groups=[0, 1], strata=[0, 1]))


# ---------------------------------------------------------------------------------------------
# PositiveRateAccumulator
# ---------------------------------------------------------------------------------------------


@PROPERTY
@given(stream_data())
def test_positive_rate_accumulator_equals_batch_dp(data):
    _, s, u, y, _ = data
    acc = PositiveRateAccumulator(groups=np.unique(s), strata=np.unique(u)).update(y, s, u)
    assert_same_dp(acc.value(), demographic_parity(y, s, u))


@PROPERTY
@given(stream_data())
def test_positive_rate_merge_of_parts_equals_one_pass(data):
    _, s, u, y, (i, j) = data
    def fresh():
        return PositiveRateAccumulator(groups=np.unique(s), strata=np.unique(u))
    parts = [fresh().update(y[a:b], s[a:b], u[a:b]) for a, b in [(0, i), (i, j), (j, None)]]
    whole = fresh().update(y, s, u)
    for merged in (parts[0].merge(parts[1]).merge(parts[2]), parts[0].merge(parts[1].merge(parts[2]))):
        np.testing.assert_array_equal(merged.positives_, whole.positives_)
        np.testing.assert_array_equal(merged.totals_, whole.totals_)
        assert_same_dp(merged.value(), whole.value())


@PROPERTY
@given(stream_data())
def test_streamed_dp_lies_in_unit_interval(data):
    _, s, u, y, _ = data
    result = PositiveRateAccumulator(groups=np.unique(s), strata=np.unique(u)).update(y, s, u).value()
    assert 0.0 <= result.difference <= 1.0 and 0.0 <= result.ratio <= 1.0
    assert 0.0 <= result.conditional_difference <= 1.0 and 0.0 <= result.conditional_ratio_min <= 1.0


def test_positive_rate_accumulator_without_strata_and_reset():
    acc = PositiveRateAccumulator(groups=["a", "b"])
    acc.update([1, 0, 1, 1], s=["a", "a", "b", "b"])
    assert acc.value().difference == pytest.approx(0.5)
    with pytest.raises(RepairInputError, match="without u labels"):
        acc.update([1], s=["a"], u=[0])
    acc.reset()
    assert acc.totals_.sum() == 0 and acc.value().difference == 0.0 and acc.value().ratio == 1.0


def test_positive_rate_accumulator_rejects_unknown_group_naming_it():
    acc = PositiveRateAccumulator(groups=[0, 1], strata=["x", "y"])
    with pytest.raises(RepairInputError, match=r"s has an unknown value 7 "):
        acc.update([1, 0], s=[0, 7], u=["x", "y"])
    with pytest.raises(RepairInputError, match="'z'"):
        acc.update([1, 0], s=[0, 1], u=["x", "z"])
    with pytest.raises(RepairInputError, match="binary"):
        acc.update([1, 3], s=[0, 1], u=["x", "y"])
    with pytest.raises(RepairInputError, match="y must have one value per row"):
        acc.update([1, 0, 1], s=[0, 1], u=["x", "y"])
    with pytest.raises(RepairInputError, match="different settings"):
        acc.merge(PositiveRateAccumulator(groups=[0, 1]))
    assert acc.totals_.sum() == 0


# ---------------------------------------------------------------------------------------------
# DamageAccumulator
# ---------------------------------------------------------------------------------------------


@PROPERTY
@given(stream_data(), st.floats(-3, 3))
def test_damage_accumulator_matches_batch_and_merges(data, scale):
    X, _, _, _, (i, j) = data
    X_repaired = X + scale * np.sin(X)
    def fresh():
        return DamageAccumulator(n_features=X.shape[1])
    parts = [fresh().update(X[a:b], X_repaired[a:b]) for a, b in [(0, i), (i, j), (j, None)]]
    merged = parts[0].merge(parts[1]).merge(parts[2])
    batch = damage(X, X_repaired)
    # Sums of floats: equal to the batch up to rounding, the row count exactly.
    assert merged.n_rows_ == len(X)
    np.testing.assert_allclose(merged.value().per_feature, batch.per_feature, rtol=1e-12, atol=1e-12)
    assert merged.value().overall == pytest.approx(batch.overall, rel=1e-12, abs=1e-12)


def test_damage_accumulator_rejects_mismatched_shapes_and_resets():
    acc = DamageAccumulator(n_features=2)
    with pytest.raises(RepairInputError, match="feature columns"):
        acc.update(np.zeros((3, 2)), np.zeros((3, 3)))
    with pytest.raises(RepairInputError, match="differ in shape"):
        acc.update(np.zeros((3, 2)), np.zeros((2, 2)))
    acc.update([[0.0, 0.0]], [[2.0, 1.0]])
    assert acc.value().overall == pytest.approx(1.5)
    assert acc.reset().value().n_rows == 0 and acc.value().overall == 0.0
    with pytest.raises(RepairInputError, match="different settings"):
        acc.merge(DamageAccumulator(n_features=3))



# ---------------------------------------------------------------------------------------------
# WassersteinAccumulator
# ---------------------------------------------------------------------------------------------


def covering_edges(X, bins=200):
    """Equal-width edges over each column's range (a constant column gets a unit range)."""
    lo, hi = X.min(axis=0), X.max(axis=0)
    return [np.linspace(a, b if b > a else a + 1.0, bins + 1) for a, b in zip(lo, hi)]


def wasserstein_accumulator(X, s, u, bins=200):
    return WassersteinAccumulator(covering_edges(X, bins), groups=np.unique(s), strata=np.unique(u))


@PROPERTY
@given(stream_data())
def test_binned_w1_is_within_one_bin_width_of_the_exact_w1(data):
    X, s, u, _, _ = data
    acc = wasserstein_accumulator(X, s, u).update(X, s, u)
    got, want = acc.value(), wasserstein_between_groups(X, s, u)
    tolerance = max(np.diff(e).max() for e in acc.edges) * (1 + 1e-9)
    np.testing.assert_array_equal(np.isnan(got.per_pair), np.isnan(want.per_pair))
    np.testing.assert_allclose(got.per_pair, want.per_pair, rtol=0, atol=tolerance)
    np.testing.assert_allclose(got.per_stratum, want.per_stratum, rtol=0, atol=tolerance)
    np.testing.assert_allclose(got.per_feature, want.per_feature, rtol=0, atol=tolerance)
    np.testing.assert_array_equal(got.weights, want.weights)
    assert got.pairs == want.pairs


@PROPERTY
@given(stream_data())
def test_wasserstein_merge_of_parts_equals_one_pass(data):
    X, s, u, _, (i, j) = data
    parts = [wasserstein_accumulator(X, s, u).update(X[a:b], s[a:b], u[a:b]) for a, b in [(0, i), (i, j), (j, None)]]
    whole = wasserstein_accumulator(X, s, u).update(X, s, u)
    for merged in (parts[0].merge(parts[1]).merge(parts[2]), parts[0].merge(parts[1].merge(parts[2]))):
        for got, want in zip(merged.counts_, whole.counts_):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(merged.value().per_pair, whole.value().per_pair)
        np.testing.assert_array_equal(merged.value().per_feature, whole.value().per_feature)


def test_wasserstein_accumulator_matches_scipy_on_continuous_data():
    rng = np.random.default_rng(3)
    s = rng.integers(0, 2, 5000)
    u = rng.integers(0, 2, 5000)
    X = np.column_stack([rng.normal(s * 0.8 + u, 1.0), rng.gamma(2.0 + s, 1.0)])
    acc = WassersteinAccumulator.from_reference(X, groups=[0, 1], strata=[0, 1], bins=200).update(X, s, u)
    result = acc.value()
    for j in range(2):
        for k in range(2):
            a, b = X[(u == j) & (s == 0), k], X[(u == j) & (s == 1), k]
            width = np.diff(acc.edges[k]).max()
            assert abs(result.per_pair[j, 0, k] - wasserstein_distance(a, b)) <= width
            assert result.per_stratum[j, k] == result.per_pair[j, 0, k]
    np.testing.assert_allclose(result.weights, np.bincount(u) / len(u))
    np.testing.assert_allclose(result.per_feature, result.weights @ result.per_stratum)


def test_wasserstein_accumulator_out_of_range_values_go_to_end_bins_and_absent_groups_are_nan():
    acc = WassersteinAccumulator([[0.0, 1.0, 2.0]], groups=["a", "b", "c"], strata=[0, 1])
    acc.update([[-50.0], [50.0], [0.5]], s=["a", "b", "a"], u=[0, 0, 1])
    np.testing.assert_array_equal(acc.counts_[0][0], [[1, 0], [0, 1], [0, 0]])
    result = acc.value()
    assert result.pairs == [("a", "b"), ("a", "c"), ("b", "c")]
    assert result.per_pair[0, 0, 0] == 1.0  # the centres 0.5 and 1.5, not -50 and 50
    assert np.isnan(result.per_pair[0, 1:, 0]).all() and np.isnan(result.per_pair[1]).all()
    np.testing.assert_array_equal(result.per_stratum, [[1.0], [0.0]])  # one group in stratum 1
    assert result.per_feature.tolist() == [pytest.approx(2 / 3)]


def test_wasserstein_accumulator_empty_reset_and_errors():
    acc = WassersteinAccumulator([[0.0, 1.0, 2.0]], groups=[0, 1])
    assert acc.value().per_feature.tolist() == [0.0]
    acc.update([[0.5], [1.5]], s=[0, 1])
    assert acc.value().per_feature.tolist() == [1.0]
    assert acc.reset().value().per_feature.tolist() == [0.0] and acc.counts_[0].sum() == 0
    single = WassersteinAccumulator([[0.0, 1.0]], groups=["only"]).update([[0.5]], s=["only"]).value()
    assert single.per_pair.shape == (1, 0, 1) and single.per_feature.tolist() == [0.0]
    with pytest.raises(RepairInputError, match="'x'"):
        acc.update([[0.5], [0.5]], s=[0, "x"])
    with pytest.raises(RepairInputError, match="non-finite"):
        acc.update([[np.nan]], s=[0])
    with pytest.raises(RepairInputError, match="one array of bin edges per feature"):
        WassersteinAccumulator([0.0, 1.0], groups=[0, 1])
    with pytest.raises(RepairInputError, match="different settings"):
        acc.merge(WassersteinAccumulator([[0.0, 1.0, 3.0]], groups=[0, 1]))
    assert acc.counts_[0].sum() == 0


# ---------------------------------------------------------------------------------------------
# RateAccumulator
# ---------------------------------------------------------------------------------------------


@PROPERTY
@given(stream_data())
def test_rate_accumulator_counts_flags_per_stratum_and_merges_exactly(data):
    _, _, u, y, (i, j) = data
    strata = np.unique(u)
    flags = y.astype(bool)
    parts = [RateAccumulator(strata).update(flags[a:b], u[a:b]) for a, b in [(0, i), (i, j), (j, None)]]
    whole = RateAccumulator(strata).update(flags, u)
    merged = parts[0].merge(parts[1].merge(parts[2]))
    np.testing.assert_array_equal(merged.flagged_, whole.flagged_)
    np.testing.assert_array_equal(merged.totals_, whole.totals_)
    result = merged.value()
    np.testing.assert_array_equal(result.per_stratum, [flags[u == v].mean() for v in strata])
    assert result.overall == flags.mean() == whole.value().overall


def test_rate_accumulator_empty_reset_and_errors():
    acc = RateAccumulator()
    assert acc.value().overall == 0.0 and np.isnan(acc.value().per_stratum).all()
    acc.update([1, 0, 0, 0])
    assert acc.value().overall == 0.25 and acc.value().per_stratum.tolist() == [0.25]
    assert acc.reset().value().totals.tolist() == [0]
    with pytest.raises(RepairInputError, match="flags must be binary"):
        acc.update([0, 2])
    with pytest.raises(RepairInputError, match="without u labels"):
        acc.update([0], u=[1])
    with pytest.raises(RepairInputError, match="'c'"):
        RateAccumulator(strata=["a", "b"]).update([1, 1], u=["a", "c"])
    with pytest.raises(RepairInputError, match="different settings"):
        acc.merge(RateAccumulator(strata=[0]))


def count_arrays(accumulator) -> list:
    """Copies of every count array of an accumulator."""
    arrays = [getattr(accumulator, name) for name in accumulator._counts]
    return [np.copy(a) for item in arrays for a in (item if isinstance(item, list) else [item])]


@PROPERTY
@given(grouped_data(max_groups=3))
def test_absorb_adds_in_place_what_merge_adds_into_a_copy(data):
    X, s, u = data
    groups, strata = np.unique(s).tolist(), np.unique(u).tolist()
    edges = [np.linspace(x.min() - 1.0, x.max() + 1.0, 8) for x in X.T]
    half = len(s) // 2
    for prototype, feed in (
            (HistogramDependenceAccumulator(edges, groups, strata), lambda a, r: a.update(X[r], s[r], u[r])),
            (WassersteinAccumulator(edges, groups, strata), lambda a, r: a.update(X[r], s[r], u[r])),
            (PositiveRateAccumulator(groups, strata), lambda a, r: a.update((X[r, 0] > 0).astype(int), s[r], u[r]))):
        first, second = feed(prototype.fresh(), slice(0, half)), feed(prototype.fresh(), slice(half, None))
        merged, other = first.merge(second), count_arrays(second)
        assert first.absorb(second) is first
        assert all(np.array_equal(a, b) for a, b in zip(count_arrays(first), count_arrays(merged), strict=True))
        assert all(np.array_equal(a, b) for a, b in zip(count_arrays(second), other, strict=True))  # unchanged


def test_copies_of_one_accumulator_merge_without_comparing_settings_and_others_are_still_compared():
    a = HistogramDependenceAccumulator([[0.0, 1.0, 2.0]], groups=[0, 1])
    twin = HistogramDependenceAccumulator([[0.0, 1.0, 2.0]], groups=[0, 1])  # same settings, built apart
    other = HistogramDependenceAccumulator([[0.0, 1.0, 3.0]], groups=[0, 1])
    assert a.fresh().merge(a.fresh()).value().total == 0.0
    assert a.fresh().merge(twin).value().total == 0.0  # compared, and equal
    for accumulator in (a.fresh(), a.fresh().merge(a.fresh())):
        with pytest.raises(RepairInputError, match="different settings"):
            accumulator.merge(other)
        with pytest.raises(RepairInputError, match="different settings"):
            accumulator.absorb(other)


@PROPERTY
@given(st.lists(st.integers(-1, 4), min_size=1, max_size=40), st.sampled_from([[0, 1, 2], [0, 1, 2, 3, 4], [1, 2, 3]]))
def test_labels_in_their_classes_are_encoded_as_by_encode(values, labels):
    # Labels 0 .. k-1 are their own codes (no search); any other labels, or a value not among them, take the
    # search, which names an unknown value.
    classes = streaming.configured_labels(labels, "s")
    values = np.array(values)
    try:
        expected = encode(values, classes, "s")  # the search
    except RepairInputError as error:
        with pytest.raises(RepairInputError, match=re.escape(str(error))):
            streaming.EncodedLabels.in_classes(values, classes, "s")
        return
    codes = streaming.EncodedLabels.in_classes(values, classes, "s")
    assert codes.tolist() == expected.tolist() and codes.classes is classes and codes.dtype == np.intp
