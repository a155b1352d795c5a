"""The shadow policy's rule: promote, retire or wait, from paired evidence, with an anytime-valid sequential test.

A candidate chain runs in shadow beside the serving (active) chain on the same live records. The evidence
(:class:`ShadowEvidence`) pairs them record by record; :func:`verdict` reads it at any time, as often as it likes,
and says one of three things:

1. **Retire at once** when the candidate chain failed in shadow, or refused a record the active chain delivered (a
   promotion would dead-letter such records).
2. **Wait** while fewer than ``shadow.min_records`` paired records were compared.
3. Else, for each compared statistic (lower is fairer), an interval on its **improvement** ``I = active value -
   candidate value`` that holds, with probability at least ``1 - alpha``, at every look at once (a confidence
   sequence, :mod:`fairstream.repair.measure.sequential`). The statistic **passes** when the interval's lower end
   exceeds ``min_improvement`` (better by more than that for sure), **fails** when its upper end is at most
   ``min_improvement`` (the interval excludes an improvement of more than that), and is **undecided** otherwise.
4. A **guard**, each at level alpha: with labels (``evidence.accuracy``), the candidate's accuracy drop (active
   minus candidate) must be at most ``max_accuracy_drop`` (passes when the drop's upper bound is within it, fails
   when its lower bound exceeds it); else, with decisions (``evidence.decisions``), the absolute change of the
   overall decision rate must be at most ``max_decision_rate_change`` (same reading); else no guard.
5. **Promote** when every compared statistic and the guard pass; **retire** when any fails for sure, or once
   ``shadow.max_records`` paired records were compared without a promotion ("cap reached"); else **wait**.

A statistic named in ``compared`` without evidence cannot pass: the policy waits, and at the cap retires saying it
was never measured. With nothing to compare the candidate is retired at once (nothing could ever promote it).

**Why the false-promotion rate is at most alpha.** If the candidate is not better by more than ``min_improvement``
on some statistic, a promotion needs that statistic's interval to lie above ``min_improvement``, which happens only
if its confidence sequence failed at some look: probability at most ``alpha``, however often and whenever the
policy looks. Promotion needs *every* statistic to pass, so P(all pass) <= P(that one passes) <= alpha: no split of
alpha across statistics is needed. (The sequences are asymptotic, CLT-like: valid as records accumulate, which is
why no look comes before ``min_records``.)

**Rate gaps** (``dp_difference``, ``eopp``: the gap ``D = max_g r_g - min_g r_g`` between groups' decision rates,
``eopp`` among records with ``y = 1``) are paired record by record. Per group ``g``, ``x`` is the active chain's
decision (its mean: the active rate ``r_g``) and ``d`` the candidate's minus the active's (its mean ``Delta_g``: the
paired change, so the candidate's rate is ``r_g + Delta_g``). For any pair of groups ``D >= r_a - r_b``, hence

    I >= min over ordered pairs g != h of [(r_a - r_b) - (r_g - r_h) - (Delta_g - Delta_h)]

with ``(a, b)`` the active chain's highest- and lowest-rate groups; symmetrically, with ``(g, h)`` the candidate's
own highest and lowest,

    I <= max over ordered pairs a != b of [(r_a - r_b) - (r_g + Delta_g - r_h - Delta_h)].

The inequalities hold for every pair, so choosing the pairs from the data keeps them valid. Each term is a linear
combination of the ``2k`` means, bounded over simultaneous confidence sequences (each at level ``alpha / 2k``, a
union bound). In the term ``(g, h) = (a, b)`` the rates cancel and only ``Delta_a - Delta_b`` remains: where the two
chains decide alike on most records, ``d`` is mostly 0 and that difference is known far more precisely than two
unpaired gaps would be. That is what pairing buys.

**Other statistics** (E, W1, dp_ratio, conditional_dp, MDP, OTF: not means over records) are measured on both chains
per chunk of records (:class:`ChunkDifferences`); the interval is a confidence sequence on the mean per-chunk
difference (batch means, ``t`` = chunks, at level alpha), and no decision is taken before :data:`MIN_CHUNKS` chunks.
It bounds the expected per-chunk improvement, which for a statistic with a small-sample bias (a gap between
estimated rates) may differ a little from the improvement over all records.

>>> import numpy as np
>>> from fairstream.streams.config import ShadowConfig
>>> rng = np.random.default_rng(0)
>>> group = (rng.random(20_000) < 0.4).astype(int)                   # two groups, shares 0.6 / 0.4
>>> active = (rng.random(20_000) < np.where(group == 1, 0.20, 0.32)).astype(float)
>>> candidate = np.where(group == 1, np.maximum(active, rng.random(20_000) < 0.05), active)  # lifts group 1
>>> sums = PairedSums.of(active, candidate - active, group, ("a", "b"))
>>> result = verdict(ShadowEvidence(20_000, {"dp_difference": sums}, {}), ShadowConfig(), ("dp_difference",))
>>> result.action, result.bounds[0].passed
('promote', True)
>>> print(result.reason.split(": ")[0])
promoted after 20000 paired records
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from itertools import permutations

import numpy as np
from numpy.typing import ArrayLike

from fairstream.repair.measure.sequential import absolute_bounds, confidence_sequence, linear_bounds
from fairstream.streams.config import STATISTICS, ShadowConfig

__all__ = [
    "MIN_CHUNKS",
    "PROMOTE",
    "RATE_STATISTICS",
    "RETIRE",
    "WAIT",
    "Bound",
    "ChunkDifferences",
    "PairedSums",
    "ShadowEvidence",
    "Verdict",
    "accuracy_guard",
    "chunk_bound",
    "decision_rate_guard",
    "rate_gap_bound",
    "verdict",
]

PROMOTE, RETIRE, WAIT = "promote", "retire", "wait"
RATE_STATISTICS = ("dp_difference", "eopp")
"""The statistics that are gaps between groups' rates: paired record by record (:func:`rate_gap_bound`)."""
PAIRED_RECORDS, PAIRED_CHUNKS = "paired records", "paired chunks"

MIN_CHUNKS = 10
"""Chunks a chunk statistic needs before its interval is finite: fewer batch means say too little of their spread."""
TARGET_RECORDS = 10_000
"""The record count the rate sequences are tuned to be tightest at (or ``max_records``, if smaller): late enough for
improvements of a hundredth in a gap, early enough not to waste the first looks."""
TARGET_CHUNKS = 100
"""Likewise for the chunk sequences."""
RECORD_PRIOR_VARIANCE, RECORD_PRIOR_WEIGHT = 0.25, 30.0
"""The prior variance of a per-record value (a 0/1 decision, or its paired change in {-1, 0, 1}), weighed as 30
records: the largest variance of a 0/1 value. It keeps rare events covered: a change the first records never show
(a variance of 0 so far) still gets a wide interval, and the coverage tests hold down to rates of 1 in 1,000."""
CHUNK_PRIOR_VARIANCE, CHUNK_PRIOR_WEIGHT = 1e-4, 1.0
"""The prior variance of a per-chunk difference, weighed as one chunk: a spread of 0.01, so a run of identical chunk
differences never gives a zero-width interval, without swamping the spreads real chunks show."""
MAX_REASON, MAX_FIGURES, MAX_FIGURE_NAME = 1000, 64, 64
"""The limits of a control record's reason and statistics."""


@dataclass(frozen=True, eq=False)
class PairedSums:
    """Sufficient statistics of one per-record paired quantity, per cell (e.g. per group), pooled over the pipeline:
    records n, sums of the active chain's value x and of its square, sums of the change d = candidate - active and of
    its square.

    Parameters
    ----------
    n, active, active_sq, change, change_sq : numpy.ndarray
        ``(k,)`` float arrays, one entry per cell.
    cells : tuple of str
        The cells' names (group labels as strings, or ``("all",)``).
    """

    n: np.ndarray
    active: np.ndarray
    active_sq: np.ndarray
    change: np.ndarray
    change_sq: np.ndarray
    cells: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "cells", tuple(self.cells))
        for name in ("n", "active", "active_sq", "change", "change_sq"):
            value = np.asarray(getattr(self, name), dtype=float)
            if value.shape != (len(self.cells),):
                raise ValueError(f"PairedSums.{name} must have one entry per cell ({len(self.cells)}), "
                                 f"got shape {value.shape}")
            object.__setattr__(self, name, value)

    def merge(self, other: PairedSums) -> PairedSums:
        """Both sums added, cell by cell (the records of both).

        Parameters
        ----------
        other : PairedSums
            Sums over the same cells, in the same order.

        Returns
        -------
        PairedSums
            The sums of both.
        """
        if other.cells != self.cells:
            raise ValueError(f"cannot merge paired sums over cells {other.cells} into {self.cells}")
        return PairedSums(self.n + other.n, self.active + other.active, self.active_sq + other.active_sq,
                          self.change + other.change, self.change_sq + other.change_sq, self.cells)

    @classmethod
    def of(cls, x: ArrayLike, d: ArrayLike, cell_codes: ArrayLike, cells: tuple[str, ...]) -> PairedSums:
        """The sums of per-record values.

        Parameters
        ----------
        x : array_like
            The active chain's value per record (float).
        d : array_like
            The change per record, candidate minus active (float).
        cell_codes : array_like
            Each record's cell, an integer in ``range(len(cells))``.
        cells : tuple of str
            The cells' names.

        Returns
        -------
        PairedSums
            Per cell: records, sums of x and x**2, sums of d and d**2.
        """
        x, d = np.asarray(x, dtype=float).ravel(), np.asarray(d, dtype=float).ravel()
        codes = np.asarray(cell_codes).ravel()
        if not (len(x) == len(d) == len(codes)):
            raise ValueError(f"x, d and cell_codes must have one entry per record, got {len(x)}, {len(d)}, "
                             f"{len(codes)}")
        if len(codes) and (not np.issubdtype(codes.dtype, np.integer) or codes.min() < 0
                           or codes.max() >= len(cells)):
            raise ValueError(f"cell_codes must be integers in range({len(cells)})")
        k = len(cells)

        def per_cell(weights=None):
            return np.bincount(codes, weights=weights, minlength=k).astype(float)
        return cls(per_cell(), per_cell(x), per_cell(x * x), per_cell(d), per_cell(d * d), tuple(cells))


@dataclass(frozen=True)
class ChunkDifferences:
    """A statistic that is not a mean over records (E, W1, dp_ratio, conditional_dp, MDP, OTF), measured on both
    chains per chunk of records: chunks so far, sum and sum of squares of (active - candidate) per chunk, and both
    chains' values over every record compared."""

    chunks: int
    total: float
    total_sq: float
    active: float
    candidate: float


@dataclass(frozen=True)
class ShadowEvidence:
    """What the monitoring agent knows of a candidate, pooled over the pipeline.

    Parameters
    ----------
    records : int
        Paired records compared (both chains delivered them).
    rates : dict of str to PairedSums
        ``"dp_difference"`` (x = the active decision 0/1, d = candidate - active, cells = groups, all records) and
        ``"eopp"`` (the same among records with y = 1).
    chunks : dict of str to ChunkDifferences
        Any other compared statistic.
    accuracy : PairedSums or None, default=None
        One cell (``"all"``): x = the active decision is correct (0/1), d = candidate correct - active correct;
        labelled records only.
    decisions : PairedSums or None, default=None
        One cell (``"all"``): x = the active decision, d = candidate - active.
    refused : int, default=0
        Records the candidate refused that the active chain delivered.
    failed : str or None, default=None
        Why the candidate chain failed in shadow, or None.
    """

    records: int
    rates: dict[str, PairedSums]
    chunks: dict[str, ChunkDifferences]
    accuracy: PairedSums | None = None
    decisions: PairedSums | None = None
    refused: int = 0
    failed: str | None = None


@dataclass(frozen=True)
class Bound:
    """An anytime-valid interval on one statistic's improvement, or on a guard's figure, and what it says.

    Attributes
    ----------
    statistic : str
        The statistic (e.g. ``"dp_difference"``), or ``"accuracy"`` / ``"decision_rate"`` for the guards.
    estimate : float
        The improvement (active - candidate) of a statistic; for the guards the accuracy drop (active - candidate)
        or the absolute change of the decision rate. NaN when nothing was measured.
    lower, upper : float
        The interval, at level alpha at every look (``-inf``, ``+inf`` when it says nothing yet).
    method : str
        ``"paired records"`` or ``"paired chunks"``.
    passed : bool or None
        True: passes for sure at level alpha; False: fails for sure; None: undecided yet.
    """

    statistic: str
    estimate: float
    lower: float
    upper: float
    method: str
    passed: bool | None

    @property
    def measured(self) -> bool:
        """Whether the interval says anything (both ends finite)."""
        return math.isfinite(self.lower) and math.isfinite(self.upper)


@dataclass(frozen=True)
class Verdict:
    """The policy's answer at one look.

    Parameters
    ----------
    action : str
        ``"promote"``, ``"retire"`` or ``"wait"``.
    reason : str
        Plain words, one clause per statistic and guard (at most 1,000 characters).
    bounds : tuple of Bound
        One per compared statistic, in order.
    guards : tuple of Bound
        The guard applied (none without accuracy or decisions).
    records : int
        Paired records compared.
    alpha : float
        The level of every interval.
    """

    action: str
    reason: str
    bounds: tuple[Bound, ...]
    guards: tuple[Bound, ...]
    records: int
    alpha: float

    def figures(self) -> dict[str, float]:
        """The figures a control record carries: finite floats under short names, at most 64.

        Returns
        -------
        dict of str to float
            ``records``, ``alpha``, and ``bound.<statistic>.estimate|lower|upper`` and
            ``guard.<name>.estimate|lower|upper`` where finite.
        """
        figures = {"records": float(self.records), "alpha": float(self.alpha)}
        for prefix, bounds in (("bound", self.bounds), ("guard", self.guards)):
            for bound in bounds:
                for part in ("estimate", "lower", "upper"):
                    figures[f"{prefix}.{bound.statistic}.{part}"] = float(getattr(bound, part))
        kept = {name: value for name, value in figures.items()
                if math.isfinite(value) and len(name) <= MAX_FIGURE_NAME}
        return dict(list(kept.items())[:MAX_FIGURES])


def verdict(evidence: ShadowEvidence, config: ShadowConfig, compared: tuple[str, ...]) -> Verdict:
    """Promote, retire or wait: the shadow policy's rule (the module docstring) on the evidence so far.

    Parameters
    ----------
    evidence : ShadowEvidence
        The paired evidence on the candidate, pooled over the pipeline.
    config : ShadowConfig
        ``min_records``, ``max_records``, ``alpha``, ``min_improvement`` and the guards' limits.
    compared : tuple of str
        The statistics the candidate must improve (names of ``STATISTICS``).

    Returns
    -------
    Verdict
        The action, its reason, and every interval behind it.
    """
    unknown = [name for name in compared if name not in STATISTICS]
    if unknown:
        raise ValueError(f"unknown statistic(s) {unknown}: expected some of {STATISTICS}")
    bounds = tuple(statistic_bound(name, evidence, config) for name in compared)
    guards = guard_bounds(evidence, config)
    action, reason = decision(evidence, config, bounds, guards)
    return Verdict(action, bounded(reason), bounds, guards, int(evidence.records), float(config.alpha))


def decision(evidence: ShadowEvidence, config: ShadowConfig, bounds: tuple[Bound, ...],
             guards: tuple[Bound, ...]) -> tuple[str, str]:
    """(action, reason) from the intervals: the order of the rule's steps."""
    records = int(evidence.records)
    if evidence.failed is not None:
        return RETIRE, f"retired: the candidate chain failed in shadow ({evidence.failed})"
    if evidence.refused > 0:
        return RETIRE, (f"retired: the candidate refused {evidence.refused} records the active chain delivered "
                        "(a promotion would dead-letter them)")
    if not bounds:
        return RETIRE, "retired: no statistic to compare (nothing could ever promote the candidate)"
    if records < config.min_records:
        return WAIT, f"waiting: {records} of the {config.min_records} paired records before the first look"
    capped = records >= config.max_records
    clauses = [statistic_clause(b, config.min_improvement, capped) for b in bounds]
    clauses += [guard_clause(g, config, capped) for g in guards] or [
        "no guard (the chains write no decision: statistics only)"]
    judged = (*bounds, *guards)
    level = (f"intervals at level alpha = {config.alpha:g} (each holds its true value at every look with "
             f"probability at least {1 - config.alpha:g}), improvement = active minus candidate: ")
    if all(b.passed is True for b in judged):
        return PROMOTE, f"promoted after {records} paired records: {level}" + "; ".join(clauses)
    if any(b.passed is False for b in judged):
        return RETIRE, f"retired after {records} paired records: {level}" + "; ".join(clauses)
    if capped:
        return RETIRE, (f"retired: cap reached, {records} paired records (max_records {config.max_records}) "
                        f"without a decision: {level}" + "; ".join(clauses))
    return WAIT, f"waiting after {records} paired records: {level}" + "; ".join(clauses)


def statistic_bound(name: str, evidence: ShadowEvidence, config: ShadowConfig) -> Bound:
    """The interval on ``name``'s improvement from the evidence that holds it (infinite when none does)."""
    if name in evidence.rates:
        target = min(config.max_records, TARGET_RECORDS)
        return rate_gap_bound(name, evidence.rates[name], config.alpha, config.min_improvement, target)
    if name in evidence.chunks:
        return chunk_bound(name, evidence.chunks[name], config.alpha, config.min_improvement)
    method = PAIRED_RECORDS if name in RATE_STATISTICS else PAIRED_CHUNKS
    return Bound(name, math.nan, -math.inf, math.inf, method, None)


def verdict_of(lower: float, upper: float, threshold: float) -> bool | None:
    """True when the whole interval lies above ``threshold``, False when none of it does, else None."""
    if lower > threshold:
        return True
    if upper <= threshold:
        return False
    return None


def rate_gap_bound(name: str, sums: PairedSums, alpha: float, min_improvement: float,
                   target: float = TARGET_RECORDS) -> Bound:
    """The anytime-valid interval on the improvement of a gap between groups' rates, paired record by record.

    Parameters
    ----------
    name : str
        The statistic (``"dp_difference"`` or ``"eopp"``).
    sums : PairedSums
        Per group: x the active chain's 0/1 decision, d the candidate's minus the active's.
    alpha : float
        The level of the interval (each of the ``2k`` group sequences at ``alpha / 2k``).
    min_improvement : float
        The improvement the candidate must exceed to pass.
    target : float, default=TARGET_RECORDS
        The records per group the sequences are tuned for.

    Returns
    -------
    Bound
        Infinite (undecided) while a group has no record, or with fewer than two groups.
    """
    k = len(sums.cells)
    if k < 2 or (sums.n <= 0).any():
        return Bound(name, math.nan, -math.inf, math.inf, PAIRED_RECORDS, None)
    # One sequence per mean, r_1..r_k then Delta_1..Delta_k, each at alpha / 2k: all hold at once at level alpha.
    means = confidence_sequence(np.concatenate([sums.n, sums.n]), np.concatenate([sums.active, sums.change]),
                                np.concatenate([sums.active_sq, sums.change_sq]), alpha / (2 * k), target=target,
                                prior_variance=RECORD_PRIOR_VARIANCE, prior_weight=RECORD_PRIOR_WEIGHT)
    active, candidate = means.mean[:k], means.mean[:k] + means.mean[k:]
    # I >= D - (r'_g - r'_h) bounded below for every (g, h), with D >= r_a - r_b for the active's top pair (a, b);
    # I <= (r_a - r_b) - D' bounded above for every (a, b), with D' >= r'_g - r'_h for the candidate's top pair.
    terms = gap_terms(k, top_bottom(active), top_bottom(candidate))
    lows, highs = linear_bounds(terms, means.lower, means.upper)
    below = k * (k - 1)  # the first rows bound I from below, the others from above
    lower, upper = float(lows[:below].min()), float(highs[below:].max())
    estimate = float((active.max() - active.min()) - (candidate.max() - candidate.min()))
    return Bound(name, estimate, lower, upper, PAIRED_RECORDS, verdict_of(lower, upper, min_improvement))


def top_bottom(rates: np.ndarray) -> tuple[int, int]:
    """The groups of the highest and the lowest rate."""
    return int(rates.argmax()), int(rates.argmin())


@lru_cache(maxsize=1024)
def gap_terms(k: int, active_top: tuple[int, int], candidate_top: tuple[int, int]) -> np.ndarray:
    """Coefficients over ``(r_1..r_k, Delta_1..Delta_k)`` of the terms ``(r_a - r_b) - (r'_g - r'_h)``, the
    candidate's rate being ``r'_g = r_g + Delta_g``: first the ``k (k - 1)`` lower terms, ``(a, b) = active_top`` and
    ``(g, h)`` every ordered pair of distinct groups, then the upper terms, ``(a, b)`` every pair and
    ``(g, h) = candidate_top``. Cached: a policy asks for the same few again and again."""
    pairs = list(permutations(range(k), 2))
    rows = [(*active_top, g, h) for g, h in pairs] + [(a, b, *candidate_top) for a, b in pairs]
    terms = np.zeros((len(rows), 2 * k))
    for row, (a, b, g, h) in enumerate(rows):  # 2 k (k - 1) rows for a handful of groups, built once
        # += accumulates, so a group in both pairs cancels (r_a - r_a = 0): no width from a rate that drops out.
        terms[row, a] += 1.0
        terms[row, b] -= 1.0
        terms[row, g] -= 1.0
        terms[row, h] += 1.0
        terms[row, k + g] -= 1.0
        terms[row, k + h] += 1.0
    terms.flags.writeable = False
    return terms


def chunk_bound(name: str, chunks: ChunkDifferences, alpha: float, min_improvement: float) -> Bound:
    """The anytime-valid interval on the mean per-chunk improvement of a statistic measured per chunk.

    Parameters
    ----------
    name : str
        The statistic.
    chunks : ChunkDifferences
        Chunks so far and the sums of their differences (active - candidate).
    alpha : float
        The level of the interval.
    min_improvement : float
        The improvement the candidate must exceed to pass.

    Returns
    -------
    Bound
        Infinite (undecided) before :data:`MIN_CHUNKS` chunks; the estimate is the mean per-chunk difference.
    """
    estimate = chunks.total / chunks.chunks if chunks.chunks > 0 else math.nan
    if chunks.chunks < MIN_CHUNKS:
        return Bound(name, estimate, -math.inf, math.inf, PAIRED_CHUNKS, None)
    cs = confidence_sequence(chunks.chunks, chunks.total, chunks.total_sq, alpha, target=TARGET_CHUNKS,
                             prior_variance=CHUNK_PRIOR_VARIANCE, prior_weight=CHUNK_PRIOR_WEIGHT)
    lower, upper = float(cs.lower), float(cs.upper)
    return Bound(name, estimate, lower, upper, PAIRED_CHUNKS, verdict_of(lower, upper, min_improvement))


def guard_bounds(evidence: ShadowEvidence, config: ShadowConfig) -> tuple[Bound, ...]:
    """The accuracy guard with labels, else the decision-rate guard with decisions, else none."""
    target = min(config.max_records, TARGET_RECORDS)
    if evidence.accuracy is not None:
        return (accuracy_guard(evidence.accuracy, config.alpha, config.max_accuracy_drop, target),)
    if evidence.decisions is not None:
        return (decision_rate_guard(evidence.decisions, config.alpha, config.max_decision_rate_change, target),)
    return ()


def overall_change(sums: PairedSums, alpha: float, target: float):
    """The confidence sequence of the mean change over every cell of ``sums``."""
    return confidence_sequence(sums.n.sum(), sums.change.sum(), sums.change_sq.sum(), alpha, target=target,
                               prior_variance=RECORD_PRIOR_VARIANCE, prior_weight=RECORD_PRIOR_WEIGHT)


def accuracy_guard(sums: PairedSums, alpha: float, max_drop: float, target: float = TARGET_RECORDS) -> Bound:
    """The accuracy guard: the interval on the accuracy drop (active - candidate) against ``max_drop``.

    Parameters
    ----------
    sums : PairedSums
        x: the active decision is correct (0/1); d: candidate correct - active correct; labelled records.
    alpha : float
        The level of the interval.
    max_drop : float
        The largest drop allowed.
    target : float, default=TARGET_RECORDS
        The labelled records the sequence is tuned for.

    Returns
    -------
    Bound
        ``statistic="accuracy"``; passes when the drop is at most ``max_drop`` for sure, fails when it exceeds it
        for sure.
    """
    cs = overall_change(sums, alpha, target)
    lower, upper = -float(cs.upper), -float(cs.lower)  # the drop is minus the change
    passed = True if upper <= max_drop else (False if lower > max_drop else None)
    return Bound("accuracy", -float(cs.mean), lower, upper, PAIRED_RECORDS, passed)


def decision_rate_guard(sums: PairedSums, alpha: float, max_change: float, target: float = TARGET_RECORDS) -> Bound:
    """The decision-rate guard: the interval on the absolute change of the overall decision rate.

    Parameters
    ----------
    sums : PairedSums
        x: the active decision (0/1); d: candidate - active.
    alpha : float
        The level of the interval.
    max_change : float
        The largest absolute change allowed.
    target : float, default=TARGET_RECORDS
        The records the sequence is tuned for.

    Returns
    -------
    Bound
        ``statistic="decision_rate"``; passes when the change is at most ``max_change`` for sure, fails when it
        exceeds it for sure.
    """
    cs = overall_change(sums, alpha, target)
    lower, upper = (float(v) for v in absolute_bounds(cs.lower, cs.upper))
    passed = True if upper <= max_change else (False if lower > max_change else None)
    return Bound("decision_rate", abs(float(cs.mean)), lower, upper, PAIRED_RECORDS, passed)


def interval_text(bound: Bound) -> str:
    """``estimate in [lower, upper]``, to four decimals."""
    return f"{bound.estimate:.4f} in [{bound.lower:.4f}, {bound.upper:.4f}]"


def statistic_clause(bound: Bound, min_improvement: float, capped: bool) -> str:
    """One statistic's clause: its improvement, its interval, and what the interval says."""
    if not bound.measured:
        return f"{bound.statistic}: {'never measured' if capped else 'not measured yet'} (no interval: cannot pass)"
    meaning = {True: f"better by more than {min_improvement:g} for sure",
               False: f"excludes an improvement of more than {min_improvement:g}",
               None: f"undecided (holds {min_improvement:g})"}[bound.passed]
    return f"{bound.statistic} improves by {interval_text(bound)}: {meaning}"


def guard_clause(bound: Bound, config: ShadowConfig, capped: bool) -> str:
    """The guard's clause: its figure, its interval, and what the interval says."""
    if bound.statistic == "accuracy":
        what, limit = "accuracy guard: drop", config.max_accuracy_drop
    else:
        what, limit = "decision-rate guard: change", config.max_decision_rate_change
    if not bound.measured:
        return f"{what} {'never measured' if capped else 'not measured yet'}"
    meaning = {True: f"at most {limit:g} for sure", False: f"more than {limit:g} for sure",
               None: f"undecided (holds {limit:g})"}[bound.passed]
    return f"{what} {interval_text(bound)}: {meaning}"


def bounded(reason: str) -> str:
    """The reason within a control record's limit (the figures travel whole)."""
    return reason if len(reason) <= MAX_REASON else reason[:MAX_REASON - 3] + "..."
