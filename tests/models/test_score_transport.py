"""Tests of the 1-D sharp Sinkhorn loss: its closed-form gradients, its dual solver, the exact W2."""

import doctest

import numpy as np
import ot
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.models import score_transport
from fairstream.models.score_transport import (
    cost_gradient,
    monotone_potentials,
    sharp_sinkhorn,
    solve_semidual,
    wasserstein2_1d,
)
from fairstream.repair.validation import RepairInputError


def scores(seed, n0=7, n1=5):
    rng = np.random.default_rng(seed)
    return rng.beta(2, 5, n0), rng.beta(5, 2, n1)


def value(r0, r1, eps, **kw):
    return sharp_sinkhorn(r0, r1, eps, gradient=False, **kw).value


def test_docstring_examples_run():
    result = doctest.testmod(score_transport)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("eps", [5.0, 50.0, 300.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_theorem1_score_gradients_match_finite_differences(eps, seed):
    r0, r1 = scores(seed)
    result = sharp_sinkhorn(r0, r1, eps)
    h = 1e-5
    fd0 = [(value(r0 + h * e, r1, eps) - value(r0 - h * e, r1, eps)) / (2 * h) for e in np.eye(len(r0))]
    fd1 = [(value(r0, r1 + h * e, eps) - value(r0, r1 - h * e, eps)) / (2 * h) for e in np.eye(len(r1))]
    scale = np.abs(np.r_[fd0, fd1]).max()
    np.testing.assert_allclose(result.grad_r0, fd0, atol=1e-6 * scale)
    np.testing.assert_allclose(result.grad_r1, fd1, atol=1e-6 * scale)


def test_lemma1_cost_gradient_matches_finite_differences():
    r0, r1 = scores(2, 6, 4)
    a, b = np.full(6, 1 / 6), np.full(4, 1 / 4)
    M = (r0[:, None] - r1[None, :]) ** 2
    eps = 20.0

    def sharp(cost):
        return float(np.sum(solve_semidual(cost, a, b, eps).plan * cost))

    H = cost_gradient(M, solve_semidual(M, a, b, eps).plan, a, b, eps)
    h = 1e-5
    fd = np.zeros_like(M)
    for i, j in np.ndindex(*M.shape):
        bump = np.zeros_like(M)
        bump[i, j] = h
        fd[i, j] = (sharp(M + bump) - sharp(M - bump)) / (2 * h)
    np.testing.assert_allclose(H, fd, atol=1e-6 * np.abs(fd).max())


@pytest.mark.parametrize("weighted", [False, True])
def test_value_and_gradients_match_pots_differentiable_sinkhorn(weighted):
    import torch  # the models extra installs it; imported here to keep the rest of the module torch-free
    rng = np.random.default_rng(3)
    r0, r1 = rng.beta(2, 5, 30), rng.beta(5, 2, 20)
    a = rng.dirichlet(np.ones(30)) if weighted else None
    b = rng.dirichlet(np.ones(20)) if weighted else None
    eps = 20.0
    ours = sharp_sinkhorn(r0, r1, eps, a=a, b=b)
    t0, t1 = torch.tensor(r0, requires_grad=True), torch.tensor(r1, requires_grad=True)
    pot = ot.solve((t0[:, None] - t1[None, :]) ** 2, None if a is None else torch.tensor(a),
                   None if b is None else torch.tensor(b), reg=1.0 / eps, method="sinkhorn_log",
                   max_iter=100_000, tol=1e-13, grad="autodiff")
    pot.value_linear.backward()  # <P, M>, differentiated through the unrolled Sinkhorn iterations
    assert ours.value == pytest.approx(pot.value_linear.item(), rel=1e-9)
    np.testing.assert_allclose(ours.grad_r0, t0.grad.numpy(), atol=1e-9)
    np.testing.assert_allclose(ours.grad_r1, t1.grad.numpy(), atol=1e-9)


def test_sharp_value_approaches_exact_w2_from_above_as_eps_grows():
    r0, r1 = scores(4, 40, 25)
    exact = wasserstein2_1d(r0, r1)
    values = [value(r0, r1, eps) for eps in (5.0, 50.0, 500.0, 5000.0)]
    assert all(v >= exact - 1e-12 for v in values)  # the entropic plan is a feasible coupling
    assert np.all(np.diff(values) < 0)
    assert values[-1] - exact < 1e-3 * exact


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 30), st.integers(1, 30), st.integers(0, 2**32 - 1), st.booleans())
def test_exact_w2_equals_the_linear_program(n0, n1, seed, weighted):
    rng = np.random.default_rng(seed)
    r0, r1 = rng.normal(size=n0), rng.normal(size=n1)
    a = rng.dirichlet(np.ones(n0)) if weighted else np.full(n0, 1 / n0)
    b = rng.dirichlet(np.ones(n1)) if weighted else np.full(n1, 1 / n1)
    lp = ot.emd2(a, b, (r0[:, None] - r1[None, :]) ** 2)
    assert wasserstein2_1d(r0, r1, a, b) == pytest.approx(lp, rel=1e-9, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 25), st.integers(1, 25), st.integers(0, 2**32 - 1), st.sampled_from([0, 3]))
def test_monotone_potentials_are_an_optimal_dual(n0, n1, seed, ties):
    rng = np.random.default_rng(seed)
    # Rounding to few decimals makes ties (and coinciding cumulative weights) likely.
    r0, r1 = rng.normal(size=n0).round(ties or 12), rng.normal(size=n1).round(ties or 12)
    alpha, beta = monotone_potentials(r0, r1)
    M = (r0[:, None] - r1[None, :]) ** 2
    assert np.all(alpha[:, None] + beta[None, :] <= M + 1e-9)  # feasible
    assert alpha.mean() + beta.mean() == pytest.approx(wasserstein2_1d(r0, r1), abs=1e-9)  # no duality gap
    assert beta[-1] == 0.0


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 20), st.integers(2, 20), st.integers(0, 2**32 - 1), st.floats(5.0, 500.0))
def test_sharp_sinkhorn_properties(n0, n1, seed, eps):
    rng = np.random.default_rng(seed)
    r0, r1 = rng.random(n0), rng.random(n1)
    result = sharp_sinkhorn(r0, r1, eps)
    plan = result.dual.plan
    # A few points at large eps give a nearly sparse plan whose weakly coupled columns converge last.
    assert result.dual.marginal_error < 1e-6
    np.testing.assert_allclose(plan.sum(axis=1), 1 / n0, rtol=1e-6)
    np.testing.assert_allclose(plan.sum(axis=0), 1 / n1, rtol=1e-6)
    assert result.value == pytest.approx(float(np.sum(plan * (r0[:, None] - r1[None, :]) ** 2)))
    # Symmetric, and invariant to shifting both samples: so the score gradients sum to zero.
    # (Tolerances allow for a few points at large eps: a nearly sparse plan, a stiff dual.)
    swapped = sharp_sinkhorn(r1, r0, eps)
    assert swapped.value == pytest.approx(result.value, rel=1e-6, abs=1e-12)
    np.testing.assert_allclose(swapped.grad_r0, result.grad_r1, atol=1e-6)
    assert value(r0 + 0.3, r1 + 0.3, eps) == pytest.approx(result.value, rel=1e-6, abs=1e-12)
    assert result.grad_r0.sum() + result.grad_r1.sum() == pytest.approx(0.0, abs=1e-7)


def test_warm_start_from_exact_potentials_saves_lbfgs_iterations():
    rng = np.random.default_rng(5)
    r0, r1 = rng.beta(2, 5, 300), rng.beta(5, 2, 200)
    cold = sharp_sinkhorn(r0, r1, 1000.0, warm_start=False, gradient=False)
    warm = sharp_sinkhorn(r0, r1, 1000.0, warm_start=True, gradient=False)
    assert warm.value == pytest.approx(cold.value, rel=1e-9)
    assert warm.dual.marginal_error < 1e-9 and cold.dual.marginal_error < 1e-9
    assert 2 * warm.dual.n_iter < cold.dual.n_iter


def test_single_point_sample_has_a_fixed_plan():
    result = sharp_sinkhorn([0.1, 0.5, 0.9], [0.5], eps=50.0)
    assert result.value == pytest.approx((0.16 + 0.0 + 0.16) / 3)
    np.testing.assert_allclose(result.grad_r0, 2 * (np.array([0.1, 0.5, 0.9]) - 0.5) / 3)


@pytest.mark.parametrize("call, message", [
    (lambda: sharp_sinkhorn([0.1], [0.2], eps=0.0), "eps must be a positive"),
    (lambda: sharp_sinkhorn([], [0.2]), "non-empty"),
    (lambda: sharp_sinkhorn([0.1, np.nan], [0.2]), "non-finite score nan"),
    (lambda: sharp_sinkhorn([0.1, 0.2], [0.2], a=[0.5, 0.6]), "summing to 1"),
    (lambda: wasserstein2_1d([[0.1]], [0.2]), "1-D"),
])
def test_bad_inputs_raise_clear_errors(call, message):
    with pytest.raises(RepairInputError, match=message):
        call()
