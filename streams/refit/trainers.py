"""One trainer per artifact kind: fit a candidate on a research window, and score a module on a holdout.

The re-fit job (:mod:`~fairstream.streams.refit.job`) never special-cases a kind: it splits the
window, asks the kind's trainer for a candidate, has the trainer score the candidate and the
active module on the same holdout, lets the trainer say whether the candidate is worse, and
publishes. A trainer is a small class with:

- ``kind`` and ``needs_labels`` (whether the window must carry y);
- ``fit(window, actives)``: the candidate module (``actives`` is what the workers serve now, by kind:
  a flow is trained in front of the active scorer and warm-starts from the active flow);
- ``validate(module, window, actives)``: a :class:`Validation` (the compared figure, lower is better,
  and the metrics sealed into the artifact's manifest);
- ``refusal(candidate, current)``: why the candidate must not replace the current module, or None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

import numpy as np

if TYPE_CHECKING:
    from fairstream.streams.config import PipelineConfig

    from .sources import ResearchWindow


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


# =============================================================================== plans


class PlanTrainer:
    """Distributional repair plans (Langbridge et al.), compared by dependence E after repair on the holdout.

    ``tolerance``: the candidate is refused when its holdout E exceeds the current plan's by more
    than this fraction. E after repair sits near its noise floor, where it varies by about 10-20 %
    from one holdout to another, so a re-fit on unchanged data may be refused; that is harmless
    (the current plan stays). Drift moves E by multiples, far beyond the tolerance.
    """

    kind = "plan"
    needs_labels = False

    def __init__(self, config: "PipelineConfig", tolerance: float = 0.1, seed: int = 0, n_q: int = 250,
                 out_of_range: str = "clamp", repair_amount: float = 1.0):
        self.config, self.tolerance, self.seed = config, tolerance, seed
        self.n_q, self.out_of_range, self.repair_amount = n_q, out_of_range, repair_amount

    def fit(self, window: "ResearchWindow", actives: Mapping):
        """A plan fitted on the window, with the pipeline's feature names."""
        from fairstream.repair.distributional import DistributionalRepair

        return DistributionalRepair(n_q=self.n_q, out_of_range=self.out_of_range, repair_amount=self.repair_amount,
                                    columns=list(self.config.features)).fit(window.X, window.s, window.u)

    def validate(self, plan, held: "ResearchWindow", actives: Mapping) -> Validation:
        """E after the plan repairs the holdout; rows it refuses stay unrepaired, as a penalty."""
        from fairstream.repair.measure.evaluation import evaluate_repair

        result = plan.repair(held.X, held.s, held.u, keys=held.keys)
        evaluation = evaluate_repair(held.X, result.values, held.s, held.u, seed=self.seed)
        e_after, floor = float(evaluation.e_after.total), float(evaluation.floor.total_mean)
        return Validation(
            name="E", value=e_after, floor=floor, unusable=int(len(held) - result.n_repaired),
            summary=f"E {format_value(e_after)} (noise floor {format_value(floor)})",
            metrics={"E_holdout_after": e_after, "E_holdout_before": float(evaluation.e_before.total),
                     "E_holdout_floor": floor, "damage_holdout": evaluation.damage.tolist()})

    def refusal(self, candidate: Validation, current: Validation) -> str | None:
        """Refuse a candidate whose E is worse than the current plan's by more than the tolerance."""
        if candidate.value <= current.value * (1.0 + self.tolerance):
            return None
        return (f"candidate E {format_value(candidate.value)} > current E {format_value(current.value)} x "
                f"{1.0 + self.tolerance:.2f}")


# =============================================================================== flows


class FlowTrainer:
    """AdapFair flows (Wang et al.) in front of the frozen scorer the workers serve, compared by DP gap and accuracy.

    The candidate is trained on the window with the active ``scorer`` frozen, warm-started from the
    active flow. On the holdout both are scored as ``scorer(flow(x))``: the candidate is refused if
    its gap (``notion``: DP, or EOpp/EO) exceeds the current flow's by more than ``tolerance``
    (relative) plus 0.01 (absolute: gaps near zero are noise), or if its accuracy is lower by more
    than ``max_accuracy_drop``. A first flow is compared with the scorer alone.
    """

    kind = "flow"
    needs_labels = True

    def __init__(self, config: "PipelineConfig", tolerance: float = 0.1, seed: int = 0, lam: float = 0.5,
                 notion: str = "dp", n_steps: int = 200, max_accuracy_drop: float = 0.02, **flow_params):
        self.config, self.tolerance, self.seed = config, tolerance, seed
        # Other AdapFair parameters (n_blocks, hidden, group_aware, ...) pass through; the defaults are the paper's.
        self.params = dict(lam=lam, notion=notion, n_steps=n_steps, seed=seed, **flow_params)
        self.max_accuracy_drop = max_accuracy_drop

    @staticmethod
    def _scorer(actives: Mapping):
        scorer = actives.get("scorer")
        if scorer is None:
            raise TrainerError("no scorer is published: a flow is trained in front of the frozen scorer the workers "
                               "serve; publish one first (fairstream artifacts publish)")
        return scorer.module

    def fit(self, window: "ResearchWindow", actives: Mapping):
        """A flow fitted on the window in front of the active scorer, warm-started from the active flow."""
        from fairstream.models.flow_training import refit_flow

        current = actives.get("flow")
        return refit_flow(window.X, window.s, window.y, self._scorer(actives),
                          warm_start=None if current is None else current.module,
                          columns=list(self.config.features), **self.params)

    def validate(self, flow, held: "ResearchWindow", actives: Mapping) -> Validation:
        """The gap and accuracy of ``scorer(flow(x))`` on the holdout (``flow=None``: the scorer alone)."""
        from fairstream.models.flow import validate_flow

        result = validate_flow(flow, self._scorer(actives), held.X, held.s, held.y)
        gap = {"dp": result.dp_gap, "eopp": result.eopp_gap, "eo": result.eo_gap}[self.params["notion"]]
        name = f"{self.params['notion'].upper()} gap"
        return Validation(name=name, value=float(gap), unusable=result.n_refused, metrics=result.as_metrics(),
                          summary=f"{name} {format_value(gap)}, accuracy {result.accuracy:.3f}")

    def baseline(self, held: "ResearchWindow", actives: Mapping) -> Validation:
        """The scorer alone: what a first flow must beat."""
        return self.validate(None, held, actives)

    def refusal(self, candidate: Validation, current: Validation) -> str | None:
        """Refuse a wider gap (beyond tolerance) or an accuracy loss beyond ``max_accuracy_drop``."""
        if candidate.value > current.value * (1.0 + self.tolerance) + 0.01:
            return (f"candidate {candidate.name} {format_value(candidate.value)} > current "
                    f"{format_value(current.value)} x {1.0 + self.tolerance:.2f} + 0.01")
        drop = current.metrics["accuracy"] - candidate.metrics["accuracy"]
        if drop > self.max_accuracy_drop:
            return (f"candidate accuracy {candidate.metrics['accuracy']:.3f} is {drop:.3f} below the current "
                    f"{current.metrics['accuracy']:.3f} (at most {self.max_accuracy_drop} allowed)")
        return None


TRAINERS = {trainer.kind: trainer for trainer in (PlanTrainer, FlowTrainer)}
"""Artifact kind -> its trainer class; ``fairstream refit --kind`` offers these."""


def make_trainer(kind: str, config: "PipelineConfig", **params):
    """The trainer of ``kind`` with its parameters; an unknown kind names the known ones."""
    try:
        cls = TRAINERS[kind]
    except KeyError:
        raise TrainerError(f"no trainer for artifact kind {kind!r} (re-fittable: {sorted(TRAINERS)})") from None
    return cls(config, **params)


def labelled(window: "ResearchWindow", kind: str) -> None:
    """Refuse a window without labels for a kind that trains on them."""
    if window.y is None or (len(window) and not np.isin(window.y, (0, 1)).all()):
        raise TrainerError(f"a {kind} re-fit needs every research record labelled (y = 0 or 1)")
