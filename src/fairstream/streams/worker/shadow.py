"""The shadow promotion policy (``[pipeline] promotion = "shadow"``): promote a candidate or retire it, with why.

Every worker applies a pending candidate chain beside the active one on the same batches
(:class:`~fairstream.streams.worker.processing.Served`) and compares the two
(:class:`~fairstream.streams.worker.monitor.ShadowComparison`). Once the comparison holds
``shadow.min_records`` live records, :func:`decide` reads its figures:

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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fairstream.streams.config import STATISTICS, ShadowConfig
from fairstream.streams.control.records import (
    MAX_ACTOR,
    MAX_REASON,
    MAX_STATISTIC_NAME,
    MAX_STATISTICS,
    decision_record,
)
from fairstream.streams.control.records import CANDIDATE_FAILED, CANDIDATE_REFUSED
from fairstream.streams.schemas import ControlRecord

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
