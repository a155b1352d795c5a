import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.stats import norm

from fairstream.repair.density import (
    binned_bandwidth,
    binned_counts,
    dirichlet_strength,
    group_pmfs,
    kde_pmf,
    linear_binning,
    proportion_strength,
    row_kernel,
    silverman_bandwidth,
    spread,
)

NODES = np.linspace(0.0, 10.0, 21)
samples = arrays(np.float64, st.integers(1, 200), elements=st.floats(0.0, 10.0))


@given(samples)
def test_linear_binning_keeps_mass_and_mean(x):
    p = linear_binning(x, NODES)
    assert abs(p.sum() - 1) < 1e-9
    assert abs(p @ NODES - x.mean()) < 1e-9


def test_atoms_survive_the_empirical_estimate_but_not_the_kde():
    # Half of Adult works exactly 40 hours: the empirical pmf keeps that atom, a KDE melts it.
    rng = np.random.default_rng(0)
    x = np.where(rng.random(4000) < 0.5, 40.0, rng.integers(1, 99, 4000)).astype(float)
    nodes = np.arange(1.0, 99.0)
    assert linear_binning(x, nodes)[39] > 0.49
    assert kde_pmf(x, nodes, silverman_bandwidth(x))[39] < 0.3


def test_silverman_falls_back_when_iqr_is_zero():
    x = np.array([40.0] * 80 + [20.0, 60.0] * 10)
    assert silverman_bandwidth(x) > 0
    assert silverman_bandwidth(np.full(10, 3.0)) == 0.0


# ------------------------------------------------------------------ row kernel, empirical Bayes, group pmfs


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 10), st.floats(0.05, 4.0))
def test_row_kernel_is_the_row_distribution_of_kernel_draws_under_algorithm_2(source, h):
    # Records drawn from N(node, h^2), clamped to the grid and linearly interpolated between rows
    # (what Algorithm 2 does with them), use row j with probability K[j, source].
    nodes = np.linspace(0.0, 10.0, 11)
    draws = np.random.default_rng(source).normal(nodes[source], h, 200_000)
    np.testing.assert_allclose(row_kernel(nodes, h)[:, source], linear_binning(draws, nodes), atol=0.005)


def direct_row_kernel(nodes, h):
    """The kernel entry by entry, one Gaussian integral per (row, source) pair (the O(n^2) way)."""
    step = nodes[1] - nodes[0]
    ramp = lambda t: t * norm.cdf(t / h) + h * norm.pdf(t / h)  # E[(Y + t)^+] for Y ~ N(0, h^2)
    offset = nodes[None, :] - nodes[:, None]
    K = (ramp(offset + step) - 2.0 * ramp(offset) + ramp(offset - step)) / step
    K[0] = (ramp(step - offset[0]) - ramp(-offset[0])) / step
    K[-1] = (ramp(offset[-1] + step) - ramp(offset[-1])) / step
    return np.clip(K, 0.0, None)


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 120), st.floats(-50.0, 50.0), st.floats(0.01, 3.0), st.floats(0.01, 30.0), st.integers(0, 2**31))
def test_the_kernel_from_its_lags_and_spread_equal_the_direct_kernel(n, start, step, h, seed):
    # row_kernel computes the 2n - 1 distinct lags and spread() convolves with them; both must be
    # the kernel integrated entry by entry, on any uniform grid (not only the integer lattice).
    nodes = start + step * np.arange(n)
    mass = np.random.default_rng(seed).random(n)
    K = direct_row_kernel(nodes, h)
    np.testing.assert_allclose(row_kernel(nodes, h), K, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(spread(nodes, h, mass), K @ mass, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(spread(nodes, 0.0, mass), mass)


@given(st.integers(2, 60), st.floats(0.0, 20.0))
def test_row_kernel_columns_are_pmfs_and_bandwidth_zero_is_the_identity(n, h):
    nodes = np.linspace(-3.0, 5.0, n)
    K = row_kernel(nodes, h)
    assert np.all(K >= 0) and np.allclose(K.sum(axis=0), 1.0)
    np.testing.assert_array_equal(row_kernel(nodes, 0.0), np.eye(n))


def test_the_kde_keeps_its_tails_at_the_end_rows_where_clamped_records_go():
    # A sample piled at the top of the grid: half of its KDE lies beyond the grid and belongs to
    # the last row (clamped records use it), not spread over the interior.
    nodes = np.arange(0.0, 21.0)
    p = kde_pmf(np.full(50, 20.0), nodes, bandwidth=3.0)
    assert p[-1] > 0.5 and abs(p @ nodes - 20.0 + 3.0 * 0.4) < 0.2


def test_binned_bandwidth_matches_silverman_on_the_sample():
    x = np.random.default_rng(1).normal(5.0, 2.0, 4000)
    nodes = np.linspace(-5.0, 15.0, 400)
    assert abs(binned_bandwidth(nodes, binned_counts(x, nodes), len(x)) / silverman_bandwidth(x) - 1) < 0.03


def test_empirical_bayes_keeps_atoms_and_smooths_noise():
    rng = np.random.default_rng(2)
    nodes = np.arange(0.0, 100.0)
    smooth = np.round(rng.normal(50, 10, 400))
    atoms = np.where(rng.random(400) < 0.4, 40.0, smooth)
    n0 = {name: dirichlet_strength(binned_counts(x, nodes), kde_pmf(x, nodes, silverman_bandwidth(x)))
          for name, x in (("smooth", smooth), ("atoms", atoms))}
    assert n0["smooth"] >= 100 * n0["atoms"]


def test_proportion_strength_trusts_the_model_unless_a_node_contradicts_it():
    rng = np.random.default_rng(3)
    nodes = np.arange(0.0, 30.0)
    share = 1 / (1 + np.exp(-(nodes - 15) / 5))  # Pr[s = 1 | x = node]
    x = rng.integers(0, 30, 3000).astype(float)
    s = (rng.random(3000) < share[x.astype(int)]).astype(int)
    model = np.vstack([1 - share, share])
    counts = np.vstack([binned_counts(x[s == g], nodes) for g in (0, 1)])
    smooth_m = proportion_strength(counts, model)
    s_atom = np.where(x == 10.0, 1, s)  # at x = 10 every record is in group 1, against the model
    atom_m = proportion_strength(np.vstack([binned_counts(x[s_atom == g], nodes) for g in (0, 1)]), model)
    # About 100 records per node: m above that means the model outweighs each node's own shares.
    assert smooth_m >= 300 and atom_m < smooth_m / 10


@settings(max_examples=40, deadline=None)
@given(arrays(np.float64, st.integers(4, 150), elements=st.floats(0.0, 10.0)), st.integers(0, 2**31))
def test_group_pmfs_are_pmfs_and_strength_zero_keeps_each_groups_own_values(x, seed):
    codes = np.random.default_rng(seed).integers(0, 2, len(x))
    shares = np.vstack([np.full(len(NODES), 0.5)] * 2)
    present = np.bincount(codes, minlength=2) > 0
    pmfs = group_pmfs(x, codes, 2, NODES, 1.5, shares)
    assert np.allclose(pmfs.sum(axis=1), present.astype(float)) and np.all(pmfs >= 0)
    own = group_pmfs(x, codes, 2, NODES, 1.5, shares, strength=0.0)
    for g in np.flatnonzero(present):
        np.testing.assert_allclose(own[g], linear_binning(x[codes == g], NODES), atol=1e-12)


def test_a_thin_group_borrows_its_strata_shape():
    # 20 rows of group 0 among 400: its pmf from the pooled sample and the posterior is closer to
    # the truth than the KDE of its own 20 rows (mean L1 over repetitions).
    nodes = np.linspace(-5.0, 6.0, 60)
    truth = linear_binning(np.random.default_rng(0).normal(1.0, 1.0, 400_000), nodes)
    err_pooled, err_own = [], []
    for seed in range(20):
        rng = np.random.default_rng(seed + 1)
        codes = (rng.random(400) >= 0.05).astype(int)
        x = rng.normal(np.where(codes == 0, 1.0, 0.0), 1.0)
        logit = np.polyfit(x, codes == 0, 1)  # a rough linear model of Pr[s = 0 | x] is enough
        p0 = np.clip(np.polyval(logit, nodes), 0.01, 0.99)
        pooled = group_pmfs(x, codes, 2, nodes, 1.5, np.vstack([p0, 1 - p0]))[0]
        own = group_pmfs(x[codes == 0], np.zeros(int((codes == 0).sum()), int), 1, nodes, 1.5)[0]
        err_pooled.append(np.abs(pooled - truth).sum()); err_own.append(np.abs(own - truth).sum())
    assert np.mean(err_pooled) < 0.8 * np.mean(err_own)
