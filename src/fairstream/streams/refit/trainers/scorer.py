"""The trainer of fair scorers: trained on the chain's output before them, compared by gap and accuracy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import numpy as np

from fairstream.models.scorer import Scorer

from ..options import TrainerOption, non_negative_arg
from .base import (
    MAX_ACCURACY_DROP,
    RecordTrainer,
    Validation,
    format_value,
    published_before,
    through_chain,
    wider_gap_or_less_accurate,
)

if TYPE_CHECKING:
    from fairstream.streams.config import PipelineConfig

    from ..sources import ResearchWindow


class ScorerTrainer(RecordTrainer):
    """Fair scorers (FTM: Kim et al.; OTF: Buyl and De Bie; the Reg and norm baselines) at the end of the chain.

    The scorer is trained on what it will read: the window's features passed through the chain's
    modules before it (a plan, a flow), as the workers serve them. ``method`` is one of
    :data:`~fairstream.models.scorer_training.METHODS`; its fairness figure is MDP for ``ftm`` (with
    one map for both sides, fitted on the holdout) and the DP gap otherwise. The candidate is refused
    if that figure exceeds the current scorer's by more than ``tolerance`` (relative) plus 0.01, or
    its accuracy is lower by more than ``max_accuracy_drop``. The first scorer is published as is.
    """

    module = Scorer
    TITLE = "scorers"
    OPTIONS = {
        "method": TrainerOption("--method", choices=("ftm", "otf", "reg", "norm", "unconstrained", "logistic"),
                                help="training method: FTM (matched DP), OTF (optimal-transport fairness), the Reg "
                                     "and norm-penalty baselines, or none"),
        "lam": TrainerOption("--weight", type=non_negative_arg, metavar="LAMBDA",
                             help="the fairness term's weight (ftm, reg: lambda; otf, norm: alpha in [0, 1])"),
        "max_accuracy_drop": MAX_ACCURACY_DROP,
    }

    def __init__(self, config: "PipelineConfig", tolerance: float = 0.1, seed: int = 0, method: str = "ftm",
                 lam: float = 1.0, max_accuracy_drop: float = 0.02, **scorer_params):
        self.config, self.tolerance, self.seed, self.method = config, tolerance, seed, method
        self.params = {"lam": lam, **scorer_params} if method != "logistic" else dict(scorer_params)
        self.max_accuracy_drop = max_accuracy_drop
        self._holdout: tuple | None = None  # (holdout window, its chain output, the MDP map fitted on it)

    def _upstream(self, window: "ResearchWindow", actives: Mapping) -> np.ndarray:
        """The window's features as the scorer sees them: through the chain's earlier modules."""
        return through_chain(published_before(self.config, self.kind, actives), window).X

    def fit(self, window: "ResearchWindow", actives: Mapping):
        """A scorer fitted on the window's chain output, warm-started from the active scorer."""
        from fairstream.models.scorer_training import fit_scorer

        current = actives.get(self.kind)
        warm = {} if self.method == "logistic" or current is None else {"warm_start": current.module}
        return fit_scorer(self._upstream(window, actives), window.s, window.y, method=self.method,
                          columns=list(self.config.features), groups=list(self.config.groups), seed=self.seed,
                          **warm, **self.params)

    def validate(self, scorer, held: "ResearchWindow", actives: Mapping) -> Validation:
        """Accuracy, DP gap and MDP of ``scorer`` on the holdout's chain output (one MDP map per holdout)."""
        from fairstream.models.scorer import validate_scorer
        from fairstream.repair.group_maps import GroupTransportMap

        # The candidate and the current scorer are scored on one chain output with one map: computed once.
        if self._holdout is None or self._holdout[0] is not held:
            X = self._upstream(held, actives)
            self._holdout = (held, X, GroupTransportMap(seed=self.seed).fit(X, held.s,
                                                                           columns=list(self.config.features)))
        _, X, group_map = self._holdout
        result = validate_scorer(scorer, X, held.s, held.y, group_map=group_map, seed=self.seed)
        name, value = ("MDP", result.mdp) if self.method == "ftm" else ("DP gap", result.dp_gap)
        return Validation(name=name, value=float(value), metrics=result.as_metrics(),
                          summary=f"{name} {format_value(value)}, accuracy {result.accuracy:.3f}")

    refusal = wider_gap_or_less_accurate  # the rule of every trainer compared by gap and accuracy
