"""The posterior of the protected attribute given the features and the stratum, Pr[s | x, u].

Two uses in the distributional repair:

- **imputing a missing s** (the paper's first item of future work): production records often do
  not carry s, while the research set does. A plan fitted with a posterior can repair such a
  record under a draw of s from Pr[s | x, u], keyed by the record's hash so it is replayable;
- **pooling thin research strata**: per feature, the 1-D posterior Pr[s | x_k, u] reweights the
  whole stratum's research sample into an estimate of each group's distribution (a density-ratio
  or "exponential tilt" model), so a group of 25 research rows borrows the shape of its
  stratum's 250.

The model, per stratum u: one logistic regression per group (one-vs-rest) on the standardised
features (and, where BIC prefers it, their squares), normalised over the groups. Linear log-odds
are exact for normal groups with equal variances, squares for unequal ones; thin strata cannot
afford the squares' noise, large ones can. For two groups one-vs-rest is logistic regression.
It is fitted by the damped Newton (IRLS) steps of :mod:`fairstream.repair.logistic` on the distinct
rows of each stratum with their group counts (the same likelihood, far fewer rows), every stratum,
candidate degree and cross-validation fold in one stacked solve, and checked for calibration by
K-fold cross-validation at fit time (:attr:`GroupPosterior.cv_`).

What imputation can and cannot do: a record repaired under a drawn s lands on the barycentre of
the *drawn* group, so the repair removes only the dependence that (x, u) reveals about s. The
paper reproduction (Table IV) measures, as a share of the repair with the true s: about 15% at a
cross-validated AUC of 0.7, 40% at 0.85, 75% at 0.92, 90% at 0.97 and all of it at 1.0, while
every record is moved as far as a true-s repair would move it. So do not impute:

- when s is poorly predictable from (x, u) (AUC well below 0.9): the damage is paid in full and
  little of the dependence is removed; dead-letter the records or collect s;
- when records without s differ from the research population (s missing not at random, or
  Pr[s | u] or f(x | s, u) drifted): the posterior is then miscalibrated and the draws biased;
- where inferring a protected attribute is itself not allowed. The draw is a random device for
  the repair, not an estimate of the person's s: it must not be stored or used for decisions
  (the stream reports *that* s was imputed).

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> s = rng.integers(0, 2, 4000); u = rng.integers(0, 2, 4000)
>>> X = rng.normal(1.5 * s[:, None], 1.0, size=(4000, 2))
>>> post = GroupPosterior().fit(X, s, u)
>>> p = post.predict_proba([[3.0, 3.0], [-1.5, -1.5]], [0, 1])
>>> bool(p[0, 1] > 0.95 and p[1, 0] > 0.95), bool(post.report()["ece"] < 0.05)
(True, True)
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.special import expit

from .array_layout import ArraySpec, Check, above, at_least, finite
from .estimator import Estimator
from .logistic import fit_logistic_stack
from .measure.metrics import auc
from .validation import RepairInputError, as_2d, as_labels, check_finite, encode, normalise_labels

__all__ = ["GroupPosterior", "distinct_rows", "missing_mask", "one_vs_rest", "one_vs_rest_stack", "polynomial_design"]

CV_METRICS = ("log_loss", "brier", "ece", "auc", "accuracy")
_CALIBRATION_BINS = 10


def missing_mask(s) -> np.ndarray:
    """Rows whose protected attribute is missing: ``None`` or NaN (in an object or float array).

    >>> missing_mask(np.array([0, None, 1.0, float("nan"), "f"], dtype=object)).tolist()
    [False, True, False, True, False]
    """
    arr = np.asarray(s)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.dtype.kind == "f":
        return np.isnan(arr)
    if arr.dtype.kind == "O":
        # NaN is the one value that differs from itself; the comparisons are element-wise.
        return np.asarray(np.equal(arr, None) | np.not_equal(arr, arr), dtype=bool)
    return np.zeros(arr.shape, dtype=bool)


def polynomial_design(Z: np.ndarray, degree: int) -> np.ndarray:
    """``[1, z, z^2, ..., z^degree]`` per column of the standardised ``Z`` (no cross terms)."""
    powers = [Z ** p for p in range(1, degree + 1)]
    return np.hstack([np.ones((len(Z), 1)), *powers])


def distinct_rows(X: np.ndarray, codes: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of ``X`` and, for each, how many records of each group have it: (m, d) and (m, n_groups).

    A logistic likelihood depends on the records only through these counts, and integer features
    (ages, hours, counts) have far fewer distinct rows than a stratum has records.
    """
    # Column by column, each row's code so far and the column's value code make a new code, renumbered
    # densely so it stays below len(X) (an integer sort is far faster than np.unique(axis=0)'s).
    values, code = np.unique(X[:, 0], return_inverse=True)
    rows = values[:, None]
    for column in X.T[1:]:
        values, column_code = np.unique(column, return_inverse=True)
        first, code = np.unique(code * len(values) + column_code, return_index=True, return_inverse=True)[1:]
        rows = X[first]
    counts = np.bincount(code * n_groups + codes, minlength=len(rows) * n_groups).reshape(len(rows), n_groups)
    return rows, counts.astype(np.float64)


def one_vs_rest(design: np.ndarray, counts: np.ndarray, l2: float) -> np.ndarray:
    """Coefficients (n_groups, p) of one logistic regression per group present in ``counts``.

    ``design`` has one row per distinct record and ``counts[i, g]`` records of group g share row i.
    Absent groups get NaN coefficients (probability 0); with a single group present nothing is
    fitted (its probability is 1); with two, one regression is fitted and the other group's is its
    mirror image (one-vs-rest for two groups is one logistic regression).
    """
    return one_vs_rest_stack(design, counts, np.zeros(1, dtype=np.intp), np.zeros(1, dtype=np.intp),
                             np.array([design.shape[1]]), l2)[0]


def one_vs_rest_stack(design: np.ndarray, counts: np.ndarray, starts: np.ndarray, block: np.ndarray,
                      widths: np.ndarray, l2: float) -> np.ndarray:
    """:func:`one_vs_rest` of several problems, every regression in one :func:`fit_logistic_stack`.

    ``design`` (n, p) and ``counts`` (n, n_groups) hold blocks of rows one after another, block b's
    from ``starts[b]``; problem j is fitted on block ``block[j]`` with its first ``widths[j]`` columns
    (its other coefficients are 0). Returns (n_problems, n_groups, p).
    """
    n_groups, p = counts.shape[1], design.shape[1]
    lengths = np.diff(np.append(starts, len(design)))
    present = (np.add.reduceat(counts, starts, axis=0) > 0)[block]  # (problems, groups)
    n_present = present.sum(axis=1)
    first = present & (np.cumsum(present, axis=1) == 1)
    # Two groups: one regression, the other group's is its mirror; one group: nothing to fit (probability 1).
    j, g = np.nonzero(np.where((n_present == 2)[:, None], first, present & (n_present > 2)[:, None]))
    coef = np.full((len(block), n_groups, p), np.nan)
    coef[n_present == 1] = np.where(present[n_present == 1, :, None], 0.0, np.nan)
    if len(j):
        rows = lengths[block[j]]
        owner = np.repeat(np.arange(len(j)), rows)
        index = np.arange(rows.sum()) + np.repeat(starts[block[j]] - (np.cumsum(rows) - rows), rows)
        Z = design[index] * (np.arange(p) < widths[j][owner, None])
        coef[j, g] = fit_logistic_stack(Z, counts[index, g[owner]], counts.sum(axis=1)[index], np.cumsum(rows) - rows,
                                        l2, width=widths[j])[0]
    mirrored = np.flatnonzero(n_present == 2)
    second = present[mirrored] & ~first[mirrored]
    coef[mirrored, np.argmax(second, axis=1)] = -coef[mirrored, np.argmax(first[mirrored], axis=1)]
    return coef


def ovr_proba(design: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """Normalised one-vs-rest probabilities (..., n, n_groups) of ``design`` (..., n, p); ``coef`` is
    (n_groups, p), (n, n_groups, p) or anything that broadcasts against (..., n, n_groups, p).

    The linear predictor is an element-wise product summed per row (not a matrix product), so a
    row's probabilities are bit-identical whatever batch it is computed in.
    """
    eta = (design[..., None, :] * coef).sum(axis=-1)
    score = np.where(np.isnan(eta), 0.0, expit(np.nan_to_num(eta)))
    total = score.sum(axis=-1, keepdims=True)
    return score / np.where(total > 0, total, 1.0)


class GroupPosterior(Estimator):
    """Pr[s | x, u] by stratum-wise one-vs-rest logistic regression on standardised x and its powers.

    Parameters
    ----------
    degree:
        Highest power of each standardised feature in the log-odds, or ``"bic"``: 1 or 2 per
        stratum, whichever has the lower Bayesian information criterion.
    l2:
        Ridge penalty on the standardised coefficients; keeps separable strata finite.
    n_folds:
        Folds of the cross-validated calibration check run at fit time (0 skips it).
    """

    def __init__(self, degree: int | str = "bic", l2: float = 1e-3, n_folds: int = 5):
        self.degree = degree
        self.l2 = l2
        self.n_folds = n_folds

    def fit(self, X, s, u, groups: Sequence | None = None, strata: Sequence | None = None) -> "GroupPosterior":
        """Fit on labelled rows; ``groups``/``strata`` fix the label sets (default: those seen)."""
        if self.degree != "bic" and not (isinstance(self.degree, (int, np.integer)) and self.degree >= 1):
            raise RepairInputError(f"degree must be 'bic' or an integer >= 1, got {self.degree!r}")
        X = as_2d(X)
        check_finite(X, [f"x{k}" for k in range(X.shape[1])])
        s = normalise_labels(as_labels(s, len(X), "s"))
        u = normalise_labels(as_labels(u, len(X), "u"))
        self.groups_ = np.unique(s) if groups is None else normalise_labels(np.asarray(groups))
        self.strata_ = np.unique(u) if strata is None else normalise_labels(np.asarray(strata))
        return self.fit_codes(X, encode(s, self.groups_, "s"), encode(u, self.strata_, "u"), self.groups_, self.strata_)

    def fit_codes(self, X: np.ndarray, s_codes: np.ndarray, u_codes: np.ndarray, groups: np.ndarray,
                  strata: np.ndarray) -> "GroupPosterior":
        """:meth:`fit` on checked, finite ``X`` with the rows' group and stratum codes into ``groups`` and ``strata``."""
        self.groups_, self.strata_ = groups, strata
        self.n_features_in_ = X.shape[1]
        # The fit and every cross-validation fold's fit: each (fit, stratum) a stratum of one stacked fit.
        folds = self._folds(s_codes, u_codes)
        parts = [np.ones(len(X), dtype=bool)] + [folds != f for f in range(int(self.n_folds)) if (folds == f).any()]
        stats = [self._statistics(X[rows], s_codes[rows], u_codes[rows]) for rows in parts]
        mean, scale = np.vstack([m for m, _, _, _ in stats]), np.vstack([sc for _, sc, _, _ in stats])
        coef = self._fit_distinct([v for _, _, values, _ in stats for v in values],
                                  [c for _, _, _, counts in stats for c in counts], mean, scale)
        n_u = len(strata)
        self.mean_, self.scale_, self.coef_ = mean[:n_u], scale[:n_u], coef[:n_u]
        self.cv_ = self._cross_validate(X, s_codes, u_codes, folds, mean[n_u:], scale[n_u:], coef[n_u:])
        return self

    @property
    def max_degree(self) -> int:
        """The degree of the stored design: the highest power any stratum may use."""
        return 2 if self.degree == "bic" else int(self.degree)

    def fit_distinct(self, values: Sequence[np.ndarray | None], counts: Sequence[np.ndarray | None], mean: np.ndarray,
                     scale: np.ndarray, groups: np.ndarray, strata: np.ndarray) -> "GroupPosterior":
        """Fit from each stratum's :func:`distinct_rows` (``values[a]``, ``counts[a]``; None where a stratum has no
        rows) and its standardisation (``mean``, ``scale``: (n_strata, n_features)), with no calibration check.

        The same fit as :meth:`fit_codes` with ``n_folds=0``, for a caller that has the counts already.
        """
        if self.n_folds:
            raise RepairInputError("fit_distinct has no rows to cross-validate on: "
                                   f"n_folds must be 0, got {self.n_folds!r}")
        self.groups_, self.strata_ = groups, strata
        self.n_features_in_ = mean.shape[1]
        self.mean_, self.scale_ = mean, scale
        self.coef_ = self._fit_distinct(values, counts, mean, scale)
        self.cv_ = np.full(len(CV_METRICS), np.nan)
        return self

    def _statistics(self, X, s_codes, u_codes) -> tuple[np.ndarray, np.ndarray, list, list]:
        """Per stratum: the mean and scale that standardise it, its :func:`distinct_rows` and their group counts
        (None for a stratum without rows)."""
        n_u, n_g, d = len(self.strata_), len(self.groups_), X.shape[1]
        mean, scale = np.zeros((n_u, d)), np.ones((n_u, d))
        values, counts = [None] * n_u, [None] * n_u
        for a in range(n_u):
            rows = u_codes == a
            if not rows.any():
                continue
            mean[a] = X[rows].mean(axis=0)
            sd = X[rows].std(axis=0)
            scale[a] = np.where(sd > 0, sd, 1.0)  # a constant column stays 0 after standardising
            values[a], counts[a] = distinct_rows(X[rows], s_codes[rows], n_g)
        return mean, scale, values, counts

    def _fit_distinct(self, values, counts, mean, scale) -> np.ndarray:
        """One-vs-rest coefficients per stratum in the max-degree layout (unused powers are 0): every stratum and
        candidate degree in one stacked fit, then per stratum the degree with the lower BIC."""
        n_g, d = len(self.groups_), mean.shape[1]
        coef = np.full((len(values), n_g, 1 + d * self.max_degree), np.nan)
        fitted = [a for a in range(len(values)) if values[a] is not None]
        if not fitted:
            return coef
        degrees = np.array((1, 2) if self.degree == "bic" else (int(self.degree),))
        lengths = np.array([len(values[a]) for a in fitted])
        starts = np.cumsum(lengths) - lengths
        owner = np.repeat(np.arange(len(fitted)), lengths)
        design = polynomial_design((np.concatenate([values[a] for a in fitted]) - mean[fitted][owner])
                                   / scale[fitted][owner], self.max_degree)
        C = np.concatenate([counts[a] for a in fitted])
        # Every stratum with every candidate degree: one problem each.
        stack = one_vs_rest_stack(design, C, starts, np.repeat(np.arange(len(fitted)), len(degrees)),
                                  np.tile(1 + d * degrees, len(fitted)), float(self.l2))
        stack = stack.reshape(len(fitted), len(degrees), n_g, -1)
        if len(degrees) == 1:
            coef[fitted] = stack[:, 0]
            return coef
        # BIC per stratum and degree.
        proba = ovr_proba(design[:, None], stack[owner])  # (rows, degrees, groups)
        log_likelihood = np.add.reduceat(np.sum(C[:, None] * np.log(np.clip(proba, 1e-300, None)), axis=2), starts)
        totals = np.add.reduceat(C, starts)  # (strata, groups)
        n_free = (np.count_nonzero(totals, axis=1) - 1)[:, None] * (1 + d * degrees)
        bic = -2.0 * log_likelihood + n_free * np.log(totals.sum(axis=1))[:, None]
        coef[fitted] = stack[np.arange(len(fitted)), np.where(bic[:, 1] < bic[:, 0], 1, 0)]
        return coef

    def _folds(self, s_codes, u_codes) -> np.ndarray:
        """Each row's cross-validation fold: deterministic, dealt within each (u, s) cell so every fold sees
        every group (all 0 without folds)."""
        if not self.n_folds:
            return np.zeros(len(s_codes), dtype=np.int64)
        cell = u_codes * len(self.groups_) + s_codes
        order = np.lexsort((np.random.default_rng(0).random(len(cell)), cell))
        fold = np.empty(len(cell), dtype=np.int64)
        fold[order] = np.arange(len(cell)) % int(self.n_folds)
        return fold

    def _cross_validate(self, X, s_codes, u_codes, folds, mean, scale, coef) -> np.ndarray:
        """Out-of-fold log-loss, Brier score, calibration error, AUC (two groups) and accuracy, from each
        non-empty fold's fit (``mean``, ``scale``, ``coef``: the folds' strata one after another)."""
        if not self.n_folds:
            return np.full(len(CV_METRICS), np.nan)
        n_u = len(self.strata_)
        proba = np.zeros((len(X), len(self.groups_)))
        for i, f in enumerate(f for f in range(int(self.n_folds)) if (folds == f).any()):
            test, fit = folds == f, slice(i * n_u, (i + 1) * n_u)
            proba[test] = self._proba(X[test], u_codes[test], mean[fit], scale[fit], coef[fit])
        return calibration_metrics(proba, s_codes)

    def _proba(self, X, u_codes, mean, scale, coef) -> np.ndarray:
        design = polynomial_design((X - mean[u_codes]) / scale[u_codes], self.max_degree)
        return ovr_proba(design, coef[u_codes])

    def proba_codes(self, X: np.ndarray, u_codes: np.ndarray) -> np.ndarray:
        """Pr[s = groups_[g] | x, u] for stratum codes ``u_codes``, shape (n, n_groups)."""
        return self._proba(X, u_codes, self.mean_, self.scale_, self.coef_)

    def predict_proba(self, X, u) -> np.ndarray:
        """Pr[s = groups_[g] | x, u] of each row, shape (n, n_groups); unseen strata raise."""
        self._check_fitted()
        X = as_2d(X, n_features=self.n_features_in_)
        check_finite(X, [f"x{k}" for k in range(X.shape[1])])
        u_codes = encode(normalise_labels(as_labels(u, len(X), "u")), self.strata_, "u")
        return self.proba_codes(X, u_codes)

    def report(self) -> dict:
        """The cross-validated calibration check as a dict (NaN when it was skipped)."""
        self._check_fitted()
        return {name: float(v) for name, v in zip(CV_METRICS, self.cv_)}

    def _check_fitted(self) -> None:
        if not hasattr(self, "coef_"):
            raise RepairInputError("this GroupPosterior is not fitted yet: call fit(X, s, u) first")

    # ------------------------------------------------------------------ artifact arrays

    def to_arrays(self, prefix: str = "posterior_") -> dict:
        """The learned state as plain arrays (for an artifact's npz payload)."""
        self._check_fitted()
        return {f"{prefix}coef": self.coef_, f"{prefix}mean": self.mean_, f"{prefix}scale": self.scale_,
                f"{prefix}cv": self.cv_, f"{prefix}degree": np.array(str(self.degree)),
                f"{prefix}l2": np.array(float(self.l2)), f"{prefix}n_folds": np.array(int(self.n_folds))}

    @staticmethod
    def array_specs(prefix: str = "posterior_") -> tuple[ArraySpec, ...]:
        """The arrays of :meth:`to_arrays`, in the owner's dimensions ``n_strata``, ``n_groups`` and ``n_features``."""
        return (
            ArraySpec(f"{prefix}coef", "f", ("n_strata", "n_groups", "n_terms"), (_finite_or_absent(),)),
            ArraySpec(f"{prefix}mean", "f", ("n_strata", "n_features"), (finite(),)),
            ArraySpec(f"{prefix}scale", "f", ("n_strata", "n_features"), (finite(), above(0.0))),
            ArraySpec(f"{prefix}cv", "f", (len(CV_METRICS),), (_score_or_unmeasured(),)),
            ArraySpec(f"{prefix}degree", "U", (), (_degree_of_terms(),)),
            ArraySpec(f"{prefix}l2", "f", (), (finite(), at_least(0.0))),
            ArraySpec(f"{prefix}n_folds", "iu", (), (at_least(0),)),
        )

    @classmethod
    def from_arrays(cls, arrays, groups: np.ndarray, strata: np.ndarray, prefix: str = "posterior_") -> "GroupPosterior":
        """Rebuild from :meth:`to_arrays` output (bit-exact) with the owner's group and stratum labels."""
        degree = str(arrays[f"{prefix}degree"])
        post = cls(degree=degree if degree == "bic" else int(degree), l2=float(arrays[f"{prefix}l2"]),
                   n_folds=int(arrays[f"{prefix}n_folds"]))
        post.coef_, post.mean_, post.scale_ = (np.asarray(arrays[f"{prefix}{n}"]) for n in ("coef", "mean", "scale"))
        post.cv_ = np.asarray(arrays[f"{prefix}cv"])
        post.groups_, post.strata_ = np.asarray(groups), np.asarray(strata)
        post.n_features_in_ = post.mean_.shape[1]
        return post


def _finite_or_absent() -> Check:
    """Coefficients: finite, or NaN in every term of a group's row (the group is absent from the stratum)."""
    def bad(coef, ctx):
        absent = np.isnan(coef).all(axis=-1, keepdims=True)
        return ~np.isfinite(coef) & ~absent, coef
    return Check("finite (or NaN in a whole row: a group absent from the stratum)", bad)


def _score_or_unmeasured() -> Check:
    """A cross-validated score (log-loss, Brier, ECE, AUC, accuracy): >= 0, or NaN when it was not measured."""
    return Check("a finite score >= 0, or NaN (not measured)",
                 lambda cv, ctx: (~(np.isnan(cv) | (np.isfinite(cv) & (cv >= 0))), cv))


def _degree_of_terms() -> Check:
    """'bic' (degree 2 stored) or a degree >= 1, matching the coefficients' 1 + n_features * degree terms."""
    def bad(degree, ctx):
        text = str(degree)
        value = 2 if text == "bic" else int(text) if text.isdecimal() and int(text) >= 1 else None
        fits = value is not None and ctx.dims["n_terms"] == 1 + ctx.dims["n_features"] * value
        return np.array(not fits), degree
    return Check("'bic' or a degree >= 1 matching the coefficients (1 + n_features * degree terms: {n_terms})", bad)


def calibration_metrics(proba: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Log-loss, Brier score, class-wise expected calibration error, AUC (two groups) and accuracy."""
    n, n_groups = proba.shape
    onehot = np.eye(n_groups)[codes]
    log_loss = -np.mean(np.log(np.clip(proba[np.arange(n), codes], 1e-15, None)))
    brier = np.mean(np.sum((proba - onehot) ** 2, axis=1))
    bins = np.minimum((proba * _CALIBRATION_BINS).astype(np.int64), _CALIBRATION_BINS - 1)
    ece = 0.0
    for g in range(n_groups):
        # Sum over bins of (bin share) * |mean predicted - observed frequency| in the bin.
        gap = np.bincount(bins[:, g], proba[:, g] - onehot[:, g], minlength=_CALIBRATION_BINS)
        ece += np.abs(gap).sum() / n / n_groups
    area = auc(proba[:, 1], codes == 1) if n_groups == 2 else np.nan
    accuracy = np.mean(np.argmax(proba, axis=1) == codes)
    return np.array([log_loss, brier, ece, area, accuracy])
