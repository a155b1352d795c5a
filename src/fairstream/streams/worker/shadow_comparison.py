"""The shadow comparison: a pending candidate chain and the active chain measured on the same live records.

A worker shadowing a candidate (:class:`~fairstream.streams.worker.shadow.ShadowTrial`) feeds every delivered batch
to a :class:`ShadowComparison` as well: the records the active chain delivered, and the same records through the
candidate chain. Its :meth:`~ShadowComparison.figures` are what the shadow policy decides on and what the worker
announces on the control topic. Both sides are counted by the fairness monitor's own accumulators
(:mod:`.monitor`), cumulatively since the candidate began rather than over a sliding window.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import numpy as np

from fairstream.streams.codec.repaired import RepairedBatch
from fairstream.streams.config import PipelineConfig

from .drift import DETECTED
from .monitor import (
    MATCH_ROWS,
    BatchStatistics,
    Chain,
    as_chain,
    check_decisions,
    monitored_batch,
    outside_fitted_range,
)

log = logging.getLogger(__name__)

MAX_FIGURES = 64
"""At most this many shadow figures (:meth:`ShadowComparison.figures`): they travel in every worker's announcement."""

RATE_GAPS = ("dp_difference", "eopp")
"""The compared statistics with a noise floor: a gap between two groups' rates, whose sampling noise is known."""


class _ShadowSide:
    """One side of a :class:`ShadowComparison` (the active or the candidate chain): every record since the comparison
    began, in cumulative accumulators of the monitor's own :class:`BatchStatistics`."""

    def __init__(self, chain: Chain, config: PipelineConfig, first: RepairedBatch, statistics: tuple[str, ...]):
        self.key = chain.key
        self.statistics = BatchStatistics(chain, config, first, statistics)
        self.share = config.monitor.sample_share  # the monitor's sample (by key): the same records on both sides
        self.wanted = {DETECTED[name][0] for name in statistics} | {("dp", "after")}
        self.totals: dict = {}  # (statistic, stage) -> the accumulator of every record so far
        self.correct = None  # right decisions per (stratum, group) among labelled records, as a decision rate

    def add(self, batch: RepairedBatch, chain: Chain) -> None:
        """Count one batch that went through ``chain``."""
        view = monitored_batch(batch, chain, outside_fitted_range(batch, chain), self.share)
        counted = self.statistics.counted(view)
        for key, accumulator in self.statistics.of(counted, self.wanted).items():
            self.totals[key] = accumulator if key not in self.totals else self.totals[key].merge(accumulator)
        if counted.y is not None and view.decision_after is not None:
            right = (check_decisions(view.decision_after) == counted.y).astype(np.int64)
            correct = self.statistics.prototypes["dp", "after"].fresh().count(right, counted.s, counted.u)
            self.correct = correct if self.correct is None else self.correct.merge(correct)
        queue = self.statistics.match_queue
        if queue is not None and queue.n_rows >= MATCH_ROWS:  # bound what waits, as the monitor does
            queue.match()

    def statistic(self, name: str) -> float:
        """``name`` after the chain, all strata, over every record so far (NaN if not measured)."""
        key, scalar = DETECTED[name]
        accumulator = self.totals.get(key)
        return np.nan if accumulator is None else float(scalar(accumulator.value()))

    def rates(self, accumulator) -> tuple[float, dict]:
        """The overall and per-group rate of a decision-rate accumulator (NaN where nothing was counted)."""
        if accumulator is None:
            return np.nan, {}
        positives, totals = accumulator.positives_.sum(axis=0), accumulator.totals_.sum(axis=0)
        overall = positives.sum() / totals.sum() if totals.sum() else np.nan
        groups, rates = self.statistics.groups, accumulator.value().rates
        return float(overall), {str(g): float(rate) for g, rate in zip(groups, rates)}

    def gap_noise(self, name: str) -> float:
        """One standard error of the gap between the groups with the highest and the lowest rate (NaN if unknown).

        A rate gap is a difference of two binomial proportions: its variance is p(1 - p)/n of each group.
        """
        accumulator = self.totals.get(DETECTED[name][0])
        if accumulator is None:
            return np.nan
        totals = accumulator.totals_.sum(axis=0).astype(np.float64)
        rates = accumulator.value().rates
        present = np.flatnonzero(totals > 0)
        if len(present) < 2:
            return np.nan
        ends = [present[np.argmax(rates[present])], present[np.argmin(rates[present])]]
        p = np.clip(rates[ends], 0.0, 1.0)  # a sampled rate may pass 1; these are exact, the clip only guards
        return float(np.sqrt(np.sum(p * (1 - p) / totals[ends])))


class ShadowComparison:
    """The active and the candidate chain measured on the same live records, cumulative since the candidate began.

    Both sides are measured by the monitor's own accumulators (:class:`BatchStatistics`, :func:`monitored_batch`,
    the detectors' scalars of :data:`DETECTED`), over every record observed, not a sliding window: the compared
    ``statistics`` after each chain (all strata), and, where the chain writes a decision, the overall and per-group
    decision rate and, on labelled records, the overall and per-group accuracy. Only the records both chains
    delivered are compared (the active batch is cut to the candidate batch's keys). Each side bins E and W1 as its
    own monitor does (its repair stage's fitted range, else its first batch's range). A change of either chain's
    versions starts the comparison afresh. Only the two rate gaps (``dp_difference``, ``eopp``) get a noise floor:
    two binomial standard errors of the gap between the groups with the highest and the lowest rate (the larger of
    the two sides'); the other statistics have none that is cheap to compute on the live stream, and none is
    given. :meth:`observe` never raises: what cannot be measured ends the
    comparison (``failed`` says why, logged) and the worker goes on.
    """

    def __init__(self, config: PipelineConfig, statistics: tuple[str, ...], clock: Callable[[], float] = time.time):
        self.config, self.compared, self.clock = config, tuple(statistics), clock
        self.failed: str | None = None
        self._reset()

    def _reset(self) -> None:
        self.n_records, self.since = 0, None
        self.sides: dict[str, _ShadowSide] = {}

    def observe(self, active_batch: RepairedBatch, active_chain, candidate_batch: RepairedBatch | None,
                candidate_chain) -> None:
        """Count a batch on both sides: ``active_batch`` made by ``active_chain``, ``candidate_batch`` (the records
        the candidate chain also accepted) by ``candidate_chain`` (chains: :class:`Chain` or registry ``Active``\\ s
        in order)."""
        if self.failed is not None or candidate_batch is None or len(candidate_batch) == 0:
            return
        try:
            self._observe(active_batch, _chain(active_chain), candidate_batch, _chain(candidate_chain))
        except Exception as exc:  # the comparison only watches: whatever it cannot measure must not stop the worker
            self.failed = f"{type(exc).__name__}: {str(exc)[:300]}"
            log.error("the shadow comparison cannot measure the candidate (%s): no shadow figures for it",
                      self.failed, exc_info=exc)

    def _observe(self, active_batch: RepairedBatch, active: Chain, candidate_batch: RepairedBatch,
                 candidate: Chain) -> None:
        active_batch = paired_rows(active_batch, candidate_batch)
        pairs = {"active": (active_batch, active), "candidate": (candidate_batch, candidate)}
        if self.sides and any(self.sides[role].key != chain.key for role, (_, chain) in pairs.items()):
            log.info("a chain in the shadow comparison changed version: comparing afresh")
            self._reset()
        if not self.sides:
            self.sides = {role: _ShadowSide(chain, self.config, batch, self.compared)
                          for role, (batch, chain) in pairs.items()}
            self.since = self.clock()
        for role, (batch, chain) in pairs.items():
            self.sides[role].add(batch, chain)
        self.n_records += len(candidate_batch)

    def figures(self) -> dict[str, float]:
        """The comparison so far, flat and finite, at most :data:`MAX_FIGURES` entries.

        ``records``, ``since``; per compared statistic ``active.<s>``, ``candidate.<s>`` and ``noise.<s>`` (for a
        rate gap: two standard errors of the gap, the larger of the two sides'); ``active|candidate.decision_rate``
        and ``.accuracy``, then per group ``.decision_rate.<group>`` and ``.accuracy.<group>``. A value that is not
        finite (a statistic not measured, a group without records) is left out; past the bound, per-group entries
        are left out (whole groups, last configured first), never a compared statistic.
        """
        figures = {"records": float(self.n_records)}
        if self.since is not None:
            figures["since"] = float(self.since)
        if not self.sides or self.failed is not None:
            return figures
        try:
            overall, per_group = self._figures()
        except Exception as exc:  # a read may match MDP's samples: it must not stop the worker either
            self.failed = f"{type(exc).__name__}: {str(exc)[:300]}"
            log.error("the shadow comparison cannot read its figures (%s)", self.failed, exc_info=exc)
            return figures
        figures.update(_finite(overall))
        for entries in per_group:  # one group's entries together, within the bound
            entries = _finite(entries)
            if len(figures) + len(entries) > MAX_FIGURES:
                break
            figures.update(entries)
        return figures

    def _figures(self) -> tuple[dict, list[dict]]:
        active, candidate = self.sides["active"], self.sides["candidate"]
        overall = {}
        for name in self.compared:
            overall[f"active.{name}"], overall[f"candidate.{name}"] = active.statistic(name), candidate.statistic(name)
            if name in RATE_GAPS:
                overall[f"noise.{name}"] = 2 * max(active.gap_noise(name), candidate.gap_noise(name))
        groups = [str(g) for g in active.statistics.groups]
        per_group = {g: {} for g in groups}
        for what, read in (("decision_rate", lambda side: side.totals.get(("dp", "after"))),
                           ("accuracy", lambda side: side.correct)):
            for role, side in self.sides.items():
                rate, rates = side.rates(read(side))
                overall[f"{role}.{what}"] = rate
                for g in groups:
                    per_group[g][f"{role}.{what}.{g}"] = rates.get(g, np.nan)
        return overall, list(per_group.values())


def _chain(chain) -> Chain:
    return chain if isinstance(chain, Chain) else as_chain(tuple(chain))


def _finite(figures: dict) -> dict[str, float]:
    return {key: float(value) for key, value in figures.items() if np.isfinite(value)}


def paired_rows(active: RepairedBatch, candidate: RepairedBatch) -> RepairedBatch:
    """The records of ``active`` that the candidate chain also delivered (``candidate``: a subset in the same
    order): the rows the candidate refused are compared on neither side."""
    if len(active) == len(candidate):
        return active
    return active.take(np.flatnonzero(np.isin(active.keys, candidate.keys)))
