"""Face-verification metrics: pair scores, error curves, a global threshold, per-group FAR/FRR, BFAR/BFRR.

Two embeddings are compared by cosine similarity; a pair is accepted as "same identity" when its
score is *strictly* above a global threshold ``t``. Over impostor pairs (different identities)
``FAR(t) = #{s > t} / |I|``; over genuine pairs (same identity) ``FRR(t) = #{s <= t} / |G|``
(FRR is also called FNMR). Per group ``a`` only *same-group* pairs count. The threshold is set once
for everyone at a target FAR ``alpha`` on the pooled impostor pairs, ``t = inf{t : FAR(t) <= alpha}``,
and the bias of the groups' error rates at that ``t`` is summarised as in Conti and Clémençon,
"Mitigating Bias in Facial Recognition Systems: Centroid Fairness Loss Optimization" (2024), and
NIST FRVT part 8:

    BFAR(t) = max_a FAR_a(t) / geometric-mean_a FAR_a(t),   BFRR likewise with FRR_a.

1 means equal groups, larger is more bias. A group with no error at ``t`` makes the geometric mean
0: the ratio is then reported as ``inf`` (``nan`` if no group has an error), never silently
floored, and every result carries the error and pair counts behind each rate.

Counts are the state, as in :mod:`fairstream.repair.measure.accumulators`: the batch function
:func:`verification_rates`, the mergeable :class:`VerificationAccumulator` (counts at a fixed
threshold) and :class:`CalibratedVerificationAccumulator` (windowed monitoring on sampled labelled
pairs: score histograms, read at the threshold of a target FAR on the pairs themselves, so two
embedding modules whose scores differ by a monotone rescaling are compared at the same operating
point) call the same :func:`rates_from_counts`.

>>> import numpy as np
>>> scores = np.array([0.9, 0.2, 0.8, 0.1, 0.7, 0.6])
>>> genuine = np.array([True, False, True, False, False, False])
>>> r = verification_rates(scores, genuine, s=["a", "a", "b", "b", "b", "b"], threshold=0.5)
>>> r.far.tolist(), r.frr.tolist(), r.bfar
([0.0, 0.6666666666666666], [0.0, 0.0], inf)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fairstream.repair.validation import RepairInputError, as_labels, encode, normalise_labels

from .accumulators import Mergeable, configured_labels, label_codes
from .metrics import as_binary, safe_ratio

__all__ = [
    "CalibratedVerificationAccumulator",
    "PairScores",
    "ScoreCurve",
    "VerificationAccumulator",
    "VerificationRates",
    "bias_ratio",
    "cosine_scores",
    "curve_distance",
    "l2_normalise",
    "paired_cosine",
    "rates_from_counts",
    "same_group_pair_scores",
    "threshold_at_far",
    "verification_rates",
]

# Rows of the (rows x group size) score block computed at once: bounds memory at ~ 8 * 1024 * n bytes.
_CHUNK_ROWS = 1024
# Bins of the per-group score histograms kept for plotting curves (width 1e-4 on [-1, 1]).
_CURVE_BINS = 20_000


# --------------------------------------------------------------------------------------------
# Scores
# --------------------------------------------------------------------------------------------


def l2_normalise(vectors) -> np.ndarray:
    """Rows divided by their L2 norm, in float64; zero rows stay zero.

    >>> l2_normalise([[3.0, 4.0], [0.0, 0.0]]).tolist()
    [[0.6, 0.8], [0.0, 0.0]]
    """
    v = np.atleast_2d(np.asarray(vectors, dtype=np.float64))
    if v.ndim != 2:
        raise RepairInputError(f"vectors must be 1-D or 2-D, got shape {v.shape}")
    # Divide by the largest entry first: the norm of tiny (subnormal) vectors would underflow to 0.
    scale = np.max(np.abs(v), axis=1, keepdims=True) if v.shape[1] else np.ones((v.shape[0], 1))
    v = v / np.where(scale > 0, scale, 1.0)
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    return v / np.where(norms > 0, norms, 1.0)


def cosine_scores(a, b) -> np.ndarray:
    """Cosine similarity of every row of ``a`` with every row of ``b``, shape (len(a), len(b)).

    >>> cosine_scores([[1.0, 0.0]], [[2.0, 0.0], [0.0, 5.0]]).tolist()
    [[1.0, 0.0]]
    """
    return l2_normalise(a) @ l2_normalise(b).T


def paired_cosine(a, b) -> np.ndarray:
    """Cosine similarity of row i of ``a`` with row i of ``b`` (the scores of labelled pairs).

    >>> paired_cosine([[1.0, 0.0], [1.0, 1.0]], [[3.0, 0.0], [-1.0, 1.0]]).tolist()
    [1.0, 0.0]
    """
    za, zb = l2_normalise(a), l2_normalise(b)
    if za.shape != zb.shape:
        raise RepairInputError(f"paired vectors need equal shapes, got {za.shape} and {zb.shape}")
    return np.einsum("ij,ij->i", za, zb)


# --------------------------------------------------------------------------------------------
# Empirical error curves
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ScoreCurve:
    """An empirical score distribution: sorted distinct ``values`` and ``cumulative`` counts.

    ``cumulative[j] = #{scores <= values[j]}``, so ``frr(t) = #{s <= t} / n`` and
    ``far(t) = #{s > t} / n`` are exact step functions, and the generalised inverses
    ``frr_inverse(alpha) = inf{t : frr(t) >= alpha}`` and ``far_inverse(alpha) = inf{t : far(t) <= alpha}``
    return one of the ``values``. Built from raw scores (exact, float64) or from a histogram, in
    which case every score stands at its bin's left edge (resolution one bin width).

    >>> c = ScoreCurve.from_scores([0.1, 0.4, 0.4, 0.9])
    >>> c.frr(0.4), c.far(0.4), c.frr_inverse(0.5), c.far_inverse(0.25)
    (0.75, 0.25, 0.4, 0.4)
    """

    values: np.ndarray
    cumulative: np.ndarray

    def __post_init__(self) -> None:
        v, c = np.asarray(self.values, dtype=np.float64), np.asarray(self.cumulative, dtype=np.int64)
        if v.ndim != 1 or v.shape != c.shape or v.size == 0:
            raise RepairInputError(f"a curve needs matching non-empty 1-D values and counts, got {v.shape} and {c.shape}")
        if np.any(np.diff(v) <= 0) or np.any(np.diff(c) <= 0) or c[0] <= 0:
            raise RepairInputError("curve values must increase strictly and cumulative counts must be positive and "
                                   "increase strictly")
        object.__setattr__(self, "values", v)
        object.__setattr__(self, "cumulative", c)

    @classmethod
    def from_scores(cls, scores) -> ScoreCurve:
        """The exact curve of a 1-D array of finite scores."""
        s = np.asarray(scores, dtype=np.float64).ravel()
        if s.size == 0 or not np.all(np.isfinite(s)):
            raise RepairInputError(f"a curve needs at least one score, all finite (got {s.size} scores)")
        values, counts = np.unique(s, return_counts=True)
        return cls(values, np.cumsum(counts))

    @classmethod
    def from_histogram(cls, edges, counts) -> ScoreCurve:
        """The curve of binned scores; each non-empty bin's mass sits at its left edge."""
        edges, counts = np.asarray(edges, dtype=np.float64), np.asarray(counts, dtype=np.int64)
        if edges.ndim != 1 or counts.shape != (edges.size - 1,) or np.any(counts < 0) or counts.sum() == 0:
            raise RepairInputError("a histogram needs len(edges) - 1 non-negative counts, not all zero")
        full = counts > 0
        return cls(edges[:-1][full], np.cumsum(counts[full]))

    @property
    def n(self) -> int:
        """Number of scores behind the curve."""
        return int(self.cumulative[-1])

    def count_le(self, t):
        """``#{s <= t}`` for each ``t`` (int64 array, or an int for a scalar ``t``)."""
        j = np.searchsorted(self.values, np.asarray(t, dtype=np.float64), side="right")
        return _like(t, np.where(j > 0, self.cumulative[np.maximum(j - 1, 0)], 0))

    def frr(self, t):
        """``#{s <= t} / n``: the false-reject rate if these are genuine scores."""
        return _like(t, np.asarray(self.count_le(t)) / self.n)

    def far(self, t):
        """``#{s > t} / n``: the false-accept rate if these are impostor scores."""
        return _like(t, (self.n - np.asarray(self.count_le(t))) / self.n)

    def frr_inverse(self, alpha):
        """``inf{t : frr(t) >= alpha}`` (alpha in (0, 1]); the smallest value for alpha <= 1/n."""
        need = np.ceil(np.asarray(alpha, dtype=np.float64) * self.n)
        return _like(alpha, self._value_reaching(need))

    def far_inverse(self, alpha):
        """``inf{t : far(t) <= alpha}`` (alpha in [0, 1)); the largest value for alpha < 1/n."""
        need = self.n - np.floor(np.asarray(alpha, dtype=np.float64) * self.n)
        return _like(alpha, self._value_reaching(need))

    def _value_reaching(self, count) -> np.ndarray:
        """The smallest value whose cumulative count is at least ``count``."""
        return self.values[np.clip(np.searchsorted(self.cumulative, count, side="left"), 0, self.values.size - 1)]


def _like(arg, result: np.ndarray):
    """A Python scalar for a scalar argument, else the array."""
    return result.item() if np.ndim(arg) == 0 else result


def curve_distance(a: ScoreCurve, b: ScoreCurve) -> float:
    """``sup_t |frr_a(t) - frr_b(t)|``, which is also the sup distance of the two FAR curves.

    Both are right-continuous steps that jump only at their values, so the sup is attained there.

    >>> curve_distance(ScoreCurve.from_scores([0.0, 1.0]), ScoreCurve.from_scores([0.5, 1.0]))
    0.5
    """
    t = np.union1d(a.values, b.values)
    return float(np.max(np.abs(a.frr(t) - b.frr(t))))


# --------------------------------------------------------------------------------------------
# Threshold, rates and bias ratios
# --------------------------------------------------------------------------------------------


def _check_far(far) -> float:
    if isinstance(far, bool) or not isinstance(far, (int, float, np.integer, np.floating)) or not 0 <= far < 1:
        raise RepairInputError(f"a target FAR must be a number in [0, 1), got {far!r}")
    return float(far)


def threshold_at_far(impostor_scores, far: float) -> float:
    """The global threshold ``inf{t : FAR(t) <= far}`` over impostor scores (exact).

    With ``k = floor(far * n)`` it is the (k+1)-th largest score: at most ``k`` scores lie above it.

    Parameters
    ----------
    impostor_scores : array-like of shape (n,)
        Scores of pairs of different identities.
    far : float
        The target false accept rate, in [0, 1].

    Returns
    -------
    float
        The threshold: pairs scoring above it are accepted.

    Examples
    --------
    >>> threshold_at_far([0.1, 0.2, 0.3, 0.4, 0.5], far=0.2)
    0.4
    """
    s = np.asarray(impostor_scores, dtype=np.float64).ravel()
    if s.size == 0:
        raise RepairInputError("threshold_at_far needs at least one impostor score")
    k = int(np.floor(_check_far(far) * s.size))
    return float(np.partition(s, s.size - 1 - k)[s.size - 1 - k])


def bias_ratio(rates) -> float:
    """``max(rates) / geometric-mean(rates)``: 1 for equal groups; inf if some rate is 0; nan if all are.

    Parameters
    ----------
    rates : array-like of shape (n_groups,)
        A rate per group (e.g. FAR), each in [0, 1].

    Returns
    -------
    float
        The ratio, at least 1 (BFAR or BFRR when ``rates`` are FARs or FRRs).

    Examples
    --------
    >>> round(bias_ratio([0.01, 0.04]), 12), bias_ratio([0.0, 0.1])
    (2.0, inf)
    """
    r = np.asarray(rates, dtype=np.float64)
    r = r[np.isfinite(r)]
    if r.size == 0 or r.max() == 0:
        return float("nan")
    if r.min() == 0:
        return float("inf")
    return float(r.max() / np.exp(np.mean(np.log(r))))


@dataclass(frozen=True, eq=False)
class VerificationRates:
    """Per-group and overall FAR/FRR at one threshold, with the counts behind them and BFAR/BFRR.

    ``far``/``frr`` are per group (NaN where a group had no pair of that kind); ``fnmr`` is the
    pooled FRR (the paper's "ROC" figure at the threshold's FAR level) and ``far_overall`` the
    pooled FAR. ``bfar``/``bfrr`` are over the groups with pairs of that kind.
    """

    threshold: float
    groups: np.ndarray
    far: np.ndarray
    frr: np.ndarray
    false_accepts: np.ndarray
    impostor_pairs: np.ndarray
    false_rejects: np.ndarray
    genuine_pairs: np.ndarray
    far_overall: float
    fnmr: float
    bfar: float
    bfrr: float

    def as_dict(self) -> dict:
        """JSON-ready summary (inf and NaN become None), e.g. for an artifact's metrics."""
        clean = (lambda x: float(x) if np.isfinite(x) else None)
        labels = [g.item() if hasattr(g, "item") else g for g in self.groups]
        return {
            "threshold": clean(self.threshold), "fnmr": clean(self.fnmr), "far": clean(self.far_overall),
            "bfar": clean(self.bfar), "bfrr": clean(self.bfrr),
            "per_group": {str(g): {"far": clean(fa), "frr": clean(fr), "false_accepts": int(na),
                                   "impostor_pairs": int(ni), "false_rejects": int(nr), "genuine_pairs": int(ng)}
                          for g, fa, fr, na, ni, nr, ng in zip(labels, self.far, self.frr, self.false_accepts,
                                                                self.impostor_pairs, self.false_rejects,
                                                                self.genuine_pairs)},
        }


def rates_from_counts(threshold: float, groups, false_accepts, impostor_pairs, false_rejects,
                      genuine_pairs) -> VerificationRates:
    """Rates and bias ratios from per-group counts (shared by the batch function and the accumulator)."""
    fa, ni, fr, ng = (np.asarray(x, dtype=np.int64) for x in (false_accepts, impostor_pairs, false_rejects,
                                                               genuine_pairs))
    far = safe_ratio(fa, ni, empty=np.nan)
    frr = safe_ratio(fr, ng, empty=np.nan)
    return VerificationRates(
        threshold=float(threshold), groups=np.asarray(groups), far=far, frr=frr,
        false_accepts=fa, impostor_pairs=ni, false_rejects=fr, genuine_pairs=ng,
        far_overall=float(safe_ratio(fa.sum(), ni.sum(), empty=np.nan)),
        fnmr=float(safe_ratio(fr.sum(), ng.sum(), empty=np.nan)),
        bfar=bias_ratio(far), bfrr=bias_ratio(frr))


def _pair_counts(scores: np.ndarray, genuine: np.ndarray, codes: np.ndarray, n_groups: int, threshold: float):
    accept = scores > threshold
    return (np.bincount(codes[~genuine & accept], minlength=n_groups),
            np.bincount(codes[~genuine], minlength=n_groups),
            np.bincount(codes[genuine & ~accept], minlength=n_groups),
            np.bincount(codes[genuine], minlength=n_groups))


def _pair_scores(scores, n_rows: int | None = None) -> np.ndarray:
    s = np.asarray(scores, dtype=np.float64).reshape(-1) if np.ndim(scores) == 0 else np.asarray(scores, np.float64)
    if s.ndim != 1 or (n_rows is not None and s.size != n_rows):
        raise RepairInputError(f"scores must be a 1-D array of pair scores, got shape {s.shape}")
    if not np.all(np.isfinite(s)):
        raise RepairInputError(f"scores holds a non-finite value at pair {int(np.argmin(np.isfinite(s)))}")
    return s


def verification_rates(scores, genuine, s, threshold: float, groups=None) -> VerificationRates:
    """Per-group FAR/FRR and BFAR/BFRR at ``threshold`` for labelled pairs.

    ``scores`` are pair scores, ``genuine`` says which pairs are of one identity and ``s`` the
    group of each pair (both images in it; cross-group pairs should not be passed). ``groups``
    fixes the reported groups and their order (default: those seen).

    Parameters
    ----------
    scores : array-like of shape (n_pairs,)
        Similarity score of each pair (e.g. cosine).
    genuine : array-like of bool, shape (n_pairs,)
        Whether each pair is of one identity.
    s : array-like of shape (n_pairs,)
        Group of each pair.
    threshold : float
        Pairs scoring above it are accepted.
    groups : sequence or None, default=None
        The groups to report, in order; None takes those seen.

    Returns
    -------
    VerificationRates
        FAR and FRR per group, and BFAR and BFRR.
    """
    scores = _pair_scores(scores)
    genuine = as_binary(genuine, scores.size, "genuine").astype(bool)
    labels = normalise_labels(as_labels(s, scores.size, "s"))
    classes = np.unique(labels) if groups is None else configured_labels(groups, "groups")
    codes = encode(labels, classes, "s")
    return rates_from_counts(threshold, classes, *_pair_counts(scores, genuine, codes, len(classes), threshold))


class VerificationAccumulator(Mergeable):
    """Mergeable per-group counts of false accepts/rejects at a fixed threshold, for windowed monitoring.

    Feed it labelled pairs sampled from the stream (their cosine scores under the active module,
    e.g. :func:`paired_cosine`, whether they are genuine, and the pairs' group); wrap it in a
    :class:`~fairstream.repair.measure.windows.CountWindow` or ``TimeWindow`` for windows. ``value()``
    equals :func:`verification_rates` on all pairs seen. The threshold is part of the settings:
    accumulators at different thresholds do not merge.

    >>> acc = VerificationAccumulator(groups=["a", "b"], threshold=0.5)
    >>> _ = acc.update([0.9, 0.6, 0.4], genuine=[1, 0, 1], s=["a", "a", "b"])
    >>> acc.value().far.tolist(), acc.value().frr.tolist()
    ([1.0, nan], [0.0, 1.0])
    """

    _counts = ("false_accepts_", "impostor_pairs_", "false_rejects_", "genuine_pairs_")

    def __init__(self, groups, threshold: float):
        self.groups = configured_labels(groups, "groups")
        if isinstance(threshold, bool) or not np.isfinite(threshold):
            raise RepairInputError(f"threshold must be a finite number, got {threshold!r}")
        self.threshold = float(threshold)
        for name in self._counts:
            setattr(self, name, np.zeros(len(self.groups), dtype=np.int64))

    def _settings(self) -> tuple:
        return (self.groups, self.threshold)

    def update(self, scores, genuine, s) -> VerificationAccumulator:
        """Count a batch of pair ``scores`` with their ``genuine`` flags and groups ``s``."""
        scores = _pair_scores(scores)
        genuine = as_binary(genuine, scores.size, "genuine").astype(bool)
        codes = label_codes(s, self.groups, scores.size, "s")
        for name, counts in zip(self._counts, _pair_counts(scores, genuine, codes, len(self.groups), self.threshold)):
            setattr(self, name, getattr(self, name) + counts)
        return self

    def value(self) -> VerificationRates:
        """Rates, BFAR and BFRR at the threshold over the pairs counted so far."""
        return rates_from_counts(self.threshold, self.groups, self.false_accepts_, self.impostor_pairs_,
                                 self.false_rejects_, self.genuine_pairs_)


class CalibratedVerificationAccumulator(Mergeable):
    """Mergeable per-group histograms of genuine and impostor pair scores, read at the threshold of a target FAR.

    The threshold is set on the pairs counted, as for an evaluation set (:meth:`PairScores.rates_at_far`):
    the lowest bin edge ``t`` at which at most ``floor(far * n)`` of the ``n`` pooled impostor pairs
    score at or above it. Per-group FAR and FRR, FNMR and BFAR/BFRR are then exact counts for the
    rule "accepted when the score's bin starts at or above ``t``" (bins of width 1e-4 on the cosine
    range [-1, 1], scores outside it in the end bins). The threshold follows the scores: under a
    monotone rescaling of every score it moves with them and the rates stay those of the same pairs,
    up to pairs that share a bin with it. With fewer than ``1 / far`` impostor pairs no false accept
    is allowed and the FARs say nothing (``calibrated`` is False).

    >>> acc = CalibratedVerificationAccumulator(groups=["a", "b"], far=0.25)
    >>> _ = acc.update([0.9, 0.7, 0.2, 0.6, 0.1, 0.3], genuine=[1, 1, 0, 0, 0, 0], s=["a", "b", "a", "b", "b", "a"])
    >>> r = acc.value()  # 4 impostors: one may pass, so t is just above the second highest (0.3)
    >>> round(r.threshold, 4), r.far.tolist(), r.frr.tolist(), r.fnmr
    (0.3001, [0.0, 0.5], [0.0, 0.0], 0.0)
    """

    _counts = ("counts_",)

    def __init__(self, groups, far: float, bins: int = _CURVE_BINS):
        self.groups = configured_labels(groups, "groups")
        self.far = _check_far(far)
        if self.far == 0:
            raise RepairInputError("a calibrated accumulator needs a target FAR > 0")
        self.edges = np.linspace(-1.0, 1.0, int(bins) + 1)
        self.counts_ = np.zeros((2, len(self.groups), int(bins)), dtype=np.int64)  # [impostor, genuine], group, bin

    def _settings(self) -> tuple:
        return (self.groups, self.far, self.edges)

    @property
    def impostor_hist_(self) -> np.ndarray:
        """Impostor pairs per (group, score bin)."""
        return self.counts_[0]

    @property
    def genuine_hist_(self) -> np.ndarray:
        """Genuine pairs per (group, score bin)."""
        return self.counts_[1]

    def update(self, scores, genuine, s) -> CalibratedVerificationAccumulator:
        """Count a batch of pair ``scores`` with their ``genuine`` flags and groups ``s`` (one bincount)."""
        scores = _pair_scores(scores)
        genuine = as_binary(genuine, scores.size, "genuine").astype(np.intp)
        codes = label_codes(s, self.groups, scores.size, "s")
        _, n_groups, n_bins = self.counts_.shape
        cells = (genuine * n_groups + codes) * n_bins + _bin(scores, self.edges)
        self.counts_ = self.counts_ + np.bincount(cells, minlength=self.counts_.size).reshape(self.counts_.shape)
        return self

    @property
    def n_impostor(self) -> int:
        """Impostor pairs counted (all groups)."""
        return int(self.impostor_hist_.sum())

    @property
    def calibrated(self) -> bool:
        """True once the impostor pairs allow at least one false accept at the target FAR."""
        return self.n_impostor * self.far >= 1.0

    def threshold_bin(self) -> int:
        """The first bin of the accepted scores: the lowest edge with at most ``floor(far * n)`` impostors at or
        above it (the top edge, nothing accepted, before any impostor pair)."""
        pooled = self.impostor_hist_.sum(axis=0)
        at_or_above = np.concatenate([np.cumsum(pooled[::-1])[::-1], [0]])
        allowed = np.floor(self.far * pooled.sum())
        return pooled.size if not pooled.sum() else int(np.argmax(at_or_above <= allowed))

    def value(self) -> VerificationRates:
        """Rates, BFAR and BFRR at the calibrated threshold over the pairs counted so far."""
        j = self.threshold_bin()
        return rates_from_counts(self.edges[j], self.groups, self.impostor_hist_[:, j:].sum(axis=1),
                                 self.impostor_hist_.sum(axis=1), self.genuine_hist_[:, :j].sum(axis=1),
                                 self.genuine_hist_.sum(axis=1))


# --------------------------------------------------------------------------------------------
# All same-group pairs of a labelled evaluation set
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class PairScores:
    """Scores of all same-group pairs of an evaluation set, kept compactly and exactly where it matters.

    Every genuine score is kept (``genuine``, group codes ``genuine_group``). Of the impostor scores,
    the ``top`` ones (descending, with ``top_group``) are kept: enough to place the threshold of any
    FAR down to ``max_far`` exactly and to count each group's false accepts above it. The rest are
    counted per group in ``impostor_hist`` (fine bins on [-1, 1]) for plotting whole curves.
    """

    groups: np.ndarray
    genuine: np.ndarray
    genuine_group: np.ndarray
    top: np.ndarray
    top_group: np.ndarray
    impostor_pairs: np.ndarray
    impostor_hist: np.ndarray
    edges: np.ndarray
    max_far: float

    @property
    def n_impostor(self) -> int:
        """Number of same-group impostor pairs (all groups)."""
        return int(self.impostor_pairs.sum())

    def threshold(self, far: float) -> float:
        """Exact ``inf{t : FAR(t) <= far}`` on the pooled same-group impostor pairs."""
        far = _check_far(far)
        if far > self.max_far:
            raise RepairInputError(f"FAR {far} is above max_far={self.max_far} the scores were kept for")
        if self.n_impostor == 0:
            raise RepairInputError("no same-group impostor pair: the threshold is undefined")
        return float(self.top[int(np.floor(far * self.n_impostor))])

    def rates(self, threshold: float) -> VerificationRates:
        """Per-group rates at ``threshold`` (exact when it is at or above the kept impostor scores' minimum)."""
        n = len(self.groups)
        if self.top.size < self.n_impostor and threshold < self.top[-1]:
            raise RepairInputError(f"threshold {threshold} is below the kept impostor scores; raise max_far")
        fa = np.bincount(self.top_group[self.top > threshold], minlength=n)
        fr = np.bincount(self.genuine_group[self.genuine <= threshold], minlength=n)
        return rates_from_counts(threshold, self.groups, fa, self.impostor_pairs, fr,
                                 np.bincount(self.genuine_group, minlength=n))

    def rates_at_far(self, far: float) -> VerificationRates:
        """Rates at the global threshold of target ``far``."""
        return self.rates(self.threshold(far))

    def curves(self, group: int) -> tuple[ScoreCurve, ScoreCurve]:
        """(genuine, impostor) curves of the group with code ``group``; impostors binned (1e-4 wide)."""
        return (ScoreCurve.from_scores(self.genuine[self.genuine_group == group]),
                ScoreCurve.from_histogram(self.edges, self.impostor_hist[group]))


def same_group_pair_scores(vectors, identities, s, max_far: float = 1e-3,
                           score_map: Callable[[np.ndarray, int], np.ndarray] | None = None,
                           chunk_rows: int = _CHUNK_ROWS) -> PairScores:
    """Cosine scores of every pair of vectors whose two images share a group, computed in blocks.

    ``identities`` and ``s`` give each vector's identity and group. ``score_map(scores, group_code)``,
    if given, maps the raw scores of a group's pairs first (a score-level baseline that needs the
    attribute at test time). Cost: one (chunk x n_a) matrix product per block; memory O(chunk * n_a).

    >>> import numpy as np
    >>> v = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    >>> pairs = same_group_pair_scores(v, identities=[0, 0, 1, 1], s=[0, 0, 0, 0])
    >>> pairs.genuine.size, pairs.n_impostor
    (2, 4)
    """
    Z = l2_normalise(vectors)
    n = Z.shape[0]
    ids = normalise_labels(as_labels(identities, n, "identities"))
    labels = normalise_labels(as_labels(s, n, "s"))
    classes, codes = np.unique(labels, return_inverse=True)
    members = [np.flatnonzero(codes == g) for g in range(len(classes))]
    impostor_pairs = np.array([_impostor_pair_count(ids[rows]) for rows in members], dtype=np.int64)
    # Enough of the largest impostor scores to place the threshold of any FAR <= max_far exactly.
    keeper = _TopKeeper(int(np.floor(_check_far(max_far) * impostor_pairs.sum())) + 1)
    edges = np.linspace(-1.0, 1.0, _CURVE_BINS + 1)
    hist = np.zeros((len(classes), _CURVE_BINS), dtype=np.int64)
    genuine, genuine_group = [np.zeros(0)], [np.zeros(0, dtype=np.intp)]
    for g, rows in enumerate(members):
        for gen, imp in group_pair_blocks(Z[rows], ids[rows], chunk_rows):
            if score_map is not None:
                gen, imp = score_map(gen, g), score_map(imp, g)
            genuine.append(gen)
            genuine_group.append(np.full(gen.size, g, dtype=np.intp))
            hist[g] += np.bincount(_bin(imp, edges), minlength=_CURVE_BINS)
            keeper.add(imp, g)
    top, top_group = keeper.result()
    return PairScores(groups=classes, genuine=np.concatenate(genuine), genuine_group=np.concatenate(genuine_group),
                      top=top, top_group=top_group, impostor_pairs=impostor_pairs, impostor_hist=hist,
                      edges=edges, max_far=float(max_far))


def _impostor_pair_count(ids: np.ndarray) -> int:
    """Pairs i < j with different identities among ``ids``."""
    n = ids.size
    per_identity = np.unique(ids, return_counts=True)[1].astype(np.int64)
    return int(n * (n - 1) // 2 - np.sum(per_identity * (per_identity - 1) // 2))


def _bin(scores: np.ndarray, edges: np.ndarray) -> np.ndarray:
    n_bins = edges.size - 1
    return np.clip(((scores - edges[0]) / (edges[-1] - edges[0]) * n_bins).astype(np.intp), 0, n_bins - 1)


def group_pair_blocks(Z: np.ndarray, ids: np.ndarray, chunk_rows: int):
    """(genuine, impostor) scores of the pairs i < j of one group, one row block at a time."""
    n = Z.shape[0]
    for start in range(0, n, chunk_rows):
        stop = min(start + chunk_rows, n)
        block = Z[start:stop] @ Z[start:].T
        upper = np.arange(n - start)[None, :] > np.arange(stop - start)[:, None]  # j > i
        same = ids[start:stop, None] == ids[None, start:]
        yield block[upper & same], block[upper & ~same]


class _TopKeeper:
    """The ``m`` largest scores seen so far (with their group), in O(m) memory plus one block."""

    def __init__(self, m: int):
        self.m, self.cutoff, self.size = m, -np.inf, 0
        self.scores: list[np.ndarray] = [np.zeros(0)]
        self.groups: list[np.ndarray] = [np.zeros(0, dtype=np.intp)]

    def add(self, scores: np.ndarray, group: int) -> None:
        """Offer a block of one group's scores."""
        keep = scores > self.cutoff  # anything at or below the cutoff is beaten by m kept scores
        self.scores.append(scores[keep])
        self.groups.append(np.full(int(keep.sum()), group, dtype=np.intp))
        self.size += int(keep.sum())
        if self.size > 4 * self.m:
            self._shrink()

    def _shrink(self) -> None:
        s, g = np.concatenate(self.scores), np.concatenate(self.groups)
        if s.size > self.m:
            part = np.argpartition(-s, self.m - 1)[:self.m]
            s, g = s[part], g[part]
            self.cutoff = float(s.min())
        self.scores, self.groups, self.size = [s], [g], s.size

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """The ``m`` largest scores (all of them if fewer), descending, and their groups."""
        self._shrink()
        order = np.argsort(-self.scores[0], kind="stable")
        return self.scores[0][order], self.groups[0][order]
