"""Drift detection of the monitor's statistics: river detectors on chunks of records, with hysteresis.

Each statistic named in ``monitor.statistic`` (after the chain) feeds its own river drift detector
(:class:`DriftTracker`) in chunks of ``window_records / 16`` records (:class:`Chunker`). Hysteresis turns
detector hits into one drift event per shift: an event needs the windowed statistic above its
``monitor.threshold`` and its detector armed; it re-arms once the statistic is back below the threshold, or
after ``cooldown_seconds``. The statistics themselves are measured by :mod:`.monitor`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from river import drift

from fairstream.streams.config import MonitorConfig

DETECTED: dict[str, tuple[tuple[str, str], Callable]] = {
    "dependence_e": (("dependence_e", "after"), lambda r: r.total),
    "w1": (("w1", "after"), lambda r: float(np.mean(r.per_feature))),
    "dp_difference": (("dp", "after"), lambda r: r.difference),
    "dp_ratio": (("dp", "after"), lambda r: 1.0 - r.ratio),  # higher is less fair, like every other one
    "conditional_dp": (("dp", "after"), lambda r: r.conditional_difference),
    "eopp": (("eopp", "after"), lambda r: r.difference),
    "mdp": (("mdp", "after"), lambda r: r.overall),
    "otf": (("otf", "after"), lambda r: np.nan if r is None else r.value),
}
"""Statistic a detector can watch -> (the accumulator it reads, its scalar after the chain, all strata)."""


@dataclass(frozen=True)
class DriftEvent:
    """A confirmed drift of a monitored statistic (one per shift, after hysteresis)."""
    statistic: str
    detector: str
    value: float  # the windowed statistic when the event fired
    version: int  # version of the chain's first module in use
    ts: float


DETECTOR_SCALE = 4.0
"""Chunk values reach a detector scaled so that the alert threshold is this. River's ADWIN bound has a
term that does not shrink with the variance (it assumes values in [0, 1]), so on the few dozen
chunks a window gives it misses a jump from half the threshold to 1.5 times it at scale 1; at 4 it
sees it within a few chunks. Hysteresis still needs the window above the threshold for an event."""


def make_detector(name: str):
    """A river drift detector tuned for a statistic scaled so that the alert threshold is ``DETECTOR_SCALE``."""
    if name == "adwin":
        return drift.ADWIN(delta=0.002, clock=4)
    if name == "page_hinkley":
        return drift.PageHinkley(min_instances=10, delta=0.4, threshold=12.0, mode="up")
    return drift.KSWIN(alpha=0.001, window_size=60, stat_size=20, seed=0)


class DriftTracker:
    """A river detector on chunk values of one statistic, with hysteresis (one event per shift)."""

    def __init__(self, statistic: str, monitor: MonitorConfig, clock: Callable[[], float]):
        self.statistic, self.monitor, self.clock = statistic, monitor, clock
        self.threshold = monitor.thresholds[statistic]
        self.detector = make_detector(monitor.detector)
        self.armed, self.last_event = True, -np.inf
        self.pending = 0  # records left during which a detector hit waits for the window to confirm it
        self.value: float | None = None  # the windowed statistic when last read (by confirm)

    def feed_chunk(self, chunk: dict) -> None:
        """Give the detector one chunk's value of the statistic (scaled so that the threshold is DETECTOR_SCALE)."""
        key, scalar = DETECTED[self.statistic]
        if key not in chunk:  # e.g. a chunk of unlabelled records for eopp
            return
        value = float(scalar(chunk[key].value()))
        if not np.isfinite(value):
            return
        self.detector.update(value / self.threshold * DETECTOR_SCALE)
        if self.detector.drift_detected:
            # The detector sees a shift within a few chunks; the window needs longer to cross the
            # threshold, so the hit waits (at most one window of records) for that confirmation.
            self.pending = self.monitor.window_records

    def confirm(self, n_records: int, window_value: Callable[[], float | None]) -> bool:
        """After a batch of ``n_records``: True when a detector hit is confirmed by the window (an event).

        ``window_value()`` reads the window (a merge of its buckets): only while a hit waits for confirmation or
        the tracker waits to re-arm; the value read is kept in ``value``.
        """
        self.pending = max(self.pending - n_records, 0)
        if not self.pending and self.armed:  # no event possible, nothing to re-arm: the window need not be read
            return False
        self.value = window_value()
        if self.value is None:
            return False
        if self.value < self.threshold:
            self.armed = True
        now = self.clock()
        cooled = now - self.last_event >= self.monitor.cooldown_seconds
        if self.pending and self.value > self.threshold and (self.armed or cooled):
            self.armed, self.last_event, self.pending = False, now, 0
            return True
        return False


class Chunker:
    """Cuts batches into pieces at chunk boundaries and merges each chunk's accumulators.

    Chunks are cut from the records, not from batches, so a detector's sensitivity does not depend
    on the batch size: 16 chunks per window give a detector enough samples before a shift (ADWIN
    needs a few dozen) while each chunk's statistic stays well above its own estimation noise.
    """

    def __init__(self, window_records: int):
        self.size = max(50, window_records // 16)
        self.filled, self.chunk = 0, None

    def pieces(self, n: int) -> list[slice]:
        """The slices of a batch of ``n`` rows, each ending at a chunk boundary or at the batch's end."""
        out, start, filled = [], 0, self.filled
        while start < n:
            stop = start + min(self.size - filled, n - start)
            out.append(slice(start, stop))
            filled = (filled + stop - start) % self.size
            start = stop
        return out

    def add(self, accumulators: dict, n_records: int) -> dict | None:
        """Merge one piece; returns the chunk's accumulators when it is full."""
        self.chunk = dict(accumulators) if self.chunk is None else {
            key: self.chunk[key].merge(acc) if key in self.chunk else acc for key, acc in accumulators.items()}
        self.filled += n_records
        if self.filled < self.size:
            return None
        full, self.chunk, self.filled = self.chunk, None, 0
        return full
