"""Mergeable streaming accumulators for count-based fairness statistics.

Each accumulator keeps integer counts (or sums) over a finite, configured set of groups and
strata, so that windows, partitions and workers can be combined: ``a.merge(b)`` after feeding
``a`` and ``b`` two halves of a stream equals one accumulator fed the whole stream (exactly for
the integer counts; up to float rounding for the damage sums).
``value()`` hands the counts to the same ``*_from_counts`` function the batch metrics in
:mod:`fairstream.repair.measure.metrics` use, so streaming and batch values agree exactly.

The protocol follows river: ``update(...)`` takes a whole batch (vectorised) and returns
``self``; ``merge(other)`` returns a new accumulator; ``reset()`` empties the counts.

Example
-------
>>> import numpy as np
>>> acc = PositiveRateAccumulator(groups=["a", "b"], strata=[0, 1])
>>> _ = acc.update(y=[1, 0, 1, 1], s=["a", "a", "b", "b"], u=[0, 0, 0, 1])
>>> round(acc.value().difference, 3)
0.5
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from fairstream.repair.validation import RepairInputError, as_2d, as_labels, check_finite, encode, normalise_labels

from .metrics import (
    ALL_STRATA,
    DamageResult,
    DemographicParityResult,
    DependenceResult,
    WassersteinResult,
    as_binary,
    as_edges,
    bin_index,
    check_alpha,
    damage_from_sums,
    dependence_from_counts,
    dp_from_counts,
    equal_width_edges,
    features,
    histogram_counts,
    rate_counts,
    repair_displacement,
    safe_ratio,
)

__all__ = [
    "DamageAccumulator",
    "DecisionRateAccumulator",
    "HistogramDependenceAccumulator",
    "PositiveRateAccumulator",
    "EncodedLabels",
    "RateAccumulator",
    "RateResult",
    "WassersteinAccumulator",
]


def configured_labels(values, name: str) -> np.ndarray:
    """The configured labels, sorted as :func:`encode` needs; ``None`` means one stratum."""
    if values is None:
        return np.array([ALL_STRATA])
    labels = normalise_labels(np.asarray(values))
    if labels.ndim != 1 or labels.size == 0:
        raise RepairInputError(f"{name} must be a non-empty 1-D sequence of labels")
    classes = np.unique(labels)
    if classes.size != labels.size:
        raise RepairInputError(f"{name} holds duplicate labels: {labels.tolist()}")
    return classes


class EncodedLabels(np.ndarray):
    """Labels already encoded as codes in ``classes``: encode a batch once, feed many accumulators.

    A window slices it row by row like any array; an accumulator built with the same classes takes
    the codes as they are instead of encoding the labels again.

    >>> codes = EncodedLabels.encode(["b", "a", "b"], ["a", "b"])
    >>> codes.tolist(), codes[1:].classes.tolist()
    ([1, 0, 1], ['a', 'b'])
    """

    classes: np.ndarray

    @classmethod
    def encode(cls, values, labels, name: str = "labels") -> "EncodedLabels":
        """Codes of ``values`` in the configured ``labels``; an unknown value raises naming it."""
        return cls.in_classes(values, configured_labels(labels, name), name)

    @classmethod
    def in_classes(cls, values, classes: np.ndarray, name: str = "labels") -> "EncodedLabels":
        """:meth:`encode` with labels already configured (:func:`configured_labels`, or an accumulator's
        ``groups`` or ``strata``): for a caller that encodes every batch in the same labels."""
        values = np.asarray(values)
        if values.dtype.kind in "iu" and classes.dtype.kind == "i" and values.size and classes[0] == 0 \
                and classes[-1] == len(classes) - 1 and values.min() >= 0 and values.max() < len(classes):
            codes = values.astype(np.intp).view(cls)  # labels 0 .. k-1 (sorted, distinct) are their own codes
            codes.classes = classes
            return codes
        codes = encode(normalise_labels(np.asarray(values)), classes, name).view(cls)
        codes.classes = classes
        return codes

    def __array_finalize__(self, obj) -> None:
        self.classes = getattr(obj, "classes", None)


def label_codes(values, classes: np.ndarray, n_rows: int, name: str, configured: bool = True) -> np.ndarray:
    """Codes of a batch's labels in the configured ``classes``; an unknown label raises naming it."""
    if not configured:
        if values is not None:
            raise RepairInputError(f"{name} was given but the accumulator was built without {name} labels")
        return np.zeros(n_rows, dtype=np.intp)
    if values is None:
        raise RepairInputError(f"{name} is required: the accumulator was built with {name} labels {classes.tolist()}")
    if isinstance(values, EncodedLabels) and values.classes is not None and len(values) == n_rows \
            and _same(values.classes, classes):
        return values.view(np.ndarray)
    return encode(normalise_labels(as_labels(values, n_rows, name)), classes, name)


class Mergeable(ABC):
    """Shared merge/reset: the state is a few count arrays that add up across accumulators.

    Subclasses name their count attributes in ``_counts`` and their settings (which must match
    for a merge to mean anything) in ``_settings``.
    """

    _counts: tuple[str, ...] = ()

    @abstractmethod
    def _settings(self) -> tuple:
        """Everything two accumulators must share for their counts to be added."""

    def merge(self, other):
        """A new accumulator holding the counts of both; ``self`` and ``other`` are unchanged."""
        self._check_mergeable(other)
        # A shallow copy suffices: every count is replaced by a fresh array below, and settings
        # (bin edges, labels) are never mutated. A deep copy made merging the monitor's hot spot.
        merged = _shallow_copy(self)
        for name in self._counts:
            setattr(merged, name, _add(getattr(self, name), getattr(other, name)))
        return merged

    def absorb(self, other):
        """Add ``other``'s counts into this accumulator in place; returns ``self``.

        Only for an accumulator that owns its count arrays (one :meth:`merge` made, or one built by
        :meth:`update` calls): a window's bucket that later batches are added to, where a merge would copy
        every array each time.
        """
        self._check_mergeable(other)
        for name in self._counts:
            setattr(self, name, _add_into(getattr(self, name), getattr(other, name)))
        return self

    def _of_counts(self, **counts):
        """An accumulator with this one's settings holding ``counts`` (every name of ``_counts``), for a caller
        that counted already-validated inputs itself (the stream monitor bins many accumulators' columns at once).
        """
        made = _shallow_copy(self)
        for name in self._counts:
            setattr(made, name, counts[name])
        return made

    def fresh(self):
        """An empty accumulator with the same settings, shared: cheap to make and to merge with this one."""
        return _shallow_copy(self).reset()

    def _check_mergeable(self, other) -> None:
        """Raise unless ``other`` has this accumulator's type and settings (one's copies share them: no compare)."""
        family = self.__dict__.get("_family")
        if type(other) is type(self) and family is not None and other.__dict__.get("_family") is family:
            return
        if type(other) is not type(self) or not _same(self._settings(), other._settings()):
            raise RepairInputError(f"cannot merge {type(other).__name__} with different settings into "
                                   f"{type(self).__name__}")

    def reset(self):
        """Forget every record seen; the settings stay. Returns ``self``."""
        for name in self._counts:
            setattr(self, name, _zeros_like(getattr(self, name)))
        return self


def _shallow_copy(accumulator):
    """A copy sharing the settings objects (never mutated) and marked as one family with ``accumulator``, so that
    merging copies skips comparing their settings; faster than ``copy.copy``."""
    accumulator.__dict__.setdefault("_family", object())
    made = object.__new__(type(accumulator))
    made.__dict__.update(accumulator.__dict__)
    return made


def _add(a, b):
    if isinstance(a, list):
        return [x + y for x, y in zip(a, b)]
    return a + b


def _add_into(a, b):
    if isinstance(a, list):
        for x, y in zip(a, b):
            x += y
        return a
    if isinstance(a, np.ndarray):
        a += b
        return a
    return a + b


def _zeros_like(a):
    if isinstance(a, list):
        return [np.zeros_like(x) for x in a]
    if isinstance(a, np.ndarray):
        return np.zeros_like(a)
    return type(a)(0)


def _same(a, b) -> bool:
    """Deep equality of settings tuples holding arrays and lists of arrays."""
    if a is b:  # accumulators from one factory share their settings objects
        return True
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and a.dtype.kind == b.dtype.kind and bool(np.all(a == b))
    return a == b


class PositiveRateAccumulator(Mergeable):
    """Positives and totals per (stratum, group) for demographic parity and conditional DP.

    ``value()`` gives the same :class:`DemographicParityResult` as
    :func:`fairstream.repair.measure.metrics.demographic_parity` on all records seen.

    >>> acc = PositiveRateAccumulator(groups=[0, 1])
    >>> acc.update(y=[1, 1, 0, 1], s=[0, 0, 1, 1]).value().ratio
    0.5
    """

    _counts = ("positives_", "totals_")

    def __init__(self, groups, strata=None):
        self.groups = configured_labels(groups, "groups")
        self.strata = configured_labels(strata, "strata")
        self._has_strata = strata is not None
        shape = (len(self.strata), len(self.groups))
        self.positives_ = np.zeros(shape, dtype=np.int64)
        self.totals_ = np.zeros(shape, dtype=np.int64)

    def _settings(self) -> tuple:
        return (self.groups, self.strata, self._has_strata)

    def update(self, y, s, u=None) -> "PositiveRateAccumulator":
        """Count a batch of binary decisions ``y`` with groups ``s`` and strata ``u``."""
        s_arr = np.asarray(s)
        n_rows = s_arr.shape[0] if s_arr.ndim else 1
        y = as_binary(y, n_rows)
        s_codes = label_codes(s_arr, self.groups, n_rows, "s")
        u_codes = label_codes(u, self.strata, n_rows, "u", configured=self._has_strata)
        positives, totals = rate_counts(y, s_codes, u_codes, len(self.groups), len(self.strata))
        self.positives_ += positives
        self.totals_ += totals
        return self

    def value(self) -> DemographicParityResult:
        """DP difference and ratio, overall and per stratum, from the counts so far."""
        return dp_from_counts(self.positives_, self.totals_, self.groups, self.strata)


class HistogramDependenceAccumulator(Mergeable):
    """Histogram counts per (stratum, group, feature, bin) on fixed edges, for dependence E.

    The edges are fixed at construction (e.g. from the research data's range with
    :meth:`from_reference`); values outside them are counted in the end bins, as the batch
    estimator does with the same edges, and also in ``out_of_range_`` per (stratum, feature), a
    drift signal in its own right (Langbridge, Quinn and Shorten (2024), section 7). ``value()`` equals
    ``dependence_e(X, s, u, alpha=alpha, edges=edges)`` on all records seen.

    >>> acc = HistogramDependenceAccumulator(edges=[[0.0, 1.0, 2.0]], groups=[0, 1])
    >>> acc.update([[0.5], [1.5], [0.5], [1.5]], s=[0, 0, 1, 1]).value().total
    0.0
    """

    _counts = ("counts_", "out_of_range_")

    def __init__(self, edges, groups, strata=None, alpha: float = 0.5):
        self.edges = _per_feature_edges(edges)
        self.groups = configured_labels(groups, "groups")
        self.strata = configured_labels(strata, "strata")
        self.alpha = float(alpha)
        self._has_strata = strata is not None
        check_alpha(self.alpha)
        self.counts_ = [np.zeros((len(self.strata), len(self.groups), len(e) - 1), dtype=np.int64)
                        for e in self.edges]
        self.out_of_range_ = np.zeros((len(self.strata), len(self.edges)), dtype=np.int64)

    @classmethod
    def from_reference(cls, X, groups, strata=None, bins: int = 30, alpha: float = 0.5):
        """An accumulator with ``bins`` equal-width bins over each column's range in ``X``."""
        return cls(equal_width_edges(X, bins), groups, strata, alpha)

    @property
    def n_features(self) -> int:
        """How many features are measured."""
        return len(self.edges)

    def _settings(self) -> tuple:
        return (self.edges, self.groups, self.strata, self._has_strata, self.alpha)

    def update(self, X, s, u=None) -> "HistogramDependenceAccumulator":
        """Count a batch of records ``X`` (n, d) with groups ``s`` and strata ``u``."""
        X = features(X, n_features=self.n_features)
        s_codes = label_codes(s, self.groups, X.shape[0], "s")
        u_codes = label_codes(u, self.strata, X.shape[0], "u", configured=self._has_strata)
        n_groups, n_strata = len(self.groups), len(self.strata)
        for k, e in enumerate(self.edges):
            x = X[:, k]
            self.counts_[k] += histogram_counts(bin_index(x, e), s_codes, u_codes, n_groups, n_strata, len(e) - 1)
            outside = (x < e[0]) | (x > e[-1])
            self.out_of_range_[:, k] += np.bincount(u_codes[outside], minlength=n_strata)
        return self

    def value(self) -> DependenceResult:
        """Dependence E per feature, total and per (stratum, feature), from the counts so far."""
        return dependence_from_counts(self.counts_, self.alpha, self.groups, self.strata)

    def out_of_range_fraction(self) -> np.ndarray:
        """Share of records per (stratum, feature) that fell outside the edges (0 if none seen)."""
        seen = self.counts_[0].sum(axis=(1, 2))[:, None]
        return np.divide(self.out_of_range_, seen, out=np.zeros(self.out_of_range_.shape), where=seen > 0)


def _per_feature_edges(edges) -> list[np.ndarray]:
    """Edges given one array per feature; a flat list of numbers is refused as ambiguous."""
    try:
        flat = np.asarray(edges, dtype=np.float64).ndim == 1
    except ValueError:  # ragged: a different number of bins per feature
        flat = False
    if flat:
        raise RepairInputError("edges must hold one array of bin edges per feature, e.g. [[0, 1, 2]] for one feature")
    return as_edges(edges, len(edges))


class DamageAccumulator(Mergeable):
    """Sums of |x' - x| per feature and a record count, for the mean damage of a repair.

    >>> acc = DamageAccumulator(n_features=2)
    >>> acc.update([[0.0, 1.0]], [[1.0, 1.0]]).value().per_feature.tolist()
    [1.0, 0.0]
    """

    _counts = ("abs_sums_", "n_rows_")

    def __init__(self, n_features: int):
        if not isinstance(n_features, (int, np.integer)) or n_features < 1:
            raise RepairInputError(f"n_features must be a positive integer, got {n_features!r}")
        self.n_features = int(n_features)
        self.abs_sums_ = np.zeros(self.n_features)
        self.n_rows_ = 0

    def _settings(self) -> tuple:
        return (self.n_features,)

    def update(self, X, X_repaired) -> "DamageAccumulator":
        """Add a batch of original rows and their repaired versions."""
        displacement = repair_displacement(X, X_repaired, self.n_features)
        self.abs_sums_ = self.abs_sums_ + displacement.sum(axis=0)
        self.n_rows_ = self.n_rows_ + int(displacement.shape[0])
        return self

    def value(self) -> DamageResult:
        """Mean |x' - x| per feature and overall, from the sums so far."""
        return damage_from_sums(self.abs_sums_, self.n_rows_)


# ---------------------------------------------------------------------------------------------
# W1 between groups, matched-pair gaps (MDP), flagged-record rates
# ---------------------------------------------------------------------------------------------


def stratum_weights(stratum_totals: np.ndarray) -> np.ndarray:
    """Pr[u] from the records per stratum (all 0 before any record)."""
    return safe_ratio(stratum_totals, stratum_totals.sum(), empty=0.0)


class WassersteinAccumulator(Mergeable):
    """Counts per (stratum, group, feature, fine bin) for W1 between groups from binned CDFs.

    Each group's values are binned on fixed edges (e.g. 200 bins over the research range; values
    outside the edges are counted in the end bins). For a pair of groups, ``value()`` computes
    ``W1 = sum_b |F_a(b) - F_b(b)| * (c_{b+1} - c_b)`` from the binned CDFs F, with the mass of
    each bin at its centre c_b (for equal-width bins, the bin width). For values inside the edges
    it is within one bin width of :func:`fairstream.repair.measure.metrics.wasserstein_between_groups`,
    and it returns the same :class:`~fairstream.repair.measure.metrics.WassersteinResult`: per pair,
    the max over pairs per (stratum, feature), and the Pr[u]-weighted value per feature.

    >>> acc = WassersteinAccumulator(edges=[[0.0, 1.0, 2.0, 3.0, 4.0]], groups=[0, 1])
    >>> acc.update([[0.5], [1.5], [2.5], [3.5]], s=[0, 0, 1, 1]).value().per_feature.tolist()
    [2.0]
    """

    _counts = ("counts_",)

    def __init__(self, edges, groups, strata=None):
        self.edges = _per_feature_edges(edges)
        self.groups = configured_labels(groups, "groups")
        self.strata = configured_labels(strata, "strata")
        self._has_strata = strata is not None
        self.counts_ = [np.zeros((len(self.strata), len(self.groups), len(e) - 1), dtype=np.int64)
                        for e in self.edges]

    @classmethod
    def from_reference(cls, X, groups, strata=None, bins: int = 200):
        """An accumulator with ``bins`` equal-width bins over each column's range in ``X``."""
        return cls(equal_width_edges(X, bins), groups, strata)

    @property
    def n_features(self) -> int:
        """How many features are measured."""
        return len(self.edges)

    def _settings(self) -> tuple:
        return (self.edges, self.groups, self.strata, self._has_strata)

    def update(self, X, s, u=None) -> "WassersteinAccumulator":
        """Count a batch of records ``X`` (n, d) with groups ``s`` and strata ``u``."""
        X = features(X, n_features=self.n_features)
        s_codes = label_codes(s, self.groups, X.shape[0], "s")
        u_codes = label_codes(u, self.strata, X.shape[0], "u", configured=self._has_strata)
        n_groups, n_strata = len(self.groups), len(self.strata)
        for k, e in enumerate(self.edges):
            self.counts_[k] += histogram_counts(bin_index(X[:, k], e), s_codes, u_codes, n_groups, n_strata,
                                                len(e) - 1)
        return self

    def value(self) -> WassersteinResult:
        """W1 per (stratum, pair, feature), max over pairs per stratum, Pr[u]-weighted per feature."""
        pairs = list(combinations(range(len(self.groups)), 2))
        a, b = (np.array(pairs, dtype=np.intp).reshape(-1, 2).T)
        per_pair = np.stack([_binned_w1(c, e, a, b) for c, e in zip(self.counts_, self.edges)], axis=-1)
        per_stratum = np.where(np.isnan(per_pair), -np.inf, per_pair).max(axis=1, initial=-np.inf)
        per_stratum = np.where(np.isfinite(per_stratum), per_stratum, 0.0)
        weights = stratum_weights(self.counts_[0].sum(axis=(1, 2)))
        return WassersteinResult(per_feature=weights @ per_stratum, per_stratum=per_stratum, per_pair=per_pair,
                                 pairs=[(self.groups[i].item(), self.groups[j].item()) for i, j in pairs],
                                 weights=weights, groups=self.groups, strata=self.strata)


def _binned_w1(counts: np.ndarray, edges: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """W1 between groups ``a[p]`` and ``b[p]`` per stratum, shape (n_strata, n_pairs); NaN if one is empty."""
    totals = counts.sum(axis=-1, keepdims=True)
    cdf = safe_ratio(np.cumsum(counts, axis=-1), totals, empty=np.nan)
    centre_gaps = np.diff((edges[:-1] + edges[1:]) / 2)
    return np.abs(cdf[:, a, :-1] - cdf[:, b, :-1]) @ centre_gaps


@dataclass(frozen=True, eq=False)
class RateResult:
    """Share of flagged records per stratum (NaN where empty) and overall (0 before any record)."""

    per_stratum: np.ndarray
    overall: float
    weights: np.ndarray
    flagged: np.ndarray
    totals: np.ndarray
    strata: np.ndarray


class RateAccumulator(Mergeable):
    """Flagged records and totals per stratum, e.g. the rate of records outside a plan's grid.

    >>> flags = np.array([[True, False], [False, False], [False, False], [True, True]]).any(axis=1)
    >>> result = RateAccumulator(strata=[0, 1]).update(flags, u=[0, 0, 1, 1]).value()
    >>> result.per_stratum.tolist(), result.overall
    ([0.5, 0.5], 0.5)
    """

    _counts = ("flagged_", "totals_")

    def __init__(self, strata=None):
        self.strata = configured_labels(strata, "strata")
        self._has_strata = strata is not None
        self.flagged_ = np.zeros(len(self.strata), dtype=np.int64)
        self.totals_ = np.zeros(len(self.strata), dtype=np.int64)

    def _settings(self) -> tuple:
        return (self.strata, self._has_strata)

    def update(self, flags, u=None) -> "RateAccumulator":
        """Count a batch of 0/1 (or boolean) ``flags`` with strata ``u``."""
        flag_arr = np.asarray(flags)
        n_rows = flag_arr.shape[0] if flag_arr.ndim else 1
        flag_arr = as_binary(flag_arr, n_rows, "flags")
        u_codes = label_codes(u, self.strata, n_rows, "u", configured=self._has_strata)
        flagged, totals = rate_counts(flag_arr, np.zeros(n_rows, dtype=np.intp), u_codes, 1, len(self.strata))
        self.flagged_ += flagged[:, 0]
        self.totals_ += totals[:, 0]
        return self

    def value(self) -> RateResult:
        """Flagged share per stratum and overall, from the counts so far."""
        return RateResult(per_stratum=safe_ratio(self.flagged_, self.totals_, empty=np.nan),
                          overall=float(safe_ratio(self.flagged_.sum(), self.totals_.sum(), empty=0.0)),
                          weights=stratum_weights(self.totals_), flagged=self.flagged_.copy(),
                          totals=self.totals_.copy(), strata=self.strata)


def check_decisions(decisions) -> np.ndarray:
    """The scorer's decisions as an array of 0 and 1; any other value raises naming it."""
    decisions = np.asarray(decisions)
    if decisions.size and (decisions.dtype.kind not in "iub" or decisions.min() < 0 or decisions.max() > 1):
        bad = decisions[(decisions != 0) & (decisions != 1)][0]
        raise RepairInputError(f"decisions must be 0 or 1, got {bad!r}")
    return decisions


class DecisionRateAccumulator(PositiveRateAccumulator):
    """Positive rates per (stratum, group) of decisions known for every record or for a weighted sample of them.

    The chain's decisions are known for every record (exact counts). The classifier alone's are known on a
    uniform sample of each batch only: the totals stay exact (every record's group and stratum is known), the
    positives are estimated from the sample, each sampled decision counting the records it stands for
    (``n / m``). The estimated positives are unbiased, so each (stratum, group) rate of the window is an
    unbiased estimate of the rate of all its records (a small cell's estimate may exceed 1). Merges and reads
    like :class:`PositiveRateAccumulator`.
    """

    def __init__(self, groups, strata=None):
        super().__init__(groups, strata)
        self.positives_ = self.positives_.astype(np.float64)

    def count(self, decisions: np.ndarray, s: EncodedLabels, u: EncodedLabels, among: np.ndarray | None = None,
              rows: np.ndarray | None = None, weight: float = 1.0) -> "DecisionRateAccumulator":
        """Count every record (of ``among``, a mask, if given) with the batch's encoded groups ``s`` and strata
        ``u``, and the positive ``decisions``: of every record, or of the sampled batch rows ``rows``, each
        weighing ``weight``."""
        decisions = check_decisions(decisions)
        cell = np.asarray(u) * len(self.groups) + np.asarray(s)
        shape, size = self.totals_.shape, self.totals_.size
        counted = np.ones(len(cell), dtype=bool) if among is None else among
        self.totals_ = self.totals_ + np.bincount(cell[counted], minlength=size).reshape(shape)
        rows = slice(None) if rows is None else rows
        positive = weight * decisions * counted[rows]
        self.positives_ = self.positives_ + np.bincount(cell[rows], positive, size).reshape(shape)
        return self
