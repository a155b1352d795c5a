"""Tests of the batch fairness metrics: dependence E, its noise floor, DP, W1 and damage."""

import doctest
from itertools import combinations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import entropy

from fairstream.repair.validation import RepairInputError
from fairstream.repair.measure import metrics
from fairstream.repair.measure.metrics import (
    damage,
    demographic_parity,
    dependence_e,
    dependence_e_noise_floor,
    dp_difference,
    dp_ratio,
    equal_width_edges,
    permute_within_strata,
    symmetrised_kl_from_counts,
    wasserstein_between_groups,
)

LABEL_SETS = [np.array([0, 1, 2, 3]), np.array(["female", "male", "other", "unknown"])]
PROPERTY = settings(max_examples=60, deadline=None)


@st.composite
def grouped_data(draw, max_groups=4, max_strata=3, max_rows=60, max_features=3):
    """Random (X, s, u) with 2+ groups and 1+ strata; ints or strings as labels; ties allowed."""
    n = draw(st.integers(4, max_rows))
    d = draw(st.integers(1, max_features))
    n_groups = draw(st.integers(2, max_groups))
    n_strata = draw(st.integers(1, max_strata))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    labels = LABEL_SETS[draw(st.integers(0, 1))]
    # The first rows cover every group, so all n_groups labels occur.
    s = labels[np.r_[np.arange(n_groups), rng.integers(0, n_groups, n - n_groups)]]
    u = rng.integers(0, n_strata, n)
    # Rounding makes ties and repeated values common, a harder case for the binning.
    X = np.round(rng.normal(scale=draw(st.floats(0.1, 100.0)), size=(n, d)), draw(st.integers(0, 3)))
    return X, s, u


def simulate_spec004(n, seed):
    """Langbridge, Quinn and Shorten (2024) simulation: x ~ N(mu_{u,s}, I_2), mu = -1/+1 for s=0 in u=0/1 and 0 for s=1."""
    rng = np.random.default_rng(seed)
    u = rng.integers(0, 2, n)
    s = (rng.random(n) >= np.where(u == 0, 0.3, 0.1)).astype(int)
    shift = np.where(u == 0, -1.0, 1.0) * (s == 0)
    return shift[:, None] + rng.normal(size=(n, 2)), s, u


def test_docstring_examples_run():
    result = doctest.testmod(metrics)
    assert result.attempted > 0 and result.failed == 0


# ---------------------------------------------------------------------------------------------
# Dependence E
# ---------------------------------------------------------------------------------------------


def test_e_matches_analytic_symmetrised_kl_on_spec004_simulation():
    # Per (u, k) the groups are N(+-1, 1) vs N(0, 1): symmetrised KL = (mean gap)^2 / 2 = 0.5.
    # At n = 200k and 60 bins the histogram estimator is off by: binning bias about -0.001 (exact
    # bin probabilities give 0.4989), plug-in/smoothing bias about +0.002 (the permutation noise
    # floor), sampling sd about 0.007 per feature (40 seeds: mean 0.498/0.500, max |error| 0.020).
    # 0.03 is therefore > 4 sd, and the total (sd about 0.01) gets 0.045.
    X, s, u = simulate_spec004(200_000, seed=0)
    result = dependence_e(X, s, u, bins=60)
    assert np.all(np.abs(result.per_feature - 0.5) < 0.03)
    assert abs(result.total - 1.0) < 0.045
    np.testing.assert_allclose(result.per_stratum, 0.5, atol=0.05)
    np.testing.assert_allclose(result.weights, 0.5, atol=0.01)


def test_noise_floor_is_small_on_spec004_simulation():
    X, s, u = simulate_spec004(200_000, seed=1)
    floor = dependence_e_noise_floor(X, s, u, n_permutations=5, bins=60)
    assert np.all(floor.per_feature_mean < 0.01)
    assert np.all(floor.per_feature_sd < 0.005)
    assert floor.samples.shape == (5, 2)
    assert floor.total_mean == pytest.approx(floor.samples.sum(axis=1).mean())


@PROPERTY
@given(grouped_data())
def test_e_is_non_negative(data):
    X, s, u = data
    result = dependence_e(X, s, u, bins=5)
    assert np.all(result.per_stratum >= 0)
    assert np.all(result.per_feature >= 0)
    assert result.total == pytest.approx(result.per_feature.sum())


@PROPERTY
@given(grouped_data(), st.integers(2, 4))
def test_e_is_zero_when_every_group_has_the_same_data(data, n_groups):
    X, _, u = data
    labels = np.array(["a", "b", "c", "d"])[:n_groups]
    # Each group receives an exact copy of the same rows, in every stratum.
    X_all = np.tile(X, (n_groups, 1))
    u_all = np.tile(u, n_groups)
    s_all = np.repeat(labels, len(X))
    result = dependence_e(X_all, s_all, u_all, bins=7)
    np.testing.assert_allclose(result.per_stratum, 0.0, atol=1e-12)
    assert result.total == pytest.approx(0.0, abs=1e-12)


@PROPERTY
@given(grouped_data(), st.randoms(use_true_random=False))
def test_e_is_symmetric_in_the_group_labels(data, random):
    X, s, u = data
    groups = np.unique(s)
    relabelled = dict(zip(groups.tolist(), random.sample(groups.tolist(), len(groups))))
    s_swapped = np.array([relabelled[g] for g in s.tolist()])
    np.testing.assert_allclose(dependence_e(X, s_swapped, u).per_stratum, dependence_e(X, s, u).per_stratum,
                               rtol=1e-12, atol=1e-15)


@PROPERTY
@given(grouped_data(max_strata=1, max_groups=4))
def test_e_with_many_groups_is_the_mean_over_pairs(data):
    X, s, _ = data
    edges = [np.linspace(-500, 500, 11)] * X.shape[1]  # fixed, so a subset is binned the same way
    groups = np.unique(s)
    pair_values = [dependence_e(X[np.isin(s, pair)], s[np.isin(s, pair)], edges=edges).per_feature
                   for pair in combinations(groups, 2)]
    np.testing.assert_allclose(dependence_e(X, s, edges=edges).per_feature, np.mean(pair_values, axis=0))


@PROPERTY
@given(grouped_data())
def test_e_per_stratum_is_e_of_the_stratum_alone_and_weighted_by_its_frequency(data):
    X, s, u = data
    result = dependence_e(X, s, u, bins=6)
    for j, stratum in enumerate(result.strata):
        rows = u == stratum
        alone = dependence_e(X[rows], s[rows], bins=6)
        np.testing.assert_allclose(result.per_stratum[j], alone.per_feature)
        assert result.weights[j] == pytest.approx(rows.mean())
    np.testing.assert_allclose(result.per_feature, result.weights @ result.per_stratum)


def test_symmetrised_kl_from_counts_is_half_of_kl_both_ways():
    counts = np.array([[3, 0, 7, 1], [1, 4, 2, 0]])
    p, q = (counts + 0.5) / (counts.sum(axis=1, keepdims=True) + 0.5 * 4)
    expected = 0.5 * entropy(p, q) + 0.5 * entropy(q, p)
    assert float(symmetrised_kl_from_counts(counts, alpha=0.5)) == pytest.approx(expected, rel=1e-12)


def test_symmetrised_kl_from_counts_leaves_out_absent_groups():
    two = np.array([[3, 0, 7], [1, 4, 2]])
    with_empty = np.vstack([two, np.zeros(3)])
    assert float(symmetrised_kl_from_counts(with_empty)) == pytest.approx(float(symmetrised_kl_from_counts(two)))
    assert float(symmetrised_kl_from_counts(np.array([[3, 0, 7], [0, 0, 0]]))) == 0.0


def test_stratum_with_one_group_contributes_zero():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 1))
    X[:20] += 3.0
    s = np.r_[np.zeros(10), np.ones(10), np.zeros(20)].astype(int)
    u = np.r_[np.zeros(20), np.ones(20)].astype(int)
    result = dependence_e(X, s, u, bins=4)
    assert result.per_stratum[1, 0] == 0.0
    assert result.per_feature[0] == pytest.approx(0.5 * result.per_stratum[0, 0])


def test_e_follows_column_order():
    X, s, u = simulate_spec004(5_000, seed=2)
    X[:, 1] = np.random.default_rng(0).normal(size=len(X))  # feature 1 carries no dependence
    result = dependence_e(X, s, u)
    flipped = dependence_e(X[:, ::-1], s, u)
    np.testing.assert_allclose(flipped.per_feature, result.per_feature[::-1])
    assert result.per_feature[0] > 0.3 and result.per_feature[1] < 0.1


def test_explicit_edges_equal_to_the_pooled_range_give_the_default_result():
    X, s, _ = simulate_spec004(3_000, seed=4)
    default = dependence_e(X, s, bins=12)
    explicit = dependence_e(X, s, edges=equal_width_edges(X, bins=12))
    np.testing.assert_array_equal(default.per_feature, explicit.per_feature)


def test_explicit_edges_may_differ_in_length_per_feature_and_clip_outside_values():
    X = np.array([[-10.0, 0.1], [0.5, 0.2], [0.5, 0.9], [10.0, 0.8]])
    edges = [np.array([0.0, 1.0]), np.array([0.0, 0.5, 1.0])]
    result = dependence_e(X, [0, 0, 1, 1], edges=edges)
    # Feature 0 has one bin, so both groups have the same pmf; feature 1 separates them.
    assert result.per_feature[0] == 0.0 and result.per_feature[1] > 0.0


@PROPERTY
@given(grouped_data(max_strata=3), st.integers(0, 1000))
def test_permutation_keeps_group_sizes_within_each_stratum(data, seed):
    _, s, u = data
    s_codes = np.unique(s, return_inverse=True)[1]
    permuted = permute_within_strata(s_codes, u, np.random.default_rng(seed))
    for stratum in np.unique(u):
        rows = u == stratum
        np.testing.assert_array_equal(np.sort(permuted[rows]), np.sort(s_codes[rows]))


def test_noise_floor_is_reproducible_and_below_a_real_dependence():
    X, s, u = simulate_spec004(4_000, seed=5)
    first = dependence_e_noise_floor(X, s, u, n_permutations=4, seed=7)
    again = dependence_e_noise_floor(X, s, u, n_permutations=4, seed=7)
    np.testing.assert_array_equal(first.samples, again.samples)
    assert np.all(first.per_feature_mean < dependence_e(X, s, u).per_feature / 4)


@pytest.mark.parametrize("kwargs, message", [
    ({"alpha": 0.0}, "alpha"),
    ({"bins": 0}, "bins"),
    ({"edges": [[0.0, 1.0]]}, "features"),
    ({"edges": [[1.0, 0.0], [0.0, 1.0]]}, "strictly increasing"),
])
def test_bad_estimator_settings_raise(kwargs, message):
    X = np.zeros((4, 2))
    with pytest.raises(RepairInputError, match=message):
        dependence_e(X, [0, 1, 0, 1], **kwargs)


def test_mismatched_lengths_raise():
    X = np.zeros((5, 2))
    with pytest.raises(RepairInputError, match="s must have one value per row"):
        dependence_e(X, [0, 1, 0, 1], None)
    with pytest.raises(RepairInputError, match="u must have one value per row"):
        dependence_e(X, [0, 1, 0, 1, 0], [0, 1])
    with pytest.raises(RepairInputError, match="y must have one value per row"):
        demographic_parity([1, 0], s=[0, 1, 0])
    with pytest.raises(RepairInputError, match="s must have one value per row"):
        wasserstein_between_groups(X, [0, 1])
    with pytest.raises(RepairInputError, match="differ in shape"):
        damage(X, np.zeros((4, 2)))


def test_non_finite_features_raise_naming_the_column():
    X = np.zeros((3, 2))
    X[1, 1] = np.nan
    with pytest.raises(RepairInputError, match="'x1'"):
        dependence_e(X, [0, 1, 0])


# ---------------------------------------------------------------------------------------------
# Demographic parity
# ---------------------------------------------------------------------------------------------


@st.composite
def decisions(draw):
    X, s, u = draw(grouped_data(max_features=1))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return (rng.random(len(s)) < draw(st.floats(0, 1))).astype(int), s, u


@PROPERTY
@given(decisions())
def test_dp_difference_and_ratio_lie_in_unit_interval(data):
    y, s, u = data
    result = demographic_parity(y, s, u)
    for value in (result.difference, result.ratio, result.conditional_difference, result.conditional_ratio,
                  result.conditional_difference_max, result.conditional_ratio_min):
        assert 0.0 <= value <= 1.0
    assert np.all((0 <= result.stratum_difference) & (result.stratum_difference <= 1))
    assert np.all((0 <= result.stratum_ratio) & (result.stratum_ratio <= 1))


@PROPERTY
@given(decisions())
def test_conditional_dp_is_dp_within_each_stratum(data):
    y, s, u = data
    result = demographic_parity(y, s, u)
    for j, stratum in enumerate(result.strata):
        rows = u == stratum
        alone = demographic_parity(y[rows], s[rows])
        assert result.stratum_difference[j] == pytest.approx(alone.difference)
        assert result.stratum_ratio[j] == pytest.approx(alone.ratio)
    assert result.conditional_difference == pytest.approx(result.weights @ result.stratum_difference)
    assert result.conditional_difference_max == pytest.approx(result.stratum_difference.max())
    assert result.conditional_ratio_min == pytest.approx(result.stratum_ratio.min())


def test_dp_on_a_hand_computed_example():
    y = [1, 1, 0, 0, 1, 0, 0, 0, 1, 1, 1, 0]
    s = ["a", "a", "a", "a", "b", "b", "b", "b", "c", "c", "c", "c"]
    u = [0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1]
    result = demographic_parity(y, s, u)
    np.testing.assert_allclose(result.rates, [0.5, 0.25, 0.75])
    assert result.difference == pytest.approx(0.5)
    assert result.ratio == pytest.approx(1 / 3)
    # u=0: rates 1, 0.5, 1; u=1: rates 0, 0, 0.5.
    np.testing.assert_allclose(result.stratum_rates, [[1.0, 0.5, 1.0], [0.0, 0.0, 0.5]])
    np.testing.assert_allclose(result.stratum_difference, [0.5, 0.5])
    np.testing.assert_allclose(result.stratum_ratio, [0.5, 0.0])
    assert result.conditional_ratio == pytest.approx(0.25)
    assert dp_difference(y, s) == pytest.approx(0.5)
    assert dp_ratio(y, s) == pytest.approx(1 / 3)


def test_dp_edge_cases_all_negative_and_single_group_stratum():
    assert dp_ratio([0, 0, 0, 0], s=[0, 0, 1, 1]) == 1.0
    result = demographic_parity([1, 0, 1, 1], s=[0, 1, 0, 0], u=[0, 0, 1, 1])
    assert np.isnan(result.stratum_rates[1, 1])  # group 1 never appears in stratum 1
    assert result.stratum_difference[1] == 0.0 and result.stratum_ratio[1] == 1.0


@pytest.mark.parametrize("bad", [[1, 2, 0], [0.5, 1, 0], ["yes", "no", "no"]])
def test_non_binary_decisions_raise_naming_the_value(bad):
    with pytest.raises(RepairInputError, match="binary"):
        demographic_parity(bad, s=[0, 1, 0])


def test_boolean_decisions_are_accepted():
    assert dp_difference(np.array([True, False, True, True]), s=[0, 0, 1, 1]) == pytest.approx(0.5)


# ---------------------------------------------------------------------------------------------
# W1
# ---------------------------------------------------------------------------------------------


@PROPERTY
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=30), st.data())
def test_w1_matches_the_sorted_difference_definition(a, data):
    # For two equal-size 1-D samples, W1 is the mean gap between their order statistics.
    b = data.draw(st.lists(st.floats(-1e3, 1e3), min_size=len(a), max_size=len(a)))
    X = np.array(a + b)[:, None]
    result = wasserstein_between_groups(X, s=[0] * len(a) + [1] * len(b))
    expected = np.mean(np.abs(np.sort(a) - np.sort(b)))
    assert result.per_feature[0] == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_w1_with_three_groups_reports_pairs_and_their_max():
    X = np.array([0.0, 1.0, 2.0, 3.0, 10.0, 11.0])[:, None]
    result = wasserstein_between_groups(X, s=["a", "a", "b", "b", "c", "c"])
    assert result.pairs == [("a", "b"), ("a", "c"), ("b", "c")]
    np.testing.assert_allclose(result.per_pair[0, :, 0], [2.0, 10.0, 8.0])
    assert result.per_stratum[0, 0] == 10.0 and result.per_feature[0] == 10.0


def test_w1_leaves_out_absent_groups_and_weights_strata():
    X = np.array([0.0, 1.0, 5.0, 0.0, 4.0, 9.0])[:, None]
    result = wasserstein_between_groups(X, s=[0, 1, 2, 0, 0, 1], u=[0, 0, 0, 1, 1, 1])
    assert np.isnan(result.per_pair[1, 1, 0]) and np.isnan(result.per_pair[1, 2, 0])  # no group 2 in u=1
    np.testing.assert_allclose(result.per_stratum[:, 0], [5.0, 7.0])  # u=1: |mean(0, 4) - 9|
    assert result.per_feature[0] == pytest.approx(6.0)


# ---------------------------------------------------------------------------------------------
# Damage
# ---------------------------------------------------------------------------------------------


@PROPERTY
@given(grouped_data(), st.floats(-5, 5))
def test_damage_of_a_shift_is_its_size(data, shift):
    X, _, _ = data
    result = damage(X, X + shift)
    np.testing.assert_allclose(result.per_feature, abs(shift), atol=1e-9 * (1 + np.abs(X).max()))
    assert result.n_rows == len(X)


def test_damage_per_feature_and_overall():
    result = damage([[0.0, 0.0], [1.0, 1.0]], [[1.0, 0.0], [0.0, 4.0]])
    np.testing.assert_allclose(result.per_feature, [1.0, 1.5])
    assert result.overall == pytest.approx(1.25)


@st.composite
def edges_and_values(draw):
    """Per-column edges (equal-width from linspace, or uneven) and values: inside, on every edge, outside, rounded."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    columns, edges = draw(st.integers(1, 4)), []
    for _ in range(columns):
        lo = draw(st.floats(-1e6, 1e6))
        span = draw(st.floats(1e-6, 1e6))
        bins = draw(st.integers(1, 250))
        e = np.linspace(lo, lo + span, bins + 1) if draw(st.booleans()) else \
            lo + span * np.cumsum(np.r_[0.0, rng.random(bins) + 1e-3]) / bins
        edges.append(e if np.all(np.diff(e) > 0) else np.linspace(0.0, 1.0, bins + 1))
    n = draw(st.integers(1, 80))
    X = np.empty((n, columns))
    for k, e in enumerate(edges):
        pool = np.r_[e, np.nextafter(e, -np.inf), np.nextafter(e, np.inf), e[0] - 1.0, e[-1] + 1.0,
                     np.round(rng.uniform(e[0], e[-1], 8), draw(st.integers(0, 3)))]
        X[:, k] = rng.choice(pool, n)
    return edges, X


@PROPERTY
@given(edges_and_values())
def test_column_bins_are_the_bins_of_a_binary_search(case):
    # ColumnBins guesses each bin arithmetically; every kept guess must be searchsorted's bin, values on an edge
    # (and an ulp either side of it), outside the edges, and on uneven edges included.
    edges, X = case
    expected = np.column_stack([metrics.bin_index(X[:, k], e) for k, e in enumerate(edges)])
    assert np.array_equal(metrics.ColumnBins(edges).codes(X), expected)


def test_column_bins_send_nan_and_inf_where_a_binary_search_does():
    edges = [np.linspace(0.0, 1.0, 11)]
    X = np.array([[np.nan], [np.inf], [-np.inf], [1.0], [0.0]])
    assert np.array_equal(metrics.ColumnBins(edges).codes(X)[:, 0], metrics.bin_index(X[:, 0], edges[0]))


@PROPERTY
@given(st.integers(0, 2**32 - 1), st.integers(1, 4), st.integers(1, 3), st.integers(2, 4), st.integers(1, 30))
def test_e_of_stacked_histograms_is_e_feature_by_feature(seed, n_features, n_strata, n_groups, n_bins):
    # dependence_from_counts stacks features of equal bins into one pass: the same floats as one pass each.
    rng = np.random.default_rng(seed)
    counts = [rng.integers(0, 40, (n_strata, n_groups, n_bins)) * (rng.random((n_strata, n_groups, 1)) < 0.8)
              for _ in range(n_features)]
    result = metrics.dependence_from_counts(counts, 0.5, list(range(n_groups)), list(range(n_strata)))
    one_by_one = np.stack([symmetrised_kl_from_counts(c, 0.5) for c in counts], axis=1)
    assert np.array_equal(result.per_stratum, one_by_one)
    totals = counts[0].sum(axis=(1, 2))
    assert np.array_equal(result.weights, metrics.safe_ratio(totals, totals.sum(), empty=0.0))
    assert np.array_equal(result.per_feature, result.weights @ one_by_one)
