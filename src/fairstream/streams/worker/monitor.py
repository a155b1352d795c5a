"""The fairness monitor: sliding-window statistics of the repaired stream.

It watches exactly what the record agent writes to ``records.repaired``: in a worker the agent hands
each delivered batch over as arrays (original and output features of the same records, and the
scorer's scores and decisions as the chain computed them, once), so the monitor costs a few
vectorised calls per batch, no second pass of the messages and no second scoring of the chain's
output; a standalone reader of the topic can feed it raw values instead
(:meth:`FairnessMonitor.observe`), and then the monitor scores them itself. The record chain is whatever the config names (``plan``;
``flow`` then ``scorer``; ...): the first module is the *repair stage* (stage ``before`` is its
input, ``after`` its output), a ``scorer`` scores them, and the last module that writes a decision (the
scorer, or group thresholds placed after it) makes the decisions the records carry: the monitor finds
each by its kind's capabilities (:class:`Chain`). A chain without a scorer (empty, or group thresholds alone: a
monitor-only pipeline) measures the score and decision the records carry of their own model (mapped fields), or
the thresholds' decisions on that score, after the chain only (:func:`carried_view`). For the chain's versions in use and per stratum, over
a count window and a time window, it keeps:

- ``dependence_e`` and ``w1`` between groups, per feature, before and after the repair stage
  (fixed bins per version: the plan's grid range, or the first batch's range for other modules,
  so the numbers are comparable across windows of one version);
- ``dp_difference``, ``dp_ratio`` and ``conditional_dp`` of the label (stage ``label``) and, with a
  scorer, of its decisions on the chain's output (``after``: the decisions every record carries,
  exact) and on the original features (``before``: the classifier alone, which needs a scorer call
  of its own, so it is measured on the same uniform sample of each batch as MDP: every record's
  group and stratum counted, the positives estimated by the sampled decisions, each counting the
  ``n / m`` records it stands for, so each group's rate in a window is an unbiased estimate of the
  rate of all its records); ``eopp`` (equal opportunity: the DP gap among records with y = 1);
- ``mdp``: matched demographic parity (Kim et al., Fairness Through Matching (2024)), mean
  |f(x) - f(T(x))| of the scorer f with the frozen transport coupling T its artifact carries
  (fitted between the groups of its training data, each record's counterparts weighted by their
  share of it; with more than two groups every group is matched to a reference group), per pair of
  groups, the worst pair overall, on the chain's output (``after``: the features the scorer reads,
  the space its map was fitted in). It is measured on a uniform random sample (without replacement)
  of the records chosen by a hash of their key (``monitor.sample_share`` of them, :func:`sampled_rows`), each
  sampled row weighted by the records it stands for (``1 / share``), so the window's MDP is an unbiased estimate
  of the MDP of all its records whatever the batch sizes, the order of the records and the worker that reads
  them (the pipeline's sample is the union of the workers'). The
  samples wait and are matched together when a window is read (a gauge export, a detector's
  chunk), or once ``MATCH_ROWS`` wait: the map's fixed cost per call is that of a few hundred rows.
  A map that no longer carries one group onto the other (drift) shows as MDP moving away from
  the groups' score W1;
- ``otf`` (only when monitored: it solves a small OT problem per read): the OTF⁰ cost of the
  scorer's scores after the chain (Chen et al.) on a uniform sample of the window;
- ``out_of_range_rate`` of the repair stage (original values outside a plan's grid).

Every update is a handful of vectorised calls per batch; reading a window merges its buckets (and
matches MDP's waiting samples).
The monitor never stops the worker: a batch it cannot measure (data or an artifact that makes a
statistic raise) ends the monitoring of that chain version with one logged error, and the next
version is monitored afresh.
Drift detection of these statistics is :mod:`.drift`; the gauge rows of a window are read by
:mod:`.gauge_rows`. A pending candidate chain is compared with the active one on the same records, cumulatively
since it began, by :class:`~fairstream.streams.worker.shadow_comparison.ShadowComparison` (these accumulators, both
sides).
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from fairstream.repair.hashing import keys_to_uint64, uniforms
from fairstream.repair.validation import RepairInputError
from fairstream.repair.measure.accumulators import (
    DecisionRateAccumulator,
    EncodedLabels,
    check_decisions,
    HistogramDependenceAccumulator,
    PositiveRateAccumulator,
    RateAccumulator,
    WassersteinAccumulator,
    configured_labels,
)
from fairstream.repair.measure.mdp import MatchedDPAccumulator
from fairstream.repair.measure.metrics import ColumnBins, as_binary, features
from fairstream.repair.measure.otf import OTF0Accumulator
from fairstream.repair.measure.windows import BatchWindow
from fairstream.streams.codec.repaired import NO_MODULE, RepairedBatch, decode_repaired
from fairstream.streams.config import PipelineConfig

from .drift import DETECTED, Chunker, DriftEvent, DriftTracker
from .gauge_rows import StatisticWindows, measurable

if TYPE_CHECKING:
    from .metrics import PipelineMetrics

log = logging.getLogger(__name__)

E_BINS, W1_BINS = 20, 200  # 20 bins: a small finite-sample bias (about 0.04 at 8000 Adult records)
SAMPLE_SEED = 0x5EED_0F_5A4D
"""Seed of the hash that picks the sampled records (:func:`sampled_rows`): a pure function of the record key, so a
record is in the sample whatever worker, batch or partition it arrives in, and replays give the same statistics."""


def key_draws(keys) -> np.ndarray:
    """Three uniform draws per record, (n, 3), a pure function of its key: column 0 decides whether the record is in
    the sample (:func:`sampled_rows`), column 1 is its priority in OTF's bottom-k sample, column 2 breaks its ties
    between equally near counterparts (MDP's map)."""
    return uniforms(SAMPLE_SEED, keys_to_uint64(np.asarray(keys)), 3)


def sampled_rows(draws: np.ndarray, share: float) -> tuple[np.ndarray, float]:
    """The batch rows in the pipeline-wide sample (``monitor.sample_share`` of the records, chosen by key) and the
    records each stands for (``1 / share``).

    The statistics that need extra scorer calls (the classifier alone, MDP's counterparts) are measured on these
    rows. Each record is in the sample with probability ``share`` independently of every other, so a sum over the
    sample weighted by ``1 / share`` is an unbiased estimate of the same sum over every record; and as the choice
    depends on the key only, the sample of the pipeline's records is the same whatever the number of workers and
    the partition assignment (the monitoring agent merges the workers' samples into the pipeline's).
    """
    if share >= 1.0:
        return np.arange(len(draws)), 1.0
    return np.flatnonzero(draws[:, 0] < share), 1.0 / share


def writes(module, column: str) -> bool:
    """Whether ``module``'s kind declares it writes ``column`` (its :class:`~fairstream.repair.protocol.Capabilities`)."""
    return column in module.capabilities.writes


@dataclass(frozen=True)
class Chain:
    """The artifacts one record batch went through, in order; the monitor asks their capabilities which is which.

    The *repair stage* is the first module that writes the features (stage ``before`` is its input, ``after``
    its output), the *scorer* the last that writes a score (the classifier of stage ``before``, and the scores
    of MDP and OTF), the *decider* the last that writes a decision: the decision every output record carries,
    a module placed after the scorer (group thresholds) included, is what the decision statistics ``after``
    measure.
    """

    actives: tuple

    @property
    def key(self) -> tuple:
        """What identifies the chain's versions (the monitor restarts its windows when it changes)."""
        return tuple((a.kind, a.version) for a in self.actives)

    @property
    def version(self) -> int:
        """The first module's version: what ``provenance.version`` of an output record says (an empty chain's:
        :data:`~fairstream.streams.codec.repaired.NO_MODULE`)."""
        return self.actives[0].version if self.actives else NO_MODULE

    @property
    def repair(self):
        """The repair stage: the first module that writes the features, or None (a chain that only scores)."""
        return next((a.module for a in self.actives if writes(a.module, "features")), None)

    @property
    def scorer(self):
        """The last module that writes a score, or None."""
        return next((a.module for a in reversed(self.actives) if writes(a.module, "score")), None)

    @property
    def decider(self):
        """The last module that writes a decision (what the output records carry), or None."""
        return next((a.module for a in reversed(self.actives) if writes(a.module, "decision")), None)

    @property
    def matches(self) -> bool:
        """Whether the scorer matches counterparts with a group map it carries (MDP can be measured)."""
        scorer = self.scorer
        return scorer is not None and scorer.capabilities.counterparts and scorer.group_map_ is not None


def chain_text(key: tuple) -> str:
    """A chain's versions as the log names them (:attr:`Chain.key`); the empty chain measures the records' own."""
    return ", ".join(f"{kind} v{version}" for kind, version in key) or "the records as they came (no module)"


def as_chain(actives: tuple) -> Chain:
    """A :class:`Chain` of registry ``Active`` artifacts in chain order (None entries, e.g. no scorer, left out)."""
    return Chain(tuple(a for a in actives if a is not None))


def fitted_range(module):
    """``module.fitted_range()`` (strata, lowest, highest) if its capabilities declare one, else None."""
    return module.fitted_range() if module is not None and module.capabilities.fitted_range else None


def outside_fitted_range(batch: RepairedBatch, chain: Chain) -> np.ndarray:
    """Records with an original value outside the range ``chain``'s repair stage was fitted on in their stratum (as
    the batch says, when it carries the flags)."""
    if batch.out_of_range is not None:
        return batch.out_of_range
    fitted = fitted_range(chain.repair)
    if fitted is None:
        return np.zeros(len(batch), dtype=bool)
    strata, lowest, highest = fitted
    codes = np.clip(np.searchsorted(strata, batch.u), 0, len(strata) - 1)
    return ((batch.before < lowest[codes]) | (batch.before > highest[codes])).any(axis=1)


def plan_edges(plan, bins: int) -> list[np.ndarray]:
    """Fixed equal-width bins per feature over the range a module was fitted on (all strata)."""
    _, lowest, highest = plan.fitted_range()
    return [finite_edges(a, b, bins) for a, b in zip(lowest.min(axis=0), highest.max(axis=0))]


def stage_edges(module, X: np.ndarray, bins: int, ranges: tuple | None = None) -> list[np.ndarray]:
    """Bins for one stage: the range the repair module was fitted on (a plan's grids), else per feature its configured
    valid range where finite (``ranges``: lows and highs), else the range of the first batch a version sees, widened
    by 10%.

    Values outside fall in the end bins, so a later batch with a wider range is still counted. Only the first two
    are the same in every worker: the pipeline's monitoring agent adds no counts binned otherwise (a chain without
    a fitted range, on features without a finite valid range, has its E and W1 measured per worker only).
    """
    if fitted_range(module) is not None:
        return plan_edges(module, bins)
    lo, hi = X.min(axis=0), X.max(axis=0)
    pad = np.maximum(0.1 * hi - 0.1 * lo, 1e-9)  # not 0.1 * (hi - lo), which overflows for -1e308 and 1e308
    with np.errstate(over="ignore"):
        lo, hi = lo - pad, hi + pad
    if ranges is not None:
        lows, highs = (np.asarray(bound, dtype=np.float64) for bound in ranges)
        fixed = np.isfinite(lows) & np.isfinite(highs)
        lo, hi = np.where(fixed, lows, lo), np.where(fixed, highs, hi)
    with np.errstate(over="ignore"):
        return [finite_edges(a, b, bins) for a, b in zip(lo, hi)]


_BOUND = float(np.finfo(np.float64).max) / 2  # edges within it: bin centres (a + b) / 2 and widths never overflow


def finite_edges(lo: float, hi: float, bins: int) -> np.ndarray:
    """``bins + 1`` finite, strictly increasing, equal-width edges over [lo, hi] (the bins of one feature).

    ``np.linspace`` where it gives such edges within +-8.99e307 (every real range does); a range it
    cannot cut (an end beyond that, a span that overflows, a single point, a span of a few ulps) gets
    edges clipped to it or, failing that, bins of width 1 (or 1e-6 of the value) around its middle.
    Values outside the edges fall in the end bins: a statistic is still measured, never raised.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
    if _usable(edges):
        return edges
    lo, hi = np.clip(np.nan_to_num([lo, hi]), -_BOUND, _BOUND)
    if hi > lo:
        t = np.linspace(0.0, 1.0, bins + 1)
        edges = np.clip(lo * (1.0 - t) + hi * t, -_BOUND, _BOUND)  # no hi - lo: it may overflow
        if _usable(edges):
            return edges
    middle = float(np.clip(lo / 2 + hi / 2, -_BOUND / 2, _BOUND / 2))
    return middle + max(abs(middle) * 1e-6, 1.0) * (np.arange(bins + 1) - bins / 2)


def _usable(edges: np.ndarray) -> bool:
    with np.errstate(over="ignore", invalid="ignore"):
        return bool((np.abs(edges) <= _BOUND).all() and (np.diff(edges) > 0).all())


@dataclass
class Sampled:
    """The batch rows of its sample (:func:`sampled_rows`), each standing for ``weight`` records, and the
    scorer's decisions on their original features (the classifier alone: one scorer call on the sample only)."""

    rows: np.ndarray
    weight: float
    decisions: np.ndarray

    def take(self, rows: slice) -> "Sampled":
        """The sampled rows among the batch rows ``rows`` (a slice), renumbered from its start."""
        keep = (self.rows >= rows.start) & (self.rows < rows.stop)
        return Sampled(self.rows[keep] - rows.start, self.weight, self.decisions[keep])


MATCH_ROWS = 1024
"""MDP's sampled rows wait and are matched to their counterparts in one call when a window is read (a gauge
export, a detector's chunk), or once this many wait: the map's fixed cost per call (about 0.5 ms) is paid once per
eight batches of 1000 or so, not once per batch, and one call (a few ms) holds the worker's loop only briefly."""


@dataclass
class ToMatch:
    """MDP's sample of a batch on the chain's output, waiting to be matched: the sampled rows' features, groups,
    strata and scores f(x), their batch rows, and the records each stands for."""

    X: np.ndarray
    s: np.ndarray
    u: np.ndarray
    f: np.ndarray
    rows: np.ndarray
    weight: float
    draws: np.ndarray  # each sampled row's tie-break draw (from its key)

    @classmethod
    def of(cls, X: np.ndarray, s: np.ndarray, u: np.ndarray, scores: np.ndarray, rows: np.ndarray,
           weight: float, draws: np.ndarray) -> "ToMatch":
        """The sampled ``rows`` of a batch, on the features ``X`` the scorer read, each standing for ``weight``, with
        the batch's tie-break ``draws``."""
        return cls(X[rows], s[rows], u[rows], scores[rows], rows, weight, draws[rows])

    def take(self, rows: slice) -> "ToMatch":
        """The sampled rows among the batch rows ``rows`` (a slice), renumbered from its start."""
        keep = (self.rows >= rows.start) & (self.rows < rows.stop)
        return ToMatch(self.X[keep], self.s[keep], self.u[keep], self.f[keep], self.rows[keep] - rows.start,
                       self.weight, self.draws[keep])


class MatchQueue:
    """The samples of one chain version waiting to be matched by the scorer's frozen map, matched together.

    Each pair's weight is its share of its row under the coupling (counterparts in the reference group, in
    every other group for a reference record) times the records its row stands for.
    """

    def __init__(self, scorer, groups: list, strata: list):
        self.scorer, self.empty = scorer, MatchedDPAccumulator(groups, strata)
        self.waiting: list[tuple[ToMatch, list]] = []  # (sample, the cell its accumulator is put in once matched)
        self.n_rows = 0

    def add(self, sample: ToMatch) -> list:
        """Queue a sample; returns the cell that will hold its accumulator (a one-item list, empty until matched)."""
        cell: list = []
        self.waiting.append((sample, cell))
        self.n_rows += len(sample.rows)
        return cell

    def match(self) -> None:
        """Match every waiting sample in one call of the map (and one of the scorer on the counterparts)."""
        if not self.waiting:
            return
        waiting, self.waiting, self.n_rows = self.waiting, [], 0
        samples = [sample for sample, _ in waiting]
        s = np.concatenate([sample.s for sample in samples])
        pairs = self.scorer.matched_counterparts(np.concatenate([sample.X for sample in samples]), s,
                                                 draws=np.concatenate([sample.draws for sample in samples]))
        f_matched = self.scorer.predict_proba(pairs.X)
        f = np.concatenate([sample.f for sample in samples])[pairs.rows]
        # every pair's labels encoded once, not once per sample
        s_pair = EncodedLabels.in_classes(s[pairs.rows], self.empty.groups, "s")
        s_matched = EncodedLabels.in_classes(pairs.s, self.empty.groups, "s_matched")
        u = EncodedLabels.in_classes(np.concatenate([sample.u for sample in samples])[pairs.rows], self.empty.strata,
                                     "u")
        # pairs come in row order: each sample's are one contiguous run
        bounds = np.searchsorted(pairs.rows, np.cumsum([0] + [len(sample.rows) for sample in samples]))
        weights = pairs.weights * np.repeat([sample.weight for sample in samples], np.diff(bounds))
        for (_, cell), accumulator in zip(waiting, self.empty.runs(f, f_matched, s_pair, s_matched, u, weights,
                                                                   bounds)):
            cell.append(accumulator)


class DeferredMatchedDP:
    """MDP's accumulator in the windows: the matched rows' sums, and samples still waiting in the queue.

    It merges and reads like a :class:`MatchedDPAccumulator` (``merge``, ``fresh``, ``value``); reading one
    matches every waiting sample first. Matched samples are folded into the sums as they are met.
    """

    def __init__(self, queue: MatchQueue, matched: MatchedDPAccumulator, waiting: tuple = ()):
        self.queue, self.matched, self.waiting = queue, matched, waiting

    def fresh(self) -> "DeferredMatchedDP":
        """An empty accumulator of the same queue."""
        return DeferredMatchedDP(self.queue, self.queue.empty.fresh())

    def update(self, sample: ToMatch) -> "DeferredMatchedDP":
        """Queue a batch's sample (its MDP counts once it is matched)."""
        if len(sample.rows):
            self.waiting += (self.queue.add(sample),)
        return self

    def merge(self, other: "DeferredMatchedDP") -> "DeferredMatchedDP":
        """A new accumulator holding both; ``self`` and ``other`` keep their value."""
        self._fold()
        other._fold()
        return DeferredMatchedDP(self.queue, self.matched.merge(other.matched), self.waiting + other.waiting)

    def value(self):
        """The MDP of every row so far (matching what waits)."""
        self.queue.match()
        self._fold()
        return self.matched.value()

    def _fold(self) -> None:
        """Add the samples matched since into the sums (the value is unchanged)."""
        done = [cell[0] for cell in self.waiting if cell]
        if done:
            self.matched = functools.reduce(lambda a, b: a.merge(b), done, self.matched)
            self.waiting = tuple(cell for cell in self.waiting if not cell)


@dataclass
class MonitoredBatch:
    """One batch as the monitor sees it: the repair stage's input and output, labels, and the scorer's view."""

    before: np.ndarray
    after: np.ndarray
    s: np.ndarray
    u: np.ndarray
    y: np.ndarray | None
    out_of_range: np.ndarray
    sampled_before: Sampled | None = None  # the scorer on the original features of a sample (the classifier alone)
    decision_after: np.ndarray | None = None  # the scorer on the chain's output (what the records carry): every row
    score_after: np.ndarray | None = None
    matched_after: ToMatch | None = None  # MDP's sample on the chain's output (the same rows), matched later
    priority: np.ndarray | None = None  # each record's priority in OTF's bottom-k sample (from its key)

    def __len__(self) -> int:
        return len(self.s)

    def take(self, rows: slice) -> "MonitoredBatch":
        """The rows ``rows`` of every array (None stays None)."""
        return MonitoredBatch(**{name: None if value is None else value.take(rows)
                                 if isinstance(value, (ToMatch, Sampled)) else value[rows]
                                 for name, value in vars(self).items()})


def monitored_batch(batch: RepairedBatch, chain: Chain, out_of_range: np.ndarray, share: float) -> MonitoredBatch:
    """A delivered batch as the monitor measures it, with the scorer's view when the chain scores.

    The scores and decisions after the chain are what the records carry (``batch.score``, ``batch.decision``:
    computed once by the record agent, or read back from the topic): the statistics of the decisions after the
    chain are exact, and describe the chain's final decision, a post module's (group thresholds) included. Only
    a batch without them (records written without, read back from the topic) has them recomputed: the scores by
    the scorer (``predict_proba`` of the features it read), the decisions at score >= 0.5 when the scorer is the
    module that decides; when a later module decides (placed post), they are not guessed: the batch raises, and
    the monitor refuses this chain version with a logged error (:meth:`FairnessMonitor.observe_batch`).
    The two that need extra scorer calls are measured on the records of the pipeline-wide sample (``share`` of
    them, chosen by key: :func:`sampled_rows`): the classifier alone, the scorer at 0.5 on the original features (DP and EOpp
    ``before``: exact totals, positives estimated from the sample), and MDP's counterparts. Each sampled row
    counts the ``n / m`` records it stands for, so both stay unbiased in every window.
    """
    view = MonitoredBatch(batch.before, batch.after, batch.s, batch.u, batch.y, out_of_range)
    draws = key_draws(batch.keys)
    view.priority = draws[:, 1]  # OTF's sample, of the chain's scores or of the records' own: by key either way
    scorer = chain.scorer
    if scorer is None:
        return carried_view(view, batch, chain)
    view.score_after = batch.score if batch.score is not None else scorer.predict_proba(batch.after)
    rows, weight = sampled_rows(draws, share)
    if chain.decider is not None:
        view.decision_after = batch.decision if batch.decision is not None else \
            recomputed_decisions(chain, view.score_after)
        view.sampled_before = Sampled(rows, weight, (scorer.predict_proba(batch.before[rows]) >= 0.5).astype(np.int64))
    if chain.matches:
        view.matched_after = ToMatch.of(batch.after, batch.s, batch.u, view.score_after, rows, weight, draws[:, 2])
    return view


def carried_view(view: MonitoredBatch, batch: RepairedBatch, chain: Chain) -> MonitoredBatch:
    """``view`` with the score and decision the records carry, for a chain without a scorer: a monitor-only
    pipeline measures its records' own model (their mapped score and decision), group thresholds alone the
    decisions they made on the records' own scores. Nothing can be recomputed without a scorer: a decider whose
    decisions are missing raises (the monitor refuses this chain version)."""
    if chain.decider is not None and batch.decision is None:
        raise RepairInputError(f"the records carry no decision, and the chain's decisions come from "
                               f"{chain.decider.kind!r}: the monitor reads decisions from the records")
    view.score_after, view.decision_after = batch.score, batch.decision
    return view


def recomputed_decisions(chain: Chain, scores: np.ndarray) -> np.ndarray:
    """The decisions of records that carry none: the scorer's (score >= 0.5) when it decides; never a later
    module's (it may decide per group, or at random by record key), which raises naming that module."""
    if chain.decider is not chain.scorer:
        raise RepairInputError(f"the records carry no decision, and the chain's decisions come from "
                               f"{chain.decider.kind!r} (placed {chain.decider.capabilities.place}), after the "
                               "scorer: the monitor reads decisions from the records and does not recompute them")
    return (scores >= 0.5).astype(np.int64)


@dataclass
class Counted:
    """A batch validated and encoded once for every accumulator (:meth:`BatchStatistics.counted`).

    ``cell`` is each record's (stratum, group) cell, ``u * n_groups + s``; ``bins`` the index of each value's
    count in the flat histogram of every (statistic, stage, feature) column (:attr:`BatchStatistics.bins`);
    ``outside`` whether a value lies outside its E edges (before, then after); ``y`` the labels as 0/1.
    """

    view: MonitoredBatch
    s: EncodedLabels
    u: EncodedLabels
    cell: np.ndarray
    bins: np.ndarray
    outside: np.ndarray
    y: np.ndarray | None

    def take(self, rows: slice) -> "Counted":
        """The rows ``rows`` of every array."""
        return Counted(self.view.take(rows), self.s[rows], self.u[rows], self.cell[rows], self.bins[rows],
                       self.outside[rows], None if self.y is None else self.y[rows])


HISTOGRAMS = (("dependence_e", "before", E_BINS), ("dependence_e", "after", E_BINS), ("w1", "before", W1_BINS),
              ("w1", "after", W1_BINS))
"""The histogram accumulators, in the order of their columns in :attr:`BatchStatistics.bins` (d features each)."""


RATES = (("out_of_range_rate", "before"), ("dp", "label"), ("dp", "after"), ("dp", "before"), ("eopp", "after"),
         ("eopp", "before"))
"""The rate accumulators (:meth:`BatchStatistics._rates`)."""


class BatchStatistics:
    """One accumulator per statistic and stage, filled once per batch and shared by every window.

    A batch is validated and encoded once (:meth:`counted`) and counted for every accumulator together
    (:meth:`of`): the histograms of E and W1, both stages, every feature, in one binning and one ``bincount``
    (:class:`~fairstream.repair.measure.metrics.ColumnBins`: the same bins as a binary search); the rates of DP,
    EOpp and out-of-range from one encoding of the cells. Each accumulator holds exactly the counts its own
    ``update`` would count (the tests compare them). ``statistics`` (default: ``monitor.statistic``) says whether
    MDP and OTF are wanted.
    """

    def __init__(self, chain: Chain, config: PipelineConfig, first: RepairedBatch, statistics: tuple | None = None):
        groups, strata = list(config.groups), list(config.strata)
        statistics = config.monitor.statistics if statistics is None else statistics  # what mdp and otf follow
        self.groups, self.strata = groups, strata
        self.group_classes, self.stratum_classes = configured_labels(groups, "s"), configured_labels(strata, "u")
        self.n_features, self.label = len(config.features), bool(config.label)
        stages = ("before", "after")
        # The configured valid ranges bound the records' own values: those before the repair, and after it when no
        # module writes the features (a repair module maps them elsewhere).
        ranges = config.range_bounds()
        edges = {(stage, bins): stage_edges(chain.repair, X, bins, ranges if stage == "before" or chain.repair is None
                                            else None)
                 for stage, X in (("before", first.before), ("after", first.after)) for bins in (E_BINS, W1_BINS)}
        decided = chain.scorer is not None and chain.decider is not None  # the classifier alone, and the decisions
        # Without a scorer, the decisions after the chain are those the records carry (their own model's, or group
        # thresholds' on their own score): measured after the chain only, as there is no classifier to run before.
        self.decides = decided or (chain.scorer is None and first.decision is not None)
        decision_stages = stages if decided else ("after",) if self.decides else ()
        matched = chain.matches
        if "mdp" in statistics and not matched:
            log.warning("monitor.statistic 'mdp' is configured but the scorer carries no group map: no MDP")
        otf = (chain.scorer is not None or first.score is not None) and "otf" in statistics
        self.match_queue = MatchQueue(chain.scorer, groups, strata) if matched else None
        self.factories = {
            **{("dependence_e", st): functools.partial(HistogramDependenceAccumulator, edges[st, E_BINS], groups, strata)
               for st in stages},
            **{("w1", st): functools.partial(WassersteinAccumulator, edges[st, W1_BINS], groups, strata) for st in stages},
            **({("dp", "label"): lambda: PositiveRateAccumulator(groups, strata)} if config.label else {}),
            **{(name, st): (lambda: DecisionRateAccumulator(groups, strata)) for st in decision_stages
               for name in ("dp", *(("eopp",) if config.label else ()))},
            **({("mdp", "after"): lambda: DeferredMatchedDP(self.match_queue, self.match_queue.empty)}
               if matched else {}),
            # a uniform sample of the window: OTF0 is not a sum over records
            **({("otf", "after"): lambda: OTF0Accumulator(groups, eps=1e-2, max_rows=256)} if otf else {}),
            ("out_of_range_rate", "before"): lambda: RateAccumulator(strata),
        }
        # Fresh copies of one prototype share its settings (edges, labels), so merging them skips
        # comparing those arrays element by element.
        self.prototypes = {key: factory() for key, factory in self.factories.items()}
        self.factories = {key: prototype.fresh for key, prototype in self.prototypes.items()}
        self.bins = ColumnBins([e for name, stage, bins in HISTOGRAMS for e in edges[stage, bins]])
        self.n_cells = len(groups) * len(strata)
        sizes = self.n_cells * self.bins.n_bins  # the counts of one column: (stratum, group, bin)
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.intp)
        e_edges = edges["before", E_BINS] + edges["after", E_BINS]
        self.e_range = np.array([e[0] for e in e_edges]), np.array([e[-1] for e in e_edges])

    def labels(self, batch: MonitoredBatch) -> tuple[EncodedLabels, EncodedLabels]:
        """The batch's groups and strata encoded once for every accumulator (slices of them stay encoded)."""
        return (EncodedLabels.in_classes(batch.s, self.group_classes, "s"),
                EncodedLabels.in_classes(batch.u, self.stratum_classes, "u"))

    def counted(self, batch: MonitoredBatch) -> Counted:
        """The batch validated (features finite, labels known and binary) and encoded once for :meth:`of`."""
        s, u = self.labels(batch)
        before = features(batch.before, n_features=self.n_features)
        after = features(batch.after, n_features=self.n_features)
        cell = u.view(np.ndarray) * len(self.groups) + s.view(np.ndarray)
        X = np.concatenate([before, after], axis=1)
        codes = self.bins.codes(np.concatenate([X, X], axis=1))
        codes += cell[:, None] * self.bins.n_bins + self.offsets[:-1]
        outside = (X < self.e_range[0]) | (X > self.e_range[1])
        y = as_binary(batch.y, len(cell)) if self.label and batch.y is not None else None
        return Counted(batch, s, u, cell, codes, outside, y)

    def of(self, batch: Counted, keys=None, rows: slice | None = None) -> dict:
        """The accumulators of the batch (of its ``rows`` only, if given), or only those of ``keys``; ``batch``:
        :meth:`counted`."""
        wanted = self.prototypes.keys() if keys is None else [key for key in keys if key in self.prototypes]
        new = self._histograms(batch, wanted, slice(None) if rows is None else rows)
        if rows is not None and any(key not in new for key in wanted):  # the others need a piece of every array
            batch = batch.take(rows)
        new.update(self._rates(batch, wanted))
        view = batch.view
        if ("mdp", "after") in wanted:
            new["mdp", "after"] = self.factories["mdp", "after"]().update(view.matched_after)
        if ("otf", "after") in wanted:
            new["otf", "after"] = self.factories["otf", "after"]().update(view.score_after, view.after, view.s,
                                                                          priority=view.priority)
        return new

    def _histograms(self, batch: Counted, wanted, rows: slice) -> dict:
        """E's and W1's accumulators of both stages for the batch ``rows``, from one ``bincount`` of every value's
        count index."""
        keys = [(name, stage) for name, stage, _ in HISTOGRAMS]
        if not any(key in wanted for key in keys):
            return {}
        d = self.n_features
        wanted_columns = [k for h, key in enumerate(keys) if key in wanted for k in range(h * d, (h + 1) * d)]
        values = batch.bins[rows] if len(wanted_columns) == len(keys) * d else batch.bins[rows, wanted_columns]
        counts = np.bincount(values.ravel(), minlength=self.offsets[-1])
        shapes = [(len(self.strata), len(self.groups), int(n)) for n in self.bins.n_bins]
        columns = [counts[a:b].reshape(shape) for a, b, shape in zip(self.offsets[:-1], self.offsets[1:], shapes)]
        new = {}
        for h, key in enumerate(keys):
            if key not in wanted:
                continue
            counts_ = columns[h * d:(h + 1) * d]
            if key[0] == "dependence_e":
                new[key] = self.prototypes[key]._of_counts(counts_=counts_,
                                                           out_of_range_=self._outside(batch, h, rows))
            else:
                new[key] = self.prototypes[key]._of_counts(counts_=counts_)
        return new

    def _outside(self, batch: Counted, stage: int, rows: slice) -> np.ndarray:
        """Records of ``rows`` outside the E edges per (stratum, feature) of stage 0 (before) or 1 (after)."""
        d, n_strata = self.n_features, len(self.strata)
        index = np.arange(d) * n_strata + batch.u.view(np.ndarray)[rows, None]
        outside = batch.outside[rows, stage * d:(stage + 1) * d]
        counts = np.bincount(index.ravel(), weights=outside.ravel(), minlength=d * n_strata)
        return np.ascontiguousarray(counts.astype(np.int64).reshape(d, n_strata).T)

    def _rates(self, batch: Counted, wanted) -> dict:
        """DP of the label, DP and EOpp (among y = 1) of the chain's decisions (every record) and of the classifier
        alone (a sample), and the out-of-range rate, all from the batch's cells."""
        view, cell, size, new = batch.view, batch.cell, self.n_cells, {}
        if not any(key in wanted for key in RATES):
            return new
        shape = (len(self.strata), len(self.groups))
        totals = np.bincount(cell, minlength=size).reshape(shape)
        if ("out_of_range_rate", "before") in wanted:
            flags = view.out_of_range
            flags = flags if flags.dtype == bool else as_binary(flags, len(cell), "flags")
            flagged = np.bincount(batch.u.view(np.ndarray), weights=flags, minlength=len(self.strata))
            new["out_of_range_rate", "before"] = self.prototypes["out_of_range_rate", "before"]._of_counts(
                flagged_=flagged.astype(np.int64), totals_=totals.sum(axis=1))
        if ("dp", "label") in wanted and batch.y is not None:
            positives = np.bincount(cell, weights=batch.y, minlength=size).astype(np.int64).reshape(shape)
            new["dp", "label"] = self.prototypes["dp", "label"]._of_counts(positives_=positives, totals_=totals)
        if not self.decides:  # no decisions
            return new
        if view.decision_after is None:
            raise RepairInputError("the records of this batch carry no decision, those of the first batch did")
        sample = view.sampled_before  # the classifier alone: None without a scorer (the records' own decisions)
        labelled = batch.y == 1 if batch.y is not None else None  # a batch without labels says nothing about EOpp
        among = None if labelled is None else np.bincount(cell[labelled], minlength=size).reshape(shape)
        after = check_decisions(view.decision_after)
        stages = [("after", cell, lambda: 1.0 * after, lambda: 1.0 * after * labelled)]
        if sample is not None:
            rows, before = sample.rows, check_decisions(sample.decisions)
            stages.append(("before", cell[rows], lambda: sample.weight * before,
                           lambda: sample.weight * before * labelled[rows]))
        for stage, cells, positive, labelled_positive in stages:
            # float: weighted positives (numpy's bincount of no rows gives int64 even with weights)
            if ("dp", stage) in wanted:
                new["dp", stage] = self.prototypes["dp", stage]._of_counts(
                    positives_=np.bincount(cells, positive(), size).astype(np.float64).reshape(shape), totals_=totals)
            if ("eopp", stage) in wanted and among is not None:
                new["eopp", stage] = self.prototypes["eopp", stage]._of_counts(
                    positives_=np.bincount(cells, labelled_positive(), size).astype(np.float64).reshape(shape),
                    totals_=among)
        return new


def slice_of(ts: np.ndarray, seconds: float) -> np.ndarray:
    """The event-time slice of each record: ``floor(ts / seconds)``, the unit of the pipeline's windows."""
    return np.floor(np.asarray(ts, dtype=np.float64) / seconds).astype(np.int64)


def in_slices(batch: RepairedBatch, seconds: float) -> tuple[RepairedBatch, np.ndarray]:
    """The batch with its records in slice order (stable: a batch within one slice is unchanged) and each record's
    slice; statistics do not depend on the order of a batch's records."""
    slices = slice_of(batch.ts, seconds)
    if len(slices) > 1 and (np.diff(slices) < 0).any():
        order = np.argsort(slices, kind="stable")
        batch, slices = batch.take(order), slices[order]
    return batch, slices


def cuts(n: int, chunker: Chunker | None, slices: np.ndarray | None) -> list[slice]:
    """The pieces of a batch of ``n`` rows: cut at the detectors' chunk boundaries (``chunker``) and where the slice
    changes (``slices``, sorted), or one piece."""
    bounds = {0, n}
    if chunker is not None:
        bounds.update(piece.stop for piece in chunker.pieces(n))
    if slices is not None:
        bounds.update((np.flatnonzero(np.diff(slices)) + 1).tolist())
    ends = sorted(bounds)
    return [slice(a, b) for a, b in zip(ends[:-1], ends[1:])]


class FairnessMonitor:
    """Windows and drift detection for the record chain's versions in use; gauges via ``rows``.

    ``role`` says whose chain it measures in the log: ``"active"`` (the serving chain) or ``"candidate"`` (a candidate
    chain in shadow, whose versions are not the ones serving).

    Parameters
    ----------
    config : PipelineConfig
        The pipeline: its features, groups, strata, chain and ``[monitor]`` settings.
    clock : callable, default=time.time
        Returns the current time in seconds (for the time windows).
    role : {"active", "candidate"}, default="active"
        Whose chain the monitor measures.
    detect : bool, default=True
        Run the drift detectors (the monitoring agent's, on the pipeline's slices); a worker's monitor only counts.
    sink : callable or None, default=None
        ``sink(monitor, slice, records, accumulators)`` receives each batch's accumulators cut at its records'
        event-time slices (a worker's :class:`~fairstream.streams.worker.partials.PartialAggregates`).
    windows : bool, default=True
        Keep the count and time windows (and so rows and gauges); False: only count for the ``sink``.
    """

    def __init__(self, config: PipelineConfig, clock: Callable[[], float] = time.time, role: str = "active",
                 detect: bool = True, sink: Callable | None = None, windows: bool = True):
        self.config, self.monitor, self.clock, self.role = config, config.monitor, clock, role
        self.detect, self.sink, self.keep_windows = detect, sink, windows
        self.version: int | None = None
        self.chain_key: tuple | None = None
        self.refused: tuple | None = None  # the chain whose statistics could not be measured (see observe_batch)
        self.skipped = 0  # records of other versions (observe)
        self.unreadable = 0  # values of the topic that are not readable repaired records (observe)
        self.unmeasured = 0  # records of a refused chain

    def _start(self, chain: Chain, first: RepairedBatch) -> None:
        self._start_windows(chain.key, chain.version, BatchStatistics(chain, self.config, first))

    def _start_windows(self, key: tuple, version: int, statistics) -> None:
        """Fresh windows and detectors for the chain ``key`` whose accumulators ``statistics.factories`` makes."""
        m = self.monitor
        self.chain_key, self.version, self.refused = key, version, None
        self.statistics = statistics
        features = list(self.config.features)
        self.windows = {
            "count": StatisticWindows(lambda: BatchWindow(records=m.window_records, buckets=m.buckets), self.statistics,
                                      features),
            "time": StatisticWindows(lambda: BatchWindow(seconds=m.window_seconds, buckets=m.buckets), self.statistics,
                                     features),
        }
        self.chunker = Chunker(m.window_records)
        self.trackers = [DriftTracker(name, m, self.clock) for name in m.statistics] if self.detect else []
        self.detected = {DETECTED[name][0] for name in m.statistics}  # the accumulators the detectors read
        log.info("monitoring %s%s", chain_text(key),
                 "" if self.role == "active" else f" ({self.role} chain, in shadow)")

    def observe(self, values: list[bytes], *actives) -> list[DriftEvent]:
        """Update every window with ``records.repaired`` values made by the chain ``actives``; returns drift events."""
        chain = as_chain(actives)
        batch = decode_repaired(values, self.config)
        self.unreadable += batch.unreadable
        mine = np.flatnonzero(batch.versions == chain.version)
        self.skipped += len(batch) - len(mine)
        return self.observe_batch(batch.take(mine), *chain.actives) if len(mine) else []

    def observe_batch(self, batch: RepairedBatch, *actives) -> list[DriftEvent]:
        """Update every window with the arrays of a batch that went through the chain ``actives``, in order.

        Never raises: a batch that makes a statistic raise (an artifact or data the monitor cannot measure)
        ends the monitoring of this chain (:meth:`_refuse`); its records are then only counted (``unmeasured``)
        until another chain version arrives. The worker goes on repairing either way.

        Parameters
        ----------
        batch : RepairedBatch
            The delivered batch, as arrays (see ``streams/codec/repaired.py``).
        *actives : Active
            The chain's active artifacts, in chain order.

        Returns
        -------
        list of DriftEvent
            The drift events this batch confirmed (usually empty).
        """
        chain = as_chain(actives)
        if len(batch.s) == 0:
            return []
        if chain.key == self.refused:
            self.unmeasured += len(batch.s)
            return []
        try:
            return self._observe(batch, chain)
        except Exception as exc:  # the monitor only watches: whatever it cannot measure must not stop the worker
            self._refuse(chain.key, exc)
            self.unmeasured += len(batch.s)
            return []

    def _refuse(self, key: tuple, exc: Exception) -> None:
        log.error("the fairness monitor cannot measure %s (%s: %s): no statistics for this chain version until "
                  "another one is served; records are still repaired",
                  chain_text(key), type(exc).__name__, str(exc)[:300],
                  exc_info=exc)
        self.refused, self.chain_key, self.version = key, None, None  # rows() and statistic() say nothing

    def _observe(self, batch: RepairedBatch, chain: Chain) -> list[DriftEvent]:
        if self.chain_key != chain.key:  # a new version of any module: fresh windows and detectors
            self._start(chain, batch)
        slices = None
        if self.sink is not None:  # the batch in slice order: each slice's records one run of rows
            batch, slices = in_slices(batch, self.monitor.slice_seconds)
        view = monitored_batch(batch, chain, outside_fitted_range(batch, chain), self.monitor.sample_share)
        pieces = cuts(len(view), self.chunker if self.detect else None, slices)
        accumulators, parts = self._accumulators(view, pieces, every=slices is not None)
        if slices is not None:
            for piece, part in zip(pieces, parts):
                self.sink(self, int(slices[piece.start]), piece.stop - piece.start, part)
        queue = self.statistics.match_queue
        if queue is not None and queue.n_rows >= MATCH_ROWS:  # no window read for a while: bound what waits
            queue.match()
        return self._add(accumulators, len(view), float(np.max(batch.ts)), zip(pieces, parts))

    def _add(self, accumulators: dict, n_records: int, ts: float, parts) -> list[DriftEvent]:
        """Add a batch's accumulators to both windows and its ``parts`` ((rows, accumulators) per piece) to the
        detectors' chunks; returns the drift events it confirmed."""
        if self.keep_windows:
            for windows in self.windows.values():
                windows.add(accumulators, n_records, ts=ts)
        if not self.trackers:
            return []
        for piece, part in parts:
            chunk = self.chunker.add(part, piece.stop - piece.start)
            if chunk is not None:
                for tracker in self.trackers:
                    tracker.feed_chunk(chunk)
        return [DriftEvent(tracker.statistic, self.monitor.detector, tracker.value, self.version, self.clock())
                for tracker in self.trackers
                if tracker.confirm(n_records, functools.partial(self.statistic, "count", tracker.statistic))]

    def observe_counts(self, key: tuple, version: int, statistics, accumulators: dict, n_records: int,
                       ts: float, detect: bool = True) -> list[DriftEvent]:
        """Update every window (and the detectors) with accumulators counted elsewhere: the monitoring agent's closed
        slices, one slice one batch. Never raises, like :meth:`observe_batch`.

        Parameters
        ----------
        key : tuple
            The chain's versions (a new key starts fresh windows and detectors).
        version : int
            The chain's first module's version (what drift events are about).
        statistics : object
            Its ``factories`` ((statistic, stage) -> a fresh accumulator) make the windows' accumulators.
        accumulators : dict
            (statistic, stage) -> the slice's accumulator.
        n_records : int
            Records in the slice.
        ts : float
            The slice's time (its end), for the time window.
        detect : bool, default=True
            Feed the detectors too (a late slice joins the windows only).

        Returns
        -------
        list of DriftEvent
            The drift events this slice confirmed (usually empty).
        """
        if key == self.refused or n_records == 0:
            return []
        try:
            if self.chain_key != key:
                self._start_windows(key, version, statistics)
            parts = [(slice(0, n_records), accumulators)] if detect else []
            return self._add(accumulators, n_records, ts, parts)
        except Exception as exc:  # the agent only watches: whatever it cannot measure must not stop it
            self._refuse(key, exc)
            return []

    def _accumulators(self, view: MonitoredBatch, pieces: list[slice], every: bool = False) -> tuple[dict, list[dict]]:
        """The batch's accumulators, and those of each piece it was cut into (at chunk and slice boundaries).

        A batch of one piece is counted once. One that spans boundaries is counted piece by piece: every statistic
        (``every``: each piece goes to its slice's partial aggregate) or only the monitored ones (the detectors'
        chunks), merged into the batch's; the other statistics once for the whole batch.
        """
        counted = self.statistics.counted(view)
        if len(pieces) == 1:
            accumulators = self.statistics.of(counted)
            return accumulators, [accumulators]
        keys = None if every else self.detected
        parts = [self.statistics.of(counted, keys, piece) for piece in pieces]
        accumulators = {} if every else self.statistics.of(counted, self.statistics.factories.keys() - self.detected)
        for key in parts[0]:
            accumulators[key] = functools.reduce(lambda a, b: a.merge(b), (part[key] for part in parts))
        return accumulators, parts

    def rows(self, window: str = "count", statistic: str | None = None) -> list[tuple]:
        """Gauge rows of one window (of one statistic), or [] while it holds fewer than ``min_records`` records.

        Parameters
        ----------
        window : {"count", "time"}, default="count"
            The window to read.
        statistic : str or None, default=None
            One statistic's rows; None reads every statistic's.

        Returns
        -------
        list of tuple
            One tuple of gauge label values per row, the statistic's value last.
        """
        if self.version is None or self.windows[window].n_records < self.monitor.min_records:
            return []
        try:
            return [row for row in self.windows[window].rows(statistic) if np.isfinite(row[-1])]
        except Exception as exc:  # read by the gauge export after each batch: it must not stop the worker either
            self._refuse(self.chain_key, exc)
            return []

    def statistic(self, window: str = "count", name: str | None = None) -> float | None:
        """A detector's statistic (default: the first configured) after the chain, all strata, over a window.

        Parameters
        ----------
        window : {"count", "time"}, default="count"
            The window to read.
        name : str or None, default=None
            A statistic of ``STATISTICS``; None is the first configured.

        Returns
        -------
        float or None
            The statistic's value (0 is fair), or None while the window holds too few records.
        """
        if self.version is None or self.windows[window].n_records < self.monitor.min_records:
            return None
        try:
            return self.windows[window].detector_value(name or self.monitor.statistics[0])
        except Exception as exc:  # a read may match MDP's waiting samples: it must not stop the worker either
            self._refuse(self.chain_key, exc)
            return None


def export_fairness(monitor: FairnessMonitor, metrics: PipelineMetrics, role: str = "active",
                    scope: str = "worker", left_out: tuple = ()) -> None:
    """Set the fairness gauges of the ``role`` chain from both windows, as the pipeline's figures or one worker's
    (``scope``). A window below min_records exports nothing; one that lacks a group's records exports its
    unmeasurable statistics as such (:func:`~.gauge_rows.measurable`); statistics named in ``left_out`` (the agent's:
    some worker's counts of them could not be added) are not exported, and say so (group ``all``, reason
    ``bins_differ``); the window sizes are the active chain's."""
    for window in ("count", "time"):
        windows = monitor.windows[window] if monitor.version is not None else None
        if role == "active":
            metrics.window_records.labels(window, scope).set(windows.n_records if windows is not None else 0)
        rows = [row for row in monitor.rows(window) if row[0] not in left_out]
        records = windows.group_records() if windows is not None and windows.n_records else None
        kept, short = measurable(rows, records if rows else None, monitor.monitor.min_group_records)
        if left_out and rows:
            short = {**short, "all": "bins_differ"}
        metrics.replace_fairness(role, scope, window, kept, short, records)
