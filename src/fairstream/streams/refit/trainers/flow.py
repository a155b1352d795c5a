"""The trainer of AdapFair flows: trained in front of the active scorer, compared by gap and accuracy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from fairstream.models.flow import FlowPreprocessor
from fairstream.models.kinds import active_at

from ..options import TrainerOption, fraction_arg, positive_int_arg
from .base import MAX_ACCURACY_DROP, RecordTrainer, TrainerError, Validation, format_value, wider_gap_or_less_accurate

if TYPE_CHECKING:
    from fairstream.streams.config import PipelineConfig

    from ..sources import ResearchWindow


class FlowTrainer(RecordTrainer):
    """AdapFair flows (Wang et al.) in front of the frozen scorer the workers serve, compared by DP gap and accuracy.

    The candidate is trained on the window with the active ``scorer`` frozen, warm-started from the
    active flow. On the holdout both are scored as ``scorer(flow(x))``: the candidate is refused if
    its gap (``notion``: DP, or EOpp/EO) exceeds the current flow's by more than ``tolerance``
    (relative) plus 0.01 (absolute: gaps near zero are noise), or if its accuracy is lower by more
    than ``max_accuracy_drop``. A first flow is compared with the scorer alone.
    """

    module = FlowPreprocessor
    TITLE = "flows"
    OPTIONS = {
        "lam": TrainerOption("--lam", type=fraction_arg, metavar="WEIGHT",
                             help="AdapFair's trade-off: lam * cross-entropy + (1 - lam) * fairness"),
        "notion": TrainerOption("--notion", choices=("dp", "eopp", "eo"),
                                help="fairness notion the flow is trained and validated on"),
        "n_steps": TrainerOption("--steps", type=positive_int_arg, metavar="N", help="Adam steps"),
        "max_accuracy_drop": MAX_ACCURACY_DROP,
    }

    def __init__(self, config: "PipelineConfig", tolerance: float = 0.1, seed: int = 0, lam: float = 0.5,
                 notion: str = "dp", n_steps: int = 200, max_accuracy_drop: float = 0.02, **flow_params):
        self.config, self.tolerance, self.seed = config, tolerance, seed
        # Other AdapFair parameters (n_blocks, hidden, group_aware, ...) pass through; the defaults are the paper's.
        self.params = dict(lam=lam, notion=notion, n_steps=n_steps, seed=seed, **flow_params)
        self.max_accuracy_drop = max_accuracy_drop

    @staticmethod
    def _scorer(actives: Mapping):
        scorer = active_at(actives, "score")
        if scorer is None:
            raise TrainerError("no scorer is published: a flow is trained in front of the frozen scorer the workers "
                               "serve; publish one first (fairstream artifacts publish)")
        return scorer.module

    def fit(self, window: "ResearchWindow", actives: Mapping):
        """A flow fitted on the window in front of the active scorer, warm-started from the active flow."""
        from fairstream.models.flow_training import refit_flow

        current = actives.get(self.kind)
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

    refusal = wider_gap_or_less_accurate  # the rule of every trainer compared by gap and accuracy
