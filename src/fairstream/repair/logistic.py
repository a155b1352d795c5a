"""Ridge-penalised binary logistic regression by damped Newton steps (IRLS), numpy only.

One solver for every logistic model in the project: the stream's baseline scorer
(:class:`fairstream.models.scorer.LogisticScorer`) and the repair's posterior of the protected
attribute, Pr[s | x, u] (:mod:`fairstream.repair.posterior`). The caller builds the design
matrix ``Z`` (first column all ones: the unpenalised intercept). :func:`fit_logistic_stack` solves
many small problems at once (one Newton step for all of them per iteration): a plan fit has one
per (stratum, feature, degree), and a Python loop over them would cost more than their arithmetic.

>>> import numpy as np
>>> Z = np.column_stack([np.ones(6), [-2.0, -1.0, -0.5, 0.5, 1.0, 2.0]])
>>> theta, n_iter, converged = fit_logistic(Z, np.array([0, 0, 1, 0, 1, 1.0]), l2=1e-3)
>>> converged, bool(theta[1] > 0)
(True, True)
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

__all__ = ["fit_logistic", "fit_logistic_stack"]

_MAX_HALVINGS = 30


def fit_logistic(Z: np.ndarray, y: np.ndarray, l2: float, max_iter: int = 50,
                 tol: float = 1e-8) -> tuple[np.ndarray, int, bool]:
    """Minimise mean log-loss + l2/2 ||theta[1:]||^2 by damped Newton steps (IRLS).

    Each step solves the Newton system; step halving keeps the objective decreasing. Returns the
    parameters, the number of steps and whether the last step was below ``tol``.
    """
    y = np.asarray(y, dtype=np.float64)
    theta, n_iter, converged = fit_logistic_stack(Z, y, np.ones(len(y)), np.zeros(1, dtype=np.intp), l2, max_iter, tol)
    return theta[0], int(n_iter[0]), bool(converged[0])


def fit_logistic_stack(Z: np.ndarray, positive: np.ndarray, total: np.ndarray, starts: np.ndarray, l2: float,
                       max_iter: int = 50, tol: float = 1e-8,
                       width: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`fit_logistic` of several problems on grouped rows at once, each with its own steps.

    The rows of ``Z`` (n_rows, p) are the problems' rows one after another, problem r's from
    ``starts[r]`` (each problem has at least one row); row i stands for ``total[i]`` records,
    ``positive[i]`` of them labelled 1. Problem r uses the first ``width[r]`` columns (default all):
    its other parameters stay 0. Each problem takes the damped Newton steps it would take alone; returns
    the parameters (n_problems, p), each problem's number of steps and whether its last step was below
    ``tol`` (or no step could lower its objective: at the optimum up to rounding).
    """
    problems = _Problems(Z, positive, total, np.asarray(starts), l2, width)
    n_problems, p = len(problems.starts), Z.shape[1]
    theta = np.zeros((n_problems, p))
    loss = problems.objective(theta)
    n_iter = np.full(n_problems, max_iter)
    converged = np.zeros(n_problems, dtype=bool)
    running, part = np.arange(n_problems), problems
    for it in range(1, max_iter + 1):
        current = theta[running]
        step = part.newton_steps(current)
        accepted, candidate, new_loss = _halve_until_lower(part, current, step, loss[running])
        if accepted.all():  # the common case, without masks
            finished = np.abs(candidate - current).max(axis=1) < tol
            theta[running], loss[running] = candidate, new_loss
        else:
            finished = ~accepted  # no decrease even for tiny steps: at the optimum up to rounding
            finished[accepted] = np.abs(candidate[accepted] - current[accepted]).max(axis=1) < tol
            theta[running[accepted]], loss[running[accepted]] = candidate[accepted], new_loss[accepted]
        if finished.any():
            n_iter[running[finished]], converged[running[finished]] = it, True
            running = running[~finished]
            if running.size == 0:
                break
            part = problems.subset(running)
    return theta, n_iter, converged


class _Problems:
    """The rows of a stack of logistic problems (see :func:`fit_logistic_stack`) and their per-problem sums.

    Each row's counts are divided by its problem's records once, so every sum below is a mean.
    """

    # Up to this many floats of per-row outer products (n_rows x p^2) they are kept, and the Hessians are
    # their weighted sums, one call for all problems; beyond, one matrix product per problem is cheaper.
    _OUTER_PRODUCT_FLOATS = 1 << 16

    def __init__(self, Z, positive, total, starts, l2, width):
        n_problems, p = len(starts), Z.shape[1]
        self.Z, self.starts = Z, starts
        self.lengths = np.diff(np.append(starts, len(Z)))
        self.owner = np.repeat(np.arange(n_problems), self.lengths)
        records = np.add.reduceat(total, starts)[self.owner]
        self.positive, self.total = positive / records, total / records
        self.outer = Z[:, :, None] * Z[:, None, :] if Z.size * p <= self._OUTER_PRODUCT_FLOATS else None
        unused = np.zeros((n_problems, p), dtype=bool) if width is None else np.arange(p) >= np.asarray(width)[:, None]
        self.penalty = np.where(unused, 0.0, float(l2))
        self.penalty[:, 0] = 0.0
        self.half_penalty = 0.5 * self.penalty
        # An unused column is all zero: a unit curvature keeps its Newton system regular and its step 0.
        self.ridge = np.where(unused, 1.0, self.penalty)[:, :, None] * np.eye(p)

    def subset(self, problems: np.ndarray) -> "_Problems":
        """The stack of the given problems only (indices, increasing)."""
        keep = np.zeros(len(self.starts), dtype=bool)
        keep[problems] = True
        rows = keep[self.owner]
        part = _Problems.__new__(_Problems)
        part.Z, part.positive, part.total = self.Z[rows], self.positive[rows], self.total[rows]
        part.outer = None if self.outer is None else self.outer[rows]
        part.lengths = self.lengths[problems]
        part.starts = np.cumsum(part.lengths) - part.lengths
        part.owner = np.repeat(np.arange(len(problems)), part.lengths)
        part.penalty, part.half_penalty = self.penalty[problems], self.half_penalty[problems]
        part.ridge = self.ridge[problems]
        return part

    def sums(self, values: np.ndarray) -> np.ndarray:
        """Per-problem sums of per-row ``values`` (along the first axis)."""
        if len(self.starts) == 1:  # one problem (a scorer's): a plain sum
            return values.sum(axis=0, keepdims=True)
        return np.add.reduceat(values, self.starts, axis=0)

    def column_sums(self, weights: np.ndarray) -> np.ndarray:
        """Per problem, the sum of its rows of ``Z`` weighted by ``weights``: (n_problems, p)."""
        if len(self.starts) == 1:
            return (weights @ self.Z)[None]
        return self.sums(self.Z * weights[:, None])

    def eta(self, theta: np.ndarray) -> np.ndarray:
        """Each row's linear predictor under its problem's parameters."""
        if len(self.starts) == 1:
            return self.Z @ theta[0]
        return np.einsum("ij,ij->i", self.Z, theta[self.owner])

    def objective(self, theta: np.ndarray) -> np.ndarray:
        """Mean log-loss over each problem's records + l2/2 ||theta[1:]||^2."""
        eta = self.eta(theta)
        return self.sums(self.total * np.logaddexp(0.0, eta) - self.positive * eta) \
            + np.einsum("ij,ij,ij->i", self.half_penalty, theta, theta)

    def newton_steps(self, theta: np.ndarray) -> np.ndarray:
        """Each problem's Newton step: its Hessian solved against its gradient."""
        prob = expit(self.eta(theta))
        grad = self.column_sums(self.total * prob - self.positive) + self.penalty * theta
        weight = self.total * prob * (1.0 - prob)
        if self.outer is not None:
            hessian = self.sums(self.outer * weight[:, None, None])
        else:
            weighted = self.Z * weight[:, None]
            hessian = np.stack([weighted[a:a + n].T @ self.Z[a:a + n] for a, n in zip(self.starts, self.lengths)])
        hessian += self.ridge
        try:
            return np.linalg.solve(hessian, grad[..., None])[..., 0]
        except np.linalg.LinAlgError:  # one singular system: solve each alone, least squares where singular
            return np.array([_solve_one(h, g) for h, g in zip(hessian, grad)]).reshape(grad.shape)


def _solve_one(hessian: np.ndarray, grad: np.ndarray) -> np.ndarray:
    try:
        return np.linalg.solve(hessian, grad)
    except np.linalg.LinAlgError:
        return np.linalg.lstsq(hessian, grad, rcond=None)[0]


def _halve_until_lower(problems: _Problems, theta: np.ndarray, step: np.ndarray, loss: np.ndarray):
    """Step halving per problem: the first of t = 1, 1/2, ... (at most ``_MAX_HALVINGS``) that does not raise
    its objective. Returns which problems found one, their candidate parameters and objectives."""
    candidate = theta - step
    new_loss = problems.objective(candidate)
    accepted = new_loss <= loss
    if accepted.all():
        return accepted, candidate, new_loss
    t = 1.0
    for _ in range(_MAX_HALVINGS - 1):
        searching = np.flatnonzero(~accepted)
        if searching.size == 0:
            break
        t *= 0.5
        trial = theta[searching] - t * step[searching]
        trial_loss = problems.subset(searching).objective(trial)
        ok = trial_loss <= loss[searching]
        candidate[searching[ok]], new_loss[searching[ok]] = trial[ok], trial_loss[ok]
        accepted[searching[ok]] = True
    return accepted, candidate, new_loss
