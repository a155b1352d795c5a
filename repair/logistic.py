"""Ridge-penalised binary logistic regression by damped Newton steps (IRLS), numpy only.

One solver for every logistic model in the project: the stream's baseline scorer
(:class:`fairstream.models.scorer.LogisticScorer`) and the repair's posterior of the protected
attribute, Pr[s | x, u] (:mod:`fairstream.repair.posterior`). The caller builds the design
matrix ``Z`` (first column all ones: the unpenalised intercept).

>>> import numpy as np
>>> Z = np.column_stack([np.ones(6), [-2.0, -1.0, -0.5, 0.5, 1.0, 2.0]])
>>> theta, n_iter, converged = fit_logistic(Z, np.array([0, 0, 1, 0, 1, 1.0]), l2=1e-3)
>>> converged, bool(theta[1] > 0)
(True, True)
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

__all__ = ["fit_logistic"]

_MAX_HALVINGS = 30


def fit_logistic(Z: np.ndarray, y: np.ndarray, l2: float, max_iter: int = 50,
                 tol: float = 1e-8) -> tuple[np.ndarray, int, bool]:
    """Minimise mean log-loss + l2/2 ||theta[1:]||^2 by damped Newton steps (IRLS).

    Each step solves the Newton system; step halving keeps the objective decreasing. Returns the
    parameters, the number of steps and whether the last step was below ``tol``.
    """
    n, p = Z.shape
    penalty = np.full(p, l2)
    penalty[0] = 0.0

    def objective(theta):
        eta = Z @ theta
        return np.mean(np.logaddexp(0.0, eta) - y * eta) + 0.5 * np.sum(penalty * theta * theta)

    theta = np.zeros(p)
    loss = objective(theta)
    for it in range(1, max_iter + 1):
        prob = expit(Z @ theta)
        grad = Z.T @ (prob - y) / n + penalty * theta
        hessian = (Z * (prob * (1.0 - prob))[:, None]).T @ Z / n + np.diag(penalty)
        try:
            step = np.linalg.solve(hessian, grad)
        except np.linalg.LinAlgError:
            step = np.linalg.lstsq(hessian, grad, rcond=None)[0]
        t = 1.0
        for _ in range(_MAX_HALVINGS):
            candidate = theta - t * step
            new_loss = objective(candidate)
            if new_loss <= loss:
                break
            t *= 0.5
        else:  # no decrease even for tiny steps: at the optimum up to rounding
            return theta, it, True
        change = float(np.max(np.abs(candidate - theta)))
        theta, loss = candidate, new_loss
        if change < tol:
            return theta, it, True
    return theta, max_iter, False
