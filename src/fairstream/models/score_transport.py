"""Optimal transport between two groups' 1-D score samples: the sharp Sinkhorn loss and its gradient.

AdapFair (Huang, Tang and Chang, "AdapFair: Ensuring Adaptive Fairness for Machine Learning
Operations", 2025) measures unfairness as the transport cost between the classifier's score
distributions of two groups. With scores ``r0`` (n0 rows, weights ``a``) and ``r1`` (n1 rows,
weights ``b``), the cost matrix is ``M[i, j] = (r0[i] - r1[j])**2`` and the loss is the *sharp*
Sinkhorn value ``S = <P, M>``: the entropic plan ``P`` evaluated on the linear cost only. ``eps``
is the paper's inverse regularisation strength (POT's ``reg`` is ``1 / eps``); as ``eps`` grows,
``S`` tends to the exact squared 2-Wasserstein distance (:func:`wasserstein2_1d`).

Forward pass: the paper's semi-dual in ``beta`` (its Eqs. 6-8, ``beta[-1] = 0``), minimised with
L-BFGS. Because the scores are 1-D, the exact (``eps`` -> infinity) dual potentials follow in
O(n log n) from the sorted, monotone coupling; L-BFGS starts there instead of at zero, which cuts
its iterations several-fold at the ``eps`` values that make ``S`` close to the exact distance.
Backward pass: the closed-form gradient of the paper's Lemma 1 (the cost-matrix gradient ``H``)
and Theorem 1 (the score gradients ``C0``, ``C1``), with one dense solve on the smaller group.

This module is numpy/scipy only; the torch autograd wrapper lives in the training code.

>>> import numpy as np
>>> r0, r1 = np.array([0.1, 0.4, 0.5]), np.array([0.2, 0.9])
>>> result = sharp_sinkhorn(r0, r1, eps=1000.0)
>>> round(result.value, 4), round(wasserstein2_1d(r0, r1), 4)
(0.105, 0.105)
>>> bool(np.isclose(result.grad_r0.sum() + result.grad_r1.sum(), 0.0, atol=1e-9))
True
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from scipy import linalg, optimize

from fairstream.repair.validation import RepairInputError

_MAX_NEWTON_STEPS = 4

__all__ = ["DualSolution", "SharpSinkhorn", "cost_gradient", "monotone_potentials", "sharp_sinkhorn",
           "solve_semidual", "wasserstein2_1d"]


@dataclass(frozen=True)
class DualSolution:
    """The entropic OT dual at its optimum: potentials, plan, L-BFGS iterations, marginal error."""

    alpha: np.ndarray
    beta: np.ndarray
    plan: np.ndarray
    n_iter: int
    marginal_error: float  # max_j |column sum of the plan - b_j| / b_j


@dataclass(frozen=True)
class SharpSinkhorn:
    """The sharp Sinkhorn value ``<P, M>`` of two score samples and its gradients (None if not asked)."""

    value: float
    grad_r0: np.ndarray | None
    grad_r1: np.ndarray | None
    dual: DualSolution


def probability_weights(w, n: int, name: str) -> np.ndarray:
    """Uniform weights, or the given ones checked to be a positive probability vector."""
    if w is None:
        return np.full(n, 1.0 / n)
    w = np.asarray(w, dtype=np.float64)
    if w.shape != (n,) or not np.all(np.isfinite(w)) or np.any(w <= 0) or not np.isclose(w.sum(), 1.0):
        raise RepairInputError(f"{name} must be {n} positive weights summing to 1")
    return w


def _scores(r, name: str) -> np.ndarray:
    r = np.asarray(r, dtype=np.float64)
    if r.ndim != 1 or r.size == 0:
        raise RepairInputError(f"{name} must be a non-empty 1-D array of scores, got shape {r.shape}")
    if not np.all(np.isfinite(r)):
        raise RepairInputError(f"{name} has a non-finite score {float(r[~np.isfinite(r)][0])!r}")
    return r


def coupling_path(r0, r1, a, b):
    """The monotone (north-west corner) coupling of sorted samples: interval widths and index pairs."""
    o0, o1 = np.argsort(r0, kind="stable"), np.argsort(r1, kind="stable")
    c0, c1 = np.cumsum(a[o0]), np.cumsum(b[o1])
    c0[-1] = c1[-1] = 1.0  # rounding must not leave a sliver beyond the last sample
    t = np.unique(np.concatenate([[0.0], c0, c1]))
    mid = 0.5 * (t[:-1] + t[1:])
    i = np.minimum(np.searchsorted(c0, mid), len(c0) - 1)
    j = np.minimum(np.searchsorted(c1, mid), len(c1) - 1)
    return np.diff(t), o0[i], o1[j]


def wasserstein2_1d(r0, r1, a=None, b=None) -> float:
    """Exact squared 2-Wasserstein distance between two weighted 1-D samples (sorting, O(n log n)).

    >>> wasserstein2_1d([0.0, 1.0], [0.5])
    0.25
    """
    r0, r1 = _scores(r0, "r0"), _scores(r1, "r1")
    widths, i, j = coupling_path(r0, r1, probability_weights(a, len(r0), "a"), probability_weights(b, len(r1), "b"))
    return float(np.sum(widths * (r0[i] - r1[j]) ** 2))


def monotone_potentials(r0, r1, a=None, b=None) -> tuple[np.ndarray, np.ndarray]:
    """Exact OT dual potentials ``(alpha, beta)`` for the cost ``(r0_i - r1_j)**2``, with ``beta[-1] = 0``.

    Along the monotone coupling's support ``alpha_i + beta_j = M_ij`` (complementary slackness);
    walking the support in order fixes one new potential per step, so a cumulative sum gives all.

    >>> alpha, beta = monotone_potentials([0.0, 1.0], [0.0, 1.0])
    >>> (alpha + beta).tolist()  # zero cost on the diagonal of the identity coupling
    [0.0, 0.0]
    """
    r0, r1 = _scores(r0, "r0"), _scores(r1, "r1")
    _, i, j = coupling_path(r0, r1, probability_weights(a, len(r0), "a"), probability_weights(b, len(r1), "b"))
    cost = (r0[i] - r1[j]) ** 2
    # A step to a new row i' from (i, j) goes through the edge (i', j): alpha_i' = M[i', j] - beta_j,
    # i.e. alpha grows by M[i', j] - M[i, j]. A step that only changes the column keeps alpha.
    # (A step changing both is a degenerate corner; the edge (i', j) keeps the potentials feasible.)
    new_row = np.r_[False, i[1:] != i[:-1]]
    step = np.r_[0.0, (r0[i[1:]] - r1[j[:-1]]) ** 2 - (r0[i[:-1]] - r1[j[:-1]]) ** 2]
    alpha_path = cost[0] + np.cumsum(np.where(new_row, step, 0.0))
    alpha, beta = np.empty(len(r0)), np.empty(len(r1))
    alpha[i], beta[j] = alpha_path, cost - alpha_path
    shift = beta[-1]
    return alpha + shift, beta - shift


def _kernel(M: np.ndarray, a: np.ndarray, beta: np.ndarray, eps: float):
    """``alpha*(beta)`` (Eq. 6), the unnormalised kernel ``E`` and row scales: plan = ``E * scale[:, None]``.

    Eq. 6 is a log-sum-exp; subtracting each row's maximum first keeps ``exp`` finite at any
    ``eps``. One ``exp`` per entry, done in place: this is the inner loop of the forward pass.
    """
    E = beta[None, :] - M
    peak = E.max(axis=1)
    E -= peak[:, None]
    E *= eps
    np.exp(E, out=E)
    total = E.sum(axis=1)
    alpha = (np.log(a) - np.log(total)) / eps - peak
    return alpha, E, a / total


def solve_semidual(M, a, b, eps: float, beta0=None, tol: float = 1e-10, max_iter: int = 1000,
                   newton_from: float = 1e-5) -> DualSolution:
    """Minimise the semi-dual ``-alpha*(beta)'a - beta'b`` over ``beta[:-1]`` (``beta[-1] = 0``).

    L-BFGS (as in the paper) until every column sum of the plan is within ``newton_from``
    (relative) of ``b``, then Newton steps down to ``tol``: near the optimum Newton converges
    quadratically, and its Hessian is the matrix Lemma 1 factorises anyway. The implicit gradient
    assumes an exact optimum, so the polish is what makes it match finite differences. The row
    sums equal ``a`` by construction. ``beta0`` is a starting point (its last entry is subtracted).
    """
    M = np.asarray(M, dtype=np.float64)
    n0, n1 = M.shape
    a, b = probability_weights(a, n0, "a"), probability_weights(b, n1, "b")
    start = np.zeros(n1) if beta0 is None else np.asarray(beta0, dtype=np.float64)
    beta = np.append(start[:-1] - start[-1], 0.0)
    if n1 == 1:  # one target point: the plan is fixed, nothing to solve
        alpha, plan, scale = _kernel(M, a, beta, eps)
        return DualSolution(alpha, beta, plan * scale[:, None], 0, 0.0)

    def objective(free: np.ndarray):
        beta = np.append(free, 0.0)
        alpha, E, scale = _kernel(M, a, beta, eps)
        return -alpha @ a - beta @ b + 1.0 / eps, (scale @ E)[:-1] - b[:-1]

    def lbfgs(beta: np.ndarray, target: float) -> tuple[np.ndarray, int]:
        # ftol=0: stop on the marginal error (gtol), not on a stalled objective.
        result = optimize.minimize(objective, beta[:-1], jac=True, method="L-BFGS-B",
                                   options={"maxiter": max_iter, "gtol": target * float(b[:-1].min()),
                                            "ftol": 0.0, "maxcor": 20})
        return np.append(result.x, 0.0), int(result.nit)

    beta, n_iter = lbfgs(beta, max(tol, newton_from))
    alpha, plan, error = _solution(M, a, b, beta, eps)
    for _ in range(_MAX_NEWTON_STEPS):
        if error <= tol:
            break
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", linalg.LinAlgWarning)  # the backtracking guards the step
                step = linalg.solve(eps * _hessian(plan, a), plan.sum(axis=0)[:-1] - b[:-1], assume_a="pos")
        except (linalg.LinAlgError, ValueError):
            break
        # Backtrack: with a nearly sparse plan the Hessian is ill-conditioned and a full step can overshoot.
        for t in (1.0, 0.5, 0.25, 0.125):
            candidate = beta - t * np.append(step, 0.0)
            new = _solution(M, a, b, candidate, eps)
            if new[2] < error:
                break
        else:
            break
        beta, (alpha, plan, error), n_iter = candidate, new, n_iter + 1
    if error > tol:  # Newton stalled (rounding level or ill-conditioning): let L-BFGS finish
        beta, more = lbfgs(beta, tol)
        alpha, plan, error = _solution(M, a, b, beta, eps)
        n_iter += more
    return DualSolution(alpha=alpha, beta=beta, plan=plan, n_iter=n_iter, marginal_error=error)


def _hessian(plan: np.ndarray, a: np.ndarray) -> np.ndarray:
    """``Diag(P~'1) - P~' Diag(1/a) P~`` (the paper's ``B`` at the optimum), without cancellation.

    Written as a difference, the diagonal loses all its digits when a row of the plan is nearly
    one-hot (large ``eps``). Its entries equal ``sum_i P_ij * (sum_{k != j} P_ik) / a_i``; the sums
    over the other columns come from prefix and suffix sums, which cancel nothing.
    """
    P_t = plan[:, :-1]
    H = -(P_t / a[:, None]).T @ P_t
    left = np.cumsum(plan, axis=1) - plan
    right = np.cumsum(plan[:, ::-1], axis=1)[:, ::-1] - plan
    diagonal = np.sum(P_t * (left + right)[:, :-1] / a[:, None], axis=0)
    H[np.diag_indices_from(H)] = diagonal
    return H


def _solution(M, a, b, beta, eps):
    """Potentials, plan and relative marginal error at ``beta``."""
    alpha, plan, scale = _kernel(M, a, beta, eps)
    plan *= scale[:, None]
    return alpha, plan, float(np.max(np.abs(plan.sum(axis=0) - b) / b))


def cost_gradient(M, plan, a, b, eps: float) -> np.ndarray:
    """Lemma 1: the gradient ``H`` of the sharp Sinkhorn value ``<P*(M), M>`` with respect to ``M``.

    Implicit differentiation of the optimality conditions; one dense (n1-1)-square solve, so put
    the smaller sample in the columns.
    """
    M, P = np.asarray(M, dtype=np.float64), np.asarray(plan, dtype=np.float64)
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    P_t = P[:, :-1]
    mu_r = (M * P).sum(axis=1)
    mu_c = (M[:, :-1] * P_t).sum(axis=0)
    B = _hessian(P, a)  # = Diag(b~) - P~' Diag(1/a) P~ at the optimum
    rhs = mu_c - P_t.T @ (mu_r / a)
    try:
        with warnings.catch_warnings():
            # A column coupled to nearly nothing (large eps, few points) makes B ill-conditioned
            # along a direction the right-hand side barely touches; the solution stays usable.
            warnings.simplefilter("ignore", linalg.LinAlgWarning)
            s_v = linalg.solve(B, rhs, assume_a="pos") if len(rhs) else rhs
    except (linalg.LinAlgError, ValueError):
        # B is positive definite in exact arithmetic; a nearly singular one (a plan close to a
        # permutation) gets the least-squares solution instead of an exception mid-training.
        s_v = linalg.lstsq(B, rhs)[0]
    s_u = (mu_r - P_t @ s_v) / a
    s_v = np.append(s_v, 0.0)
    return P + eps * (s_u[:, None] + s_v[None, :] - M) * P


def sharp_sinkhorn(r0, r1, eps: float = 200.0, a=None, b=None, gradient: bool = True, tol: float = 1e-10,
                   max_iter: int = 1000, warm_start: bool = True) -> SharpSinkhorn:
    """Sharp Sinkhorn ``<P, M>`` between score samples ``r0``, ``r1`` and (Theorem 1) its gradients.

    ``grad_r0[i] = sum_j H_ij * 2 (r0_i - r1_j)`` and ``grad_r1[j] = sum_i H_ij * 2 (r1_j - r0_i)``.
    ``warm_start`` starts L-BFGS from the exact 1-D potentials (:func:`monotone_potentials`).
    """
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.integer, np.floating)) \
            or not np.isfinite(eps) or eps <= 0:
        raise RepairInputError(f"eps must be a positive finite number, got {eps!r}")
    r0, r1 = _scores(r0, "r0"), _scores(r1, "r1")
    a, b = probability_weights(a, len(r0), "a"), probability_weights(b, len(r1), "b")
    if len(r0) < len(r1):  # the linear solve is on the columns: keep the smaller sample there
        swapped = sharp_sinkhorn(r1, r0, eps, b, a, gradient, tol, max_iter, warm_start)
        dual = swapped.dual
        return SharpSinkhorn(swapped.value, swapped.grad_r1, swapped.grad_r0,
                             DualSolution(dual.beta, dual.alpha, dual.plan.T, dual.n_iter, dual.marginal_error))
    M = (r0[:, None] - r1[None, :]) ** 2
    beta0 = monotone_potentials(r0, r1, a, b)[1] if warm_start else None
    dual = solve_semidual(M, a, b, float(eps), beta0=beta0, tol=tol, max_iter=max_iter)
    value = float(np.sum(dual.plan * M))
    if not gradient:
        return SharpSinkhorn(value, None, None, dual)
    H = cost_gradient(M, dual.plan, a, b, float(eps))
    grad_r0 = 2.0 * (r0 * H.sum(axis=1) - H @ r1)
    grad_r1 = 2.0 * (r1 * H.sum(axis=0) - H.T @ r0)
    return SharpSinkhorn(value, grad_r0, grad_r1, dual)
