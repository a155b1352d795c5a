"""The trainer of group decision thresholds behind the published scorer, and the gaps of 0/1 decisions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import numpy as np

from fairstream.models.thresholds import GroupThresholds

from ..options import TrainerOption
from .base import (
    MAX_ACCURACY_DROP,
    RecordTrainer,
    TrainerError,
    Validation,
    fitted_behind,
    format_value,
    published_before,
    through_chain,
    wider_gap_or_less_accurate,
)

if TYPE_CHECKING:
    from fairstream.streams.config import PipelineConfig

    from ..sources import ResearchWindow


class ThresholdsTrainer(RecordTrainer):
    """Group-specific decision thresholds after the scorer (Hardt, Price and Srebro, 2016), compared by gap and accuracy.

    The window is scored by the published chain before the thresholds (a plan or a flow, then the scorer) and
    :class:`~fairstream.models.thresholds.GroupThresholds` picks the threshold (or randomised pair, keyed by the
    record) that satisfies ``constraint``: ``dp`` (equal positive rates), ``eopp`` (equal true positive rates) or
    ``eo`` (equal true and false positive rates). ``scope`` says among which records the rates are equal:

    - ``conditional`` (default): per stratum u and group, and validated on the worst within-stratum gap (the
      largest of the strata's gaps), as the monitor's conditional statistics read it. The gap over all records
      may stay wide (Simpson: groups spread differently over the strata);
    - ``overall``: per group alone (fitted without u), and validated on the gap over all records.

    The metrics carry both figures (``dp_gap`` and ``conditional_dp_gap``, ...) and ``fitted_behind``: the kind,
    version and sha256 of every published module before the thresholds (the scorer whose scores they cut).
    On the holdout the candidate and the current thresholds are applied behind the same chain and compared as
    flows are: refused if the validated gap exceeds the current one's by more than ``tolerance`` (relative) plus
    0.01, or the accuracy of the decisions is lower by more than ``max_accuracy_drop``. A first module is compared
    with the chain without thresholds (the scorer's own decisions). A holdout group without the labels the gap
    needs (no positives for eopp, no negatives either for eo) is a TrainerError, not a gap of 0.

    ``max_accuracy_drop`` defaults to 0.03, not the 0.02 of flows and scorers: a first module is compared with
    a scorer that was never asked to be fair, and equalising rates by post-processing costs accuracy by design
    (the price of the constraint, Hardt et al.). Measured on Adult (half to fit, half held out), demographic
    parity by thresholds moves a logistic scorer's accuracy from 0.806 to 0.792 with five numeric features
    (age, education-num, log capital gain and loss, hours) and from 0.749 to 0.755 with the demo's two (age,
    hours: the thresholds also correct a miscalibrated cut at 0.5). 0.03 admits twice the measured price, and
    the sampling noise of a small holdout, and still refuses thresholds that give away more. Later re-fits are
    compared with the active thresholds, where the drop is near zero.
    """

    module = GroupThresholds
    TITLE = "decision thresholds"
    OPTIONS = {
        "constraint": TrainerOption("--constraint", choices=("dp", "eopp", "eo"),
                                    help="what the thresholds equalise across groups: positive rates (dp), true "
                                         "positive rates (eopp) or true and false positive rates (eo)"),
        "scope": TrainerOption("--scope", choices=("conditional", "overall"),
                               help="conditional: thresholds per stratum u and group, validated on the worst "
                                    "within-stratum gap (the monitor's conditional statistics); overall: per "
                                    "group, validated on the gap over all records"),
        "max_accuracy_drop": MAX_ACCURACY_DROP,
    }

    def __init__(self, config: "PipelineConfig", tolerance: float = 0.1, seed: int = 0, constraint: str = "dp",
                 scope: str = "conditional", max_accuracy_drop: float = 0.03, **threshold_params):
        for name, value in (("constraint", constraint), ("scope", scope)):
            if value not in self.OPTIONS[name].choices:
                raise TrainerError(f"{name} must be one of {list(self.OPTIONS[name].choices)}, got {value!r}")
        self.config, self.tolerance, self.seed, self.constraint = config, tolerance, seed, constraint
        self.scope, self.max_accuracy_drop = scope, max_accuracy_drop
        self.params = threshold_params  # other GroupThresholds parameters

    @property
    def conditional(self) -> bool:
        return self.scope == "conditional"

    def _chain(self, actives: Mapping) -> list:
        """The published modules before the thresholds; one of them must write the score they read."""
        from fairstream.models.kinds import capabilities

        chain = published_before(self.config, self.kind, actives)
        if not any("score" in capabilities(module.kind).writes for module in chain):
            raise TrainerError(f"the chain before the thresholds ({[module.kind for module in chain]}) writes no "
                               f"score: thresholds are trained on the scores of a published scorer")
        return chain

    def fit(self, window: "ResearchWindow", actives: Mapping):
        """Thresholds fitted on the scores the published chain gives the window (per stratum when conditional)."""
        from fairstream.models.thresholds import GroupThresholds
        from fairstream.repair.validation import RepairInputError

        score = through_chain(self._chain(actives), window).columns["score"]
        u, strata = (window.u, list(self.config.strata)) if self.conditional else (None, None)
        try:
            return GroupThresholds(constraint=self.constraint, random_state=self.seed, **self.params).fit(
                score, window.s, window.y, u, groups=list(self.config.groups), strata=strata)
        except RepairInputError as exc:  # a cell of the window without the labels the constraint needs
            raise TrainerError(f"the research window cannot fit {self.constraint} thresholds: {exc}") from None

    def validate(self, thresholds, held: "ResearchWindow", actives: Mapping) -> Validation:
        """The scope's gap of the constraint and the accuracy of the chain's decisions on the holdout (``None``: no
        thresholds)."""
        from fairstream.repair.protocol import Batch, apply_chain

        chain = self._chain(actives) + ([] if thresholds is None else [thresholds])
        result = apply_chain(chain, Batch(X=held.X, keys=held.keys, s=held.s, u=held.u, y=held.y))
        rows = np.flatnonzero(result.ok)
        refused = int(len(held) - len(rows))
        prefix = "conditional_" if self.conditional else ""
        figure = f"{prefix}{self.constraint}_gap"
        metrics = decision_metrics(result.columns["decision"][rows], held.s[rows], held.y[rows], held.u[rows],
                                   needed=(figure,))
        metrics.update(constraint=self.constraint, scope=self.scope, n_rows=len(rows), n_refused=refused,
                       fitted_behind=fitted_behind(self.config, self.kind, actives))
        name = f"{prefix.replace('_', ' ')}{self.constraint.upper()} gap"
        gap = metrics[figure]
        return Validation(name=name, value=gap, unusable=refused, metrics=metrics,
                          summary=f"{name} {format_value(gap)}, accuracy {metrics['accuracy']:.3f}")

    def baseline(self, held: "ResearchWindow", actives: Mapping) -> Validation:
        """The chain without thresholds (the scorer's own decisions): what a first module must beat."""
        return self.validate(None, held, actives)

    refusal = wider_gap_or_less_accurate  # the rule of every trainer compared by gap and accuracy



GAP_ROWS = {"dp": ("rows",), "eopp": ("positives",), "eo": ("positives", "negatives")}
"""Among which holdout rows each gap compares the groups' positive rates (eo: the larger of its two gaps)."""


def decision_metrics(decision: np.ndarray, s: np.ndarray, y: np.ndarray, u: np.ndarray | None = None,
                     needed=None) -> dict:
    """Accuracy and gaps of 0/1 decisions: DP (positive rates), EOpp (true positive rates), EO (TPR and FPR).

    With strata ``u``, also the worst within-stratum gaps (``conditional_dp_gap``, ...: the largest of the strata's
    gaps). A gap is undefined when a group (in a stratum) has none of the rows it compares (eopp: no positives): a
    TrainerError naming the group for a gap in ``needed`` (every gap when None), None for the others.

    >>> decision_metrics(np.array([1, 0, 1, 1]), np.array([0, 0, 1, 1]), np.array([1, 0, 0, 1]))
    {'accuracy': 0.75, 'dp_gap': 0.5, 'eopp_gap': 0.0, 'eo_gap': 1.0}
    """
    from fairstream.repair.measure.metrics import encode_observed

    decision, y = np.asarray(decision), np.asarray(y)
    groups, s_codes = encode_observed(s, len(decision), "s")
    strata, u_codes = encode_observed(u, len(decision), "u")
    among = {"rows": np.ones(len(decision), dtype=bool), "positives": y == 1, "negatives": y == 0}
    metrics = {"accuracy": float(np.mean(decision == y))}
    for conditional in (False, True) if u is not None else (False,):
        for constraint, kinds in GAP_ROWS.items():
            figure = f"{'conditional_' if conditional else ''}{constraint}_gap"
            try:
                metrics[figure] = max(_rate_gap(decision, s_codes, u_codes, among[what], groups.tolist(),
                                                strata.tolist(), conditional, what, constraint) for what in kinds)
            except TrainerError:
                if needed is not None and figure not in needed:
                    metrics[figure] = None  # sealed as undefined; the figure compared is defined
                else:
                    raise
    return metrics


def _rate_gap(decision, s_codes, u_codes, rows, groups: list, strata: list, conditional: bool, what: str,
              constraint: str) -> float:
    """Max - min positive rate of the decisions among ``rows`` across groups: overall, or the worst stratum's."""
    from fairstream.repair.measure.metrics import rate_counts

    positives, totals = rate_counts(decision[rows], s_codes[rows], u_codes[rows], len(groups), len(strata))
    if not conditional:
        positives, totals = positives.sum(axis=0, keepdims=True), totals.sum(axis=0, keepdims=True)
    empty = np.argwhere(totals == 0)
    if len(empty):
        stratum, group = empty[0]
        where, which = (f" in stratum u={strata[stratum]!r}", "conditional ") if conditional else ("", "")
        raise TrainerError(f"holdout group {groups[group]!r}{where} has no {what}: the {which}{constraint} gap is "
                           f"undefined")
    rates = positives / totals
    return float((rates.max(axis=1) - rates.min(axis=1)).max())
