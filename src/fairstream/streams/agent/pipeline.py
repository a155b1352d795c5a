"""The pipeline's statistics: every worker's partial aggregates merged into one set of windows per chain.

:class:`PipelineStatistics` takes the stats topic's messages (:class:`~fairstream.streams.codec.partials.Partial`)
and adds them, slice by slice, into the open slices of their chain (:class:`~.slices.OpenSlices`); a closed slice
is one batch of the pipeline's records for the chain's :class:`~fairstream.streams.worker.monitor.FairnessMonitor`
(the same windows, gauge rows and drift detectors a worker once ran on its own partitions, now on the pipeline's).
The serving chain's monitor runs the detectors: one drift decision per pipeline. A candidate's slices, paired with
the serving chain's slices of the same records, and the workers' per-record paired figures make the shadow
evidence (:class:`PairedComparison`) that the promotion rule reads (:mod:`.promotion`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from fairstream.repair.validation import RepairInputError
from fairstream.streams.codec.partials import PAIRED_FIELDS, Partial, PartialError, layout_digest
from fairstream.streams.config import PipelineConfig
from fairstream.streams.worker.drift import DETECTED, Chunker, DriftEvent
from fairstream.streams.worker.monitor import FairnessMonitor

from .promotion import RATE_STATISTICS, ChunkDifferences, PairedSums, ShadowEvidence
from .slices import MAX_OPEN, OpenSlices

log = logging.getLogger(__name__)

RETIRED_AFTER = 600.0
"""A chain no partial arrived for in this many seconds (a version replaced, a candidate gone) is forgotten."""


@dataclass
class Prototypes:
    """The accumulators a chain's windows hold, as the monitor's ``statistics`` (``factories``: key -> fresh one)."""

    factories: dict
    match_queue: None = None


class ChainStatistics:
    """One chain's (role and versions) open slices and windows, from every worker's partials."""

    def __init__(self, config: PipelineConfig, role: str, key: tuple, clock: Callable[[], float],
                 monotonic: Callable[[], float]):
        self.role, self.key, self.monotonic = role, key, monotonic
        self.slices = OpenSlices(config.monitor.lateness_seconds, monotonic)
        self.monitor = FairnessMonitor(config, clock=clock, role=role, detect=role == "active")
        self.seconds = config.monitor.slice_seconds
        self.prototypes: dict = {}
        self.mixed: dict[tuple, str] = {}  # (statistic, stage) -> a worker that binned it otherwise (left out)
        self.late = 0  # records of partials that came after their slice closed
        self.records = 0  # records of closed slices
        self.seen = monotonic()

    @property
    def version(self) -> int:
        """The first module's version (what drift events and re-fit requests are about)."""
        return self.key[0][1] if self.key else -1

    def add(self, partial: Partial) -> list[tuple[int, int, dict]]:
        """Add a partial's slices; returns the late ones (already added to the windows, not to the detectors)."""
        self.seen = self.monotonic()
        for _, accumulators in partial.slices.values():
            for key in list(accumulators):
                if not self._fits(key, accumulators[key]):
                    del accumulators[key]  # its other statistics still count
                    if key not in self.mixed:
                        log.error("worker %s counts %s (%s) in other bins than the pipeline's first partial: its counts "
                                  "of it are left out and the pipeline's %s is not reported (the chain's repair "
                                  "module has no fitted range: give every feature a finite [pipeline.valid_ranges] "
                                  "entry)", partial.worker, key[0], key[1], key[0])
                    self.mixed[key] = partial.worker
        late = self.slices.add(partial.slices)
        for index, records, accumulators in late:
            self.late += records
            self.monitor.observe_counts(self.key, self.version, self._statistics(), accumulators, records,
                                        ts=(index + 1) * self.seconds, detect=False)
        return late

    def _fits(self, key: tuple, accumulator) -> bool:
        """Whether ``accumulator`` adds up with the chain's first of ``key`` (same type, bins, labels, settings)."""
        prototype = self.prototypes.setdefault(key, accumulator)
        if prototype is accumulator:
            return True
        if type(prototype) is not type(accumulator):
            return False
        try:
            check = getattr(prototype, "_check_mergeable", None)
            if check is not None:
                check(accumulator)
            else:  # OTF's sample: its settings are compared by merging nothing
                prototype.fresh().merge(accumulator.fresh())
        except RepairInputError:
            return False
        return True

    def close(self, everything: bool = False) -> tuple[list[tuple[int, int, dict]], list[DriftEvent]]:
        """Close the slices due (in order) into the windows and detectors: (closed slices, drift events)."""
        closed, events = self.slices.close(everything), []
        for index, records, accumulators in closed:
            self.records += records
            events += self.monitor.observe_counts(self.key, self.version, self._statistics(), accumulators, records,
                                                  ts=(index + 1) * self.seconds)
        return closed, events

    def _statistics(self) -> Prototypes:
        return Prototypes({key: prototype.fresh for key, prototype in self.prototypes.items()})


class PairedComparison:
    """A candidate and the serving chain on the same records, pooled over the pipeline, since the candidate began.

    The workers' paired figures add up as they arrive (:meth:`add_paired`); a closed slice of either chain waits
    for the other's slice of the same records (same slice, same record count) and both then join a comparison
    chunk: each chunk of at least ``chunk_records`` records gives one per-chunk difference of every compared
    statistic that is not a rate gap (:class:`~.promotion.ChunkDifferences`).
    """

    def __init__(self, compared: tuple[str, ...], chunk_records: int):
        self.compared = tuple(name for name in compared if name not in RATE_STATISTICS)
        self.paired: dict[str, PairedSums] = {}
        self.waiting: dict[str, dict[int, tuple[int, dict]]] = {"active": {}, "candidate": {}}
        self.chunk: dict | None = None
        self.chunk_records, self.filled, self.compared_records = chunk_records, 0, 0
        self.differences: dict[str, list[float]] = {name: [] for name in self.compared}
        self.totals: dict[str, dict] = {"active": {}, "candidate": {}}
        self.refused, self.failed = 0, ""

    def add_paired(self, partial: Partial) -> None:
        """Add a candidate partial's paired figures, refusals and failure."""
        self.refused += partial.refused
        self.failed = partial.failed or self.failed
        for name, cells in partial.paired.items():
            sums = PairedSums(*(cells[f] for f in PAIRED_FIELDS), cells=cells["cells"])
            self.paired[name] = sums if name not in self.paired else self.paired[name].merge(sums)

    def closed(self, role: str, index: int, records: int, accumulators: dict) -> None:
        """A slice of ``role``'s chain closed: compare it once the other chain's slice of the same records has."""
        other = "candidate" if role == "active" else "active"
        pair = self.waiting[other].pop(index, None)
        if pair is None:
            if role == "candidate" or index >= min(self.waiting["candidate"], default=index):
                self.waiting[role][index] = (records, accumulators)
                self._prune()
            return
        sides = {role: (records, accumulators), other: pair}
        if sides["active"][0] != sides["candidate"][0]:
            return  # the candidate did not see every record of the slice (it began, or ended, within it)
        self._compare(sides["active"][1], sides["candidate"][1], records)

    def _prune(self) -> None:
        """Slices whose pair never closes (the candidate began or left within them) do not wait for ever."""
        for waiting in self.waiting.values():
            for index in sorted(waiting)[:-MAX_OPEN]:
                del waiting[index]

    def _compare(self, active: dict, candidate: dict, records: int) -> None:
        self.compared_records += records
        for role, accumulators in (("active", active), ("candidate", candidate)):
            totals = self.totals[role]
            for key, accumulator in accumulators.items():
                totals[key] = accumulator if key not in totals else totals[key].merge(accumulator)
        if self.chunk is None:
            self.chunk = {"active": dict(active), "candidate": dict(candidate)}
        else:
            for role, accumulators in (("active", active), ("candidate", candidate)):
                held = self.chunk[role]
                for key, accumulator in accumulators.items():
                    held[key] = accumulator if key not in held else held[key].merge(accumulator)
        self.filled += records
        if self.filled >= self.chunk_records:
            for name in self.compared:
                a, c = value_of(self.chunk["active"], name), value_of(self.chunk["candidate"], name)
                if np.isfinite(a) and np.isfinite(c):
                    self.differences[name].append(a - c)
            self.chunk, self.filled = None, 0

    def evidence(self) -> ShadowEvidence:
        """The evidence so far, for :func:`~.promotion.verdict`."""
        chunks = {}
        for name in self.compared:
            values = np.asarray(self.differences[name], dtype=np.float64)
            if len(values):
                chunks[name] = ChunkDifferences(len(values), float(values.sum()), float((values * values).sum()),
                                                value_of(self.totals["active"], name),
                                                value_of(self.totals["candidate"], name))
        decisions = self.paired.get("decision_rate")
        records = int(decisions.n.sum()) if decisions is not None else self.compared_records
        return ShadowEvidence(records, {name: sums for name, sums in self.paired.items() if name in RATE_STATISTICS},
                              chunks, self.paired.get("accuracy"), decisions, self.refused, self.failed or None)


def value_of(accumulators: dict, statistic: str) -> float:
    """A statistic after the chain over ``accumulators`` (NaN if they do not hold it)."""
    key, scalar = DETECTED[statistic]
    accumulator = accumulators.get(key)
    if accumulator is None:
        return np.nan
    value = scalar(accumulator.value())
    return float(value) if value is not None and np.isfinite(value) else np.nan


class PipelineStatistics:
    """Every worker's partials of one pipeline, merged: per chain its windows, the detectors, the shadow evidence.

    Parameters
    ----------
    config : PipelineConfig
        The pipeline (the agent's config: workers counted under another layout or slice length are refused).
    clock : callable, default=time.time
        Wall-clock time (drift events, the time window of late slices).
    monotonic : callable, default=time.monotonic
        The clock slices wait by (:class:`~.slices.OpenSlices`).
    """

    def __init__(self, config: PipelineConfig, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic):
        self.config, self.clock, self.monotonic = config, clock, monotonic
        self.layout = layout_digest(config.features, config.groups, config.strata)
        self.chains: dict[tuple[str, tuple], ChainStatistics] = {}
        self.comparisons: dict[tuple[tuple, tuple], PairedComparison] = {}
        self.serving: tuple | None = None  # the serving chain's versions (the registry's; else the latest seen)
        self.latest: tuple | None = None  # the versions of the latest partial of a serving chain
        self.future = 0  # records of slices too far ahead of the agent's clock, left out

    def _in_time(self, partial: Partial) -> None:
        """Leave out the slices further ahead than the agent's clock allows (a worker's clock, or a forged message):
        one such slice would close every slice before it and make every later record late."""
        monitor = self.config.monitor
        ahead = np.floor((self.clock() + monitor.max_event_time_skew + monitor.lateness_seconds) / monitor.slice_seconds)
        future = [index for index in partial.slices if index > ahead]
        if future:
            dropped = sum(partial.slices.pop(index)[0] for index in future)
            self.future += dropped
            log.error("%d records from %s are in slices up to %.0f s ahead of this agent's clock (more than "
                      "monitor.max_event_time_skew): left out", dropped, partial.worker,
                      (max(future) + 1) * monitor.slice_seconds - self.clock())

    def add(self, partial: Partial) -> None:
        """Add one worker's partial.

        Parameters
        ----------
        partial : Partial
            A decoded stats message.

        Raises
        ------
        PartialError
            For a partial of another pipeline, layout, slice length or role.
        """
        self._check(partial)
        self._in_time(partial)
        chain = self._chain(partial.role, partial.chain)
        for index, records, accumulators in chain.add(partial):
            log.info("late partial from %s: %d records of slice %d, which had closed (counted, not detected)",
                     partial.worker, records, index)
        if partial.role == "candidate" and (partial.paired or partial.refused or partial.failed):
            self._comparison(partial.chain, partial.active).add_paired(partial)
        if partial.role == "active":
            self.latest = partial.chain

    def _check(self, partial: Partial) -> None:
        config = self.config
        if partial.pipeline != config.name:
            raise PartialError(f"a partial of pipeline {partial.pipeline!r} from {partial.worker!r} on the stats "
                               f"topic of {config.name!r}")
        if partial.layout != self.layout:
            raise PartialError(f"worker {partial.worker!r} counts under other features, groups or strata than this "
                               "agent's config: its counts cannot be added")
        if partial.slice_seconds != config.monitor.slice_seconds:
            raise PartialError(f"worker {partial.worker!r} counts in slices of {partial.slice_seconds:g} s, this "
                               f"agent's config says {config.monitor.slice_seconds:g} s")
        if partial.role not in ("active", "candidate"):
            raise PartialError(f"worker {partial.worker!r} sent a partial of role {partial.role!r}")

    def _chain(self, role: str, key: tuple) -> ChainStatistics:
        chain = self.chains.get((role, key))
        if chain is None:
            chain = self.chains[role, key] = ChainStatistics(self.config, role, key, self.clock, self.monotonic)
        return chain

    def _comparison(self, candidate: tuple, active: tuple) -> PairedComparison:
        comparison = self.comparisons.get((candidate, active))
        if comparison is None:
            comparison = self.comparisons[candidate, active] = PairedComparison(
                self.config.shadow_statistics, Chunker(self.config.monitor.window_records).size)
        return comparison

    @property
    def active(self) -> ChainStatistics | None:
        """The serving chain's statistics (None before any of its partials)."""
        key = self.serving if self.serving is not None else self.latest
        return self.chains.get(("active", key)) if key is not None else None

    def tick(self, everything: bool = False) -> list[DriftEvent]:
        """Close the slices due and forget chains gone quiet.

        Parameters
        ----------
        everything : bool, default=False
            Close every open slice (at a stop).

        Returns
        -------
        list of DriftEvent
            The serving chain's drift events (only its detectors run).
        """
        events = []
        for (role, key), chain in list(self.chains.items()):
            closed, found = chain.close(everything)
            if chain is self.active:
                events += found
            for comparison_key, comparison in self.comparisons.items():
                if key == (comparison_key[0] if role == "candidate" else comparison_key[1]):
                    for index, records, accumulators in closed:
                        comparison.closed(role, index, records, accumulators)
            if chain is not self.active and not chain.slices.open and \
                    self.monotonic() - chain.seen > RETIRED_AFTER:
                del self.chains[role, key]
        for candidate, active in list(self.comparisons):
            if ("candidate", candidate) not in self.chains:  # the candidate left (promoted, retired) long ago
                del self.comparisons[candidate, active]
        return events

    def comparison_for(self, candidate: tuple) -> PairedComparison | None:
        """The comparison of ``candidate``'s versions with the serving chain (None before any evidence)."""
        active = self.serving if self.serving is not None else self.latest
        return self.comparisons.get((candidate, active))

    def candidate(self, key: tuple) -> ChainStatistics | None:
        """A candidate chain's statistics, if any of its partials arrived."""
        return self.chains.get(("candidate", key))
