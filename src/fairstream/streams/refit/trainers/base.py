"""What every trainer shares: the trainer contract, the validation it returns and the helpers of its rules.

The re-fit job (:mod:`~fairstream.streams.refit.job`) never special-cases a kind: it splits the
window, asks the kind's trainer for a candidate, has the trainer score the candidate and the
active module on the same holdout, lets the trainer say whether the candidate is worse, and
publishes. A trainer is a small class, in a module of its own in this package, with:

- ``module``: the :class:`~fairstream.repair.protocol.FrozenModule` class it trains; its ``kind`` is that
  class's (the kind's capabilities, :func:`fairstream.models.kinds.capabilities`, say whether the window must
  carry y). The package's registry (:mod:`fairstream.streams.refit.trainers`) finds it there;
- ``TITLE`` and ``OPTIONS``: its command-line options (trainer parameter ->
  :class:`~fairstream.streams.refit.options.TrainerOption`), offered by ``fairstream refit``;
- ``split(window, holdout, seed)`` and ``too_small(window, fit_rows, holdout_rows, min_rows)``: how the
  window is divided (records: by (u, s) cell; embeddings: by identity, so validation sees unseen people);
- ``fit(window, actives)``: the candidate module (``actives`` is what the workers serve now, by kind:
  a flow is trained in front of the active scorer and warm-starts from the active flow);
- ``validate(module, window, actives)``: a :class:`Validation` (the compared figure, lower is better,
  and the metrics sealed into the artifact's manifest);
- ``refusal(candidate, current)``: why the candidate must not replace the current module, or None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Mapping

import numpy as np

from ..options import TrainerOption, unit_interval_arg

if TYPE_CHECKING:
    from fairstream.streams.config import PipelineConfig

    from ..sources import ResearchWindow


class TrainerError(ValueError):
    """The window or the deployment cannot give a candidate of this kind; the message says why (not a crash)."""


@dataclass(frozen=True)
class Validation:
    """A module's score on the holdout: ``value`` of the figure ``name`` (lower is better) and its details.

    ``floor`` is what an ideal module would still measure (the plan's noise floor), ``unusable``
    counts holdout rows the module could not process, and ``metrics`` go into the manifest.
    """

    name: str
    value: float
    summary: str
    metrics: dict = field(default_factory=dict)
    floor: float | None = None
    unusable: int = 0


def format_value(value: float) -> str:
    """A compared figure as it appears in reasons and reports."""
    return f"{value:.3g}"


MAX_ACCURACY_DROP = TrainerOption(
    "--max-accuracy-drop", type=unit_interval_arg, metavar="FRACTION",
    help="refuse a candidate whose holdout accuracy is lower than the current one's by more than this fraction, "
         "e.g. 0.02 for two points")
"""Shared by the trainers that compare accuracy: one definition, one flag."""


class Trainer:
    """What every trainer declares: the ``module`` class it trains, the title of its options' group and its ``OPTIONS``.

    A subclass that declares ``module`` trains that class's ``kind``, set here so the two cannot disagree.
    """

    module: ClassVar[type]
    kind: ClassVar[str]
    TITLE: ClassVar[str] = ""
    OPTIONS: ClassVar[dict[str, TrainerOption]] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "module" in vars(cls):
            cls.kind = cls.module.kind



class RecordTrainer(Trainer):
    """Splits a window of records by (u, s) cell and checks that every configured cell is represented."""

    config: "PipelineConfig"

    def split(self, window: "ResearchWindow", holdout: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Row indices (fit, holdout), ``holdout`` of every (u, s) cell held out at random."""
        from ..sources import stratified_split

        return stratified_split(window.s, window.u, holdout, seed)

    def too_small(self, window: "ResearchWindow", fit_rows: np.ndarray, holdout_rows: np.ndarray,
                  min_rows: int) -> str | None:
        """Why the window cannot give a fair fit and validation (a cell too small), or None."""
        for u_value in self.config.strata:
            for s_value in self.config.groups:
                n_fit = _cell_size(window, fit_rows, u_value, s_value)
                n_holdout = _cell_size(window, holdout_rows, u_value, s_value)
                if min(n_fit, n_holdout) < min_rows:
                    return (f"research window too small: cell (u={u_value!r}, s={s_value!r}) has {n_fit} fit and "
                            f"{n_holdout} holdout rows, at least {min_rows} of each are needed "
                            f"(window of {len(window)} valid rows from {window.source})")
        return None


def _cell_size(window: "ResearchWindow", rows: np.ndarray, u_value, s_value) -> int:
    return int(np.sum((window.u[rows] == u_value) & (window.s[rows] == s_value)))


def worse_by(candidate: Validation, current: Validation, tolerance: float, slack: float = 0.0) -> str | None:
    """Why the candidate's compared figure is worse than the current one's beyond ``tolerance`` (+ ``slack``)."""
    if candidate.value <= current.value * (1.0 + tolerance) + slack:
        return None
    plus = f" + {slack:g}" if slack else ""
    return (f"candidate {candidate.name} {format_value(candidate.value)} > current {format_value(current.value)} "
            f"x {1.0 + tolerance:.2f}{plus}")


def cost_by(candidate: Validation, current: Validation, metric: str, label: str, sign: float, allowed: float,
            fmt: str) -> str | None:
    """Why a side metric got worse by more than ``allowed`` (``sign`` +1: higher is worse, -1: lower is worse)."""
    change = sign * (candidate.metrics[metric] - current.metrics[metric])
    if change <= allowed:
        return None
    side = "above" if sign > 0 else "below"
    return (f"candidate {label} {candidate.metrics[metric]:{fmt}} is {change:{fmt}} {side} the current "
            f"{current.metrics[metric]:{fmt}} (at most {allowed} allowed)")


def wider_gap_or_less_accurate(trainer, candidate: Validation, current: Validation) -> str | None:
    """Refuse a wider gap (beyond tolerance) or an accuracy loss beyond ``max_accuracy_drop``.

    The rule of the trainers compared by a fairness gap and accuracy (flows, scorers, thresholds), used as
    their ``refusal`` method: gaps near zero are noise, hence 0.01 of absolute slack.
    """
    return worse_by(candidate, current, trainer.tolerance, slack=0.01) or \
        cost_by(candidate, current, "accuracy", "accuracy", -1.0, trainer.max_accuracy_drop, ".3f")


def configured_chain(config: "PipelineConfig", kind: str) -> tuple[str, ...]:
    """The chain of the agent that applies ``kind`` (its capabilities' agent); ``kind`` not in it: TrainerError."""
    from fairstream.models.kinds import capabilities, reads_carried

    agent = capabilities(kind).agent
    chain = getattr(config, agent).chain  # config.records or config.embeddings: the section agents.<agent>
    if kind not in chain:
        raise TrainerError(f"the pipeline's {agent.rstrip('s')} chain {list(chain)} has no {kind}: add it to "
                           f"agents.{agent}.artifact before re-fitting one")
    if kind in reads_carried(chain):  # the research window holds no record's own score to fit it on
        raise TrainerError(f"the pipeline's {kind} reads what the records carry of their own model, not what a "
                           f"module of the chain {list(chain)} writes: it cannot be re-fitted here")
    return chain


def actives_before(config: "PipelineConfig", kind: str, actives: Mapping) -> dict:
    """The active entries of the configured chain's kinds before ``kind``, by kind in order; one not published:
    TrainerError."""
    chain = configured_chain(config, kind)
    before = chain[:chain.index(kind)]
    missing = [name for name in before if name not in actives]
    if missing:
        raise TrainerError(f"the chain's {missing} must be published before a {kind} is trained behind them")
    return {name: actives[name] for name in before}


def published_before(config: "PipelineConfig", kind: str, actives: Mapping) -> list:
    """The active modules of the configured chain's kinds before ``kind``, in order; one not published: TrainerError."""
    return [active.module for active in actives_before(config, kind, actives).values()]


def through_chain(modules: list, window: "ResearchWindow"):
    """The window through ``modules`` (an :class:`~fairstream.repair.protocol.Applied`); a row they refuse: TrainerError.

    Its ``X`` are the features as the next module reads them, its ``columns`` what the modules added (a score).
    """
    from fairstream.repair.protocol import Applied, Batch, apply_chain

    batch = Batch(X=window.X, keys=window.keys, s=window.s, u=window.u, y=window.y)
    if not modules:
        return Applied.all_ok(batch, window.X)
    result = apply_chain(modules, batch)
    if not result.ok.all():
        raise TrainerError(f"the chain refuses {int((~result.ok).sum())} research rows, e.g. "
                           f"{next(r for r in result.reasons if r)}")
    return result


def fitted_behind(config: "PipelineConfig", kind: str, actives: Mapping) -> list[dict]:
    """Kind, version and sha256 of the published modules before ``kind``: what a module of ``kind`` was fitted
    behind (sealed into its manifest, so an operator sees which scorer a set of thresholds belongs to)."""
    return [{"kind": name, "version": active.version, "sha256": active.sha256}
            for name, active in actives_before(config, kind, actives).items()]


def labelled(window: "ResearchWindow", kind: str) -> None:
    """Refuse a window without labels for a kind that trains on them."""
    if window.y is None or (len(window) and not np.isin(window.y, (0, 1)).all()):
        raise TrainerError(f"a {kind} re-fit needs every research record labelled (y = 0 or 1)")
