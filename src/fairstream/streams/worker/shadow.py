"""Shadow candidates in a worker: the trial of a pending candidate chain, and the policy that ends it.

Every worker applies a pending candidate chain beside the active one on the same batches
(:class:`~fairstream.streams.worker.processing.Served`); its :class:`ShadowTrial` keeps everything the worker knows
of the candidate: a fairness monitor of its own (gauges ``role="candidate"``, no drift events, no re-fit requests),
the comparison of the two chains on the same records
(:class:`~fairstream.streams.worker.shadow_comparison.ShadowComparison`), the records the candidate refused and
why its chain failed, and, under ``[pipeline] promotion = "shadow"``, the policy's decisions until the worker has
sent them. Once the comparison holds ``shadow.min_records`` live records, :func:`decide` reads its figures:

- **promote** when the candidate is lower than the active chain by more than ``shadow.min_improvement``
  on every compared statistic (``shadow.statistic``, else ``monitor.statistic``: gaps, lower is fairer)
  and its guard holds: with labels, its accuracy is at most ``shadow.max_accuracy_drop`` below the
  active chain's; without labels but with decisions, its overall decision rate is within
  ``shadow.max_decision_rate_change`` of the active chain's; a chain that writes no decision is judged on
  the statistics only;
- **retire** otherwise, and whenever the candidate refused records the active chain repaired (a promotion would
  dead-letter such records); the reason names the figures that failed (and those that passed). A candidate whose
  chain raised in shadow is retired once the window is full, saying so; one whose statistics cannot be measured
  (the comparison failed) is retired at once (:meth:`ShadowPolicy.retirements`).

The worker writes ONE decision record per pending candidate it shadows (:class:`ShadowPolicy`); several
workers may decide the same candidate: the control topic's ledger admits the first, refuses the others.
A decision judges the whole candidate chain (every kind with a pending candidate in place), so with
candidates of two kinds at once both get the same decision.

The candidate chain itself runs in the batch logic (``RecordRepairer``, :mod:`.processing`), which can never fail a
batch for it: the trial only reads what the batch's outcome says of it.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fairstream.streams.config import STATISTICS, PipelineConfig, ShadowConfig
from fairstream.streams.control.records import (
    MAX_ACTOR,
    MAX_REASON,
    MAX_STATISTIC_NAME,
    MAX_STATISTICS,
    decision_record,
)
from fairstream.streams.control.records import CANDIDATE_FAILED, CANDIDATE_REFUSED
from fairstream.streams.schemas import ControlRecord

from .monitor import FairnessMonitor, export_fairness
from .shadow_comparison import ShadowComparison

if TYPE_CHECKING:
    from .metrics import PipelineMetrics
    from .processing import BatchOutcome

log = logging.getLogger(__name__)

PROMOTE, RETIRE = "promote", "retire"
REFUSED, FAILED = CANDIDATE_REFUSED, CANDIDATE_FAILED
"""REFUSED: the figure the worker adds to a comparison's: records the active chain delivered and the candidate refused (they
are compared on neither side; a decision is due once compared and refused records reach ``shadow.min_records``).
Any refusal retires the candidate. FAILED: 1 while the candidate's chain has failed in shadow (an error in its code):
the policy retires it at once."""


@dataclass(frozen=True)
class Check:
    """One compared figure: whether the candidate passed it, and the sentence that says so."""

    passed: bool
    text: str


def decide(figures: dict, config: ShadowConfig) -> tuple[str, str]:
    """("promote" or "retire", the reason naming each figure compared), from a comparison's ``figures``.

    The statistics compared are ``config.statistics``, or, when it is empty (the monitor's), every statistic
    the figures hold for both chains.

    >>> decide({"records": 2000, "active.w1": 0.08, "candidate.w1": 0.03}, ShadowConfig())[0]
    'promote'
    >>> action, reason = decide({"records": 2000, "active.w1": 0.08, "candidate.w1": 0.09}, ShadowConfig())
    >>> print(action, reason.split("; passed")[0])
    retire retired after 2000 live records: failed w1: candidate 0.0900 vs active 0.0800 (not lower by more than 0)
    """
    names = compared(figures, config)
    checks = [statistic_check(figures, name, config.min_improvement) for name in names] or [
        Check(False, "statistics: none was measured on both chains")]
    checks.append(guard_check(figures, config))
    if figures.get(REFUSED, 0) > 0:
        checks.insert(0, Check(False, f"refusals: the candidate refused {figures[REFUSED]:.0f} records the active "
                                      "chain repaired (they would be dead-lettered)"))
    failed = [c.text for c in checks if not c.passed]
    passed = [c.text for c in checks if c.passed]
    window = f"{figures.get('records', 0):.0f} live records"
    if not failed:
        return PROMOTE, bounded(f"promoted after {window}: " + "; ".join(passed))
    return RETIRE, bounded(f"retired after {window}: failed " + "; ".join(failed)
                           + ("; passed " + "; ".join(passed) if passed else ""))


def compared(figures: dict, config: ShadowConfig) -> tuple[str, ...]:
    """The statistics the candidate must improve: the configured ones, else every one measured on both chains."""
    if config.statistics:
        return config.statistics
    return tuple(name for name in STATISTICS if f"active.{name}" in figures and f"candidate.{name}" in figures)


def statistic_check(figures: dict, name: str, min_improvement: float) -> Check:
    """Whether the candidate's ``name`` is lower than the active chain's by more than ``min_improvement``."""
    active, candidate = _figure(figures, f"active.{name}"), _figure(figures, f"candidate.{name}")
    if active is None or candidate is None:
        return Check(False, f"{name}: not measured on both chains")
    noise = _figure(figures, f"noise.{name}")
    shown = f"{name}: candidate {candidate:.4f} vs active {active:.4f}" + (
        f" (noise floor {noise:.4f})" if noise is not None else "")
    if active - candidate > min_improvement:
        return Check(True, f"{shown} (lower by {active - candidate:.4f} > {min_improvement:g})")
    return Check(False, f"{shown} (not lower by more than {min_improvement:g})")


def guard_check(figures: dict, config: ShadowConfig) -> Check:
    """The accuracy guard where both chains have an accuracy (labels), else the decision-rate guard where both
    write decisions, else none (a chain without decisions is judged on its statistics only)."""
    accuracy = _pair(figures, "accuracy")
    if accuracy is not None:
        active, candidate = accuracy
        drop = active - candidate
        text = (f"accuracy guard: candidate {candidate:.4f} vs active {active:.4f} (drop {drop:.4f}, "
                f"at most {config.max_accuracy_drop:g})")
        return Check(drop <= config.max_accuracy_drop, text)
    rates = _pair(figures, "decision_rate")
    if rates is not None:
        active, candidate = rates
        change = abs(candidate - active)
        text = (f"decision-rate guard: candidate {candidate:.4f} vs active {active:.4f} (change {change:.4f}, "
                f"at most {config.max_decision_rate_change:g})")
        return Check(change <= config.max_decision_rate_change, text)
    return Check(True, "no guard (the chains write no decision: statistics only)")


def _pair(figures: dict, name: str) -> tuple[float, float] | None:
    active, candidate = _figure(figures, f"active.{name}"), _figure(figures, f"candidate.{name}")
    return None if active is None or candidate is None else (active, candidate)


def _figure(figures: dict, key: str) -> float | None:
    value = figures.get(key)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def recordable(figures: dict) -> dict[str, float]:
    """The figures a control record's statistics can carry (finite numbers under short names, bounded)."""
    kept = {name: float(value) for name, value in figures.items()
            if isinstance(name, str) and 0 < len(name) <= MAX_STATISTIC_NAME and _figure(figures, name) is not None}
    return dict(list(kept.items())[:MAX_STATISTICS])


def bounded(reason: str) -> str:
    """The reason within the control record's limit (the figures travel whole in its statistics)."""
    return reason if len(reason) <= MAX_REASON else reason[:MAX_REASON - 3] + "..."


class ShadowPolicy:
    """The worker's side of ``promotion = "shadow"``: one decision per pending candidate, once it was measured on
    ``shadow.min_records`` live records. ``actor`` is the worker's name under the policy (``shadow-policy@...``)."""

    def __init__(self, config: ShadowConfig, actor: str):
        self.config, self.actor = config, actor[:MAX_ACTOR]
        self.decided: set[tuple[str, int, str]] = set()  # (kind, version, sha256): never decided twice

    def due(self, candidates, n_records: int) -> list:
        """The pending candidates (``Active``) not decided yet, once the comparison holds enough records."""
        if n_records < self.config.min_records:
            return []
        return [c for c in candidates if (c.kind, c.version, c.sha256) not in self.decided]

    def decisions(self, candidates, figures: dict) -> list[ControlRecord]:
        """One decision record per pending candidate of the chain (the figures judge the chain they form); each
        candidate is decided once (the worker sends the records until the broker has them)."""
        action, reason = decide(figures, self.config)
        statistics = recordable(figures)
        self.decided.update((c.kind, c.version, c.sha256) for c in candidates)
        return [decision_record(c.kind, c.version, c.sha256, action, self.actor, reason, statistics)
                for c in candidates]

    def retirements(self, candidates, why: str, figures: dict) -> list[ControlRecord]:
        """Retire each of ``candidates`` (once) for a reason the figures cannot carry: its chain failed in shadow, or
        its statistics cannot be measured (a candidate the policy can never judge must not stay pending)."""
        self.decided.update((c.kind, c.version, c.sha256) for c in candidates)
        reason, statistics = bounded(f"retired: {why}"), recordable(figures)
        return [decision_record(c.kind, c.version, c.sha256, RETIRE, self.actor, reason, statistics)
                for c in candidates]


def shadow_actor(app_id: str) -> str:
    """The shadow policy's name in the audit trail: ``shadow-policy@<app id>@<host>:<pid>``."""
    return f"shadow-policy@{app_id}@{socket.gethostname()}:{os.getpid()}"


def pending_candidates(active: tuple, candidate: tuple) -> list:
    """The candidates of a candidate chain: its artifacts that are not the active chain's."""
    return [c for a, c in zip(active, candidate) if (c.version, c.sha256) != (a.version, a.sha256)]


class ShadowTrial:
    """A worker's trial of the pending candidates of its record chain: all it keeps of them, and its decisions.

    The worker hands each batch the candidate chain also went through to :meth:`observe`, then, when its gauges
    are due, calls :meth:`export`, then :meth:`decide`; it sends the decisions queued (:meth:`next_decision`,
    :meth:`sent`) through its notice producer. A candidate arriving or leaving (:meth:`candidate_changed`) starts
    the measurement afresh; the policy's memory of what it decided, and the decisions not sent yet, stay (a
    decision on a candidate that left still goes: the ledger refuses it, harmless). Not thread-safe: the worker
    calls it under its export lock.

    Parameters
    ----------
    config : PipelineConfig
        The pipeline: its monitor, ``shadow`` settings and ``promotion`` (a policy only under ``"shadow"``).
    metrics : PipelineMetrics
        The worker's metrics: the candidate's gauges and version, and its monitor's errors.
    actor : str
        Who decides in the audit trail (:func:`shadow_actor`).

    Attributes
    ----------
    monitor : FairnessMonitor
        The candidate chain's own monitor (``role="candidate"``); its drift events are ignored.
    comparison : ShadowComparison
        The two chains on the same records, since the candidate began.
    refused : int
        Records the active chain delivered and the candidate refused, this candidate.
    failure : str or None
        Why the candidate chain failed in shadow (its last failure), or None.
    announced : dict or None
        :meth:`figures` as of the last :meth:`export` (None without any): what the worker announces.
    policy : ShadowPolicy or None
        The shadow policy, under ``promotion = "shadow"`` only.
    pending : list of ControlRecord
        Decisions not sent yet, oldest first.
    """

    def __init__(self, config: PipelineConfig, metrics: PipelineMetrics, actor: str):
        self.config, self.metrics = config, metrics
        self.policy = ShadowPolicy(config.shadow, actor) if config.promotion == "shadow" else None
        self.pending: list[ControlRecord] = []
        self.restart()

    def restart(self) -> None:
        """Measure afresh: a new monitor and comparison, nothing refused, no failure, no figures."""
        self.monitor = FairnessMonitor(self.config, role="candidate")
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
        (``chain`` and ``candidate``: the active and the candidate chain's ``Active``\\ s in order)."""
        self.refused += outcome.candidate_refused
        self.failure = outcome.candidate_failed or self.failure
        if outcome.candidate_batch is not None:  # None: the candidate chain failed on the batch (all refused)
            self.monitor.observe_batch(outcome.candidate_batch, *candidate)  # its drift events are ignored
            self.comparison.observe(outcome.monitor_batch, chain, outcome.candidate_batch, candidate)
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
        (:data:`FAILED`): what the shadow policy decides on and what a person approving it sees."""
        failed = {FAILED: 1.0} if self.failure is not None else {}
        return {REFUSED: float(self.refused), **failed, **self.comparison.figures()}

    def decide(self, chain: tuple, candidate: tuple) -> None:
        """Queue the shadow policy's decision on the pending candidates of ``candidate``, once due: at once when the
        comparison cannot measure them (it stopped for good) or the candidate chain failed, else once the window
        holds ``shadow.min_records`` records. Nothing without a policy."""
        if self.policy is None:
            return
        candidates = pending_candidates(chain, candidate)
        if self.comparison.failed is not None:
            due = self.policy.due(candidates, self.policy.config.min_records)
            why = f"its statistics cannot be measured: {self.comparison.failed}"
        elif self.failure is not None:
            # At once, not once the window fills: a failure is decisive, and another worker whose partitions never
            # made the candidate fail could otherwise promote it first.
            due = self.policy.due(candidates, self.policy.config.min_records)
            why = (f"its chain failed in shadow ({self.failure}): it refused {self.refused} "
                   "records the active chain repaired")
        else:  # refused records count towards the window: a candidate that refuses most records is still decided
            due, why = self.policy.due(candidates, self.comparison.n_records + self.refused), None
        if not due:
            return
        figures = self.figures()
        self.pending += (self.policy.decisions(due, figures) if why is None
                         else self.policy.retirements(due, why, figures))

    def next_decision(self) -> ControlRecord | None:
        """The oldest decision not sent yet, stamped afresh (None when none waits).

        Stamped afresh on each attempt: a copy sent again after a timeout has its own key, so compaction never
        replaces the first copy (the ledger refuses the later one as already decided).
        """
        if not self.pending:
            return None
        pending = self.pending[0]
        return decision_record(pending.kind, pending.version, pending.sha256, pending.action, pending.actor,
                               pending.reason, pending.statistics)

    def sent(self) -> None:
        """The decision :meth:`next_decision` gave reached the control topic: the next one is due."""
        self.pending.pop(0)
