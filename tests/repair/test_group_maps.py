"""Tests of the exact OT maps between groups: brute force on small cases, out-of-sample use, arrays."""

import doctest
from itertools import permutations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import wasserstein_distance

from fairstream.repair import artifacts, group_maps
from fairstream.repair.validation import RepairInputError
from fairstream.repair.group_maps import METHODS, GroupTransportMap, exact_matching, squared_distances
from fairstream.repair.measure.mdp import matched_dp

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


def pushforward(matched, values):
    """The weighted counterparts of ``matched`` as a measure: total weight per distinct counterpart (rounded)."""
    out = {}
    for x, w in zip(map(tuple, values), matched.weights):
        out[x] = round(out.get(x, 0.0) + w, 9)
    return out


def test_identical_records_are_one_point_carrying_all_their_partners():
    # Two identical records in group 0, one copy in group 1: the coupling sends the pair's mass half to the
    # copy and half to a 0.0; each of the two records carries both halves, so on its own records the map
    # carries group 0 exactly onto group 1 (two 0.0s and one 1.0).
    X, s = np.array([[1.0], [1.0], [0.0], [1.0], [0.0], [0.0]]), np.array([0, 0, 0, 1, 1, 1])
    gmap = GroupTransportMap(reference=1).fit(X, s)
    matched = gmap.counterparts(X[:3], s[:3])
    assert matched.rows.tolist() == [0, 0, 1, 1, 2] and matched.weights.tolist() == [0.5, 0.5, 0.5, 0.5, 1.0]
    assert pushforward(matched, matched.X) == {(0.0,): 2.0, (1.0,): 1.0}


def transport_lp(A, B):
    """The optimal transport cost between the uniform measures on the rows of A and of B, by a generic LP."""
    from scipy.optimize import linprog

    cost = squared_distances(A, B)
    n, m = cost.shape
    rows = np.kron(np.eye(n), np.ones(m))
    columns = np.kron(np.ones(n), np.eye(m))
    result = linprog(cost.ravel(), A_eq=np.vstack([rows, columns]), b_eq=np.r_[np.full(n, 1 / n), np.full(m, 1 / m)],
                     bounds=(0, None), method="highs")
    return result.fun


def test_unequal_groups_are_coupled_optimally_and_exactly():
    rng = np.random.default_rng(3)
    X, s = rng.normal(size=(13, 2)), np.array([0] * 5 + [1] * 8)
    gmap = GroupTransportMap(seed=1).fit(X, s)
    assert gmap.reference_group == 1 and gmap.weight_.sum() == pytest.approx(1.0)
    Z = gmap.scaled(X)
    assert gmap.transport_cost() == {0: pytest.approx(transport_lp(Z[:5], Z[5:]), abs=1e-12)}
    forward, back = gmap.counterparts(X[:5], s[:5]), gmap.counterparts(X[5:], s[5:])
    # Each side's records, carried with their weights, are exactly the other side's records (1/5 and 1/8 each).
    assert pushforward(forward, forward.X) == {tuple(x): 5 / 8 for x in X[5:]}
    assert pushforward(back, back.X) == {tuple(x): 8 / 5 for x in X[:5]}
    small = GroupTransportMap(n_points=4, seed=1).fit(X, s)  # at most 4 records of each group enter the coupling
    assert len(np.unique(small.source_, axis=0)) == 4 and len(np.unique(small.target_, axis=0)) == 4
    assert set(map(tuple, small.source_)) <= set(map(tuple, X[s == 0]))


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
    assert np.unique(matched.rows).tolist() == [0, 1, 2]
    # the reference record has counterparts in each other group, a full unit of weight in each
    assert set(matched.s[matched.rows == 1].tolist()) == {"a", "c"} and set(matched.s[matched.rows != 1]) == {"b"}
    np.testing.assert_allclose(np.bincount(matched.rows, matched.weights), [1.0, 2.0, 1.0])
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


@st.composite
def unequal_groups(draw):
    """Two groups of different sizes (2 to 40 records, 1 to 3 features; integer features repeat records), labels
    y, the map's method, and a scorer f (any function of x: the bound holds for every f)."""
    n0, n1 = draw(st.tuples(st.integers(2, 40), st.integers(2, 40)).filter(lambda n: n[0] != n[1]))
    d, discrete = draw(st.integers(1, 3)), draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    X = rng.normal(size=(n0 + n1, d)) + np.repeat([[0.0], [0.7]], [n0, n1], axis=0)
    X = np.round(X) if discrete else X
    w, v = rng.normal(size=d), rng.normal(size=d)
    scorer = (lambda Z: 1.0 / (1.0 + np.exp(-Z @ w)) + 0.2 * np.sin(3.0 * Z @ v))
    return X, np.repeat([0, 1], [n0, n1]), rng.integers(0, 2, n0 + n1), draw(st.sampled_from(METHODS)), scorer


@PROPERTY
@given(unequal_groups())
def test_mdp_bounds_the_w1_of_the_scores_on_the_maps_own_records(data):
    # Theorem 3.7 of Kim et al. (2024): for a transport map T from group s to s', W1(f_s, f_s') <= MDP(f, T) =
    # E_s |f(X) - f(T(X))|. The coupling is a transport plan between the two groups' records, so the bound holds
    # on them exactly, in each direction, whatever the group sizes (a subsample's assignment plus snapping
    # breaks it: the snapped records pile onto a few partners).
    X, s, y, method, f = data
    gmap = GroupTransportMap(method=method).fit(X, s, y)
    matched = gmap.counterparts(X, s)
    w1 = wasserstein_distance(f(X[s == 0]), f(X[s == 1]))
    gaps = matched.weights * np.abs(f(X)[matched.rows] - f(matched.X))
    for group in (0, 1):
        assert gaps[s[matched.rows] == group].sum() / np.sum(s == group) >= w1 - 1e-12
    pooled = matched_dp(f(X)[matched.rows], f(matched.X), s[matched.rows], matched.s, weights=matched.weights)
    assert pooled.overall >= w1 - 1e-12


def stored_map():
    """A fitted joint map of unequal groups (every array present) and its stored arrays."""
    rng = np.random.default_rng(5)
    X, s, y = rng.normal(size=(30, 3)), np.repeat(["f", "m"], [12, 18]), rng.integers(0, 2, 30)
    gmap = GroupTransportMap(method="joint", alpha=5.0).fit(X, s, y, columns=["a", "b", "c"])
    return gmap, gmap.to_arrays()


def _mutations():
    """(array, how, mutate): every way a stored array can be corrupt, for every array the map reads."""
    floats = ("offset", "scale", "source", "target", "weight")
    integers = ("reference_index", "pair", "source_y", "target_y")
    # (a map without weight is one stored before couplings: see the next test but one)
    out = [(name, "missing", None) for name in ("groups", *floats, *integers) if name != "weight"]
    for name in (*floats, "groups", "pair", "source_y", "target_y"):
        out.append((name, "truncated", lambda a: a[:-1]))
        out.append((name, "wrong shape", lambda a: a[:, None] if a.ndim == 1 else a.ravel()))
    for name in floats:
        out.append((name, "NaN", lambda a: np.where(np.arange(a.size).reshape(a.shape) == 0, np.nan, a)))
        out.append((name, "inf", lambda a: np.where(np.arange(a.size).reshape(a.shape) == a.size - 1, np.inf, a)))
        out.append((name, "wrong dtype", lambda a: a.astype(np.int64)))
    for name in integers:
        out.append((name, "wrong dtype", lambda a: a.astype(np.float64)))
    out += [("groups", "wrong dtype", lambda a: np.array([1 + 0j, 2 + 0j])),
            ("groups", "duplicate labels", lambda a: np.array([a[0], a[0]])),
            ("reference_index", "wrong shape", lambda a: a.reshape(1)),
            ("reference_index", "out of range", lambda a: np.array(2)),
            ("reference_index", "negative", lambda a: np.array(-1)),
            ("pair", "out of range", lambda a: np.where(np.arange(a.size) == 0, 2, a)),
            ("pair", "the reference group", lambda a: np.ones_like(a)),
            ("source_y", "out of range", lambda a: np.where(np.arange(a.size) == 0, 2, a).astype(a.dtype)),
            ("target_y", "negative", lambda a: np.where(np.arange(a.size) == 0, -1, a).astype(a.dtype)),
            ("weight", "negative", lambda a: np.where(np.arange(a.size) == 0, -a[0], a)),
            ("weight", "zero", lambda a: np.where(np.arange(a.size) == 0, 0.0, a)),
            ("weight", "not summing to one", lambda a: 2.0 * a),
            ("scale", "zero", lambda a: np.zeros_like(a)),
            ("offset", "wrong dtype", lambda a: a.astype(str))]
    return out


@pytest.mark.parametrize("name, how, mutate", _mutations(), ids=[f"{n}-{h}" for n, h, _ in _mutations()])
def test_from_arrays_refuses_every_corrupt_array(name, how, mutate):
    gmap, arrays = stored_map()
    params, key = gmap.get_params(), "group_map." + name
    GroupTransportMap.from_arrays(arrays, params, ["a", "b", "c"])  # intact, it loads
    broken = {k: v for k, v in arrays.items() if k != key}
    if mutate is not None:
        broken[key] = mutate(arrays[key])
    with pytest.raises(artifacts.ArtifactError, match="the group map is malformed"):
        GroupTransportMap.from_arrays(broken, params, ["a", "b", "c"])


def test_from_arrays_refuses_labels_of_a_marginal_map_unknown_arrays_and_other_column_counts():
    gmap, arrays = stored_map()
    with pytest.raises(artifacts.ArtifactError, match="undeclared array 'source_y'"):
        GroupTransportMap.from_arrays(arrays, {**gmap.get_params(), "method": "marginal"}, None)
    with pytest.raises(artifacts.ArtifactError, match=r"array 'offset' has shape \(3,\), expected \(n_features=2,\)"):
        GroupTransportMap.from_arrays(arrays, gmap.get_params(), ["a", "b"])
    with pytest.raises(artifacts.ArtifactError, match="undeclared array 'junk'"):
        GroupTransportMap.from_arrays({**arrays, "group_map.junk": np.zeros(2)}, gmap.get_params(), None)
    with pytest.raises(artifacts.ArtifactError, match="its parameters"):
        GroupTransportMap.from_arrays(arrays, {**gmap.get_params(), "extension": "linear"}, None)


def test_a_map_stored_before_couplings_loads_as_its_uniform_assignment():
    rng = np.random.default_rng(6)
    X, s = rng.normal(size=(40, 2)), np.repeat([0, 1], 20)  # equal groups: the coupling is an assignment
    gmap = GroupTransportMap().fit(X, s)
    legacy = {k: v for k, v in gmap.to_arrays().items() if k != "group_map.weight"}
    copy = GroupTransportMap.from_arrays(legacy, gmap.get_params(), None)
    assert copy.weight_.tolist() == [1 / 20] * 20
    for a, b in zip(copy.counterparts(X[:7], s[:7]), gmap.counterparts(X[:7], s[:7])):
        assert np.array_equal(a, b)


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


@PROPERTY
@given(st.integers(0, 2**32 - 1), st.integers(1, 40), st.integers(1, 60), st.integers(1, 3), st.integers(1, 4))
def test_asking_the_tree_for_two_points_first_finds_what_asking_for_eight_finds(seed, n_points, n_rows, d, grid):
    # Points and rows on a coarse grid tie often, also with more than eight points: the two-point first query
    # must give every row the nearest point, the tied rows and their tied points the eight-point query gives.
    from scipy.spatial import cKDTree

    rng = np.random.default_rng(seed)
    P = rng.integers(0, grid + 1, (n_points, d)) + rng.random((n_points, d)) * (rng.random() < 0.3)
    Z = np.r_[rng.integers(0, grid + 1, (n_rows, d)) / 2.0, P[:3]]  # halves tie between grid points, P[:3] with 0
    tree = cKDTree(P)
    fast, full = group_maps._nearest_by_tree(Z, tree), group_maps._nearest_by_tree(Z, tree, first=8)
    for a, b in zip(fast, full, strict=True):
        assert np.array_equal(a, b)


def _per_row(matched, rows):
    """Each of ``rows``' counterparts as a sorted list of (point, group, weight)."""
    return [sorted(zip(map(tuple, matched.X[matched.rows == r]), matched.s[matched.rows == r].tolist(),
                       matched.weights[matched.rows == r].tolist())) for r in rows]


@pytest.fixture(scope="module")
def tied_map():
    """A map fitted on half-integer points, and rows of the integer grid: most are exactly as near to two or four
    of its points (ties), some to one."""
    rng = np.random.default_rng(7)
    X, s = np.round(rng.normal(size=(120, 2)) * 1.5) + 0.5, np.repeat([0, 1], [70, 50])
    return GroupTransportMap(seed=0).fit(X, s), rng


def test_draws_give_each_row_its_counterparts_whatever_batch_it_is_in(tied_map):
    gmap, rng = tied_map
    X, s = np.round(rng.normal(size=(600, 2)) * 1.5), rng.integers(0, 2, 600)
    X[:40] = X[0]  # one row many times: without draws, its copies take the tied points in turn
    s[:40] = s[0]
    draws = rng.random(600)
    whole = gmap.counterparts(X, s, draws=draws)
    rows = np.arange(600)
    for part in np.split(rng.permutation(600), [7, 250, 251, 480]):  # other batches, in another order
        alone = gmap.counterparts(X[part], s[part], draws=draws[part])
        assert _per_row(alone, range(len(part))) == _per_row(whole, part)
    # The copies of one row with the same draw get the same counterparts; the point a draw picks among k tied
    # points is the floor(k * draw)-th, so the choice is uniform over them.
    same = gmap.counterparts(X[:40], s[:40], draws=np.full(40, draws[0]))
    assert len({tuple(map(tuple, c)) for c in _per_row(same, range(40))}) == 1
    spread = gmap.counterparts(X[:40], s[:40], draws=(np.arange(40) + 0.5) / 40)
    picked = [tuple(map(tuple, c)) for c in _per_row(spread, range(40))]
    assert len(set(picked)) > 1 and max(map(picked.count, set(picked))) - min(map(picked.count, set(picked))) <= 1
    # Without draws the round robin is unchanged: the k-th copy takes the k-th tied point (cyclically), so a copy's
    # counterparts depend on the copies before it in the call.
    turns = [tuple(map(tuple, c)) for c in _per_row(gmap.counterparts(X[:40], s[:40]), range(40))]
    k = len(set(turns))
    assert k > 1 and turns == [turns[i % k] for i in range(40)]
    later = [tuple(map(tuple, c)) for c in _per_row(gmap.counterparts(X[1:40], s[1:40]), range(39))]
    assert later == turns[:39] and later[0] != turns[1]
    # A row without a tie gets its one nearest point, with draws or without.
    low, high = (_per_row(gmap.counterparts(X, s, draws=np.full(600, d)), rows) for d in (0.0, 0.999))
    untied = [r for r in rows if low[r] == high[r]]
    plain = _per_row(gmap.counterparts(X, s), rows)
    assert 0 < len(untied) < 600 and all(plain[r] == low[r] for r in untied)


@pytest.mark.parametrize("groups", [[0, 1], [3, 10, 200], ["a", "b"]])
def test_group_codes_of_numbers_and_of_text_agree(groups):
    # Integer groups are compared as numbers, other labels as text: the codes are the same as by their text.
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 2))
    s = np.array(groups)[np.arange(60) % len(groups)]
    fitted = GroupTransportMap(seed=0, n_points=20).fit(X, s)
    probe = np.r_[s[:7], s[:3]] if s.dtype.kind != "i" else np.r_[s[:7], [-1, 7, 11]]
    codes = fitted._codes(probe)
    keys = fitted.groups_.astype(str).tolist()
    assert codes.tolist() == [keys.index(str(v)) if str(v) in keys else -1 for v in probe]
