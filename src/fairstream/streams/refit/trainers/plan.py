"""The trainer of distributional repair plans: fitted on the window, compared by dependence E after repair."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from fairstream.models.plan import DistributionalRepair

from ..options import TrainerOption, positive_int_arg
from .base import RecordTrainer, Validation, format_value

if TYPE_CHECKING:
    from fairstream.streams.config import PipelineConfig

    from ..sources import ResearchWindow


class PlanTrainer(RecordTrainer):
    """Distributional repair plans (Langbridge et al.), compared by dependence E after repair on the holdout.

    ``tolerance``: the candidate is refused when its holdout E exceeds the current plan's by more
    than this fraction. E after repair sits near its noise floor, where it varies by about 10-20 %
    from one holdout to another, so a re-fit on unchanged data may be refused; that is harmless
    (the current plan stays). Drift moves E by multiples, far beyond the tolerance.
    """

    module = DistributionalRepair
    TITLE = "plans"
    OPTIONS = {
        "n_q": TrainerOption("--n-q", type=positive_int_arg, metavar="N", help="grid nodes per stratum and feature"),
        "out_of_range": TrainerOption("--out-of-range", choices=("clamp", "reject"),
                                      help="what the new plan does with values outside its grid"),
    }

    def __init__(self, config: "PipelineConfig", tolerance: float = 0.1, seed: int = 0, n_q: int = 250,
                 out_of_range: str = "clamp", repair_amount: float = 1.0):
        self.config, self.tolerance, self.seed = config, tolerance, seed
        self.n_q, self.out_of_range, self.repair_amount = n_q, out_of_range, repair_amount

    def fit(self, window: "ResearchWindow", actives: Mapping):
        """A plan fitted on the window, with the pipeline's feature names.

        The posterior Pr[s | x, u] (most of a fit's time) is fitted only for a pipeline that imputes a missing s:
        a plan without it is refused, with that reason, by a pipeline that starts imputing.
        """
        from fairstream.models.plan import DistributionalRepair

        return DistributionalRepair(n_q=self.n_q, out_of_range=self.out_of_range, repair_amount=self.repair_amount,
                                    columns=list(self.config.features), posterior=self.config.imputes_s,
                                    ).fit(window.X, window.s, window.u)

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
