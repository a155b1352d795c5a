"""The fairness monitor: sliding-window statistics of the repaired stream, drift detection, gauges.

It watches exactly what the record agent writes to ``records.repaired``: in a worker the agent hands
each delivered batch over as arrays (original and repaired features of the same records), so the
monitor costs a few vectorised calls per batch and no second pass of Faust's per-message machinery;
a standalone reader of the topic can feed it raw values instead (:meth:`FairnessMonitor.observe`).
It keeps, for the plan version in use and per stratum, over a count window and a time window:

- ``dependence_e`` and ``w1`` between groups, per feature, before and after repair (fixed bins
  from the plan's grid range, so the numbers are comparable across windows);
- ``dp_difference``, ``dp_ratio`` and ``conditional_dp`` of the label (stage ``label``) and, when a
  ``scorer`` artifact is active, of its decisions before and after repair;
- ``mdp``: matched demographic parity (Kim et al., Fairness Through Matching (2024)), mean |f(x) - f(T(x))| of the scorer f with the
  plan's frozen monotone map T between groups, before repair and after it (f(x') against
  f(R(T(x))), the repaired image of the matched counterpart);
- ``out_of_range_rate`` of the plan (original values outside its grid).

Every update is a handful of vectorised calls per batch; reading a window merges its buckets.
One statistic (``monitor.statistic``, after repair) also feeds a river drift detector in chunks
of ``window_records / 16`` records. Hysteresis turns detector hits into one drift event per
shift: an event needs the windowed statistic above ``monitor.threshold`` and the monitor armed;
it re-arms once the statistic is back below the threshold, or after ``cooldown_seconds``.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np
from river import drift

from fairstream.repair.measure.accumulators import (
    EncodedLabels,
    HistogramDependenceAccumulator,
    MatchedGapAccumulator,
    PositiveRateAccumulator,
    RateAccumulator,
    WassersteinAccumulator,
)
from fairstream.repair.measure.matching import matched_counterparts
from fairstream.repair.measure.windows import BatchWindow
from fairstream.streams.codec import RepairedBatch, decode_repaired
from fairstream.streams.config import MonitorConfig, PipelineConfig

log = logging.getLogger(__name__)

E_BINS, W1_BINS = 20, 200  # 20 bins: a small finite-sample bias (about 0.04 at 8000 Adult records)


@dataclass(frozen=True)
class DriftEvent:
    """A confirmed drift of the monitored statistic (one per shift, after hysteresis)."""
    statistic: str
    detector: str
    value: float  # the windowed statistic when the event fired
    version: int  # plan version in use
    ts: float


def plan_edges(plan, bins: int) -> list[np.ndarray]:
    """Fixed equal-width bins per feature over the plan's grid range (all strata)."""
    lo = plan.grid_start_.min(axis=0)
    hi = plan.grid_stop_.max(axis=0)
    return [np.linspace(a, b if b > a else a + 1.0, bins + 1) for a, b in zip(lo, hi)]


def make_detector(name: str):
    """A river drift detector tuned for a statistic scaled so that the alert threshold is 1."""
    if name == "adwin":
        return drift.ADWIN(delta=0.002, clock=4)
    if name == "page_hinkley":
        return drift.PageHinkley(min_instances=10, delta=0.1, threshold=3.0, mode="up")
    return drift.KSWIN(alpha=0.001, window_size=60, stat_size=20, seed=0)


class Scores:
    """What the scorer says about one batch before and after repair, and about matched counterparts (DP, MDP)."""

    def __init__(self, batch: RepairedBatch, plan, scorer, groups: tuple):
        self.decisions_before = scorer.decision(batch.before)
        self.decisions_after = scorer.decision(batch.after)
        matched, matched_group = matched_counterparts(batch.before, batch.s, batch.u, groups, plan.transport_map)
        self.f_before = scorer.predict_proba(batch.before)
        self.f_matched_before = scorer.predict_proba(matched)
        self.f_after = scorer.predict_proba(batch.after)
        counterpart = plan.repair(matched, matched_group, batch.u, keys=batch.keys).values
        self.f_matched_after = scorer.predict_proba(counterpart)


class BatchStatistics:
    """One accumulator per statistic and stage, filled once per batch and shared by every window."""

    def __init__(self, plan, config: PipelineConfig, with_scorer: bool):
        groups, strata = list(config.groups), list(config.strata)
        self.groups, self.strata = groups, strata
        e_edges, w_edges = plan_edges(plan, E_BINS), plan_edges(plan, W1_BINS)
        stages = ("before", "after")
        self.factories = {
            **{("dependence_e", st): (lambda: HistogramDependenceAccumulator(e_edges, groups, strata)) for st in stages},
            **{("w1", st): (lambda: WassersteinAccumulator(w_edges, groups, strata)) for st in stages},
            **({("dp", "label"): lambda: PositiveRateAccumulator(groups, strata)} if config.label else {}),
            **{("dp", st): (lambda: PositiveRateAccumulator(groups, strata)) for st in (stages if with_scorer else ())},
            **{("mdp", st): (lambda: MatchedGapAccumulator(strata)) for st in (stages if with_scorer else ())},
            ("out_of_range_rate", "before"): lambda: RateAccumulator(strata),
        }
        # Fresh copies of one prototype share its settings (edges, labels), so merging them skips
        # comparing those arrays element by element.
        prototypes = {key: factory() for key, factory in self.factories.items()}
        self.factories = {key: prototype.fresh for key, prototype in prototypes.items()}

    def of(self, batch: RepairedBatch, out_of_range: np.ndarray, scores: Scores | None) -> dict:
        """The batch's accumulators (labels encoded once, not once per accumulator)."""
        s, u = EncodedLabels.encode(batch.s, self.groups, "s"), EncodedLabels.encode(batch.u, self.strata, "u")
        self.encoded = s, u  # the drift tracker reuses them
        new = {key: factory() for key, factory in self.factories.items()}
        for stage, X in (("before", batch.before), ("after", batch.after)):
            new["dependence_e", stage].update(X, s, u)
            new["w1", stage].update(X, s, u)
        if ("dp", "label") in new:
            if batch.y is not None:
                new["dp", "label"].update(batch.y, s, u)
            else:
                del new["dp", "label"]
        if scores is not None and ("dp", "before") in new:
            new["dp", "before"].update(scores.decisions_before, s, u)
            new["dp", "after"].update(scores.decisions_after, s, u)
            new["mdp", "before"].update(scores.f_before, scores.f_matched_before, u)
            new["mdp", "after"].update(scores.f_after, scores.f_matched_after, u)
        new["out_of_range_rate", "before"].update(out_of_range, u)
        return new


class StatisticWindows:
    """Every statistic's window of one kind (count or time) for one plan version."""

    def __init__(self, make_window: Callable[[], BatchWindow], statistics: BatchStatistics, features: list):
        self.windows = {key: make_window() for key in statistics.factories}
        self.features = features

    def add(self, accumulators: dict, n_records: int, ts: float) -> None:
        """Add one batch's accumulators."""
        for key, accumulator in accumulators.items():
            self.windows[key].add(accumulator, n_records, ts=ts)

    @property
    def n_records(self) -> int:
        """Records in the window now."""
        return self.windows["out_of_range_rate", "before"].n_records

    def _values(self, statistic: str, stages) -> dict:
        return {stage: window.value() for (name, stage), window in self.windows.items()
                if name == statistic and window.n_records and (stages is None or stage in stages)}

    def detector_value(self, statistic: str) -> float | None:
        """``statistic`` after repair over all strata and features: the one value read every batch."""
        for row in self.rows(statistic, stages=("after",)):
            if row[1:5] == ("after", "all", "all", "all") and np.isfinite(row[-1]):
                return float(row[-1])
        return None

    def rows(self, statistic: str | None = None, stages=None) -> Iterable[tuple[str, str, str, str, str, float]]:
        """(statistic, stage, stratum, feature, group_pair, value) for every gauge, or for one statistic."""
        for names, rows in self._row_makers():
            if statistic is None or statistic in names:
                yield from (row for row in rows(stages) if statistic is None or row[0] == statistic)

    def _row_makers(self):
        # Each maker reads only its own windows: the detector's statistic is computed every batch,
        # the rest once a second for the gauges.
        return [(("dependence_e",), self._e_rows), (("w1",), self._w1_rows),
                (("dp_difference", "dp_ratio", "conditional_dp"), self._dp_rows), (("mdp",), self._mdp_rows),
                (("out_of_range_rate",), self._oor_rows)]

    def _e_rows(self, stages=None):
        for stage, r in self._values("dependence_e", stages).items():
            yield from _per_stratum_feature("dependence_e", stage, r.strata, self.features, r.per_stratum, "all")
            yield from (("dependence_e", stage, "all", f, "all", v) for f, v in zip(self.features, r.per_feature))
            yield "dependence_e", stage, "all", "all", "all", r.total

    def _w1_rows(self, stages=None):
        for stage, r in self._values("w1", stages).items():
            for j, p, k in itertools.product(range(len(r.strata)), range(len(r.pairs)), range(len(self.features))):
                yield "w1", stage, str(r.strata[j]), self.features[k], "-".join(map(str, r.pairs[p])), r.per_pair[j, p, k]
            yield from (("w1", stage, "all", f, "all", v) for f, v in zip(self.features, r.per_feature))

    def _dp_rows(self, stages=None):
        for stage, r in self._values("dp", stages).items():
            yield "dp_difference", stage, "all", "all", "all", r.difference
            yield "dp_ratio", stage, "all", "all", "all", r.ratio
            yield "conditional_dp", stage, "all", "all", "all", r.conditional_difference
            yield from (("dp_difference", stage, str(a), "all", "all", v) for a, v in zip(r.strata, r.stratum_difference))

    def _mdp_rows(self, stages=None):
        for stage, r in self._values("mdp", stages).items():
            yield from (("mdp", stage, str(a), "all", "all", v) for a, v in zip(r.strata, r.per_stratum))
            yield "mdp", stage, "all", "all", "all", r.overall

    def _oor_rows(self, stages=None):
        for _, r in self._values("out_of_range_rate", stages).items():
            yield from (("out_of_range_rate", "before", str(a), "all", "all", v) for a, v in zip(r.strata, r.per_stratum))
            yield "out_of_range_rate", "before", "all", "all", "all", r.overall


def _per_stratum_feature(statistic, stage, strata, features, values, pair):
    for j, k in itertools.product(range(len(strata)), range(len(features))):
        yield statistic, stage, str(strata[j]), features[k], pair, values[j, k]


class DriftTracker:
    """River detector on chunks of the after-repair statistic, with hysteresis (one event per shift)."""

    def __init__(self, monitor: MonitorConfig, new_chunk: Callable, clock: Callable[[], float]):
        self.monitor, self.clock = monitor, clock
        self.detector = make_detector(monitor.detector)
        # 16 chunks per window: enough detector samples before a shift (ADWIN needs a few dozen)
        # while each chunk's E stays well above its own estimation noise. Chunks are cut from the
        # records, not from batches, so the detector's sensitivity does not depend on batch size.
        self.chunk_size = max(50, monitor.window_records // 16)
        self._new_chunk = new_chunk
        self.chunk, self.chunk_records = new_chunk(), 0
        self.armed, self.last_event = True, -np.inf
        self.pending = 0  # records left during which a detector hit waits for the window to confirm it

    def _feed_detector(self) -> None:
        # Scaled so that the alert threshold is 1: the detectors' parameters are absolute.
        self.detector.update(self.chunk.value().total / self.monitor.threshold)
        self.chunk, self.chunk_records = self._new_chunk(), 0
        if self.detector.drift_detected:
            # The detector sees a shift within a few chunks; the window needs longer to cross the
            # threshold, so the hit waits (at most one window of records) for that confirmation.
            self.pending = self.monitor.window_records

    def update(self, after: np.ndarray, s: np.ndarray, u: np.ndarray, window_value: float) -> bool:
        """Feed a batch's repaired rows and labels; True when a drift event is confirmed."""
        self.pending = max(self.pending - len(s), 0)
        if window_value < self.monitor.threshold:
            self.armed = True
        start = 0
        while start < len(s):  # cut the batch at chunk boundaries
            stop = start + min(self.chunk_size - self.chunk_records, len(s) - start)
            self.chunk.update(after[start:stop], s[start:stop], u[start:stop])
            self.chunk_records += stop - start
            start = stop
            if self.chunk_records == self.chunk_size:
                self._feed_detector()
        now = self.clock()
        cooled = now - self.last_event >= self.monitor.cooldown_seconds
        if self.pending and window_value > self.monitor.threshold and (self.armed or cooled):
            self.armed, self.last_event, self.pending = False, now, 0
            return True
        return False


class FairnessMonitor:
    """Windows and drift detection for the plan version in use; gauges via ``export``."""

    def __init__(self, config: PipelineConfig, clock: Callable[[], float] = time.time):
        self.config, self.monitor, self.clock = config, config.monitor, clock
        self.version: int | None = None
        self.skipped = 0

    def _start(self, plan_active, with_scorer: bool) -> None:
        m, plan = self.monitor, plan_active.module
        self.version, self.with_scorer = plan_active.version, with_scorer
        self.statistics = BatchStatistics(plan, self.config, with_scorer)
        features = list(self.config.features)
        self.windows = {
            "count": StatisticWindows(lambda: BatchWindow(records=m.window_records, buckets=m.buckets), self.statistics,
                                      features),
            "time": StatisticWindows(lambda: BatchWindow(seconds=m.window_seconds, buckets=m.buckets), self.statistics,
                                     features),
        }
        self.tracker = DriftTracker(m, self.statistics.factories["dependence_e", "after"], self.clock)
        log.info("monitoring plan version %s (scorer: %s)", self.version, with_scorer)

    def observe(self, values: list[bytes], plan_active, scorer_active=None) -> list[DriftEvent]:
        """Update every window with a batch of ``records.repaired`` values; returns confirmed drift events."""
        self._follow(plan_active, scorer_active)
        batch = decode_repaired(values, self.config)
        mine = np.flatnonzero(batch.versions == self.version)
        self.skipped += len(batch) - len(mine)
        return self.observe_batch(batch.take(mine), plan_active, scorer_active) if len(mine) else []

    def _follow(self, plan_active, scorer_active) -> None:
        if self.version != plan_active.version or self.with_scorer != (scorer_active is not None):
            self._start(plan_active, scorer_active is not None)

    def observe_batch(self, batch: RepairedBatch, plan_active, scorer_active=None) -> list[DriftEvent]:
        """Update every window with the arrays of a batch repaired by ``plan_active``."""
        self._follow(plan_active, scorer_active)
        if len(batch.s) == 0:
            return []
        plan = plan_active.module
        scores = Scores(batch, plan, scorer_active.module, tuple(self.config.groups)) if scorer_active else None
        out_of_range = batch.out_of_range if batch.out_of_range is not None else self._out_of_range(batch, plan)
        accumulators = self.statistics.of(batch, out_of_range, scores)
        self.windows["count"].add(accumulators, len(batch), ts=float(np.max(batch.ts)))
        self.windows["time"].add(accumulators, len(batch), ts=float(np.max(batch.ts)))
        value = self.statistic("count")
        s, u = self.statistics.encoded
        if value is not None and self.tracker.update(batch.after, s, u, value):
            return [DriftEvent(self.monitor.statistic, self.monitor.detector, value, self.version, self.clock())]
        return []

    @staticmethod
    def _out_of_range(batch: RepairedBatch, plan) -> np.ndarray:
        codes = np.searchsorted(plan.strata_, batch.u)
        codes = np.clip(codes, 0, len(plan.strata_) - 1)
        return ((batch.before < plan.grid_start_[codes]) | (batch.before > plan.grid_stop_[codes])).any(axis=1)

    def rows(self, window: str = "count", statistic: str | None = None) -> list[tuple]:
        """Gauge rows of one window (of one statistic), or [] while it holds fewer than ``min_records`` records."""
        if self.version is None or self.windows[window].n_records < self.monitor.min_records:
            return []
        return [row for row in self.windows[window].rows(statistic) if np.isfinite(row[-1])]

    def statistic(self, window: str = "count") -> float | None:
        """The detector's statistic (after repair, all strata and features) over a window."""
        if self.version is None or self.windows[window].n_records < self.monitor.min_records:
            return None
        return self.windows[window].detector_value(self.monitor.statistic)
