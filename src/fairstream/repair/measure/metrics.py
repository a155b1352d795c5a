"""Batch fairness metrics: dependence E, demographic parity, W1 between groups, damage.

Every count-based metric is computed in two steps: raw counts from the data, then a
``*_from_counts`` function that turns counts into the metric. The streaming accumulators in
:mod:`fairstream.repair.measure.accumulators` keep the same counts and call the same functions, so a batch
value and a streaming value over the same records agree exactly.

Conventions shared by all metrics here:

* ``s`` holds protected-group labels and ``u`` stratum labels of the unprotected attribute; both
  may be ints or strings and take any finite number of values. ``u=None`` means one stratum.
* Pr[u] is the empirical stratum frequency.
* A stratum in which fewer than two groups are present carries no measurable disparity and
  contributes 0 (E, DP difference, W1) or 1 (DP ratio).

Example
-------
>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> s = rng.integers(0, 2, 4000)
>>> u = rng.integers(0, 2, 4000)
>>> X = rng.normal(size=(4000, 2)) + s[:, None]
>>> result = dependence_e(X, s, u)
>>> bool(result.per_feature.min() > 0.3)
True
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Sequence

import numpy as np
from scipy.stats import wasserstein_distance

from fairstream.repair.validation import (
    RepairInputError,
    as_2d,
    as_labels,
    check_finite,
    column_names,
    normalise_labels,
)

__all__ = [
    "DamageResult",
    "DemographicParityResult",
    "DependenceResult",
    "NoiseFloorResult",
    "WassersteinResult",
    "auc",
    "damage",
    "demographic_parity",
    "dependence_e",
    "dependence_e_noise_floor",
    "dp_difference",
    "dp_ratio",
    "equal_width_edges",
    "symmetrised_kl_from_counts",
    "wasserstein_between_groups",
]

# Label given to the single stratum when no ``u`` is passed.
ALL_STRATA = "all"


# --------------------------------------------------------------------------------------------
# Labels and bins (shared with the streaming accumulators)
# --------------------------------------------------------------------------------------------


def encode_observed(values, n_rows: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct labels seen in ``values`` and each row's code; ``None`` is one stratum."""
    if values is None:
        return np.array([ALL_STRATA]), np.zeros(n_rows, dtype=np.intp)
    labels = normalise_labels(as_labels(values, n_rows, name))
    classes, codes = np.unique(labels, return_inverse=True)
    return classes, codes.astype(np.intp)


def features(X, n_features: int | None = None) -> np.ndarray:
    """``X`` as a finite float matrix (n, d); NaN or inf raises naming the column."""
    X = as_2d(X, n_features=n_features)
    check_finite(X, column_names(X.shape[1], None))
    return X


def as_edges(edges, n_features: int) -> list[np.ndarray]:
    """Bin edges per feature: one 1-D array shared by all, a (d, b+1) array, or d arrays.

    Edges must be finite and strictly increasing with at least two entries.
    """
    try:
        arr = np.asarray(edges, dtype=np.float64)
    except ValueError:  # ragged: a different number of bins per feature
        arr = None
    if arr is not None and arr.ndim == 1:
        per_feature = [arr] * n_features
    elif arr is not None and arr.ndim == 2:
        per_feature = list(arr)
    else:
        per_feature = [np.asarray(e, dtype=np.float64) for e in edges]
    if len(per_feature) != n_features:
        raise RepairInputError(f"got bin edges for {len(per_feature)} features, X has {n_features}")
    for k, e in enumerate(per_feature):
        if e.ndim != 1 or e.size < 2 or not np.all(np.isfinite(e)) or np.any(np.diff(e) <= 0):
            raise RepairInputError(f"bin edges for feature {k} must be >= 2 finite, strictly increasing values")
    return per_feature


def equal_width_edges(X, bins: int = 30) -> list[np.ndarray]:
    """``bins`` equal-width bins over each column's [min, max], e.g. of research data.

    >>> [e.round(1).tolist() for e in equal_width_edges([[0.0], [1.0]], bins=2)]
    [[0.0, 0.5, 1.0]]
    """
    X = features(X)
    _check_bins(bins)
    return [np.linspace(lo, hi, bins + 1) for lo, hi in zip(X.min(axis=0), X.max(axis=0))]


def bin_index(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin of each value; values outside the edges fall in the end bins (as np.histogram's last bin
    includes its right edge, so does ours)."""
    return np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)


class ColumnBins:
    """Bins of every column of a matrix on fixed per-column edges, in a few vectorised calls.

    :meth:`codes` gives, column by column, exactly what :func:`bin_index` gives (values outside the
    edges in the end bins, a value on an edge in the bin it starts, the last edge in the last bin),
    without a binary search per value: each value's bin is guessed arithmetically as if the edges
    were of equal width and kept where ``edges[b] <= x < edges[b + 1]`` confirms it (the end bins
    open to -inf and +inf). That interval is unique for strictly increasing edges, so a kept guess
    is ``bin_index``'s bin whatever the edges; the rare values it misses (rounding at an edge,
    unequal widths, NaN) get their bin from ``bin_index``.

    >>> bins = ColumnBins([np.array([0.0, 1.0, 2.0]), np.array([0.0, 10.0, 20.0, 30.0])])
    >>> bins.codes(np.array([[1.0, 30.0], [-5.0, 9.9]])).tolist()
    [[1, 2], [0, 0]]
    """

    def __init__(self, edges: Sequence[np.ndarray]):
        self.edges = [np.asarray(e, dtype=np.float64) for e in edges]
        self.n_bins = np.array([len(e) - 1 for e in self.edges], dtype=np.intp)
        starts = np.array([e[0] for e in self.edges])
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            spans = np.array([e[-1] for e in self.edges]) - starts
            self._scale = np.nan_to_num(self.n_bins / spans, posinf=0.0)  # a span that overflows: guess bin 0
        self._start = starts
        self._last = (self.n_bins - 1).astype(np.float64)
        # Every column's edges in one flat array, the outer ones opened to -inf and +inf (the end bins), so one
        # gather per side checks every guess; ``_first`` is each column's offset in it.
        self._first = np.concatenate([[0], np.cumsum(self.n_bins + 1)[:-1]]).astype(np.intp)
        self._flat = np.concatenate([np.concatenate([[-np.inf], e[1:-1], [np.inf]]) for e in self.edges])

    def codes(self, X: np.ndarray) -> np.ndarray:
        """The bin of every value of ``X`` (n, columns), column k on ``edges[k]``, as :func:`bin_index`."""
        with np.errstate(invalid="ignore", over="ignore"):
            guess = (X - self._start) * self._scale
        # fmax/fmin send NaN to bin 0, where the check below refuses it
        index = np.fmin(np.fmax(guess, 0.0, out=guess), self._last, out=guess).astype(np.intp)
        index += self._first
        kept = (self._flat[index] <= X) & (X < self._flat[index + 1])
        index -= self._first
        if not kept.all():
            missed = ~kept
            for column in np.flatnonzero(missed.any(axis=0)):
                rows = np.flatnonzero(missed[:, column])
                index[rows, column] = bin_index(X[rows, column], self.edges[column])
        return index


def histogram_counts(bin_codes: np.ndarray, s_codes: np.ndarray, u_codes: np.ndarray,
                     n_groups: int, n_strata: int, n_bins: int) -> np.ndarray:
    """Counts of one feature per (stratum, group, bin), shape (n_strata, n_groups, n_bins)."""
    flat = (u_codes * n_groups + s_codes) * n_bins + bin_codes
    counts = np.bincount(flat, minlength=n_strata * n_groups * n_bins)
    return counts.reshape(n_strata, n_groups, n_bins)


def _check_bins(bins: int) -> None:
    if not isinstance(bins, (int, np.integer)) or bins < 1:
        raise RepairInputError(f"bins must be a positive integer, got {bins!r}")


def check_alpha(alpha: float) -> None:
    """Raise unless ``alpha`` is a positive, finite smoothing count."""
    # alpha = 0 would give log(0) for any empty bin, i.e. an infinite E from sampling gaps alone.
    if not np.isfinite(alpha) or alpha <= 0:
        raise RepairInputError(f"alpha must be a positive finite smoothing count, got {alpha!r}")


def safe_ratio(num: np.ndarray, den: np.ndarray, empty: float) -> np.ndarray:
    """``num / den`` element-wise, ``empty`` where the denominator is 0 (an empty group or stratum)."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    if num.shape != den.shape:  # broadcast only when needed: a gauge export reads a thousand ratios
        num, den = np.broadcast_arrays(num, den)
    return np.divide(num, den, out=np.full(num.shape, empty), where=den > 0)


# --------------------------------------------------------------------------------------------
# Dependence E (Langbridge, Quinn and Shorten (2024), Eq. 3), histogram estimator
# --------------------------------------------------------------------------------------------


def symmetrised_kl_from_counts(counts, alpha: float = 0.5) -> np.ndarray:
    """Mean symmetrised KL between the groups' smoothed histograms, over the last two axes.

    ``counts`` has shape (..., n_groups, n_bins). Each group's pmf is ``(c + alpha) / (n + alpha*b)``;
    for a pair, ``0.5*KL(p||q) + 0.5*KL(q||p) = 0.5 * sum((p - q) * (log p - log q))``, a form whose
    terms are never negative, so the result is >= 0 even in floating point. With more than two
    groups the pairs' values are averaged; groups with no records are left out, and a slice with
    fewer than two groups present gives 0.

    >>> float(symmetrised_kl_from_counts([[5, 5], [5, 5]]))
    0.0
    """
    check_alpha(alpha)
    counts = np.asarray(counts, dtype=np.float64)
    n_groups, n_bins = counts.shape[-2:]
    totals = counts.sum(axis=-1)
    present = totals > 0
    pmf = (counts + alpha) / (totals[..., None] + alpha * n_bins)
    log_pmf = np.log(pmf)
    pair_sum = np.zeros(counts.shape[:-2])
    n_pairs = np.zeros(counts.shape[:-2])
    for a, b in combinations(range(n_groups), 2):
        both = present[..., a] & present[..., b]
        diff = (pmf[..., a, :] - pmf[..., b, :]) * (log_pmf[..., a, :] - log_pmf[..., b, :])
        pair_sum += np.where(both, 0.5 * diff.sum(axis=-1), 0.0)
        n_pairs += both
    return np.divide(pair_sum, n_pairs, out=np.zeros(pair_sum.shape), where=n_pairs > 0)


@dataclass(frozen=True, eq=False)
class DependenceResult:
    """Dependence E per feature, its total, and the per-(stratum, feature) values.

    ``per_stratum[j, k]`` is E_{u_j,k}; ``per_feature[k] = sum_j weights[j] * per_stratum[j, k]``;
    ``total`` sums ``per_feature`` over features.
    """

    per_feature: np.ndarray
    total: float
    per_stratum: np.ndarray
    weights: np.ndarray
    groups: np.ndarray
    strata: np.ndarray


def dependence_from_counts(counts: Sequence[np.ndarray], alpha: float, groups, strata) -> DependenceResult:
    """E from per-feature histograms, each of shape (n_strata, n_groups, n_bins_k).

    Pr[u] is read from the first feature's counts: every record falls in exactly one bin of
    every feature, so all features hold the same per-stratum totals.
    """
    if len({np.shape(c) for c in counts}) == 1:  # the features' histograms stacked: one pass for all of them
        per_stratum = symmetrised_kl_from_counts(np.stack(counts, axis=1), alpha)
    else:
        per_stratum = np.stack([symmetrised_kl_from_counts(c, alpha) for c in counts], axis=1)
    stratum_totals = np.asarray(counts[0]).sum(axis=(1, 2))
    total = stratum_totals.sum()
    weights = stratum_totals / total if total > 0 else np.zeros(stratum_totals.shape)
    per_feature = weights @ per_stratum
    return DependenceResult(per_feature=per_feature, total=float(per_feature.sum()), per_stratum=per_stratum,
                            weights=weights, groups=np.asarray(groups), strata=np.asarray(strata))


def _stratum_bin_codes(X: np.ndarray, u_codes: np.ndarray, n_strata: int, bins: int) -> np.ndarray:
    """Bin of each value, with ``bins`` equal-width bins over the pooled range of its (u, k)."""
    codes = np.empty(X.shape, dtype=np.intp)
    for j in range(n_strata):
        rows = u_codes == j
        for k in range(X.shape[1]):
            x = X[rows, k]
            if x.size:
                codes[rows, k] = bin_index(x, np.linspace(x.min(), x.max(), bins + 1))
    return codes


def _bin_codes(X: np.ndarray, u_codes: np.ndarray, n_strata: int, bins: int, edges) -> tuple[np.ndarray, list[int]]:
    """Bin codes (n, d) and the number of bins per feature, for pooled-range or fixed edges."""
    if edges is None:
        _check_bins(bins)
        return _stratum_bin_codes(X, u_codes, n_strata, bins), [bins] * X.shape[1]
    per_feature = as_edges(edges, X.shape[1])
    codes = np.empty(X.shape, dtype=np.intp)
    for k, e in enumerate(per_feature):
        codes[:, k] = bin_index(X[:, k], e)
    return codes, [len(e) - 1 for e in per_feature]


def _dependence_from_codes(bin_codes, n_bins, s_codes, u_codes, groups, strata, alpha) -> DependenceResult:
    counts = [histogram_counts(bin_codes[:, k], s_codes, u_codes, len(groups), len(strata), b)
              for k, b in enumerate(n_bins)]
    return dependence_from_counts(counts, alpha, groups, strata)


def dependence_e(X, s, u=None, bins: int = 30, alpha: float = 0.5, edges=None) -> DependenceResult:
    """Dependence E of Langbridge, Quinn and Shorten (2024) (Eq. 3) per feature, estimated with smoothed histograms.

    For each feature k and stratum u the pooled values are cut into ``bins`` equal-width bins over
    their [min, max] (or into the fixed ``edges`` of feature k, values outside counted in the end
    bins); each group's counts plus ``alpha`` are normalised to a pmf; E_{u,k} is the mean over
    pairs of present groups of ``0.5*KL(p_a||p_b) + 0.5*KL(p_b||p_a)``; E_k = sum_u Pr[u] E_{u,k}.
    Strata with fewer than two groups present contribute 0. The estimator deliberately shares no
    grid or smoothing with a repair, and its values are comparable only at the same ``bins``,
    ``alpha`` and similar sample sizes (Langbridge, Quinn and Shorten (2024), section 2.1): sampling noise, and the smoothing
    when group sizes differ, give E > 0 even for independent data, which is what
    :func:`dependence_e_noise_floor` measures.

    Parameters
    ----------
    X : array-like of shape (n_rows, n_features)
        Feature values.
    s : array-like of shape (n_rows,)
        Protected attribute (group) of each row.
    u : array-like of shape (n_rows,) or None, default=None
        Unprotected attribute (stratum) of each row; None is one stratum.
    bins : int, default=30
        Number of equal-width bins per feature and stratum (ignored when ``edges`` is given).
    alpha : float, default=0.5
        Pseudo-count added to every bin of every group before normalising (additive smoothing).
    edges : sequence of ndarray or None, default=None
        Fixed bin edges per feature (ascending); None derives them from the data.

    Returns
    -------
    DependenceResult
        E per feature (``per_feature``, in nats, 0 when the groups are identically distributed), per stratum and
        feature, and in total.

    Examples
    --------
    >>> X = np.array([[0.0], [1.0], [0.0], [1.0]])
    >>> float(dependence_e(X, s=[0, 0, 1, 1], u=[0, 0, 0, 0]).total)
    0.0
    """
    check_alpha(alpha)
    X = features(X)
    groups, s_codes = encode_observed(s, X.shape[0], "s")
    strata, u_codes = encode_observed(u, X.shape[0], "u")
    bin_codes, n_bins = _bin_codes(X, u_codes, len(strata), bins, edges)
    return _dependence_from_codes(bin_codes, n_bins, s_codes, u_codes, groups, strata, alpha)


@dataclass(frozen=True, eq=False)
class NoiseFloorResult:
    """E under permutations of ``s`` within strata: mean and sd per feature and of the total."""

    per_feature_mean: np.ndarray
    per_feature_sd: np.ndarray
    total_mean: float
    total_sd: float
    samples: np.ndarray  # (n_permutations, d): E_k of each permutation


def permute_within_strata(s_codes: np.ndarray, u_codes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``s_codes`` shuffled inside each stratum, so group sizes per stratum are kept."""
    by_stratum = np.argsort(u_codes, kind="stable")
    shuffled = np.lexsort((rng.random(u_codes.size), u_codes))
    out = np.empty_like(s_codes)
    out[by_stratum] = s_codes[shuffled]
    return out


def dependence_e_noise_floor(X, s, u=None, n_permutations: int = 20, seed: int = 0, bins: int = 30,
                             alpha: float = 0.5, edges=None) -> NoiseFloorResult:
    """E that an ideal repair would still measure, from sampling noise and estimator bias alone.

    Same estimator as :func:`dependence_e`, with ``s`` permuted within each ``u`` stratum, which
    makes X independent of S given U while keeping the sample sizes of every (u, s) cell.

    Parameters
    ----------
    X : array-like of shape (n_rows, n_features)
        Feature values.
    s : array-like of shape (n_rows,)
        Protected attribute (group) of each row.
    u : array-like of shape (n_rows,) or None, default=None
        Unprotected attribute (stratum) of each row; None is one stratum.
    n_permutations : int, default=20
        Number of within-stratum permutations of ``s``.
    seed : int, default=0
        Seed of the permutations.
    bins : int, default=30
        As in :func:`dependence_e`.
    alpha : float, default=0.5
        As in :func:`dependence_e`.
    edges : sequence of ndarray or None, default=None
        As in :func:`dependence_e`.

    Returns
    -------
    NoiseFloorResult
        Mean and standard deviation of E over the permutations, per feature and in total.

    Examples
    --------
    >>> rng = np.random.default_rng(1)
    >>> X, s = rng.normal(size=(500, 1)), rng.integers(0, 2, 500)
    >>> floor = dependence_e_noise_floor(X, s, n_permutations=5)
    >>> bool(0 < floor.total_mean < 0.2)
    True
    """
    check_alpha(alpha)
    if not isinstance(n_permutations, (int, np.integer)) or n_permutations < 2:
        raise RepairInputError(f"n_permutations must be an integer >= 2, got {n_permutations!r}")
    X = features(X)
    groups, s_codes = encode_observed(s, X.shape[0], "s")
    strata, u_codes = encode_observed(u, X.shape[0], "u")
    # The bins do not depend on s, so they are computed once for all permutations.
    bin_codes, n_bins = _bin_codes(X, u_codes, len(strata), bins, edges)
    rng = np.random.default_rng(seed)
    samples = np.stack([
        _dependence_from_codes(bin_codes, n_bins, permute_within_strata(s_codes, u_codes, rng), u_codes,
                               groups, strata, alpha).per_feature
        for _ in range(n_permutations)
    ])
    totals = samples.sum(axis=1)
    return NoiseFloorResult(per_feature_mean=samples.mean(axis=0), per_feature_sd=samples.std(axis=0, ddof=1),
                            total_mean=float(totals.mean()), total_sd=float(totals.std(ddof=1)), samples=samples)


# --------------------------------------------------------------------------------------------
# Demographic parity, unconditional and conditional on U
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class DemographicParityResult:
    """Positive rates and their spread across groups, overall and per stratum.

    ``rates[g]`` pools all strata; ``stratum_rates[j, g]`` is Pr[y=1 | s=g, u=j] (NaN where the
    cell is empty). ``difference`` = max - min rate, ``ratio`` = min / max rate (disparate impact;
    1 when every rate is 0). Conditional DP: ``stratum_difference``/``stratum_ratio`` per stratum,
    their Pr[u]-weighted means ``conditional_difference``/``conditional_ratio`` and the worst
    stratum ``conditional_difference_max``/``conditional_ratio_min``.
    """

    groups: np.ndarray
    strata: np.ndarray
    rates: np.ndarray
    difference: float
    ratio: float
    stratum_rates: np.ndarray
    stratum_difference: np.ndarray
    stratum_ratio: np.ndarray
    weights: np.ndarray
    conditional_difference: float
    conditional_difference_max: float
    conditional_ratio: float
    conditional_ratio_min: float


def _rate_spread(positives: np.ndarray, totals: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rates (NaN where empty), max - min and min / max over the last axis, among present groups."""
    present = totals > 0
    rates = safe_ratio(positives, totals, empty=np.nan)
    hi = np.where(present, rates, -np.inf).max(axis=-1)
    lo = np.where(present, rates, np.inf).min(axis=-1)
    measurable = present.sum(axis=-1) >= 2
    difference = np.where(measurable, hi - lo, 0.0)
    ratio = np.where(measurable, safe_ratio(lo, np.where(measurable, hi, 0.0), empty=1.0), 1.0)
    return rates, difference, ratio


def dp_from_counts(positives, totals, groups, strata) -> DemographicParityResult:
    """DP and conditional DP from positive and total counts of shape (n_strata, n_groups)."""
    positives = np.asarray(positives, dtype=np.float64)
    totals = np.asarray(totals, dtype=np.float64)
    rates, difference, ratio = _rate_spread(positives.sum(axis=0), totals.sum(axis=0))
    stratum_rates, stratum_difference, stratum_ratio = _rate_spread(positives, totals)
    stratum_totals = totals.sum(axis=1)
    weights = safe_ratio(stratum_totals, stratum_totals.sum(), empty=0.0)
    return DemographicParityResult(
        groups=np.asarray(groups), strata=np.asarray(strata), rates=rates,
        difference=float(difference), ratio=float(ratio),
        stratum_rates=stratum_rates, stratum_difference=stratum_difference, stratum_ratio=stratum_ratio,
        weights=weights,
        conditional_difference=float(weights @ stratum_difference),
        conditional_difference_max=float(stratum_difference.max()),
        conditional_ratio=float(weights @ stratum_ratio),
        conditional_ratio_min=float(stratum_ratio.min()),
    )


def as_binary(y, n_rows: int, name: str = "y") -> np.ndarray:
    """Binary decisions or labels as 0/1 ints; any other value raises naming it."""
    labels = normalise_labels(as_labels(y, n_rows, name))
    ok = (labels == 0) | (labels == 1) if labels.dtype.kind in "iuf" else np.zeros(labels.shape, dtype=bool)
    if not ok.all():
        raise RepairInputError(f"{name} must be binary (0/1), got the value {labels[np.argmin(ok)]!r}")
    return labels.astype(np.int64)


def rate_counts(y: np.ndarray, s_codes: np.ndarray, u_codes: np.ndarray,
                n_groups: int, n_strata: int) -> tuple[np.ndarray, np.ndarray]:
    """Positives and totals per (stratum, group), each of shape (n_strata, n_groups)."""
    cell = u_codes * n_groups + s_codes
    size = n_strata * n_groups
    positives = np.bincount(cell, weights=y, minlength=size).astype(np.int64)
    totals = np.bincount(cell, minlength=size)
    return positives.reshape(n_strata, n_groups), totals.reshape(n_strata, n_groups)


def demographic_parity(y, s, u=None) -> DemographicParityResult:
    """Demographic parity of binary decisions ``y`` across groups ``s``, and conditional on ``u``.

    Parameters
    ----------
    y : array-like of shape (n_rows,)
        Binary decisions (0 or 1; booleans accepted).
    s : array-like of shape (n_rows,)
        Group of each row.
    u : array-like of shape (n_rows,) or None, default=None
        Stratum of each row, for conditional demographic parity; None is one stratum.

    Returns
    -------
    DemographicParityResult
        Positive rate per group (and per stratum), their max-min difference and min/max ratio.

    Examples
    --------
    >>> result = demographic_parity([1, 1, 0, 1, 0, 0], s=["a", "a", "a", "b", "b", "b"])
    >>> round(result.difference, 3), round(result.ratio, 3)
    (0.333, 0.5)
    """
    s_arr = np.asarray(s)
    n_rows = s_arr.shape[0] if s_arr.ndim else 1
    y = as_binary(y, n_rows)
    groups, s_codes = encode_observed(s_arr, n_rows, "s")
    strata, u_codes = encode_observed(u, n_rows, "u")
    positives, totals = rate_counts(y, s_codes, u_codes, len(groups), len(strata))
    return dp_from_counts(positives, totals, groups, strata)


def dp_difference(y, s) -> float:
    """Max minus min positive rate across groups, in [0, 1].

    Parameters
    ----------
    y : array-like of shape (n_rows,)
        Binary decisions.
    s : array-like of shape (n_rows,)
        Group of each row.

    Returns
    -------
    float
        The largest minus the smallest positive rate; 0 is parity.

    Examples
    --------
    >>> dp_difference([1, 0, 0, 0], s=[0, 0, 1, 1])
    0.5
    """
    return demographic_parity(y, s).difference


def dp_ratio(y, s) -> float:
    """Min over max positive rate across groups (disparate impact), in [0, 1].

    Parameters
    ----------
    y : array-like of shape (n_rows,)
        Binary decisions.
    s : array-like of shape (n_rows,)
        Group of each row.

    Returns
    -------
    float
        The smallest over the largest positive rate; 1 is parity.

    Examples
    --------
    >>> dp_ratio([1, 0, 1, 1], s=[0, 0, 1, 1])
    0.5
    """
    return demographic_parity(y, s).ratio


# --------------------------------------------------------------------------------------------
# Ranking quality of a score
# --------------------------------------------------------------------------------------------


def auc(score: np.ndarray, positive: np.ndarray) -> float:
    """Area under the ROC curve of ``score`` for the ``positive`` rows (Mann-Whitney, mid-ranks for ties).

    NaN when one class is absent.

    Parameters
    ----------
    score : ndarray of shape (n_rows,)
        A score per row; higher means more likely positive.
    positive : ndarray of bool, shape (n_rows,)
        Which rows are positive.

    Returns
    -------
    float
        The AUC in [0, 1] (0.5 is chance), or NaN.

    Examples
    --------
    >>> auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([False, False, True, True]))
    0.75
    """
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(score, kind="stable")
    ranks = np.empty(len(score))
    ranks[order] = np.arange(1, len(score) + 1)
    # Average the ranks of tied scores.
    _, inverse = np.unique(score, return_inverse=True)
    ranks = (np.bincount(inverse, ranks) / np.bincount(inverse))[inverse]
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


# --------------------------------------------------------------------------------------------
# W1 between groups
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class WassersteinResult:
    """W1 between groups per stratum and feature.

    ``per_pair[j, p, k]`` is W1 between the groups ``pairs[p]`` in stratum j for feature k (NaN when
    either group is absent there); ``per_stratum[j, k]`` is the max over present pairs (0 with fewer
    than two groups); ``per_feature[k] = sum_j weights[j] * per_stratum[j, k]``.
    """

    per_feature: np.ndarray
    per_stratum: np.ndarray
    per_pair: np.ndarray
    pairs: list[tuple]
    weights: np.ndarray
    groups: np.ndarray
    strata: np.ndarray


def wasserstein_between_groups(X, s, u=None) -> WassersteinResult:
    """1-D W1 (``scipy.stats.wasserstein_distance``) between each pair of groups, per (u, k).

    Parameters
    ----------
    X : array-like of shape (n_rows, n_features)
        Feature values.
    s : array-like of shape (n_rows,)
        Protected attribute (group) of each row.
    u : array-like of shape (n_rows,) or None, default=None
        Unprotected attribute (stratum) of each row; None is one stratum.

    Returns
    -------
    WassersteinResult
        W1 per stratum, pair of groups and feature, and per feature (in the units of that feature).

    Examples
    --------
    >>> result = wasserstein_between_groups([[0.0], [1.0], [2.0], [3.0]], s=[0, 0, 1, 1])
    >>> result.per_feature.tolist()
    [2.0]
    """
    X = features(X)
    groups, s_codes = encode_observed(s, X.shape[0], "s")
    strata, u_codes = encode_observed(u, X.shape[0], "u")
    pairs = list(combinations(range(len(groups)), 2))
    per_pair = np.full((len(strata), len(pairs), X.shape[1]), np.nan)
    for j in range(len(strata)):
        for p, (a, b) in enumerate(pairs):
            x_a = X[(u_codes == j) & (s_codes == a)]
            x_b = X[(u_codes == j) & (s_codes == b)]
            if len(x_a) and len(x_b):
                per_pair[j, p] = [wasserstein_distance(x_a[:, k], x_b[:, k]) for k in range(X.shape[1])]
    per_stratum = np.where(np.isnan(per_pair), -np.inf, per_pair).max(axis=1, initial=-np.inf)
    per_stratum = np.where(np.isfinite(per_stratum), per_stratum, 0.0)
    stratum_totals = np.bincount(u_codes, minlength=len(strata))
    weights = safe_ratio(stratum_totals, stratum_totals.sum(), empty=0.0)
    return WassersteinResult(per_feature=weights @ per_stratum, per_stratum=per_stratum, per_pair=per_pair,
                             pairs=[(groups[a].item(), groups[b].item()) for a, b in pairs], weights=weights,
                             groups=groups, strata=strata)


# --------------------------------------------------------------------------------------------
# Damage
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class DamageResult:
    """Mean |x' - x| per feature and over all entries, from ``n_rows`` records."""

    per_feature: np.ndarray
    overall: float
    n_rows: int


def damage_from_sums(abs_sums, n_rows: int) -> DamageResult:
    """Damage from per-feature sums of |x' - x| over ``n_rows`` records (0 when there are none)."""
    abs_sums = np.asarray(abs_sums, dtype=np.float64)
    per_feature = safe_ratio(abs_sums, n_rows, empty=0.0)
    overall = float(per_feature.mean()) if per_feature.size else 0.0
    return DamageResult(per_feature=per_feature, overall=overall, n_rows=int(n_rows))


def repair_displacement(X, X_repaired, n_features: int | None = None) -> np.ndarray:
    """|x' - x| as a (n, d) matrix, after checking both arrays have the same shape and are finite."""
    X, X_repaired = features(X, n_features), features(X_repaired, n_features)
    if X.shape != X_repaired.shape:
        raise RepairInputError(f"original and repaired data differ in shape: {X.shape} vs {X_repaired.shape}")
    return np.abs(X_repaired - X)


def damage(X, X_repaired) -> DamageResult:
    """Mean absolute displacement of a repair, per feature and overall.

    Parameters
    ----------
    X : array-like of shape (n_rows, n_features)
        Features before the repair.
    X_repaired : array-like of shape (n_rows, n_features)
        The same rows after the repair.

    Returns
    -------
    DamageResult
        Mean |X_repaired - X| per feature (in the units of that feature) and their mean overall.

    Examples
    --------
    >>> damage([[0.0, 1.0], [2.0, 3.0]], [[1.0, 1.0], [2.0, 5.0]]).per_feature.tolist()
    [0.5, 1.0]
    """
    displacement = repair_displacement(X, X_repaired)
    return damage_from_sums(displacement.sum(axis=0), displacement.shape[0])
