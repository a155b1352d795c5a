"""OTF^0: the transport cost of moving a classifier's scores to the nearest fair scores, with its gradient.

Buyl and De Bie, "Optimal Transport of Classifiers to Fairness" (NeurIPS 2022). On a batch of n
records with scores ``h`` (n,), a cost matrix ``C`` (n, n) between their non-protected features and a
constraint matrix ``G`` (d_F, n) (a score vector ``f`` is fair when ``G f = 0``):

    OTF_eps(h)  = min  <C, P> - eps H(P)   over P >= 0,  P 1 = h,  G P^T 1 = 0
    OTFR_eps(h) = the same with |G P^T 1| <= |G h| (element-wise): the relaxed problem
    OTF0_eps(h) = OTF_eps(h) - OTFR_eps(h) >= 0,  and 0 when G h = 0 (their Definition 5, Proposition 2)

``H(P) = -sum P (log P - 1)``. Score mass moves between *records* (not between score values): making
a batch fair by exchanging scores between similar people is cheap, between dissimilar ones dear.
The converse of Proposition 2 is not guaranteed: OTF0 is 0 whenever the relaxed optimum happens
to be fair, which needs an unfair ``h`` whose entropic smoothing is fair (not seen in practice).

**Solver.** Substituting the closed-form row duals into the dual (their Eq. 8) leaves a smooth concave
*semi-dual* in the d_F constraint duals ``mu`` only,
``J(mu) = eps sum_i h_i LSE_j((-C_ij + (mu G)_j) / eps)`` (minimised; its gradient is ``G f(mu)``,
``f`` the plan's column sums), minimised by L-BFGS: about 10-30 iterations where the paper's
coordinate ascent takes hundreds of sweeps (8 L-BFGS iterations against about 500 sweeps on a
120-record toy problem in the engineering notes this follows). The relaxed problem is the same
function plus ``gamma . |nu|`` with ``gamma = |G h|``, solved by L-BFGS-B on ``nu = b - a``, ``a, b >= 0``;
when the unconstrained optimum already satisfies the relaxed constraints (usual at eps = 1e-3) it
is closed-form and no second solve runs. The Gibbs kernel ``exp(-C / eps)`` is computed once per
batch, so each evaluation is two matrix-vector products, not n^2 exponentials. Then

    OTF0 = J_R(nu*) - J(mu*),   d OTF0 / d h_i = lambda_i - kappa_i + sum_c |nu_c| sign((G h)_c) G_ci

with ``lambda_i - kappa_i = eps (LSE_i(nu*) - LSE_i(mu*))`` (envelope theorem). Both duals can be
warm-started from the previous batch or window (``mu0``, ``nu0``): d_F numbers.

**Normalisation** (fixed here so values compare across batches and windows):

- ``G`` (:func:`constraint_matrix`): row (k) for demographic parity is ``S_k / sum(S_k) - 1 / n``,
  so ``(G h)_k`` is the mean score of group k minus the overall mean; row (l, k) for equalized odds
  is the *corrected* conditional version ``Y_l S_k / sum(Y_l S_k) - Y_l / sum(Y_l)`` (mean in group
  k among label l minus the mean among label l; the paper's Table 1 form, taken literally, is
  infeasible). A continuous column is centred and divided by its standard deviation. Rows of an
  empty cell, or of a group that fills its whole cell, are dropped. Several sensitive attributes
  are stacked as columns of ``S``: their rows are concatenated.
- ``C`` (:func:`cost_matrix`): Euclidean distance divided by ``scale``; the default is the batch's
  largest distance (as the authors' code), so ``C`` lies in [0, 1] and ``eps`` is relative to it.
  A monitor should fix ``scale`` (e.g. from the training data) so windows share one unit.
- **values and gradients are divided by n**: OTF0 is reported per record.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(40, 2)); s = np.repeat([0, 1], 20)
>>> S, _ = one_hot(s)
>>> fair = otf0(np.full(40, 0.5), cost_matrix(X), constraint_matrix(S), eps=0.05)
>>> unfair = otf0(np.where(s == 1, 0.8, 0.2), cost_matrix(X), constraint_matrix(S), eps=0.05)
>>> abs(fair.value) < 1e-9, unfair.value > 1e-3
(True, True)
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
from scipy import optimize
from scipy.special import logsumexp, xlogy

from fairstream.repair.group_maps import squared_distances
from fairstream.repair.validation import RepairInputError, as_2d, as_scores, check_finite, normalise_labels

from .accumulators import configured_labels, label_codes
from .metrics import as_binary

__all__ = ["NOTIONS", "OTF0Accumulator", "OTFResult", "constraint_matrix", "correlation_violation", "cost_matrix",
           "one_hot", "otf0", "otf0_of_batch"]

NOTIONS = ("dp", "eo")
_TINY = 1e-280  # a kernel row sum below this has underflowed: that row is recomputed in the log domain


# ---------------------------------------------------------------------------------------------
# building the problem


def one_hot(labels, groups=None) -> tuple[np.ndarray, np.ndarray]:
    """One 0/1 column per group (sorted labels; ``groups`` fixes them): one categorical attribute of ``S``.

    >>> S, groups = one_hot(["m", "f", "m"])
    >>> S.tolist(), groups.tolist()
    ([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]], ['f', 'm'])
    """
    values = normalise_labels(np.asarray(labels))
    classes = np.unique(values) if groups is None else configured_labels(groups, "groups")
    return (values[:, None].astype(str) == classes[None, :].astype(str)).astype(np.float64), classes


def constraint_matrix(S, y=None, notion: str = "dp") -> np.ndarray:
    """The constraint matrix ``G`` (d_F, n) of ``notion`` for sensitive columns ``S`` (n, d_S) and labels ``y``.

    ``G h`` is, per sensitive column (and label for ``"eo"``), the mean score of the column's group
    minus the mean of its cell; see the module docstring. Undefined rows are dropped.

    >>> G = constraint_matrix([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    >>> (G @ np.array([0.9, 0.7, 0.2, 0.4])).round(2).tolist()  # group means 0.8 and 0.3, overall 0.55
    [0.25, -0.25]
    """
    if notion not in NOTIONS:
        raise RepairInputError(f"notion must be one of {NOTIONS}, got {notion!r}")
    S = as_2d(S)
    check_finite(S, [f"S{k}" for k in range(S.shape[1])])
    n = len(S)
    if notion == "dp":
        cells = [np.ones(n, dtype=bool)]
    else:
        if y is None:
            raise RepairInputError("equalized odds needs the labels y of the batch")
        labels = as_binary(y, n)
        cells = [labels == 0, labels == 1]
    rows = [row for cell in cells for k in range(S.shape[1]) if (row := _constraint_row(S[:, k], cell)) is not None]
    return np.array(rows).reshape(len(rows), n)


def _constraint_row(column: np.ndarray, cell: np.ndarray) -> np.ndarray | None:
    size = int(cell.sum())
    if size == 0:
        return None
    values = column[cell]
    if np.isin(values, (0.0, 1.0)).all():
        members = values.sum()
        if members == 0 or members == size:
            return None
        return cell * (column / members - 1.0 / size)
    sd = values.std()
    return None if sd == 0 else cell * (column - values.mean()) / (sd * size)


def correlation_violation(scores, S, y=None) -> float:
    """The paper's violation: max |Pearson(h, S_k)| over sensitive columns (PDP), within each label if ``y`` (PEO).

    Correlation rather than covariance keeps it in [0, 1] and unmoved by squeezing the scores'
    spread. Undefined correlations (a constant column or constant scores) are left out; NaN if all are.

    >>> round(correlation_violation([0.9, 0.8, 0.2, 0.1], [[1.0], [1.0], [0.0], [0.0]]), 3)
    0.99
    """
    h = as_scores(scores, "scores")
    S = as_2d(S)
    cells = [np.ones(h.size, dtype=bool)] if y is None else [as_binary(y, h.size) == label for label in (0, 1)]
    values = [abs(np.corrcoef(h[cell], S[cell, k])[0, 1]) for cell in cells for k in range(S.shape[1])
              if cell.sum() > 1 and h[cell].std() > 0 and S[cell, k].std() > 0]
    return float(max(values)) if values else float("nan")


def cost_matrix(X, scale: float | None = None) -> np.ndarray:
    """Euclidean distances between the rows of ``X`` divided by ``scale`` (default: the largest one).

    >>> cost_matrix([[0.0, 0.0], [3.0, 4.0], [0.0, 2.0]]).round(2).tolist()
    [[0.0, 1.0, 0.4], [1.0, 0.0, 0.72], [0.4, 0.72, 0.0]]
    """
    X = as_2d(X)
    check_finite(X, [f"x{k}" for k in range(X.shape[1])])
    C = np.sqrt(squared_distances(X, X))
    np.fill_diagonal(C, 0.0)
    if scale is None:
        scale = float(C.max()) if C.size and C.max() > 0 else 1.0
    if not (isinstance(scale, (int, float, np.floating)) and 0 < scale < np.inf):
        raise RepairInputError(f"scale must be a positive finite number, got {scale!r}")
    C /= scale
    return C


# ---------------------------------------------------------------------------------------------
# the semi-dual


class _SemiDual:
    """``J(nu) = eps sum_i h_i LSE_j((-C_ij + (nu G)_j) / eps)`` with the kernel computed once."""

    def __init__(self, h: np.ndarray, C: np.ndarray, G: np.ndarray, eps: float):
        self.h, self.C, self.G, self.eps = h, C, G, eps
        self.K = np.exp(C * (-1.0 / eps))

    def __call__(self, nu: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """``(J, f, lse)``: the value, the plan's column sums ``f`` (J's gradient is ``G f``) and each row's LSE."""
        g = nu @ self.G
        shift = g.max() if g.size else 0.0
        w = np.exp((g - shift) / self.eps)
        r = self.K @ w
        weight = np.divide(self.h, r, out=np.zeros_like(r), where=r > _TINY)
        f = (weight @ self.K) * w
        with np.errstate(divide="ignore"):
            lse = np.log(r) + shift / self.eps
        lost = np.flatnonzero(r <= _TINY)
        if lost.size:  # rows whose kernel sums underflowed: exact log-domain softmax for those rows only
            A = (g[None, :] - self.C[lost]) / self.eps
            lse[lost] = logsumexp(A, axis=1)
            f += self.h[lost] @ np.exp(A - lse[lost][:, None])
        return float(self.eps * (self.h @ lse)), f, lse


def _minimise(fun, x0: np.ndarray, bounds, tol: float, max_iter: int) -> tuple[np.ndarray, int]:
    result = optimize.minimize(fun, x0, jac=True, method="L-BFGS-B", bounds=bounds,
                               options={"maxiter": max_iter, "gtol": tol, "ftol": 0.0, "maxcor": 20})
    return result.x, int(result.nit)


@dataclass(frozen=True, eq=False)
class OTFResult:
    """OTF0 per record, its gradient w.r.t. the scores, and the solution (duals for a warm start).

    ``value`` = (OTF - OTFR) / n and ``gradient`` its derivative w.r.t. each score; ``otf``, ``otfr``
    the two entropic costs per record; ``fair_scores`` the fair score vector the scores are moved to
    (``G fair_scores ~ 0``, same total mass); ``violation`` = ``G h``; ``mu``/``nu`` the constraint
    duals; ``n_iter`` L-BFGS iterations of the fair problem and of the relaxed one (0 when it was
    closed-form); ``relaxed_active``: whether the relaxed constraints bound at its optimum.
    """

    value: float
    gradient: np.ndarray
    otf: float
    otfr: float
    fair_scores: np.ndarray
    violation: np.ndarray
    mu: np.ndarray
    nu: np.ndarray
    n_iter: tuple[int, int]
    relaxed_active: bool


def otf0(scores, C, G, eps: float = 1e-3, mu0=None, nu0=None, tol: float = 1e-10, max_iter: int = 1000) -> OTFResult:
    """OTF0 of ``scores`` (n,) for the cost ``C`` (n, n) and constraints ``G`` (d_F, n), and its gradient.

    ``eps`` is the entropic regularisation in units of ``C``; ``tol`` the largest constraint residual
    ``|G f|`` (score units) at which L-BFGS stops. See the module docstring for the method.

    Parameters
    ----------
    scores : array-like of shape (n,)
        Non-negative scores with a positive sum (transported as mass).
    C : array-like of shape (n, n)
        Transport cost between rows (see :func:`cost_matrix`).
    G : array-like of shape (d_F, n)
        Fairness constraints; ``G f = 0`` for fair scores ``f`` (see :func:`constraint_matrix`).
    eps : float, default=1e-3
        Entropic regularisation, in units of ``C``.
    mu0 : array-like of shape (d_F,) or None, default=None
        Warm start of the fair problem's dual; None starts at 0.
    nu0 : array-like of shape (d_F,) or None, default=None
        Warm start of the relaxed problem's dual; None starts at 0.
    tol : float, default=1e-10
        Largest constraint residual ``|G f|`` (score units) at which the solver stops.
    max_iter : int, default=1000
        Most L-BFGS iterations per solve.

    Returns
    -------
    OTFResult
        The value of OTF0 (units of ``C`` times score mass), its gradient with respect to the scores,
        the duals (to warm-start the next call) and the solver's iteration counts.
    """
    h = as_scores(scores, "scores")
    n = h.size
    C, G = np.asarray(C, dtype=np.float64), np.asarray(G, dtype=np.float64).reshape(-1, n)
    if C.shape != (n, n):
        raise RepairInputError(f"the cost matrix must be ({n}, {n}) for {n} scores, got {C.shape}")
    if h.min() < 0 or h.sum() <= 0:
        raise RepairInputError("scores must be non-negative with a positive sum (they are transported as mass)")
    if not (isinstance(eps, (int, float, np.floating)) and 0 < eps < np.inf):
        raise RepairInputError(f"eps must be a positive finite number, got {eps!r}")
    dual = _SemiDual(h, C, G, float(eps))
    d = len(G)
    mu, it_fair = _solve_fair(dual, _start(mu0, d), tol, max_iter)
    j_fair, fair_scores, lse_fair = dual(mu)
    gamma = np.abs(G @ h)
    nu, it_relaxed, active = _solve_relaxed(dual, gamma, _start(nu0, d), tol, max_iter, mu)
    j_relaxed, _, lse_relaxed = dual(nu)
    j_relaxed += float(gamma @ np.abs(nu))
    gradient = eps * (lse_relaxed - lse_fair) + (np.abs(nu) * _sign(G @ h, h)) @ G
    constant = float(eps * np.sum(xlogy(h, h) - h))
    return OTFResult(value=max(j_relaxed - j_fair, 0.0) / n, gradient=gradient / n,
                     otf=(constant - j_fair) / n, otfr=(constant - j_relaxed) / n, fair_scores=fair_scores,
                     violation=G @ h, mu=mu, nu=nu, n_iter=(it_fair, it_relaxed), relaxed_active=active)


def _rounding(h: np.ndarray) -> float:
    """Constraint residuals ``|(G h)_c|`` at or below this are rounding noise: the constraint holds."""
    return 1e-12 * max(1.0, float(h.max()))


def _sign(violation: np.ndarray, h: np.ndarray) -> np.ndarray:
    """sign(G h), with residuals at rounding level taken as 0: at a fair vector OTF0 has a kink (its
    minimum), where 0 is the subgradient to report, not the sign of floating-point noise."""
    return np.sign(np.where(np.abs(violation) > _rounding(h), violation, 0.0))


def _start(x0, d: int) -> np.ndarray:
    x0 = None if x0 is None else np.asarray(x0, dtype=np.float64)
    return x0 if x0 is not None and x0.shape == (d,) and np.all(np.isfinite(x0)) else np.zeros(d)


def _solve_fair(dual: _SemiDual, mu0: np.ndarray, tol: float, max_iter: int) -> tuple[np.ndarray, int]:
    if len(mu0) == 0:
        return mu0, 0

    def fun(mu):
        value, f, _ = dual(mu)
        return value, dual.G @ f

    return _minimise(fun, mu0, None, tol, max_iter)


def _solve_relaxed(dual: _SemiDual, gamma: np.ndarray, nu0: np.ndarray, tol: float, max_iter: int,
                   mu: np.ndarray) -> tuple[np.ndarray, int, bool]:
    """The relaxed problem's dual ``nu``: 0 (closed form) when the free optimum meets ``|G f| <= gamma``.

    A constraint with ``gamma_c = 0`` is an equality, as in the fair problem: its dual is free (when
    all are, the relaxed problem is the fair one and ``nu = mu``). The others are split as
    ``nu_c = b_c - a_c`` with ``a, b >= 0`` so the objective ``J(nu) + gamma . |nu|`` is smooth.
    """
    d = len(gamma)
    if d == 0 or np.all(np.abs(dual.G @ dual(np.zeros(d))[1]) <= gamma + tol):
        return np.zeros(d), 0, False
    equal = gamma <= _rounding(dual.h)
    if equal.all():
        return mu.copy(), 0, True
    free, split = np.flatnonzero(equal), np.flatnonzero(~equal)
    k = len(free)

    def nu_of(x):
        nu = np.zeros(d)
        nu[free], nu[split] = x[:k], x[k + len(split):] - x[k:k + len(split)]
        return nu

    def fun(x):
        value, f, _ = dual(nu_of(x))
        residual = dual.G @ f
        a, b = x[k:k + len(split)], x[k + len(split):]
        g = gamma[split]
        return (value + float(g @ (a + b)),
                np.concatenate([residual[free], g - residual[split], g + residual[split]]))

    start = np.concatenate([nu0[free], np.maximum(-nu0[split], 0.0), np.maximum(nu0[split], 0.0)])
    x, n_iter = _minimise(fun, start, [(None, None)] * k + [(0.0, None)] * (2 * len(split)), tol, max_iter)
    return nu_of(x), n_iter, True


def otf0_of_batch(scores, X, S, y=None, notion: str = "dp", eps: float = 1e-3, cost_scale: float | None = None,
                  **solver) -> OTFResult:
    """OTF0 of a batch from its features ``X`` (non-protected), sensitive columns ``S`` and labels ``y``.

    Parameters
    ----------
    scores : array-like of shape (n,)
        Non-negative scores of the batch's rows.
    X : array-like of shape (n, n_features)
        Non-protected features; the cost is their Euclidean distance (see :func:`cost_matrix`).
    S : array-like of shape (n, d_S)
        Sensitive columns (one-hot groups, see :func:`one_hot`, or continuous columns).
    y : array-like of shape (n,) or None, default=None
        Labels, needed for ``notion="eo"``.
    notion : {"dp", "eo"}, default="dp"
        Demographic parity or equalized odds.
    eps : float, default=1e-3
        Entropic regularisation, in units of the cost.
    cost_scale : float or None, default=None
        Distance that counts as cost 1; None takes the batch's largest distance.
    **solver
        ``mu0``, ``nu0``, ``tol`` and ``max_iter`` of :func:`otf0`.

    Returns
    -------
    OTFResult
        As :func:`otf0`.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[0.0], [0.1], [1.0], [1.1]]); S, _ = one_hot([0, 1, 0, 1])
    >>> round(otf0_of_batch([0.2, 0.2, 0.7, 0.7], X, S, eps=0.01).value, 6)  # already fair
    0.0
    """
    return otf0(scores, cost_matrix(X, cost_scale), constraint_matrix(S, y, notion), eps=eps, **solver)


# ---------------------------------------------------------------------------------------------
# a window's OTF0: a mergeable uniform sample of its rows


class OTF0Accumulator:
    """A uniform random sample (at most ``max_rows``) of a window's rows, and OTF0 on it: a monitor statistic.

    OTF0 is not a sum over records, so no counts add up across buckets; instead every row draws a
    random priority and the accumulator keeps the ``max_rows`` rows of smallest priority (bottom-k
    sampling). The bottom-k of a union is the bottom-k of the parts' bottom-k, so :meth:`merge` is
    exact and a :class:`~fairstream.repair.measure.windows.BatchWindow` of these holds a uniform sample
    of the window. :meth:`value` solves OTF0 on the sample (O(max_rows^2) time and memory), with the
    sensitive attribute one-hot over ``groups``, the cost fixed at ``cost_scale`` (pass the training
    data's scale; None: each window's largest distance) and the duals warm-started from the last value.

    >>> import numpy as np
    >>> rng = np.random.default_rng(1)
    >>> acc = OTF0Accumulator(groups=[0, 1], eps=0.05, max_rows=64)
    >>> X = rng.normal(size=(100, 2)); s = rng.integers(0, 2, 100)
    >>> window = acc.fresh().update(np.full(50, 0.5), X[:50], s[:50]).merge(acc.fresh().update(np.full(50, 0.5), X[50:], s[50:]))
    >>> window.n_rows, abs(window.value().value) < 1e-9
    (64, True)
    """

    def __init__(self, groups, notion: str = "dp", eps: float = 1e-3, max_rows: int = 512,
                 cost_scale: float | None = None, seed: int = 0):
        if notion not in NOTIONS:
            raise RepairInputError(f"notion must be one of {NOTIONS}, got {notion!r}")
        if isinstance(max_rows, bool) or not isinstance(max_rows, (int, np.integer)) or max_rows < 2:
            raise RepairInputError(f"max_rows must be an integer >= 2, got {max_rows!r}")
        self.groups = configured_labels(groups, "groups")
        self.notion, self.eps, self.max_rows, self.cost_scale = notion, float(eps), int(max_rows), cost_scale
        self._rng = np.random.default_rng(seed)  # shared by fresh copies, so buckets draw different priorities
        self._duals = {}  # the last solution's duals, shared by fresh copies: the warm start
        self.reset()

    def reset(self) -> OTF0Accumulator:
        """Forget every row; the settings stay. Returns ``self``."""
        self.priority_ = np.empty(0)
        self.scores_ = np.empty(0)
        self.X_ = None
        self.s_ = np.empty(0, dtype=np.intp)
        self.y_ = np.empty(0, dtype=np.int64)
        return self

    def fresh(self) -> OTF0Accumulator:
        """An empty accumulator with the same settings (and the shared random stream and warm start)."""
        return copy.copy(self).reset()

    @property
    def n_rows(self) -> int:
        """Rows held (at most ``max_rows``)."""
        return int(self.scores_.size)

    def update(self, scores, X, s, y=None, priority=None) -> OTF0Accumulator:
        """Add a batch: scores, non-protected features ``X`` (n, d), groups ``s`` and (for ``"eo"``) labels ``y``.

        ``priority`` (uniforms in [0, 1), one per row) replaces the random priorities: a caller that derives them
        from the record keys keeps the same sample of the same records however they are split into batches and
        workers."""
        scores = as_scores(scores, "scores")
        n = scores.size
        X = as_2d(X)
        if len(X) != n:
            raise RepairInputError(f"X must have one row per score ({n}), got {len(X)}")
        check_finite(X, [f"x{k}" for k in range(X.shape[1])])
        codes = label_codes(s, self.groups, n, "s")
        labels = as_binary(y, n) if y is not None else np.full(n, -1, dtype=np.int64)
        if self.notion == "eo" and y is None:
            raise RepairInputError("equalized odds needs the labels y of every batch")
        priority = self._rng.random(n) if priority is None else as_scores(priority, "priority", n_rows=n)
        self._keep(priority, scores, X, codes, labels)
        return self

    def _keep(self, priority, scores, X, codes, labels) -> None:
        if self.X_ is not None and X.shape[1] != self.X_.shape[1]:
            raise RepairInputError(f"X has {X.shape[1]} features, the accumulator holds rows of {self.X_.shape[1]}")
        priority = np.concatenate([self.priority_, priority])
        keep = np.argsort(priority, kind="stable")[: self.max_rows]
        self.priority_ = priority[keep]
        self.scores_ = np.concatenate([self.scores_, scores])[keep]
        self.X_ = (X if self.X_ is None else np.concatenate([self.X_, X]))[keep]
        self.s_ = np.concatenate([self.s_, codes])[keep]
        self.y_ = np.concatenate([self.y_, labels])[keep]

    def merge(self, other: OTF0Accumulator) -> OTF0Accumulator:
        """A new accumulator holding the bottom-k sample of both; ``self`` and ``other`` are unchanged."""
        if type(other) is not type(self) or (self.notion, self.eps, self.max_rows, self.cost_scale) != (
                other.notion, other.eps, other.max_rows, other.cost_scale) or not np.array_equal(self.groups,
                                                                                                  other.groups):
            raise RepairInputError("cannot merge OTF0Accumulator with different settings")
        merged = copy.copy(self)
        if other.X_ is not None:
            merged._keep(other.priority_, other.scores_, other.X_, other.s_, other.y_)
        return merged

    def value(self) -> OTFResult | None:
        """OTF0 of the sampled rows, or None while fewer than two groups (or no positive score) are held."""
        if self.X_ is None or len(np.unique(self.s_)) < 2 or self.scores_.sum() <= 0:
            return None
        S, _ = one_hot(self.s_, np.arange(len(self.groups)))
        G = constraint_matrix(S, self.y_ if self.notion == "eo" else None, self.notion)
        key = G.shape[0]
        result = otf0(self.scores_, cost_matrix(self.X_, self.cost_scale), G, eps=self.eps,
                      mu0=self._duals.get(("mu", key)), nu0=self._duals.get(("nu", key)), tol=1e-9)
        self._duals.update({("mu", key): result.mu, ("nu", key): result.nu})
        return result
