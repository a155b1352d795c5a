"""A worker's partial aggregates: what it counted since its last message to the stats topic.

The worker's monitors (the serving chain's, and a candidate's in shadow) hand every delivered batch's accumulators
to :class:`PartialAggregates`, cut at the event-time slices of its records (:meth:`add` is their ``sink``); the
shadow comparison adds the paired figures of the two chains on the same records (:meth:`add_paired`). At most every
``monitor.stats_seconds``, and when the worker stops, :meth:`take` empties it into stats messages
(:mod:`fairstream.streams.codec.partials`) that the worker sends; the pipeline's monitoring agent adds every
worker's messages into the pipeline's windows. A message that cannot be sent is kept and sent with the next one
(counts add up), so a broker that is away for a while loses nothing while the worker runs.
"""

from __future__ import annotations

import functools
import time
from typing import Callable

import numpy as np

from fairstream.repair.measure.accumulators import EncodedLabels
from fairstream.streams.codec.partials import PAIRED_FIELDS, Partial, encode_partial, layout_digest
from fairstream.streams.codec.repaired import RepairedBatch
from fairstream.streams.config import PipelineConfig

from .monitor import DeferredMatchedDP, configured_labels


class PartialAggregates:
    """Counts of the records a worker delivered, per chain and slice, not sent yet.

    Parameters
    ----------
    config : PipelineConfig
        The pipeline: its name, layout (features, groups, strata) and ``[monitor]`` slice length.
    worker : str
        Who counts (the worker's name in the stats messages).
    clock : callable, default=time.time
        The worker's clock (when a message is sent, and when the next one is due).
    """

    def __init__(self, config: PipelineConfig, worker: str, clock: Callable[[], float] = time.time):
        self.config, self.worker, self.clock = config, worker, clock
        self.layout = layout_digest(config.features, config.groups, config.strata)
        self.groups = configured_labels(list(config.groups), "s")
        self.pending: dict[tuple, dict[int, list]] = {}  # (role, chain) -> slice -> [records, accumulators]
        self.paired: dict[tuple, dict[str, dict]] = {}  # (candidate chain, active chain) -> figure -> sums
        self.refusals: dict[tuple, list] = {}  # (candidate chain, active chain) -> [refused, failure]
        self.last_sent = clock()

    def add(self, monitor, index: int, records: int, accumulators: dict) -> None:
        """Add one slice's piece of a batch (``monitor``'s role and chain): the monitor's sink.

        Parameters
        ----------
        monitor : FairnessMonitor
            The monitor that counted it (its ``role`` and ``chain_key`` say whose counts they are).
        index : int
            The slice (``floor(ts / slice_seconds)``).
        records : int
            Records of the batch in the slice.
        accumulators : dict
            (statistic, stage) -> the accumulator of those records.
        """
        slices = self.pending.setdefault((monitor.role, monitor.chain_key), {})
        held = slices.get(index)
        if held is None:  # the batch's accumulators are the windows' too: the slice's own copies are added into
            slices[index] = [records, {key: owned(accumulator) for key, accumulator in accumulators.items()}]
            return
        held[0] += records
        for key, accumulator in accumulators.items():
            mine = held[1].get(key)
            held[1][key] = owned(accumulator) if mine is None else \
                mine.absorb(accumulator) if hasattr(mine, "absorb") else mine.merge(accumulator)

    def add_paired(self, candidate: tuple, active: tuple, figures: dict[str, dict], refused: int = 0,
                   failed: str = "") -> None:
        """Add the paired figures of a batch both chains decided, the records the candidate refused of it and why its
        chain failed on it.

        Parameters
        ----------
        candidate, active : tuple
            The candidate and the active chain's versions (``Chain.key``).
        figures : dict
            :func:`paired_figures` of the batch.
        refused : int, default=0
            Records of the batch the active chain delivered and the candidate refused.
        failed : str, default=""
            Why the candidate chain failed on the batch ("" if it did not).
        """
        refusals = self.refusals.setdefault((candidate, active), [0, ""])
        refusals[0] += refused
        refusals[1] = failed or refusals[1]
        held = self.paired.setdefault((candidate, active), {})
        for name, sums in figures.items():
            if name not in held:
                held[name] = dict(sums)
            else:
                held[name] = {"cells": sums["cells"], **{f: held[name][f] + sums[f] for f in PAIRED_FIELDS}}

    @property
    def empty(self) -> bool:
        """Nothing counted since the last message."""
        return not self.pending and not self.paired

    def due(self) -> bool:
        """Whether a message is due.

        Returns
        -------
        bool
            Something is counted and ``monitor.stats_seconds`` passed since the last message.
        """
        return not self.empty and self.clock() - self.last_sent >= self.config.monitor.stats_seconds

    def take(self) -> list[bytes]:
        """Every stats message of what is held, emptying it (the caller sends them, and keeps what it could not send).

        Returns
        -------
        list of bytes
            One message per chain (:func:`~fairstream.streams.codec.partials.encode_partial`).
        """
        now = self.clock()
        partials = [self._partial(role, chain, slices, now) for (role, chain), slices in self.pending.items()]
        by_chain = {(p.role, p.chain): p for p in partials}
        for (candidate, active), figures in self.paired.items():
            partial = by_chain.get(("candidate", candidate))
            if partial is None or partial.paired:  # figures alone, or paired with another active chain
                partial = Partial(self.config.name, self.worker, "candidate", candidate, now,
                                  self.config.monitor.slice_seconds, self.layout)
                partials.append(partial)
            partial.paired, partial.active = figures, active
            partial.refused, partial.failed = self.refusals.get((candidate, active), (0, ""))
        self.pending, self.paired, self.refusals, self.last_sent = {}, {}, {}, now
        return [encode_partial(p) for p in partials]

    def _partial(self, role: str, chain: tuple, slices: dict, now: float) -> Partial:
        return Partial(self.config.name, self.worker, role, chain, now, self.config.monitor.slice_seconds, self.layout,
                       {index: (records, {key: matched(acc) for key, acc in accumulators.items()})
                        for index, (records, accumulators) in slices.items()})


def owned(accumulator):
    """A copy of a count accumulator that later batches can be added into in place (``absorb``: no new arrays per
    batch); one without (MDP's deferred samples, OTF's sample) as it is: those are merged into new ones."""
    return accumulator.fresh().absorb(accumulator) if hasattr(accumulator, "absorb") else accumulator


def matched(accumulator):
    """The accumulator as it travels: MDP's samples matched to their counterparts (its sums), any other as it is."""
    if isinstance(accumulator, DeferredMatchedDP):
        accumulator.value()  # matches what waits and folds it into the sums
        return accumulator.matched
    return accumulator


def paired_figures(active: RepairedBatch, candidate: RepairedBatch, groups: np.ndarray) -> dict[str, dict]:
    """The per-record paired comparison of two chains' decisions on the same records, as sums per cell.

    ``active`` and ``candidate`` hold the same records in the same order. Figures: ``dp_difference`` (per group:
    x the active decision, d the candidate's minus it), ``eopp`` (the same among y = 1), ``decision_rate`` (one
    cell) and ``accuracy`` (one cell, labelled records: x whether the active decision is right, d the candidate's
    minus it). Chains that write no decision give none.
    """
    if active.decision is None or candidate.decision is None or len(active) != len(candidate) or not len(active):
        return {}
    a, c = active.decision.astype(np.float64), candidate.decision.astype(np.float64)
    codes = np.asarray(EncodedLabels.in_classes(active.s, groups, "s"))
    cells = tuple(map(str, groups.tolist()))
    figures = {"dp_difference": _sums(a, c - a, codes, cells), "decision_rate": _sums(a, c - a, None, ("all",))}
    if active.y is not None:
        labelled = active.y == 1
        figures["eopp"] = _sums(a[labelled], (c - a)[labelled], codes[labelled], cells)
        right_a, right_c = (a == active.y).astype(np.float64), (c == active.y).astype(np.float64)
        figures["accuracy"] = _sums(right_a, right_c - right_a, None, ("all",))
    return figures


def _sums(x: np.ndarray, d: np.ndarray, codes: np.ndarray | None, cells: tuple) -> dict:
    """n, sum x, sum x^2, sum d, sum d^2 per cell (``codes``; None: one cell)."""
    codes = np.zeros(len(x), dtype=np.intp) if codes is None else codes
    count = functools.partial(np.bincount, codes, minlength=len(cells))
    return {"cells": cells, "n": count().astype(np.float64), "active": count(x), "active_sq": count(x * x),
            "change": count(d), "change_sq": count(d * d)}
