"""Re-fit jobs: fit a new repair plan on a labelled research window, validate it, publish it.

A :class:`RefitJob` reads a research window (the ``research`` topic or a file), splits it into a
fit part and a holdout part (seeded, stratified by (u, s) cell), fits a candidate
:class:`~fairstream.repair.distributional.DistributionalRepair` on the fit part, and measures the
dependence E after repair on the holdout, for the candidate and for the plan the workers serve now
(rebuilt from the control topic exactly as a worker would: an
:class:`~fairstream.streams.control.registry.ArtifactRegistry` replays the topic). The candidate is
published through :class:`~fairstream.streams.control.client.ControlClient` when no plan is active,
or when its E is not worse than the current plan's by more than ``tolerance`` (relative); otherwise
nothing is published and the outcome says why, with both numbers.

Three ways to run it: once (``fairstream refit --kind plan``; a Kubernetes CronJob), on a schedule
(:mod:`~fairstream.streams.refit.schedule`), or as a service answering the monitor's requests
(:mod:`~fairstream.streams.refit.service`).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .sources import ResearchWindow, Source, resolve_source

if TYPE_CHECKING:
    from fairstream.streams.config import PipelineConfig
    from fairstream.streams.control.registry import Active
    from fairstream.streams.control.store import ArtifactStore

log = logging.getLogger(__name__)

REFIT_KINDS = ("plan",)
"""Artifact kinds this module can re-fit (flows and scorers bring their own fit code later)."""

MIN_CELL_ROWS = 20
# =============================================================================== the job


@dataclass(frozen=True)
class RefitOutcome:
    """What one re-fit did and why.

    ``version`` is the version this run published (None when it published nothing);
    ``current_version`` the version that was active before it. The E values are totals over
    features on the holdout, after repair; ``noise_floor`` is E with s permuted within strata on
    the same holdout (what an ideal repair would still measure).
    """

    published: bool
    version: int | None
    reason: str
    e_candidate: float | None
    e_current: float | None
    noise_floor: float | None
    n_research: int
    seconds: float
    current_version: int | None = None
    n_holdout: int = 0
    n_invalid: int = 0
    sha256: str | None = None


@dataclass(frozen=True)
class _Score:
    """A plan's E after repair on the holdout, and how many holdout rows it could not repair."""

    e_after: float
    e_before: float
    floor: float
    damage: list
    unrepaired: int


def format_e(value: float) -> str:
    """E as it appears in reasons and reports."""
    return f"{value:.3g}"


class RefitJob:
    """Fit, validate and publish one new ``plan`` version from a research window.

    Parameters
    ----------
    config, bootstrap:
        The pipeline (features, groups, strata, topics, artifact_dir) and its broker.
    store:
        Where published artifacts are stored (default: ``ArtifactStore(config.artifact_dir)``).
    n_q, out_of_range, repair_amount:
        Passed to :class:`~fairstream.repair.distributional.DistributionalRepair`.
    holdout:
        Fraction of every (u, s) cell held out for validation.
    tolerance:
        The candidate is refused when its holdout E exceeds the current plan's by more than this
        fraction. E after repair sits near its noise floor, where it varies by about 10-20 % from
        one holdout to another, so a re-fit on unchanged data may be refused; that is harmless
        (the current plan stays). Drift moves E by multiples, far beyond the tolerance.
    min_cell_rows:
        Every configured (u, s) cell needs this many rows in the fit part and in the holdout part.
    seed:
        Seeds the split and the noise floor's permutations: the same window gives the same decision.
    """

    kind = "plan"

    def __init__(self, config: "PipelineConfig", bootstrap: str, store: "ArtifactStore | None" = None,
                 n_q: int = 250, holdout: float = 0.2, tolerance: float = 0.1, seed: int = 0,
                 out_of_range: str = "clamp", repair_amount: float = 1.0, min_cell_rows: int = MIN_CELL_ROWS):
        from fairstream.streams.control.client import ControlClient
        from fairstream.streams.control.store import ArtifactStore

        if not 0.0 < holdout < 1.0:
            raise ValueError(f"holdout must be a fraction in (0, 1), got {holdout!r}")
        if tolerance < 0:
            raise ValueError(f"tolerance must be >= 0, got {tolerance!r}")
        if min_cell_rows < 2:
            raise ValueError(f"min_cell_rows must be >= 2, got {min_cell_rows!r}")
        self.config = config
        self.bootstrap = bootstrap
        self.store = store if store is not None else ArtifactStore(config.artifact_dir)
        self.control = ControlClient(bootstrap, config.topics, self.store)
        self.n_q = n_q
        self.holdout = holdout
        self.tolerance = tolerance
        self.seed = seed
        self.out_of_range = out_of_range
        self.repair_amount = repair_amount
        self.min_cell_rows = min_cell_rows

    # ------------------------------------------------------------------ the run

    def run_once(self, source: Source) -> RefitOutcome:
        """Read the window, fit, validate, and publish if the candidate passes; never raises on a refusal."""
        started = time.monotonic()
        window = resolve_source(source)
        fit_rows, holdout_rows = stratified_split(window.s, window.u, self.holdout, self.seed)
        base = dict(n_research=len(window), n_holdout=len(holdout_rows), n_invalid=window.n_invalid)
        too_small = self._too_small(window, fit_rows, holdout_rows)
        if too_small:
            return self._finish(started, published=False, reason=too_small, **base)
        fit, held = window.subset(fit_rows), window.subset(holdout_rows)
        candidate = self.fit_candidate(fit.X, fit.s, fit.u)
        score = self._score(candidate, held)
        current = self.current_plan()
        current_score, unusable = self._score_current(current, held)
        base.update(e_candidate=score.e_after, noise_floor=score.floor,
                    e_current=None if current_score is None else current_score.e_after,
                    current_version=None if current is None else current.version)
        refusal = self._refusal(score, current_score, len(held))
        if refusal:
            return self._finish(started, published=False, reason=refusal, **base)
        artifact = self._artifact(candidate, fit, window, score, current_score, current)
        if current is not None and artifact.sha256 == current.sha256:
            # An unchanged window refits the same plan; a new version of it would change nothing.
            reason = (f"the candidate is identical to the active plan v{current.version} (payload sha256 "
                      f"{artifact.sha256[:12]}); nothing to publish")
            return self._finish(started, published=False, reason=reason, **base)
        record = self.control.publish_sync(artifact)
        reason = self._publish_reason(record.version, score, current_score, current, unusable, len(held))
        return self._finish(started, published=True, reason=reason, version=record.version, sha256=record.sha256, **base)

    def fit_candidate(self, X: np.ndarray, s: np.ndarray, u: np.ndarray):
        """The candidate plan (override to re-fit another estimator of the same kind)."""
        from fairstream.repair.distributional import DistributionalRepair

        return DistributionalRepair(n_q=self.n_q, out_of_range=self.out_of_range, repair_amount=self.repair_amount,
                                    columns=list(self.config.features)).fit(X, s, u)

    def current_plan(self) -> "Active | None":
        """The plan the workers serve now: the control topic replayed through a worker's registry.

        Replaying (rather than taking the last record) applies the workers' own rules: rollbacks,
        stale publishes, and refusal of records whose artifact does not verify or fit the pipeline.
        """
        from fairstream.streams.control.records import encode_control
        from fairstream.streams.control.registry import ArtifactRegistry, module_loaders

        registry = ArtifactRegistry(module_loaders(self.config.schema()), store=self.store)
        for record in self.control.history_sync():
            if record.kind == self.kind:
                registry.apply(encode_control(record))
        return registry.current(self.kind)

    # ------------------------------------------------------------------ validation

    def _too_small(self, window: ResearchWindow, fit_rows: np.ndarray, holdout_rows: np.ndarray) -> str | None:
        for u_value in self.config.strata:
            for s_value in self.config.groups:
                n_fit = _cell_size(window, fit_rows, u_value, s_value)
                n_holdout = _cell_size(window, holdout_rows, u_value, s_value)
                if min(n_fit, n_holdout) < self.min_cell_rows:
                    return (f"research window too small: cell (u={u_value!r}, s={s_value!r}) has {n_fit} fit and "
                            f"{n_holdout} holdout rows, at least {self.min_cell_rows} of each are needed "
                            f"(window of {len(window)} valid rows from {window.source}, holdout "
                            f"{self.holdout:.0%}); not publishing")
        return None

    def _score(self, plan, held: ResearchWindow) -> _Score:
        """E after the plan repairs the holdout; rows it refuses stay unrepaired, as a penalty."""
        from fairstream.repair.measure.evaluation import evaluate_repair

        result = plan.repair(held.X, held.s, held.u, keys=held.keys)
        evaluation = evaluate_repair(held.X, result.values, held.s, held.u, seed=self.seed)
        return _Score(e_after=float(evaluation.e_after.total), e_before=float(evaluation.e_before.total),
                      floor=float(evaluation.floor.total_mean), damage=evaluation.damage.tolist(),
                      unrepaired=int(len(held) - result.n_repaired))

    def _score_current(self, current: "Active | None", held: ResearchWindow) -> tuple[_Score | None, str | None]:
        """The current plan's score, or why it cannot repair this window at all (then it is replaced)."""
        from fairstream.repair.distributional import RepairInputError

        if current is None:
            return None, None
        try:
            return self._score(current.module, held), None
        except RepairInputError as exc:
            return None, str(exc)

    def _refusal(self, score: _Score, current: _Score | None, n_holdout: int) -> str | None:
        if current is None or score.e_after <= current.e_after * (1.0 + self.tolerance):
            return None
        return (f"candidate E {format_e(score.e_after)} > current E {format_e(current.e_after)} x "
                f"{1.0 + self.tolerance:.2f} on {n_holdout} holdout rows (noise floor {format_e(score.floor)}); "
                "not publishing")

    # ------------------------------------------------------------------ publishing

    def _artifact(self, candidate, fit: ResearchWindow, window: ResearchWindow, score: _Score,
                  current_score: _Score | None, current: "Active | None"):
        """The candidate as an artifact, with its fit-time metrics and the fingerprint of its fit data."""
        from fairstream.repair import artifacts

        metrics = {
            "E_holdout_after": score.e_after,
            "E_holdout_before": score.e_before,
            "E_holdout_floor": score.floor,
            "E_current_holdout": None if current_score is None else current_score.e_after,
            "damage_holdout": score.damage,
            "n_research": len(window),
            "n_fit": len(fit),
            "n_holdout": len(window) - len(fit),
            "n_invalid": window.n_invalid,
            "holdout_fraction": self.holdout,
            "tolerance": self.tolerance,
            "seed": self.seed,
            "source": window.source,
            "replaces_version": None if current is None else current.version,
        }
        fingerprint = artifacts.fingerprint_arrays(fit.X, _hashable(fit.s), _hashable(fit.u))
        return candidate.to_artifact(metrics=metrics, data_fingerprint=fingerprint)

    def _publish_reason(self, version: int, score: _Score, current_score: _Score | None, current: "Active | None",
                        unusable: str | None, n_holdout: int) -> str:
        candidate = f"candidate E {format_e(score.e_after)}"
        if current is None:
            return (f"no plan was active: published plan v{version} ({candidate} on {n_holdout} holdout rows, "
                    f"noise floor {format_e(score.floor)})")
        if current_score is None:
            return f"the active plan v{current.version} cannot repair this window ({unusable}): published plan v{version}"
        left = f"; the current plan left {current_score.unrepaired} holdout rows unrepaired" if current_score.unrepaired else ""
        return (f"{candidate} <= current E {format_e(current_score.e_after)} x {1.0 + self.tolerance:.2f} on "
                f"{n_holdout} holdout rows (noise floor {format_e(score.floor)}){left}: published plan v{version} "
                f"(replaces v{current.version})")

    def _finish(self, started: float, **fields) -> RefitOutcome:
        fields.setdefault("version", None)
        for name in ("e_candidate", "e_current", "noise_floor"):
            fields.setdefault(name, None)
        outcome = RefitOutcome(seconds=time.monotonic() - started, **fields)
        log.info("re-fit of %s: %s", self.kind, outcome.reason)
        return outcome


def stratified_split(s: np.ndarray, u: np.ndarray, holdout: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (fit, holdout), holding out ``holdout`` of every (u, s) cell at random.

    Stratified so that small cells are represented in both parts in proportion, whatever the draw.
    """
    rng = np.random.default_rng(seed)
    cells = np.unique(np.column_stack([_hashable(u), _hashable(s)]), axis=0, return_inverse=True)[1].ravel()
    held = []
    for cell in range(cells.max() + 1 if len(cells) else 0):
        rows = rng.permutation(np.flatnonzero(cells == cell))
        held.append(rows[: int(round(holdout * len(rows)))])
    holdout_rows = np.sort(np.concatenate(held)) if held else np.array([], dtype=np.intp)
    fit_rows = np.setdiff1d(np.arange(len(s)), holdout_rows)
    return fit_rows, holdout_rows


def _cell_size(window: ResearchWindow, rows: np.ndarray, u_value, s_value) -> int:
    return int(np.sum((window.u[rows] == u_value) & (window.s[rows] == s_value)))


def _hashable(labels: np.ndarray) -> np.ndarray:
    """Labels as a fixed-width array: the codec gives object arrays for string labels, and
    fingerprints and np.unique refuse or mis-order objects. JSON text keeps 1 and "1" apart."""
    labels = np.asarray(labels)
    if labels.dtype.kind != "O":
        return labels
    return np.array([json.dumps(value) for value in labels.tolist()], dtype=str)


def format_outcome(outcome: RefitOutcome) -> str:
    """A short multi-line report of one run, for the CLI."""
    def show(value):
        return "-" if value is None else format_e(value)

    status = f"published plan v{outcome.version}" if outcome.published else "not published"
    current = "" if outcome.current_version is None else f" (v{outcome.current_version})"
    return "\n".join([
        f"re-fit: {status}",
        f"  reason:        {outcome.reason}",
        f"  E candidate:   {show(outcome.e_candidate)}   E current{current}: {show(outcome.e_current)}"
        f"   noise floor: {show(outcome.noise_floor)}",
        f"  research rows: {outcome.n_research} ({outcome.n_holdout} held out, {outcome.n_invalid} invalid skipped)",
        f"  took:          {outcome.seconds:.1f} s",
    ])
