"""Shadow candidates in a worker: the trial of a pending candidate chain, measured beside the active one.

Every worker applies a pending candidate chain beside the active one on the same batches
(:class:`~fairstream.streams.worker.processing.Served`); its :class:`ShadowTrial` keeps everything the worker knows
of the candidate: a fairness monitor of its own (gauges ``role="candidate"``, no drift events, no re-fit requests),
the comparison of the two chains on the same records
(:class:`~fairstream.streams.worker.shadow_comparison.ShadowComparison`, the worker's own figures, announced on the
control topic as a diagnostic), the records the candidate refused and why its chain failed. Its counts go to the
pipeline's monitoring agent with the worker's other partial aggregates (:mod:`.partials`): the candidate's slices,
and the per-record paired figures of the two chains' decisions on the same records, with the refusals and the
failure. The shadow policy runs in the agent, once per pipeline, on every worker's records pooled
(:mod:`fairstream.streams.agent.promotion`); a worker decides nothing.

The candidate chain itself runs in the batch logic (``RecordRepairer``, :mod:`.processing`), which can never fail a
batch for it: the trial only reads what the batch's outcome says of it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from fairstream.streams.config import PipelineConfig
from fairstream.streams.control.records import CANDIDATE_FAILED, CANDIDATE_REFUSED

from .monitor import FairnessMonitor, as_chain, export_fairness
from .partials import PartialAggregates, paired_figures
from .shadow_comparison import ShadowComparison, paired_rows

if TYPE_CHECKING:
    from .metrics import PipelineMetrics
    from .processing import BatchOutcome

log = logging.getLogger(__name__)

REFUSED, FAILED = CANDIDATE_REFUSED, CANDIDATE_FAILED
"""REFUSED: the figure the worker adds to a comparison's: records the active chain delivered and the candidate refused
(they are compared on neither side). FAILED: 1 while the candidate's chain has failed in shadow (an error in its
code)."""


class ShadowTrial:
    """A worker's trial of the pending candidates of its record chain: all it keeps of them.

    The worker hands each batch the candidate chain also went through to :meth:`observe` and, when its gauges are
    due, calls :meth:`export`. A candidate arriving or leaving (:meth:`candidate_changed`) starts the measurement
    afresh. The candidate's counts and the paired figures go to ``partials`` (sent to the pipeline's monitoring
    agent, which decides). Not thread-safe: the worker calls it under its export lock.

    Parameters
    ----------
    config : PipelineConfig
        The pipeline: its monitor and ``shadow`` settings.
    metrics : PipelineMetrics
        The worker's metrics: the candidate's gauges and version, and its monitor's errors.
    partials : PartialAggregates
        Where the candidate's counts and paired figures go (the worker sends them to the stats topic).

    Attributes
    ----------
    monitor : FairnessMonitor
        The candidate chain's own monitor (``role="candidate"``, no detectors).
    comparison : ShadowComparison
        The two chains on the same records of this worker, since the candidate began (a diagnostic).
    refused : int
        Records the active chain delivered and the candidate refused, this candidate.
    failure : str or None
        Why the candidate chain failed in shadow (its last failure), or None.
    announced : dict or None
        :meth:`figures` as of the last :meth:`export` (None without any): what the worker announces.
    """

    def __init__(self, config: PipelineConfig, metrics: PipelineMetrics, partials: PartialAggregates):
        self.config, self.metrics, self.partials = config, metrics, partials
        self.restart()

    def restart(self) -> None:
        """Measure afresh: a new monitor and comparison, nothing refused, no failure, no figures."""
        self.monitor = FairnessMonitor(self.config, role="candidate", detect=False, sink=self.partials.add,
                                       windows=self.config.monitor.worker_statistics)
        self.comparison = ShadowComparison(self.config, self.config.shadow_statistics)
        self.announced, self.refused, self.failure = None, 0, None

    def candidate_changed(self, kind: str, candidate) -> None:
        """A pending candidate of ``kind`` arrived (an ``Active``) or left (None): measure afresh, its gauges go."""
        self.restart()
        self.metrics.clear_fairness("candidate")
        if candidate is None:
            self.metrics.candidate_version.remove(kind)
            return
        self.metrics.candidate_version.labels(kind).set(candidate.version)
        log.info("measuring %s candidate version %s in shadow beside the active chain", kind, candidate.version)

    def observe(self, outcome: BatchOutcome, chain: tuple, candidate: tuple) -> None:
        """Count a delivered batch: what the candidate refused of it and why it failed, its monitor, the comparison
        and the paired figures (``chain`` and ``candidate``: the active and the candidate chain's ``Active``\\ s in
        order)."""
        self.refused += outcome.candidate_refused
        self.failure = outcome.candidate_failed or self.failure
        active_key, candidate_key = as_chain(chain).key, as_chain(candidate).key
        figures = {}
        if outcome.candidate_batch is not None:  # None: the candidate chain failed on the batch (all refused)
            self.monitor.observe_batch(outcome.candidate_batch, *candidate)  # its drift events are ignored
            self.comparison.observe(outcome.monitor_batch, chain, outcome.candidate_batch, candidate)
            active = paired_rows(outcome.monitor_batch, outcome.candidate_batch)
            figures = paired_figures(active, outcome.candidate_batch, self.partials.groups)
        self.partials.add_paired(candidate_key, active_key, figures, outcome.candidate_refused,
                                 outcome.candidate_failed or "")
        if self.monitor.refused is not None:  # the candidate's: never the serving chain's alert
            self.metrics.monitor_errors.labels("candidate").inc()
            self.metrics.clear_fairness("candidate")

    def export(self) -> None:
        """The candidate's gauges (role candidate), and its figures for the announcer (:attr:`announced`)."""
        if self.monitor.refused is None:
            export_fairness(self.monitor, self.metrics, role="candidate")
        refused = self.refused or self.failure is not None
        self.announced = self.figures() if self.comparison.n_records or refused else None

    def figures(self) -> dict[str, float]:
        """The comparison's figures, with the records the candidate refused and whether its chain failed in shadow
        (:data:`FAILED`): this worker's own view, announced on the control topic."""
        failed = {FAILED: 1.0} if self.failure is not None else {}
        return {REFUSED: float(self.refused), **failed, **self.comparison.figures()}
