import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fairstream.repair.transport import MonotonePlan, barycenter, monotone_plan

N = 12
pmf_arrays = arrays(np.float64, N, elements=st.floats(0, 1)).filter(lambda p: p.sum() > 1e-3).map(lambda p: p / p.sum())
NODES = np.linspace(-3.0, 5.0, N)


@given(pmf_arrays, pmf_arrays)
def test_plan_marginals_are_source_and_target(a, b):
    plan = monotone_plan(a, b, NODES)
    assert np.all(plan >= 0)
    np.testing.assert_allclose(plan.sum(axis=1), a, atol=1e-9)
    np.testing.assert_allclose(plan.sum(axis=0), b, atol=1e-9)


@given(pmf_arrays, pmf_arrays)
def test_plan_is_monotone(a, b):
    # Optimal 1-D plans for a convex cost never cross: if (i, j) and (i', j') carry mass with
    # i < i' then j <= j'.
    plan = monotone_plan(a, b, NODES)
    rows, cols = np.nonzero(plan > 1e-12)
    order = np.lexsort((cols, rows))
    assert np.all(np.diff(cols[order]) >= 0)


@given(pmf_arrays, pmf_arrays, st.floats(0.05, 0.95))
def test_barycenter_mean_is_weighted_mean(a, b, w):
    nu = barycenter(np.array([a, b]), NODES, np.array([w, 1 - w]))
    assert abs(nu.sum() - 1) < 1e-9
    expected = w * (a @ NODES) + (1 - w) * (b @ NODES)
    assert abs(nu @ NODES - expected) < 1e-9


@given(pmf_arrays)
def test_barycenter_of_copies_is_the_distribution(a):
    np.testing.assert_allclose(barycenter(np.array([a, a, a]), NODES), a, atol=1e-9)


def test_barycenter_of_translates_is_the_midway_translate():
    nodes = np.arange(20.0)
    a = np.zeros(20); a[[2, 3, 4]] = [0.25, 0.5, 0.25]
    b = np.roll(a, 10)
    nu = barycenter(np.array([a, b]), nodes)
    np.testing.assert_allclose(nu, np.roll(a, 5), atol=1e-12)


@given(pmf_arrays, pmf_arrays)
def test_sampled_plan_is_the_exact_ot_plan(a, b):
    # The quantile-interval form used at apply time is the same plan POT's exact solver returns.
    np.testing.assert_allclose(MonotonePlan.between(a, b).dense(), monotone_plan(a, b, NODES), atol=1e-9)


@given(pmf_arrays, pmf_arrays)
def test_rows_without_source_mass_go_to_a_target_node_with_mass_at_their_rank(a, b):
    plan = MonotonePlan.between(a, b)
    empty = np.flatnonzero(a <= 0)
    for v in (0.0, 0.5, 0.999):
        cols = plan.sample(empty, np.full(len(empty), v))
        assert np.all(b[cols] > 0)
    # ... namely a target quantile at the row's rank (either side of it when the rank is a boundary).
    level, t_cdf = np.cumsum(a)[empty], np.cumsum(b)
    cols = plan.sample(empty, np.zeros(len(empty)))
    lo = np.searchsorted(t_cdf, level - 1e-9, side="left")
    hi = np.searchsorted(t_cdf, level + 1e-9, side="right")
    assert np.all((cols >= np.minimum(lo, len(b) - 1)) & (cols <= hi))


def test_sampling_matches_row_distribution_and_skips_zero_mass():
    rng = np.random.default_rng(0)
    a = np.array([0.2, 0.0, 0.5, 0.3]); b = np.array([0.1, 0.4, 0.0, 0.5])
    plan = MonotonePlan.between(a, b)
    dense = plan.dense()
    rows = np.repeat([0, 2, 3], 50_000)
    cols = plan.sample(rows, rng.random(len(rows)))
    for r in (0, 2, 3):
        freq = np.bincount(cols[rows == r], minlength=4) / 50_000
        expected = dense[r] / dense[r].sum()
        np.testing.assert_allclose(freq, expected, atol=0.01)
        assert np.all(freq[expected == 0] == 0)
