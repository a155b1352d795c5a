import numpy as np
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from fairstream.repair.transport import barycenter, monotone_plan, row_cdfs, sample_rows

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
def test_row_cdfs_are_cdfs_and_empty_rows_follow_the_monotone_map(a, b):
    plan = monotone_plan(a, b, NODES)
    cdfs = row_cdfs(plan, a, b)
    assert np.all(np.diff(cdfs, axis=1) >= -1e-12)
    assert np.all(cdfs[:, -1] == 1.0)
    # A row without source mass is a point mass on a node where the target has mass.
    for r in np.flatnonzero(a <= 1e-12):
        j = int(np.argmax(cdfs[r] > 0))
        assert cdfs[r, j] == 1.0 and b[j] > 0


def test_sample_rows_matches_row_distribution_and_skips_zero_mass():
    rng = np.random.default_rng(0)
    a = np.array([0.2, 0.0, 0.5, 0.3]); b = np.array([0.1, 0.4, 0.0, 0.5])
    nodes = np.arange(4.0)
    cdfs = row_cdfs(monotone_plan(a, b, nodes), a, b)
    rows = np.repeat(np.arange(4), 50_000)
    cols = sample_rows(cdfs, rows, rng.random(len(rows)))
    for r in range(4):
        freq = np.bincount(cols[rows == r], minlength=4) / 50_000
        expected = np.diff(np.concatenate([[0.0], cdfs[r]]))
        np.testing.assert_allclose(freq, expected, atol=0.01)
        assert np.all(freq[expected == 0] == 0)
