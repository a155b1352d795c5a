"""Re-fit jobs: fit a new artifact of one kind on a labelled research window, validate it, publish it.

A :class:`RefitJob` reads a research window (the ``research`` topic or a file), splits it into a
fit part and a holdout part (seeded, stratified by (u, s) cell), has the kind's trainer
(:mod:`~fairstream.streams.refit.trainers`: a plan, a flow, ...) fit a candidate on the fit part,
and scores the candidate and the module the workers serve now on the same holdout (the serving
modules are rebuilt from the control topic exactly as a worker would: an
:class:`~fairstream.streams.control.registry.ArtifactRegistry` replays the topic). The candidate is
published through :class:`~fairstream.streams.control.client.ControlClient` when nothing of its
kind is active and it beats the trainer's baseline (if it has one), or when the trainer does not
find it worse than the current module; otherwise nothing is published and the outcome says why,
with both numbers. Under a pipeline's promotion ``"approve"`` it is published as a *candidate*: the
workers apply it in shadow, and it serves only once approved; under ``"shadow"`` too, once a version
of its kind served and when the record chain applies it (the client's
:func:`~fairstream.streams.control.client.publish_mode` decides, and the outcome says why).

Three ways to run it: once (``fairstream refit --kind plan|flow``; a Kubernetes CronJob), on a
schedule (:mod:`~fairstream.streams.refit.schedule`), or as a service answering the monitor's
requests (:mod:`~fairstream.streams.refit.service`).
"""

from __future__ import annotations

import asyncio

import logging
import math
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from fairstream.models.kinds import capabilities

from .sources import ResearchWindow, Source, hashable_labels, resolve_source, stratified_split  # noqa: F401
from .trainers import REFIT_KINDS, TrainerError, Validation, format_value, labelled, make_trainer  # noqa: F401

if TYPE_CHECKING:
    from fairstream.streams.config import PipelineConfig
    from fairstream.streams.control.store import ArtifactStore

log = logging.getLogger(__name__)

MIN_CELL_ROWS = 20
# =============================================================================== the job


@dataclass(frozen=True)
class RefitOutcome:
    """What one re-fit did and why.

    ``version`` is the version this run published (None when it published nothing);
    ``current_version`` the version that was active before it. ``statistic`` names the compared
    figure (``E`` for plans: the total over features after repair; ``DP gap`` for flows), lower is
    better; ``candidate_value`` and ``current_value`` are its values on the holdout, and
    ``floor`` what an ideal module would still measure (plans: E with s permuted within strata).
    """

    kind: str
    published: bool
    version: int | None
    reason: str
    n_research: int
    seconds: float
    statistic: str | None = None
    candidate_value: float | None = None
    current_value: float | None = None
    floor: float | None = None
    current_version: int | None = None
    n_holdout: int = 0
    n_invalid: int = 0
    sha256: str | None = None
    metrics: dict = field(default_factory=dict)  # the candidate's holdout metrics
    candidate: bool = False  # published as a candidate: it serves once promoted or approved


class RefitJob:
    """Fit, validate and publish one new version of ``kind`` from a research window.

    Parameters
    ----------
    config, bootstrap:
        The pipeline (features, groups, strata, topics, artifact_dir) and its broker.
    store:
        Where published artifacts are stored (default: ``ArtifactStore(config.artifact_dir)``).
    kind:
        The artifact kind to re-fit (one of :data:`REFIT_KINDS`; default: the config's ``refit_kind``).
    holdout:
        Fraction of every (u, s) cell held out for validation.
    tolerance:
        How much worse (relative) than the current module a candidate may score (see the trainer).
    min_cell_rows:
        Every configured (u, s) cell needs this many rows in the fit part and in the holdout part.
    seed:
        Seeds the split, the trainer and the validation: the same window gives the same decision.
    trainer_params:
        Passed to the kind's trainer (plans: ``n_q``, ``out_of_range``, ``repair_amount``; flows:
        ``lam``, ``notion``, ``n_steps``, ``n_blocks``, ``hidden``, ``max_accuracy_drop``).
    """

    def __init__(self, config: "PipelineConfig", bootstrap: str, store: "ArtifactStore | None" = None,
                 kind: str | None = None, holdout: float = 0.2, tolerance: float = 0.1, seed: int = 0,
                 min_cell_rows: int = MIN_CELL_ROWS, signer=None, **trainer_params):
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
        self.kind = kind = kind or config.refit_kind
        self.trainer = make_trainer(kind, config, tolerance=tolerance, seed=seed, **trainer_params)
        self.store = store if store is not None else ArtifactStore(config.artifact_dir)
        # The pipeline's gate and trust: what serves is read as the workers read it; publishes are signed by `signer`.
        self.control = ControlClient.of(config, bootstrap, signer=signer, store=self.store)
        self.holdout = holdout
        self.tolerance = tolerance
        self.seed = seed
        self.min_cell_rows = min_cell_rows

    # ------------------------------------------------------------------ the run

    def run_once(self, source: Source, trigger: str | None = None) -> RefitOutcome:
        """Read the window, fit, validate, and publish if the candidate passes; never raises on a refusal.

        ``trigger`` says what started the run (a request's reason, "schedule", "command"): the audit
        trail's reason for the publish.
        """
        started = time.monotonic()
        window = resolve_source(source).in_key_order()
        try:
            fit_rows, holdout_rows = self.trainer.split(window, self.holdout, self.seed)
            too_small = self.trainer.too_small(window, fit_rows, holdout_rows, self.min_cell_rows)
        except TrainerError as exc:
            return self._finish(started, published=False, reason=f"{exc}; not publishing", n_research=len(window),
                                n_invalid=window.n_invalid)
        base = dict(n_research=len(window), n_holdout=len(holdout_rows), n_invalid=window.n_invalid)
        if too_small:
            reason = f"{too_small}, holdout {self.holdout:.0%}; not publishing"
            return self._finish(started, published=False, reason=reason, **base)
        fit, held = window.subset(fit_rows), window.subset(holdout_rows)
        actives = self.serving()
        current = actives.get(self.kind)
        base["current_version"] = None if current is None else current.version
        try:
            if capabilities(self.kind).needs_labels:
                labelled(window, self.kind)
            candidate = self.trainer.fit(fit, actives)
            score = self.trainer.validate(candidate, held, actives)
            current_score, unusable = self._score_current(current, held, actives)
        except TrainerError as exc:
            return self._finish(started, published=False, reason=f"{exc}; not publishing", **base)
        base.update(statistic=score.name, candidate_value=score.value, floor=score.floor, metrics=score.metrics,
                    current_value=None if current_score is None else current_score.value)
        refusal = None if current_score is None else self.trainer.refusal(score, current_score)
        if refusal:
            reason = f"{refusal} on {len(held)} holdout rows ({self._versus(current)}); not publishing"
            return self._finish(started, published=False, reason=reason, **base)
        artifact = self._artifact(candidate, fit, window, score, current_score, current)
        if current is not None and artifact.sha256 == current.sha256:
            # An unchanged window refits the same module; a new version of it would change nothing.
            reason = (f"the candidate is identical to the active {self.kind} v{current.version} (payload sha256 "
                      f"{artifact.sha256[:12]}); nothing to publish")
            return self._finish(started, published=False, reason=reason, **base)
        published = self.control.publish_under_sync(artifact, self.config.promotion,
                                                    **_audit(trigger, score, current_score))
        record = published.record
        candidate = bool(record.candidate)  # the client decided, from the promotion and the log (publish_mode)
        reason = self._publish_reason(record.version, score, current_score, current, unusable, len(held), candidate)
        if self.config.promotion != "auto" and not candidate:
            reason = f"{reason}; {published.mode.why}"
        return self._finish(started, published=True, reason=reason, version=record.version, sha256=record.sha256,
                            candidate=candidate, **base)

    def serving(self) -> Mapping:
        """What the workers serve now, by kind: the control topic replayed through a worker's registry.

        Replaying (rather than taking the last record) applies the workers' own rules: rollbacks,
        stale publishes, and refusal of records whose artifact does not verify or fit the pipeline.
        """
        from fairstream.streams.control.records import encode_control
        from fairstream.streams.control.registry import ArtifactRegistry, module_loaders

        registry = ArtifactRegistry(module_loaders(self.config.schema()), store=self.store)
        control = asyncio.run(self.control.read())
        for entry in control.entries:  # at their offsets: the version rule counts the messages between claims
            if entry.refusal is None:
                registry.apply(encode_control(entry.record), offset=entry.offset)
        return registry.snapshot()

    def current(self):
        """The ``Active`` artifact of this job's kind the workers serve now, or None."""
        return self.serving().get(self.kind)

    # ------------------------------------------------------------------ validation

    def _score_current(self, current, held: ResearchWindow, actives: Mapping) -> tuple[Validation | None, str | None]:
        """The current module's score (or the trainer's baseline when none is active), or why it cannot serve."""
        from fairstream.models.plan import RepairInputError

        if current is None:
            baseline = getattr(self.trainer, "baseline", None)
            return (None if baseline is None else baseline(held, actives)), None
        try:
            return self.trainer.validate(current.module, held, actives), None
        except RepairInputError as exc:
            return None, str(exc)

    def _versus(self, current) -> str:
        return f"against the active {self.kind} v{current.version}" if current is not None else \
            "against the deployment without one"

    # ------------------------------------------------------------------ publishing

    def _artifact(self, candidate, fit: ResearchWindow, window: ResearchWindow, score: Validation,
                  current_score: Validation | None, current):
        """The candidate as an artifact, with its fit-time metrics and the fingerprint of its fit data."""
        from fairstream.repair import artifacts

        metrics = {
            **score.metrics,
            "holdout_statistic": score.name,
            "holdout_value": score.value,
            "current_holdout_value": None if current_score is None else current_score.value,
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
        arrays = [fit.X, hashable_labels(fit.s), hashable_labels(fit.u)] + ([] if fit.y is None else [fit.y])
        return candidate.to_artifact(metrics=metrics, data_fingerprint=artifacts.fingerprint_arrays(*arrays))

    def _publish_reason(self, version: int, score: Validation, current_score: Validation | None, current,
                        unusable: str | None, n_holdout: int, as_candidate: bool = False) -> str:
        kind, candidate = self.kind, f"candidate {score.summary}"
        published = f"published candidate {kind} version {version}" if as_candidate else f"published {kind} v{version}"
        if current is None:
            versus = "" if current_score is None else f"; without a {kind}: {current_score.summary}"
            return f"no {kind} was active: {published} ({candidate} on {n_holdout} holdout rows{versus})"
        if current_score is None:
            return f"the active {kind} v{current.version} cannot serve this window ({unusable}): {published}"
        left = (f"; the current {kind} left {current_score.unusable} holdout rows unprocessed"
                if current_score.unusable else "")
        replaces = f"would replace v{current.version} once promoted" if as_candidate else f"replaces v{current.version}"
        return (f"{candidate} against current {current_score.summary} on {n_holdout} holdout rows, within "
                f"tolerance{left}: {published} ({replaces})")

    def _finish(self, started: float, **fields) -> RefitOutcome:
        fields.setdefault("version", None)
        outcome = RefitOutcome(kind=self.kind, seconds=time.monotonic() - started, **fields)
        log.info("re-fit of %s: %s", self.kind, outcome.reason)
        return outcome


def _audit(trigger: str | None, score: Validation, current_score: Validation | None) -> dict:
    """Who publishes a re-fit (the service under its own name), why, and the compared figures (finite ones)."""
    from fairstream.streams.control.records import MAX_ACTOR, MAX_REASON

    figures = {score.name: score.value}
    if current_score is not None:
        figures[f"current {current_score.name}"] = current_score.value
    reason = " ".join((trigger or "re-fit").split()) or "re-fit"
    return {"actor": f"refit@{socket.gethostname()}"[:MAX_ACTOR], "reason": reason[:MAX_REASON],
            "statistics": {name: float(value) for name, value in figures.items() if math.isfinite(value)}}


def format_outcome(outcome: RefitOutcome) -> str:
    """A short multi-line report of one run, for the CLI."""
    def show(value):
        return "-" if value is None else format_value(value)

    status = f"published {outcome.kind} v{outcome.version}" if outcome.published else "not published"
    if outcome.published and outcome.candidate:
        status = f"published candidate {outcome.kind} version {outcome.version} (it serves once promoted or approved)"
    current = "" if outcome.current_version is None else f" (v{outcome.current_version})"
    floor = "" if outcome.floor is None else f"   floor: {show(outcome.floor)}"
    return "\n".join([
        f"re-fit of {outcome.kind}: {status}",
        f"  reason:        {outcome.reason}",
        f"  {outcome.statistic or 'statistic'} candidate: {show(outcome.candidate_value)}   current{current}: "
        f"{show(outcome.current_value)}{floor}",
        f"  research rows: {outcome.n_research} ({outcome.n_holdout} held out, {outcome.n_invalid} invalid skipped)",
        f"  took:          {outcome.seconds:.1f} s",
    ])
