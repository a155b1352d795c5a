"""Tests of the exact OT maps between groups: brute force on small cases, out-of-sample use, arrays."""

import doctest
from itertools import permutations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.repair import group_maps
from fairstream.repair._validation import RepairInputError
from fairstream.repair.group_maps import GroupTransportMap, exact_matching, squared_distances

PROPERTY = settings(max_examples=40, deadline=None)


def brute_force(A, B, y_a=None, y_b=None, alpha=0.0):
    """The cheapest one-to-one matching by enumerating every permutation: (cost, perm)."""
    cost = squared_distances(A, B)
    if alpha:
        cost = cost + alpha * np.abs(np.subtract.outer(y_a, y_b))
    return min((cost[np.arange(len(A)), list(p)].sum(), list(p)) for p in permutations(range(len(B))))


@st.composite
def two_samples(draw):
    """Two equal-size samples (2 to 6 points, 1 to 3 features) and 0/1 labels."""
    n, d = draw(st.integers(2, 6)), draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    A, B = rng.normal(size=(n, d)), rng.normal(size=(n, d)) + rng.normal(size=d)
    return A, B, rng.integers(0, 2, n), rng.integers(0, 2, n)


def test_docstring_examples_run():
    result = doctest.testmod(group_maps)
    assert result.attempted > 0 and result.failed == 0


@PROPERTY
@given(two_samples())
def test_the_marginal_map_is_the_optimal_assignment(samples):
    A, B, _, _ = samples
    best_cost, best_perm = brute_force(A, B)
    perm = exact_matching(A, B)
    assert squared_distances(A, B)[np.arange(len(A)), perm].sum() == pytest.approx(best_cost, rel=1e-12, abs=1e-12)
    assert perm.tolist() == best_perm  # continuous data: the optimum is unique


@PROPERTY
@given(two_samples(), st.sampled_from([0.5, 3.0, 100.0]))
def test_the_joint_map_is_the_optimal_assignment_of_the_joint_cost(samples, alpha):
    A, B, y_a, y_b = samples
    best_cost, _ = brute_force(A, B, y_a, y_b, alpha)
    perm = exact_matching(A, B, y_a, y_b, alpha)
    cost = squared_distances(A, B) + alpha * np.abs(np.subtract.outer(y_a, y_b))
    assert cost[np.arange(len(A)), perm].sum() == pytest.approx(best_cost, rel=1e-12, abs=1e-12)
    if alpha == 100.0:  # the label term dominates: as few label changes as the label counts allow
        assert np.sum(y_a != y_b[perm]) == abs(int(y_a.sum()) - int(y_b.sum()))


@PROPERTY
@given(two_samples(), st.sampled_from(["nearest", "shift"]))
def test_a_fitted_map_reproduces_the_brute_force_matching_on_its_points(samples, extension):
    A, B, _, _ = samples
    X, s = np.vstack([A, B]), np.repeat([0, 1], len(A))
    gmap = GroupTransportMap(extension=extension, reference=1).fit(X, s)
    Z = gmap.scaled(X)  # costs are taken on min-max scaled features
    _, best = brute_force(Z[: len(A)], Z[len(A):])
    matched = gmap.counterparts(X, s)
    assert matched.rows.tolist() == list(range(len(X))) and matched.s.tolist() == [1] * len(A) + [0] * len(B)
    np.testing.assert_allclose(matched.X[: len(A)], B[best], atol=1e-12)  # group 0 -> its partner in group 1
    np.testing.assert_allclose(matched.X[len(A):][best], A, atol=1e-12)  # and back: the inverse permutation


def test_duplicate_records_are_spread_over_their_partners():
    # Two identical records in group 0, one copy in group 1: snapping both to the first copy would map
    # them to one partner; ties are spread, so on its own points the map stays one-to-one.
    X, s = np.array([[1.0], [1.0], [0.0], [1.0], [0.0], [0.0]]), np.array([0, 0, 0, 1, 1, 1])
    gmap = GroupTransportMap(reference=1).fit(X, s)
    matched = gmap.counterparts(X[:3], s[:3])
    assert sorted(matched.X.ravel().tolist()) == [0.0, 0.0, 1.0]


def test_unequal_groups_are_matched_on_equal_size_subsamples_that_are_optimally_paired():
    rng = np.random.default_rng(3)
    X, s = rng.normal(size=(13, 2)), np.array([0] * 5 + [1] * 8)
    gmap = GroupTransportMap(n_points=4, seed=1).fit(X, s)
    assert gmap.reference_group == 1 and gmap.source_.shape == gmap.target_.shape == (4, 2)
    source, target = gmap.scaled(gmap.source_), gmap.scaled(gmap.target_)
    best, _ = brute_force(source, target)
    assert np.sum((source - target) ** 2) == pytest.approx(best)
    assert set(map(tuple, gmap.source_)) <= set(map(tuple, X[s == 0]))
    assert set(map(tuple, gmap.target_)) <= set(map(tuple, X[s == 1]))
    assert gmap.transport_cost() == {0: pytest.approx(best / 4)}


def test_new_records_get_real_records_of_the_other_group_or_a_shifted_copy():
    rng = np.random.default_rng(0)
    A = rng.uniform(size=(50, 2))
    X, s = np.vstack([A, A + [2.0, -1.0]]), np.repeat([0, 1], 50)  # group 1 is group 0 translated
    new = rng.uniform(size=(7, 2))
    nearest = GroupTransportMap().fit(X, s).counterparts(new, [0] * 7)
    assert set(map(tuple, nearest.X)) <= set(map(tuple, X[s == 1])) and nearest.s.tolist() == [1] * 7
    shifted = GroupTransportMap(extension="shift").fit(X, s).counterparts(new, [0] * 7)
    np.testing.assert_allclose(shifted.X, new + [2.0, -1.0], atol=1e-12)  # the OT map of a translation


def test_more_than_two_groups_are_matched_to_the_largest_group():
    rng = np.random.default_rng(1)
    X, s = rng.normal(size=(60, 3)), np.array(["a"] * 10 + ["b"] * 30 + ["c"] * 20)
    gmap = GroupTransportMap().fit(X, s)
    assert gmap.reference_group == "b" and sorted(gmap.transport_cost()) == ["a", "c"]
    matched = gmap.counterparts(X[[0, 15, 45]], ["a", "b", "c"])
    assert matched.rows.tolist() == [0, 1, 1, 2]  # the reference record has a counterpart in each other group
    assert matched.s.tolist() == ["b", "a", "c", "b"]
    assert GroupTransportMap(reference="c").fit(X, s).reference_group == "c"
    assert GroupTransportMap().fit(X, s, groups=["a", "b", "c"]).groups_.tolist() == ["a", "b", "c"]


def test_the_joint_map_snaps_to_a_fitted_point_with_the_same_label_when_given_labels():
    X = np.array([[0.0], [0.1], [5.0], [5.1]])
    s, y = np.array([0, 0, 1, 1]), np.array([0, 1, 1, 0])
    gmap = GroupTransportMap(method="joint", alpha=100.0).fit(X, s, y)
    assert gmap.target_y_.tolist() == gmap.source_y_.tolist()  # every pair shares its label
    without, with_label = gmap.counterparts([[0.0]], [0]), gmap.counterparts([[0.0]], [0], y=[1])
    assert without.X.tolist() == [[5.1]] and with_label.X.tolist() == [[5.0]]


def test_rows_of_unknown_groups_or_with_nan_get_no_counterpart():
    rng = np.random.default_rng(2)
    gmap = GroupTransportMap().fit(rng.normal(size=(20, 2)), np.repeat([0, 1], 10))
    matched = gmap.counterparts([[0.0, 0.0], [np.nan, 1.0], [1.0, 1.0], [0.5, 0.5]], [0, 1, 7, 1])
    assert matched.rows.tolist() == [0, 3]
    empty = gmap.counterparts(np.zeros((2, 2)), [5, 5])
    assert empty.X.shape == (0, 2) and empty.rows.size == 0


def test_arrays_round_trip_gives_the_same_counterparts():
    rng = np.random.default_rng(4)
    X, s, y = rng.normal(size=(40, 3)), rng.choice(["f", "m"], 40), rng.integers(0, 2, 40)
    gmap = GroupTransportMap(method="joint", alpha=5.0, n_points=12, seed=3).fit(X, s, y, columns=["a", "b", "c"])
    copy = GroupTransportMap.from_arrays(gmap.to_arrays(), gmap.get_params(), ["a", "b", "c"])
    new = rng.normal(size=(9, 3))
    for a, b in zip(gmap.counterparts(new, s[:9], y[:9]), copy.counterparts(new, s[:9], y[:9])):
        assert np.array_equal(a, b)
    assert copy.get_params() == gmap.get_params() and copy.columns_ == ["a", "b", "c"]


def test_errors_name_the_problem():
    X, s = np.arange(8.0).reshape(4, 2), [0, 0, 1, 1]
    with pytest.raises(RepairInputError, match="not fitted"):
        GroupTransportMap().counterparts(X, s)
    with pytest.raises(RepairInputError, match="needs the labels y"):
        GroupTransportMap(method="joint").fit(X, s)
    with pytest.raises(RepairInputError, match="s has the value 2, not among the groups"):
        GroupTransportMap().fit(X, [0, 0, 1, 2], groups=[0, 1])
    with pytest.raises(RepairInputError, match="group 2 has no records"):
        GroupTransportMap().fit(X, s, groups=[0, 1, 2])
    with pytest.raises(RepairInputError, match="two or more groups"):
        GroupTransportMap().fit(X, [1, 1, 1, 1])
    with pytest.raises(RepairInputError, match="reference group 5"):
        GroupTransportMap(reference=5).fit(X, s)
    with pytest.raises(RepairInputError, match="column 'b' has a non-finite value"):
        GroupTransportMap().fit([[0.0, 1.0], [1.0, np.inf]], [0, 1], columns=["a", "b"])
    for params, name in (({"method": "exact"}, "method"), ({"extension": "linear"}, "extension"),
                         ({"alpha": -1.0}, "alpha"), ({"n_points": 0}, "n_points")):
        with pytest.raises(RepairInputError, match=name):
            GroupTransportMap(**params).fit(X, s)
    with pytest.raises(RepairInputError, match="equal shape"):
        exact_matching(np.zeros((2, 1)), np.zeros((3, 1)))
    with pytest.raises(RepairInputError, match="3 feature columns"):
        GroupTransportMap().fit(X, s).counterparts(np.zeros((1, 3)), [0])


# --------------------------------------------------------------------------- the vectorised round-robin


def _round_robin_loop(ties, distinct_of_row):
    """The definition, one row at a time: the k-th row with a given tie set takes its k-th point."""
    turns, out = {}, []
    for d in distinct_of_row:
        candidates = np.flatnonzero(ties[d])
        key = candidates.tobytes()
        turn = turns.get(key, 0)
        out.append(candidates[turn % len(candidates)])
        turns[key] = turn + 1
    return np.array(out)


@settings(max_examples=60)
@given(st.integers(1, 6), st.integers(2, 9), st.integers(0, 10_000))
def test_the_vectorised_round_robin_equals_the_row_by_row_definition(n_distinct, n_points, seed):
    from fairstream.repair.group_maps import _round_robin, _unique_rows

    rng = np.random.default_rng(seed)
    ties = rng.random((n_distinct, n_points)) < 0.5
    ties[np.arange(n_distinct), rng.integers(0, n_points, n_distinct)] = True  # every row ties with something
    ties = np.vstack([ties, ties[:1]])  # two distinct rows may share a tie set
    rows = rng.integers(0, len(ties), 40)
    rows = rows[ties[rows].sum(axis=1) > 1]
    if len(rows):
        np.testing.assert_array_equal(_round_robin(ties, rows), _round_robin_loop(ties, rows))
    A = rng.integers(0, 3, (50, 2)).astype(float)
    distinct, inverse = _unique_rows(A)
    np.testing.assert_array_equal(distinct[inverse], A)
    assert len(distinct) == len(np.unique(A, axis=0))
