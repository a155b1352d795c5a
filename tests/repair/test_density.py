import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.special import gammaln
from scipy.stats import norm

from fairstream.repair.density import (
    STRENGTHS,
    binned_bandwidth,
    binned_counts,
    dirichlet_strength,
    dirichlet_strengths,
    group_pmfs,
    group_pmfs_stack,
    kde_pmf,
    linear_binning,
    proportion_strength,
    proportion_strengths,
    row_kernel,
    sample_bandwidths,
    silverman_bandwidth,
    spread,
    spread_stack,
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


# ------------------------------------------------------------------ many (stratum, feature) problems at once


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.floats(0.05, 3.0), st.floats(0.0, 8.0)), min_size=1, max_size=5),
       st.integers(0, 2**31))
def test_spread_stack_spreads_each_row_on_its_own_grid(grids, seed):
    # Rows of different lengths share one windowed product, zero-padded to the longest: each must be its
    # own grid's kernel times its mass, whatever the others are.
    rng = np.random.default_rng(seed)
    size = np.array([n for n, _, _ in grids])
    step, h = np.array([d for _, d, _ in grids]), np.array([b for _, _, b in grids])
    mass = rng.random((len(grids), size.max())) * (np.arange(size.max()) < size[:, None])
    out = spread_stack(step, size, h, mass)
    for r, n in enumerate(size):
        nodes = step[r] * np.arange(n)
        want = mass[r, :n] if n < 2 or h[r] <= 1e-6 * step[r] else direct_row_kernel(nodes, h[r]) @ mass[r, :n]
        np.testing.assert_allclose(out[r, :n], want, rtol=1e-9, atol=1e-12)
        assert np.all(out[r, n:] == 0.0)


def test_sample_bandwidths_are_silvermans_rule_on_the_repeated_values():
    # The plan fit knows each sample by its distinct values and how often each occurs.
    rng = np.random.default_rng(4)
    samples = [np.round(rng.normal(40, 12, 500)), np.array([3.0]), np.array([40.0] * 30 + [20.0, 60.0] * 4),
               rng.normal(size=7)]
    values = [np.unique(x, return_counts=True) for x in samples]
    got = sample_bandwidths(np.concatenate([v for v, _ in values]),
                            np.concatenate([c for _, c in values]).astype(float),
                            np.repeat(np.arange(len(values)), [len(v) for v, _ in values]), len(values))
    for x, h in zip(samples, got):
        if len(x) < 2:
            assert h == 0.0
            continue
        iqr = np.subtract(*np.percentile(x, [75, 25]))
        want = (0.9 * min(x.std(ddof=1), iqr / 1.34) if iqr > 0 else 1.06 * x.std(ddof=1)) * len(x) ** -0.2
        assert h == pytest.approx(want, rel=1e-12)


def direct_evidence(counts, base, m):
    """The Dirichlet-multinomial log evidence at strength m, every node evaluated (zero counts included)."""
    return gammaln(m) - gammaln(m + counts.sum()) + np.sum(gammaln(m * base + counts) - gammaln(m * base))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31), st.floats(0.0, 0.9))
def test_the_strengths_are_the_evidence_maxima_of_every_problem(seed, empty):
    # The stacked evidence skips the nodes without counts (their terms are 0) and the grids' padding.
    rng = np.random.default_rng(seed)
    size = rng.integers(2, 30, 3)
    on_grid = np.arange(size.max()) < size[:, None]
    counts = rng.poisson(rng.uniform(0.5, 40), (3, 2, size.max())) * (rng.random((3, 2, size.max())) > empty)
    counts = counts * on_grid[:, None]
    counts[:, :, 0] += 1  # every group present
    base = rng.random((3, size.max())) + 0.01
    share = rng.uniform(0.05, 0.95, (3, size.max()))
    proportions = np.stack([share, 1 - share], axis=1)
    n0 = dirichlet_strengths(counts.sum(axis=1), base, on_grid)
    m = proportion_strengths(counts, proportions, np.ones((3, 2), dtype=bool), on_grid)
    for p, n in enumerate(size):
        pooled, b = counts[p].sum(axis=0)[:n], base[p, :n] / base[p, :n].sum()
        want = [direct_evidence(pooled, b, s) for s in STRENGTHS]
        assert n0[p] == STRENGTHS[np.argmax(want)]
        pi = proportions[p, :, :n]
        want = [np.sum([direct_evidence(counts[p, :, j], pi[:, j], s) for j in range(n)]) for s in STRENGTHS]
        assert m[p] == STRENGTHS[np.argmax(want)]


def test_the_stacked_estimator_is_each_problem_estimated_alone():
    # Pooled strata (tilted by their shares), groups alone, grids of different lengths and a one-node grid,
    # in one stack: each problem's pmfs must be those it gets alone, with the other nodes zero.
    rng = np.random.default_rng(5)
    problems = []
    for n, step, tilt in ((25, 1.0, True), (60, 0.25, False), (40, 2.0, True), (1, 0.0, False)):
        if n > 1:
            x = np.clip(np.round(rng.normal(n * step / 2, n * step / 6, 300) / step) * step, 0.0, (n - 1) * step)
        else:
            x = np.full(50, 7.0)
        codes = (rng.random(len(x)) < 0.15).astype(int) if tilt else np.ones(len(x), dtype=int)
        share = 1 / (1 + np.exp(-(np.arange(n) - n / 2) / 5)) if tilt else np.ones(n)
        problems.append((x, codes, n, step, float(x.min()) if n == 1 else 0.0, np.vstack([share, 1 - share]), tilt))
    values, weights, owner = [], [], []
    for p, (x, codes, *_) in enumerate(problems):
        v, inverse = np.unique(x, return_inverse=True)
        values.append(v), owner.append(np.full(len(v), p))
        weights.append(np.stack([np.bincount(inverse, codes == g, minlength=len(v)) for g in (0, 1)], axis=1))
    n_max = max(n for _, _, n, *_ in problems)
    proportions = np.ones((len(problems), 2, n_max))
    for p, (*_, n, _, _, share, tilt) in enumerate(problems):
        proportions[p, :, :n] = share
    for smoothing in ("auto", "kde", 0.4):
        stacked = group_pmfs_stack(np.concatenate(values), np.concatenate(weights).astype(float), np.concatenate(owner),
                                   np.array([s0 for *_, s0, _, _ in problems]),
                                   np.array([d for _, _, _, d, *_ in problems]),
                                   np.array([n for _, _, n, *_ in problems]), 1.5, proportions,
                                   np.array([not t for *_, t in problems]), smoothing)
        for p, (x, codes, n, step, s0, share, tilt) in enumerate(problems):
            nodes = s0 + step * np.arange(n)
            alone = (group_pmfs(x, codes, 2, nodes, 1.5, share, smoothing) if tilt else
                     group_pmfs(x, np.zeros(len(x), dtype=int), 1, nodes, 1.5, smoothing=smoothing))
            np.testing.assert_allclose(stacked[p, :, :n] if tilt else stacked[p, 1:, :n], alone, rtol=1e-10, atol=1e-13)
            assert np.all(stacked[p, :, n:] == 0.0) and (tilt or np.all(stacked[p, 0] == 0.0))  # group 1 alone
