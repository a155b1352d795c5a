"""Tests of OTF0: zero on fair scores, positive on unfair ones, exact gradients, duality, the window statistic."""

import doctest

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import logsumexp

from fairstream.repair.validation import RepairInputError
from fairstream.repair.measure import otf
from fairstream.repair.measure.otf import (
    OTF0Accumulator,
    _SemiDual,
    constraint_matrix,
    correlation_violation,
    cost_matrix,
    one_hot,
    otf0,
    otf0_of_batch,
)
from fairstream.repair.measure.windows import BatchWindow

PROPERTY = settings(max_examples=30, deadline=None)


def test_docstring_examples_run():
    result = doctest.testmod(otf)
    assert result.attempted > 0 and result.failed == 0


@st.composite
def batch(draw, min_rows=8, max_rows=40):
    """Features, one binary attribute (both groups present), labels (both present in each group), eps."""
    n = draw(st.integers(min_rows, max_rows))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    s = np.r_[0, 0, 1, 1, rng.integers(0, 2, n - 4)]
    y = np.r_[0, 1, 0, 1, rng.integers(0, 2, n - 4)]
    X = rng.normal(size=(n, draw(st.integers(1, 4)))) + s[:, None] * draw(st.floats(0.0, 2.0))
    return X, s, y, rng, draw(st.sampled_from([1e-3, 1e-2, 0.1]))


def fair_scores(rng, cells):
    """Scores whose mean is 0.5 in every cell: fair for the constraint rows of those cells."""
    h = 0.5 + 0.4 * rng.uniform(-1, 1, len(cells))
    for cell in np.unique(cells):
        h[cells == cell] += 0.5 - h[cells == cell].mean()
    return h if np.all((h > 0) & (h <= 1)) else np.full(len(cells), 0.5)


@PROPERTY
@given(batch())
def test_otf0_is_zero_on_a_fair_score_vector(data):
    X, s, y, rng, eps = data
    S, _ = one_hot(s)
    for notion, cells in (("dp", s), ("eo", s * 2 + y)):
        h = fair_scores(rng, cells)
        G = constraint_matrix(S, y, notion)
        assert np.abs(G @ h).max() < 1e-12
        result = otf0(h, cost_matrix(X), G, eps=eps)
        assert result.value == pytest.approx(0.0, abs=1e-9) and np.abs(result.gradient).max() < 1e-6


@PROPERTY
@given(batch(), st.floats(0.15, 0.6))
def test_otf0_is_positive_on_an_unfair_score_vector(data, gap):
    X, s, _, rng, eps = data
    eps = min(eps, 1e-2)  # at large eps OTF0 shrinks towards 0 even when unfair (their Appendix B.2)
    S, _ = one_hot(s)
    h = np.clip(0.5 + gap * (s - 0.5) + 0.05 * rng.uniform(-1, 1, len(s)), 0.01, 1.0)  # group means differ
    result = otf0(h, cost_matrix(X), constraint_matrix(S), eps=eps)
    assert result.value > 1e-9
    # ... because the relaxed optimum is not fair (OTF0 can only vanish when it is, Appendix A.3).
    assert result.otf >= result.otfr


def finite_differences(h, C, G, eps, step=1e-6):
    grad = np.empty(len(h))
    for i in range(len(h)):
        e = np.zeros(len(h))
        e[i] = step
        grad[i] = (otf0(h + e, C, G, eps, tol=1e-13).value - otf0(h - e, C, G, eps, tol=1e-13).value) / (2 * step)
    return grad


@pytest.mark.parametrize("notion, eps", [("dp", 0.05), ("dp", 0.01), ("eo", 0.05), ("eo", 0.02)])
def test_the_gradient_matches_finite_differences(notion, eps):
    rng = np.random.default_rng(7)
    n = 24
    X, s, y = rng.normal(size=(n, 2)), rng.integers(0, 2, n), rng.integers(0, 2, n)
    S = np.column_stack([one_hot(s)[0], rng.integers(0, 2, n), rng.normal(size=n)])  # two binary + continuous
    C, G = cost_matrix(X), constraint_matrix(S, y, notion)
    h = rng.uniform(0.05, 0.95, n)
    result = otf0(h, C, G, eps, tol=1e-13)
    np.testing.assert_allclose(result.gradient, finite_differences(h, C, G, eps), atol=1e-8)
    assert np.abs(result.gradient).max() > 1e-4  # the test has power: the gradient is far from 0


def test_the_relaxed_constraints_bind_in_some_cases_and_the_gradient_keeps_their_term():
    rng = np.random.default_rng(0)
    n = 30
    X, s, y = rng.normal(size=(n, 2)), rng.integers(0, 2, n), rng.integers(0, 2, n)
    S = np.column_stack([one_hot(s)[0], rng.normal(size=n)])
    C, G = cost_matrix(X), constraint_matrix(S, y, "eo")
    h = rng.uniform(0.05, 0.95, n)
    result = otf0(h, C, G, 0.05, tol=1e-13)
    assert result.relaxed_active and np.abs(result.nu).max() > 0 and result.n_iter[1] > 0
    lam_minus_kappa = result.gradient - (np.abs(result.nu) * np.sign(G @ h)) @ G / n
    numeric = finite_differences(h, C, G, 0.05)
    np.testing.assert_allclose(result.gradient, numeric, atol=1e-8)
    assert np.abs(lam_minus_kappa - numeric).max() > 1e-5  # the gamma term matters


@PROPERTY
@given(batch(max_rows=20))
def test_strong_duality_and_a_feasible_fair_plan(data):
    X, s, y, rng, eps = data
    eps = max(eps, 1e-2)  # the plan's entries exp(-C/eps) must not underflow for the primal check
    h = rng.uniform(0.05, 1.0, len(s))
    C, G = cost_matrix(X), constraint_matrix(one_hot(s)[0], y, "eo")
    result = otf0(h, C, G, eps, tol=1e-12)
    P = np.exp((result.mu @ G - C) / eps)
    P *= (h / P.sum(axis=1))[:, None]  # the closed-form row duals
    primal = np.sum(C * P) + eps * np.sum(P * (np.log(P) - 1.0))
    residual = G @ P.sum(axis=0)
    # At any mu, the primal of the plan it defines is the dual value plus mu . G f (the Lagrangian):
    # an identity up to rounding, on any BLAS.
    assert (primal - result.mu @ residual) / len(h) == pytest.approx(result.otf, rel=1e-9, abs=1e-13)
    np.testing.assert_allclose(P.sum(axis=0), result.fair_scores, rtol=1e-9, atol=1e-12)
    # L-BFGS stops near a 1e-8 residual: the objective (about n) cannot resolve smaller steps in float64.
    assert np.abs(G @ result.fair_scores).max() < 1e-7 and result.fair_scores.sum() == pytest.approx(h.sum())
    # So the duality gap is that residual's, |mu . G f| / n, whichever path BLAS took to the stopping point
    # (a fixed rel=1e-7 failed on OpenBLAS's Haswell and Zen kernels, where L-BFGS stops a step earlier).
    gap = abs(result.mu @ residual) / len(h)
    assert abs(primal / len(h) - result.otf) <= gap * (1 + 1e-6) + 1e-13


def test_warm_start_reaches_the_same_solution_in_fewer_iterations():
    rng = np.random.default_rng(1)
    X, s = rng.normal(size=(60, 3)), rng.integers(0, 2, 60)
    h = np.clip(0.4 + 0.3 * s + 0.1 * rng.normal(size=60), 0.01, 1)
    C, G = cost_matrix(X), constraint_matrix(one_hot(s)[0])
    cold = otf0(h, C, G, 1e-3)
    warm = otf0(h, C, G, 1e-3, mu0=cold.mu, nu0=cold.nu)
    assert warm.value == pytest.approx(cold.value, rel=1e-6) and warm.n_iter[0] < cold.n_iter[0]


def test_the_semi_dual_recovers_rows_whose_kernel_sum_underflows():
    rng = np.random.default_rng(2)
    n = 12
    C, G = cost_matrix(rng.normal(size=(n, 2))), constraint_matrix(one_hot(rng.integers(0, 2, n))[0])
    h, eps = rng.uniform(0.1, 1, n), 1e-3
    nu = np.array([5.0, -5.0])  # (nu G)_j spreads by ~1 cost unit: exp(-1000) underflows for some rows
    value, f, lse = _SemiDual(h, C, G, eps)(nu)
    A = (nu @ G - C) / eps
    exact = logsumexp(A, axis=1)
    assert np.isfinite(lse).all() and np.max(np.abs(lse - exact)) < 1e-9 * np.abs(exact).max()
    np.testing.assert_allclose(f, h @ np.exp(A - exact[:, None]), rtol=1e-9, atol=1e-300)
    assert value == pytest.approx(eps * h @ exact)


def test_constraint_matrix_rows_are_group_mean_gaps_and_drop_empty_cells():
    S = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [0.0, 1.0]])
    h = np.array([0.2, 0.4, 0.9, 0.6, 0.3])
    np.testing.assert_allclose(constraint_matrix(S) @ h, [0.3 - 0.48, 0.6 - 0.48])
    y = np.array([0, 1, 0, 1, 1])
    G = constraint_matrix(S, y, "eo")  # label 0: 0.2 vs 0.9 (mean 0.55); label 1: 0.4 vs 0.45 (mean 0.4333)
    np.testing.assert_allclose(G @ h, [0.2 - 0.55, 0.9 - 0.55, 0.4 - 1.3 / 3, 0.45 - 1.3 / 3])
    assert constraint_matrix(S, [0, 1, 1, 1, 1], "eo").shape == (2, 5)  # label 0 holds only group 0: no row
    assert constraint_matrix(np.ones((3, 1))).shape == (0, 3)  # one group fills the cell
    continuous = constraint_matrix([[1.0], [2.0], [3.0]])
    assert continuous @ np.ones(3) == pytest.approx(0.0) and abs((continuous @ np.array([0.0, 0.5, 1.0]))[0]) > 0


def test_correlation_violation_is_the_largest_absolute_pearson_correlation():
    h, S = np.array([0.9, 0.7, 0.3, 0.1]), np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.0, 1.0]])
    expected = max(abs(np.corrcoef(h, S[:, k])[0, 1]) for k in range(2))
    assert correlation_violation(h, S) == pytest.approx(expected)
    y = np.array([1, 0, 1, 0])
    within = max(abs(np.corrcoef(h[y == v], S[y == v, 0])[0, 1]) for v in (0, 1))
    assert correlation_violation(h, S[:, :1], y) == pytest.approx(within)
    assert np.isnan(correlation_violation([0.5, 0.5], [[0.0], [1.0]]))


def test_the_window_accumulator_keeps_a_mergeable_uniform_sample():
    rng = np.random.default_rng(5)
    acc = OTF0Accumulator(groups=["f", "m"], eps=0.05, max_rows=30, seed=1)
    parts = [acc.fresh().update(rng.uniform(size=25), rng.normal(size=(25, 2)), rng.choice(["f", "m"], 25))
             for _ in range(3)]
    merged = parts[0].merge(parts[1]).merge(parts[2])
    pooled = np.concatenate([p.priority_ for p in parts])
    assert merged.n_rows == 30 and np.array_equal(np.sort(merged.priority_), np.sort(pooled)[:30])
    result = merged.value()
    assert result.value >= 0 and len(result.gradient) == 30
    window = BatchWindow(records=50, buckets=2)
    for part in parts:
        window.add(part, n_records=25)
    assert window.accumulator().n_rows == 30 and np.array_equal(window.accumulator().priority_, parts[1].merge(
        parts[2]).priority_)
    one_group = acc.fresh().update([0.3, 0.4], np.zeros((2, 2)), ["f", "f"])
    assert one_group.value() is None
    fair = acc.fresh().update(np.full(20, 0.5), rng.normal(size=(20, 2)), rng.choice(["f", "m"], 20))
    assert fair.value().value == pytest.approx(0.0, abs=1e-9)


def test_errors_name_the_problem():
    C, G = cost_matrix(np.eye(3)), constraint_matrix(one_hot([0, 1, 1])[0])
    with pytest.raises(RepairInputError, match="non-negative with a positive sum"):
        otf0([0.5, -0.1, 0.2], C, G)
    with pytest.raises(RepairInputError, match=r"must be \(2, 2\)"):
        otf0([0.5, 0.5], C, G)
    with pytest.raises(RepairInputError, match="eps must be"):
        otf0([0.5, 0.5, 0.5], C, G, eps=0.0)
    with pytest.raises(RepairInputError, match="notion must be"):
        constraint_matrix(np.eye(2), notion="eopp")
    with pytest.raises(RepairInputError, match="needs the labels"):
        otf0_of_batch([0.5, 0.5], np.eye(2), np.eye(2), notion="eo")
    with pytest.raises(RepairInputError, match="scale must be"):
        cost_matrix(np.eye(2), scale=-1.0)
    acc = OTF0Accumulator(groups=[0, 1], notion="eo")
    with pytest.raises(RepairInputError, match="needs the labels y"):
        acc.update([0.5], [[1.0]], [0])
    with pytest.raises(RepairInputError, match="s has an unknown value 3"):
        acc.update([0.5], [[1.0]], [3], y=[1])
    with pytest.raises(RepairInputError, match="different settings"):
        acc.merge(OTF0Accumulator(groups=[0, 1]))
