"""Tests of matched demographic parity: a hand-computed case, the paper's bounds, streaming = batch, fair matching."""

import doctest
from itertools import permutations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import wasserstein_distance

from fairstream.repair.validation import RepairInputError
from fairstream.repair.group_maps import GroupTransportMap
from fairstream.repair.measure import mdp
from fairstream.repair.measure.mdp import MatchedDPAccumulator, fair_matching, fair_matching_cost, matched_dp
from fairstream.repair.measure.windows import BatchWindow

PROPERTY = settings(max_examples=50, deadline=None)


def test_docstring_examples_run():
    result = doctest.testmod(mdp)
    assert result.attempted > 0 and result.failed == 0


def test_mdp_of_a_hand_computed_case():
    # Three women (s=0) matched by a map to three men (s=1) and back; scores by hand:
    #   f(x):       0.9  0.4  0.1 | 0.7  0.3  0.2
    #   f(T(x)):    0.7  0.3  0.2 | 0.9  0.4  0.1   (a bijection: each man is one woman's counterpart)
    # |gaps| = 0.2, 0.1, 0.1 both ways -> MDP = 0.4 / 3; strata u = (a, a, b | a, b, b):
    # stratum a gaps 0.2, 0.1, 0.2 -> 0.5 / 3, stratum b gaps 0.1, 0.1, 0.1 -> 0.1.
    f = np.array([0.9, 0.4, 0.1, 0.7, 0.3, 0.2])
    f_matched = np.array([0.7, 0.3, 0.2, 0.9, 0.4, 0.1])
    s, s_matched = np.array([0, 0, 0, 1, 1, 1]), np.array([1, 1, 1, 0, 0, 0])
    result = matched_dp(f, f_matched, s, s_matched, u=["a", "a", "b", "a", "b", "b"])
    assert result.overall == pytest.approx(0.4 / 3) and result.pairs == [(0, 1)]
    np.testing.assert_allclose(result.per_stratum, [0.5 / 3, 0.1])
    assert result.n_rows.tolist() == [[3], [3]] and result.weights.tolist() == [0.5, 0.5]
    # The mean-score DP gap |0.4667 - 0.4| = 0.0667 and W1 = 0.1333 are below it (Theorem 3.7).
    assert abs(f[:3].mean() - f[3:].mean()) <= wasserstein_distance(f[:3], f[3:]) <= result.overall + 1e-12


@st.composite
def matched_sample(draw):
    """Scores of two equal-size groups and a random bijection between them."""
    n = draw(st.integers(1, 30))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    f0, f1 = rng.uniform(size=n), rng.uniform(size=n) ** draw(st.floats(0.2, 5.0))
    return f0, f1, rng.permutation(n)


@PROPERTY
@given(matched_sample())
def test_any_bijection_bounds_w1_and_the_mean_score_gap_and_rank_matching_attains_w1(sample):
    # Theorem 3.7 in-sample: a bijection is a transport map between the two empirical distributions.
    f0, f1, perm = sample
    value = matched_dp(np.r_[f0, f1[perm]], np.r_[f1[perm], f0], np.r_[np.zeros(len(f0)), np.ones(len(f0))],
                       np.r_[np.ones(len(f0)), np.zeros(len(f0))]).overall
    w1 = wasserstein_distance(f0, f1)
    assert abs(f0.mean() - f1.mean()) <= w1 + 1e-12 and w1 <= value + 1e-12
    i, j = fair_matching(f0, f1)  # Proposition 3.5: the fair matching function's MDP is W1
    assert np.mean(np.abs(f0[i] - f1[j])) == pytest.approx(w1, rel=1e-9, abs=1e-12)


def test_rank_matching_is_the_best_matching_by_brute_force():
    rng = np.random.default_rng(0)
    f0, f1 = rng.uniform(size=6), rng.uniform(size=6)
    i, j = fair_matching(f0, f1)
    best = min(np.abs(f0 - f1[list(p)]).sum() for p in permutations(range(6)))
    assert np.abs(f0[i] - f1[j]).sum() == pytest.approx(best)


@st.composite
def stream(draw):
    """Matched rows of up to 4 groups (partner group different), strata, and two cut points."""
    n, k = draw(st.integers(1, 60)), draw(st.integers(2, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    s = rng.integers(0, k, n)
    s_matched = (s + rng.integers(1, k, n)) % k
    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=2, max_size=2)))
    return rng.uniform(size=n), rng.uniform(size=n), s, s_matched, rng.integers(0, 3, n), k, cuts


@PROPERTY
@given(stream())
def test_merged_accumulators_equal_the_batch_metric_and_the_direct_means(data):
    f, g, s, t, u, k, (a, b) = data
    parts = [MatchedDPAccumulator(range(k), [0, 1, 2]).update(f[i:j], g[i:j], s[i:j], t[i:j], u[i:j])
             for i, j in ((0, a), (a, b), (b, None))]
    merged = parts[0].merge(parts[1]).merge(parts[2]).value()
    batch = matched_dp(f, g, s, t, u, groups=range(k))
    for p, (x, z) in enumerate(merged.pairs):
        rows = ((s == x) & (t == z)) | ((s == z) & (t == x))
        expected = np.abs(f - g)[rows].mean() if rows.any() else np.nan
        np.testing.assert_allclose(merged.pair_values[p], expected, rtol=1e-12)
        np.testing.assert_allclose(batch.pair_values[p], expected, rtol=1e-12)
    assert merged.overall == pytest.approx(np.nanmax(merged.pair_values))
    np.testing.assert_array_equal(merged.n_rows.sum(), len(f))


def test_one_pair_without_groups_is_the_mean_gap_per_stratum():
    rng = np.random.default_rng(1)
    f, g, u = rng.uniform(size=20), rng.uniform(size=20), rng.integers(0, 2, 20)
    new = MatchedDPAccumulator(strata=[0, 1]).update(f, g, u=u).value()
    np.testing.assert_allclose(new.per_stratum, [np.abs(f - g)[u == v].mean() for v in (0, 1)])
    assert new.overall == pytest.approx(np.abs(f - g).mean()) and new.pairs == [("all", "all")]
    assert MatchedDPAccumulator().value().overall == 0.0


def test_a_batch_window_of_accumulators_measures_its_last_batches():
    window, rng = BatchWindow(records=20, buckets=2), np.random.default_rng(2)
    batches = [(rng.uniform(size=10), rng.uniform(size=10)) for _ in range(5)]
    for f, g in batches:
        window.add(MatchedDPAccumulator(groups=[0, 1]).update(f, g, [0] * 10, [1] * 10), n_records=10)
    f, g = (np.concatenate(part) for part in zip(*batches[-2:]))
    assert window.n_records == 20 and window.value().overall == pytest.approx(np.abs(f - g).mean())


def brute_force_mdp(a, b, score) -> float:
    """MDP of the optimal coupling of two groups on one feature, found by trying every bijection.

    Both groups' people are repeated to the same number of copies (the sizes' least common multiple), so that a
    bijection of the copies is a coupling of the two groups, and every copy carries the same mass.
    """
    size = np.lcm(len(a), len(b))
    copies_a, copies_b = np.repeat(a, size // len(a)), np.repeat(b, size // len(b))
    best = min(permutations(range(len(copies_b))),
               key=lambda p: sum((copies_a[i] - copies_b[j]) ** 2 for i, j in enumerate(p)))
    return float(np.mean([abs(score(copies_a[i]) - score(copies_b[j])) for i, j in enumerate(best)]))


@pytest.mark.parametrize("a, b, by_hand", [
    # 0-0.5, 1-2, 3-5 (the nearest person would pair 1 with 0.5 and 3 with 2): gaps 0.05, 0.1, 0.2
    ([0.0, 1.0, 3.0], [0.5, 2.0, 5.0], 0.35 / 3),
    # 0 puts 2/3 of its mass on 0.5 and 1/3 on 2 (gaps 0.05, 0.2), 1 puts 1/3 on 2 and 2/3 on 5 (gaps 0.1, 0.4):
    # group 0's MDP (0.1 + 0.3) / 2 = 0.2, group 1's (0.05 + 0.15 + 0.4) / 3 = 0.2; unweighted, group 0's is 0.1875
    ([0.0, 1.0], [0.5, 2.0, 5.0], 0.2),
])
def test_mdp_of_a_frozen_map_is_that_of_the_brute_force_optimal_coupling(a, b, by_hand):
    score = (lambda x: np.asarray(x) / 10)
    assert brute_force_mdp(np.array(a), np.array(b), score) == pytest.approx(by_hand)
    X, s = np.r_[a, b][:, None], np.repeat([0, 1], [len(a), len(b)])
    matched = GroupTransportMap().fit(X, s).counterparts(X, s)
    rows = matched.rows
    # each group its own stratum: a coupling gives both groups the same MDP, each read alone here
    result = matched_dp(score(X[rows, 0]), score(matched.X[:, 0]), s[rows], matched.s, u=s[rows],
                        weights=matched.weights)
    np.testing.assert_allclose(result.per_stratum, [by_hand, by_hand], rtol=1e-12)
    assert result.overall == pytest.approx(by_hand, rel=1e-12)


def test_fair_matching_cost_is_the_mean_squared_distance_of_rank_matched_pairs():
    X = np.array([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0], [0.0, 1.0], [1.0, 2.0], [3.0, 1.0]])
    s = np.array([0, 0, 0, 1, 1, 1])
    scores = np.array([0.1, 0.5, 0.9, 0.2, 0.4, 0.8])  # ranks pair 0-3, 1-4, 2-5: squared gaps 1, 4, 1
    result = fair_matching_cost(X, scores, s, n_batches=3)
    assert result.cost.tolist() == pytest.approx([2.0]) and result.cost_sd.tolist() == [0.0]
    assert result.mdp.tolist() == pytest.approx([0.1]) and result.pairs == [(1, 0)]  # a tie: group 0 is the reference
    three = fair_matching_cost(np.zeros((7, 1)), np.linspace(0, 1, 7), [0, 1, 1, 1, 2, 2, 1], n_batches=2)
    assert three.pairs == [(0, 1), (2, 1)] and three.batch_size.tolist() == [1, 2]


def test_errors_name_the_problem():
    with pytest.raises(RepairInputError, match="row 1 is matched within its own group 'b'"):
        MatchedDPAccumulator(groups=["a", "b"]).update([0.1, 0.2], [0.3, 0.4], ["a", "b"], ["b", "b"])
    with pytest.raises(RepairInputError, match="built without groups"):
        MatchedDPAccumulator().update([0.1], [0.2], s=[0])
    with pytest.raises(RepairInputError, match="s_matched has an unknown value 'z'"):
        MatchedDPAccumulator(groups=["a", "b"]).update([0.1], [0.2], ["a"], ["z"])
    with pytest.raises(RepairInputError, match="two or more groups"):
        MatchedDPAccumulator(groups=["a"])
    with pytest.raises(RepairInputError, match="'matched_scores' has a non-finite value"):
        matched_dp([0.1, 0.2], [0.3, np.nan])
    with pytest.raises(RepairInputError, match="equal-size"):
        fair_matching([0.1, 0.2], [0.3])
    with pytest.raises(RepairInputError, match="different settings"):
        MatchedDPAccumulator(groups=[0, 1]).merge(MatchedDPAccumulator(groups=[0, 2]))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.lists(st.integers(0, 12), min_size=1, max_size=6))
def test_runs_are_accumulators_each_fed_its_run(seed, lengths):
    # One validation and one count for every run of rows: the same sums as a fresh accumulator per run.
    rng = np.random.default_rng(seed)
    n = sum(lengths)
    f, f_matched, weights = rng.random(n), rng.random(n), rng.random(n) * 3
    s = rng.integers(0, 3, n)
    s_matched, u = (s + rng.integers(1, 3, n)) % 3, rng.integers(0, 2, n)
    empty = MatchedDPAccumulator(groups=[0, 1, 2], strata=[0, 1])
    bounds = np.r_[0, np.cumsum(lengths)]
    runs = empty.runs(f, f_matched, s, s_matched, u, weights, bounds)
    assert len(runs) == len(lengths)
    for accumulator, a, b in zip(runs, bounds[:-1], bounds[1:]):
        expected = empty.fresh().update(f[a:b], f_matched[a:b], s[a:b], s_matched[a:b], u[a:b], weights[a:b])
        for name in ("abs_sums_", "masses_", "totals_"):
            assert np.array_equal(getattr(accumulator, name), getattr(expected, name))
        assert accumulator.merge(expected).totals_.sum() == 2 * (b - a)


def test_runs_refuse_what_update_refuses():
    empty = MatchedDPAccumulator(groups=[0, 1])
    with pytest.raises(RepairInputError, match="negative"):
        empty.runs([0.5, 0.5], [0.1, 0.2], [0, 1], [1, 0], None, [1.0, -1.0], [0, 1, 2])
    with pytest.raises(RepairInputError, match="own group"):
        empty.runs([0.5], [0.1], [0], [0], None, [1.0], [0, 1])


# Mutation testing (docs/mutation.md) found these behaviours untested.


def test_per_stratum_reads_only_the_pairs_a_stratum_saw():
    acc = MatchedDPAccumulator(groups=["a", "b", "c"], strata=[0, 1, 2])
    acc.update([0.9, 0.5, 0.3, 0.8, 0.1], [0.7, 0.1, 0.6, 0.2, 0.4], s=["a", "b", "c", "a", "a"],
               s_matched=["b", "a", "a", "b", "b"], u=[0, 0, 1, 1, 0], weights=[0.25, 0.5, 0.4, 1.0, 0.0])
    result = acc.value()
    # stratum 0 saw pair a-b only, with weights summing below one (and a row of weight 0: counted, no mass);
    # stratum 1 saw a-c (gap 0.3) and a-b (gap 0.6); stratum 2 saw nothing
    expected_0 = (0.25 * 0.2 + 0.5 * 0.4) / 0.75
    np.testing.assert_allclose(result.per_stratum, [expected_0, 0.6, np.nan])
    np.testing.assert_allclose(result.per_pair, [[expected_0, np.nan, np.nan], [0.6, 0.3, np.nan]] + [[np.nan] * 3])
    assert result.n_rows.tolist() == [[3, 0, 0], [1, 1, 0], [0, 0, 0]] and result.strata.tolist() == [0, 1, 2]
    assert result.pair_values.shape == (3,) and MatchedDPAccumulator().value().pair_values.shape == (1,)


def test_runs_start_where_their_bounds_start():
    rng = np.random.default_rng(4)
    f, g, w = rng.random(11), rng.random(11), rng.random(11)
    runs = MatchedDPAccumulator().runs(f, g, None, None, None, w, [3, 5, 9])  # rows 0-2 and 9-10 in none
    for accumulator, (a, b) in zip(runs, [(3, 5), (5, 9)]):
        assert accumulator.value().overall == pytest.approx(np.average(np.abs(f[a:b] - g[a:b]), weights=w[a:b]))


@pytest.mark.parametrize("call, message", [
    (lambda: matched_dp([0.1, 0.2, 0.3], [0.1, 0.2, 0.3], weights=[1, 0, -1]), "^weights has a negative value .* at row 2"),
    (lambda: MatchedDPAccumulator().update([np.nan], [0.1]), "^column 'scores' has"),
    (lambda: matched_dp([np.nan], [0.1]), "^column 'f_x' has"),
    (lambda: MatchedDPAccumulator().update([0.1, 0.2], [0.1]), r"^matched_scores must be one value per row \(2\)"),
    (lambda: MatchedDPAccumulator().update([0.1, 0.2], [0.1, 0.2], weights=[1.0]), "^weights must be one value"),
    (lambda: MatchedDPAccumulator(strata=[0, 1]).update([0.1], [0.2], u=[5]), "^u has an unknown value 5"),
    (lambda: MatchedDPAccumulator(groups=["a", "b"]).update([0.1], [0.2], ["z"], ["a"]), "^s has an unknown value"),
    (lambda: MatchedDPAccumulator(groups=["a", "a"]), "^groups holds duplicate labels"),
    (lambda: MatchedDPAccumulator(strata=[0, 0]), "^strata holds duplicate labels"),
    (lambda: fair_matching([np.nan], [0.1]), "^column 'f_a' has"),
    (lambda: fair_matching([0.1], [np.nan]), "^column 'f_b' has"),
    (lambda: fair_matching_cost([[np.nan], [1.0]], [0.1, 0.2], [0, 1]), "^column 'x0' has"),
    (lambda: fair_matching_cost([[0.0], [1.0]], [0.1], [0, 1]), r"^scores must be one value per row \(2\)"),
    (lambda: fair_matching_cost([[0.0], [1.0]], [0.1, 0.2], [0]), "^s must have one value per row"),
    (lambda: fair_matching_cost([[0.0], [1.0]], [0.1, 0.2], [0, 5], groups=[0, 1]), "^s has an unknown value 5"),
    (lambda: MatchedDPAccumulator().runs([np.nan], [0.1], None, None, None, [1.0], [0, 1]), "^column 'scores' has"),
    (lambda: MatchedDPAccumulator().runs([0.1], [np.nan], None, None, None, [1.0], [0, 1]), "^column 'matched_scores'"),
    (lambda: MatchedDPAccumulator().runs([0.1, 0.2], [0.1], None, None, None, [1.0, 1.0], [0, 1]), "^matched_scores must"),
    (lambda: MatchedDPAccumulator().runs([0.1, 0.2], [0.1, 0.2], None, None, None, [1.0], [0, 1]), "^weights must"),
    (lambda: MatchedDPAccumulator(strata=[0, 1]).runs([0.1], [0.2], None, None, [7], [1.0], [0, 1]), "^u has an unknown"),
])
def test_every_error_names_its_argument(call, message):
    with pytest.raises(RepairInputError, match=message):
        call()


def test_fair_matching_cost_honours_its_groups_reference_batch_size_and_seed():
    rng = np.random.default_rng(5)
    X, scores, s = rng.normal(size=(60, 2)), rng.random(60), np.repeat([0, 1, 2], [10, 20, 30])
    kwargs = dict(groups=[0, 1, 2, 3], reference=1, n_batches=4, batch_size=8)  # group 3 has no row
    result = fair_matching_cost(X, scores, s, **kwargs)
    assert result.pairs == [(0, 1), (2, 1)] and result.batch_size.tolist() == [8, 8] and result.n_batches == 4
    assert result.cost_sd.min() > 0  # batches of 8 of 10, 20 and 30 rows differ
    again = fair_matching_cost(X, scores, s, **kwargs)
    np.testing.assert_array_equal(again.cost, result.cost)  # seeded: the same batches
    assert not np.array_equal(fair_matching_cost(X, scores, s, seed=1, **kwargs).cost, result.cost)
    small_reference = fair_matching_cost(X, scores, s, reference=0, n_batches=2, batch_size=25)
    assert small_reference.batch_size.tolist() == [10, 10]  # no batch larger than either group


def test_fair_matching_pairs_tied_scores_in_row_order():
    # Ties are broken by position (a stable sort), so the matching and its transport cost are reproducible.
    rng = np.random.default_rng(0)
    f_a, f_b = rng.integers(0, 3, 200) / 2, rng.integers(0, 3, 200) / 2  # 200 scores of three values
    i, j = fair_matching(f_a, f_b)
    in_row_order = (lambda f: [row for value in (0.0, 0.5, 1.0) for row in np.flatnonzero(f == value)])
    assert i.tolist() == in_row_order(f_a) and j.tolist() == in_row_order(f_b)


def test_weights_of_zero_are_accepted():
    assert matched_dp([0.9, 0.2], [0.6, 0.4], weights=[0.0, 1.0]).overall == pytest.approx(0.2)
