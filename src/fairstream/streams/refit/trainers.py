"""One trainer per artifact kind: fit a candidate on a research window, and score a module on a holdout.

The re-fit job (:mod:`~fairstream.streams.refit.job`) never special-cases a kind: it splits the
window, asks the kind's trainer for a candidate, has the trainer score the candidate and the
active module on the same holdout, lets the trainer say whether the candidate is worse, and
publishes. A trainer is a small class with:

- ``kind`` (the kind's capabilities, :func:`fairstream.models.kinds.capabilities`, name the trainer by its
  import path and say whether the window must carry y), ``TITLE`` and ``OPTIONS``: its command-line options
  (trainer parameter -> :class:`~fairstream.streams.refit.options.TrainerOption`), offered by ``fairstream refit``;
- ``split(window, holdout, seed)`` and ``too_small(window, fit_rows, holdout_rows, min_rows)``: how the
  window is divided (records: by (u, s) cell; embeddings: by identity, so validation sees unseen people);
- ``fit(window, actives)``: the candidate module (``actives`` is what the workers serve now, by kind:
  a flow is trained in front of the active scorer and warm-starts from the active flow);
- ``validate(module, window, actives)``: a :class:`Validation` (the compared figure, lower is better,
  and the metrics sealed into the artifact's manifest);
- ``refusal(candidate, current)``: why the candidate must not replace the current module, or None.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Mapping

import numpy as np

from .options import TrainerOption, fraction_arg, non_negative_arg, positive_int_arg, unit_interval_arg

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


MAX_ACCURACY_DROP = TrainerOption(
    "--max-accuracy-drop", type=unit_interval_arg, metavar="FRACTION",
    help="refuse a candidate whose holdout accuracy is lower than the current one's by more than this fraction, "
         "e.g. 0.02 for two points")
"""Shared by the trainers that compare accuracy: one definition, one flag."""


class Trainer:
    """What every trainer declares: its ``kind``, the title of its options' group and its ``OPTIONS``."""

    kind: ClassVar[str]
    TITLE: ClassVar[str] = ""
    OPTIONS: ClassVar[dict[str, TrainerOption]] = {}


# =============================================================================== records


class RecordTrainer(Trainer):
    """Splits a window of records by (u, s) cell and checks that every configured cell is represented."""

    config: "PipelineConfig"

    def split(self, window: "ResearchWindow", holdout: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Row indices (fit, holdout), ``holdout`` of every (u, s) cell held out at random."""
        from .sources import stratified_split

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


def configured_chain(config: "PipelineConfig", kind: str) -> tuple[str, ...]:
    """The chain of the agent that applies ``kind`` (its capabilities' agent); ``kind`` not in it: TrainerError."""
    from fairstream.models.kinds import capabilities

    agent = capabilities(kind).agent
    chain = getattr(config, agent).chain  # config.records or config.embeddings: the section agents.<agent>
    if kind not in chain:
        raise TrainerError(f"the pipeline's {agent.rstrip('s')} chain {list(chain)} has no {kind}: add it to "
                           f"agents.{agent}.artifact before re-fitting one")
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


# =============================================================================== plans


class PlanTrainer(RecordTrainer):
    """Distributional repair plans (Langbridge et al.), compared by dependence E after repair on the holdout.

    ``tolerance``: the candidate is refused when its holdout E exceeds the current plan's by more
    than this fraction. E after repair sits near its noise floor, where it varies by about 10-20 %
    from one holdout to another, so a re-fit on unchanged data may be refused; that is harmless
    (the current plan stays). Drift moves E by multiples, far beyond the tolerance.
    """

    kind = "plan"
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


# =============================================================================== flows


class FlowTrainer(RecordTrainer):
    """AdapFair flows (Wang et al.) in front of the frozen scorer the workers serve, compared by DP gap and accuracy.

    The candidate is trained on the window with the active ``scorer`` frozen, warm-started from the
    active flow. On the holdout both are scored as ``scorer(flow(x))``: the candidate is refused if
    its gap (``notion``: DP, or EOpp/EO) exceeds the current flow's by more than ``tolerance``
    (relative) plus 0.01 (absolute: gaps near zero are noise), or if its accuracy is lower by more
    than ``max_accuracy_drop``. A first flow is compared with the scorer alone.
    """

    kind = "flow"
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
        return worse_by(candidate, current, self.tolerance, slack=0.01) or \
            cost_by(candidate, current, "accuracy", "accuracy", -1.0, self.max_accuracy_drop, ".3f")


# =============================================================================== scorers


class ScorerTrainer(RecordTrainer):
    """Fair scorers (FTM: Kim et al.; OTF: Buyl and De Bie; the Reg and norm baselines) at the end of the chain.

    The scorer is trained on what it will read: the window's features passed through the chain's
    modules before it (a plan, a flow), as the workers serve them. ``method`` is one of
    :data:`~fairstream.models.scorer_training.METHODS`; its fairness figure is MDP for ``ftm`` (with
    one map for both sides, fitted on the holdout) and the DP gap otherwise. The candidate is refused
    if that figure exceeds the current scorer's by more than ``tolerance`` (relative) plus 0.01, or
    its accuracy is lower by more than ``max_accuracy_drop``. The first scorer is published as is.
    """

    kind = "scorer"
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

        current = actives.get("scorer")
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

    refusal = FlowTrainer.refusal  # the same rule: a wider gap beyond tolerance, or a real accuracy loss


# =============================================================================== decision thresholds


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

    kind = "thresholds"
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

    refusal = FlowTrainer.refusal  # the same rule: a wider gap beyond tolerance, or a real accuracy loss


def fitted_behind(config: "PipelineConfig", kind: str, actives: Mapping) -> list[dict]:
    """Kind, version and sha256 of the published modules before ``kind``: what a module of ``kind`` was fitted
    behind (sealed into its manifest, so an operator sees which scorer a set of thresholds belongs to)."""
    return [{"kind": name, "version": active.version, "sha256": active.sha256}
            for name, active in actives_before(config, kind, actives).items()]


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


# =============================================================================== embedding modules


class EmbeddingTrainer(Trainer):
    """Centroid-fairness modules (Conti and Clémençon) on labelled embeddings, compared by BFAR at one FAR.

    The window is split by identity (held-out identities are people the candidate never saw); all
    same-group pairs of the held-out identities are scored under one global threshold at ``far``.
    The candidate is refused if its BFAR exceeds the current module's by more than ``tolerance``
    (relative), or its FNMR is worse by more than ``max_fnmr_increase``. A first module is compared
    with the identity (plain normalisation: the frozen encoder as it is).
    """

    kind = "embedding"
    TITLE = "embedding modules"
    OPTIONS = {
        "epochs": TrainerOption("--epochs", type=positive_int_arg, metavar="N",
                                help="training epochs of the Fairness Module"),
        "far": TrainerOption("--far", type=fraction_arg, metavar="RATE",
                             help="the global false accept rate the module is validated at"),
    }

    def __init__(self, config: "PipelineConfig", tolerance: float = 0.1, seed: int = 0, far: float = 1e-4,
                 max_fnmr_increase: float = 0.01, epochs: int = 20, **module_params):
        self.config, self.tolerance, self.seed, self.far = config, tolerance, seed, far
        self.max_fnmr_increase = max_fnmr_increase
        self.params = {"seed": seed, "epochs": epochs, **module_params}  # CentroidFairness parameters (hidden, ...)

    def split(self, window: "ResearchWindow", holdout: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Row indices (fit, holdout): ``holdout`` of every group's identities held out, all their vectors."""
        identities = _identities(window)
        rng = np.random.default_rng(seed)
        held = []
        for group in np.unique(window.s):
            people = rng.permutation(np.unique(identities[window.s == group]))
            held.append(people[: int(round(holdout * len(people)))])
        holdout_rows = np.flatnonzero(np.isin(identities, np.concatenate(held) if held else []))
        return np.setdiff1d(np.arange(len(window)), holdout_rows), holdout_rows

    def too_small(self, window: "ResearchWindow", fit_rows: np.ndarray, holdout_rows: np.ndarray,
                  min_rows: int) -> str | None:
        """Every configured group needs ``min_rows`` vectors and two identities on each side of the split."""
        identities = _identities(window)
        for group in self.config.groups:
            for side, rows in (("fit", fit_rows), ("holdout", holdout_rows)):
                mine = rows[window.s[rows] == group]
                if len(mine) < min_rows or len(np.unique(identities[mine])) < 2:
                    return (f"research window too small: group {group!r} has {len(mine)} {side} vectors of "
                            f"{len(np.unique(identities[mine]))} identities, at least {min_rows} vectors of 2 "
                            f"identities are needed (window of {len(window)} vectors from {window.source})")
        return None

    def fit(self, window: "ResearchWindow", actives: Mapping):
        """A Fairness Module trained with the Centroid Fairness loss on the window's vectors."""
        from fairstream.models.centroid import fit_embedding_module

        return fit_embedding_module(window.X, _identities(window), window.s, **self.params)

    def validate(self, module, held: "ResearchWindow", actives: Mapping) -> Validation:
        """BFAR and FNMR of ``module`` on all same-group pairs of the held-out identities, at ``far``."""
        from fairstream.models.centroid import validate_embedding_module

        comparison = validate_embedding_module(module, held.X, _identities(held), held.s, far=self.far)
        after = comparison.after
        return Validation(name=f"BFAR at FAR {self.far:g}", value=float(after.bfar),
                          summary=f"BFAR {format_value(after.bfar)}, FNMR {after.fnmr:.4f}",
                          metrics={"far": self.far, "bfar": float(after.bfar), "bfrr": float(after.bfrr),
                                   "fnmr": float(after.fnmr), "impostor_pairs": comparison.impostor_pairs,
                                   "genuine_pairs": comparison.genuine_pairs})

    def baseline(self, held: "ResearchWindow", actives: Mapping) -> Validation:
        """The identity module: what a first module must beat."""
        from fairstream.models.embedding import FairnessModule

        return self.validate(FairnessModule.identity(held.X.shape[1]), held, actives)

    def refusal(self, candidate: Validation, current: Validation) -> str | None:
        """Refuse a higher BFAR (beyond tolerance) or an FNMR more than ``max_fnmr_increase`` worse."""
        return worse_by(candidate, current, self.tolerance) or \
            cost_by(candidate, current, "fnmr", "FNMR", 1.0, self.max_fnmr_increase, ".4f")


def _identities(window: "ResearchWindow") -> np.ndarray:
    if window.identity is None:
        raise TrainerError("an embedding re-fit needs the identity of every vector (a labelled embeddings file)")
    return window.identity


def refit_kinds() -> tuple[str, ...]:
    """The artifact kinds whose capabilities name a trainer, records' in chain order, then embeddings'."""
    from fairstream.models.kinds import capabilities, kinds_for

    return tuple(kind for agent in ("records", "embeddings") for kind in kinds_for(agent)
                 if capabilities(kind).trainer is not None)


REFIT_KINDS = refit_kinds()
"""The kinds a re-fit can train, as registered when this module was imported."""


def trainer_class(kind: str) -> type:
    """The trainer class of ``kind``, imported from its capabilities' ``trainer`` path; none: TrainerError."""
    from fairstream.models.kinds import MODULE_KINDS, capabilities

    path = capabilities(kind).trainer if kind in MODULE_KINDS else None
    if path is None:
        raise TrainerError(f"no trainer for artifact kind {kind!r} (re-fittable: {list(refit_kinds())})")
    module, _, name = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:  # a capability naming a trainer that is not there: say which
        raise TrainerError(f"the trainer {path} of kind {kind!r} cannot be imported: {exc}") from None
    if cls.kind != kind:  # a capability naming another kind's trainer would publish the wrong kind
        raise TrainerError(f"the trainer {path} of kind {kind!r} trains {cls.kind!r}")
    return cls


def make_trainer(kind: str, config: "PipelineConfig", **params):
    """The trainer of ``kind`` with its parameters; a kind without a trainer names the re-fittable ones."""
    return trainer_class(kind)(config, **params)


def labelled(window: "ResearchWindow", kind: str) -> None:
    """Refuse a window without labels for a kind that trains on them."""
    if window.y is None or (len(window) and not np.isin(window.y, (0, 1)).all()):
        raise TrainerError(f"a {kind} re-fit needs every research record labelled (y = 0 or 1)")
