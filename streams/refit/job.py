"""Re-fit jobs: fit a new repair plan on a labelled research window, validate it, publish it.

A :class:`RefitJob` reads a research window (the ``research`` topic or a file), splits it into a
fit part and a holdout part (seeded, stratified by (u, s) cell), fits a candidate
:class:`~fairstream.repair.distributional.DistributionalRepair` on the fit part, and measures the
dependence E after repair on the holdout, for the candidate and for the plan the workers serve now
(rebuilt from the control topic exactly as a worker would: an
:class:`~fairstream.streams.control.registry.ArtifactRegistry` replays the topic). The candidate is published
through :class:`~fairstream.streams.control.registry.ControlClient` when no plan is active, or when its E is
not worse than the current plan's by more than ``tolerance`` (relative); otherwise nothing is
published and the outcome says why, with both numbers.

Three ways to run it:

- once (``fairstream refit --kind plan``; a Kubernetes CronJob, ``deploy/k8s/refit-cronjob.yaml``);
- on a schedule in one process (``--every 6h``, :func:`run_every`);
- as a service (``--serve``, :class:`RefitService`) answering the monitor's requests on
  ``refit.requests``, de-duplicated, coalesced and rate-limited.

The ``refit.requests`` message (key = the artifact kind, value = UTF-8 JSON, see :class:`RefitRequest`)::

    {"request_id": "2b1f...",            # required, unique per request: re-deliveries are ignored
     "kind": "plan",                     # required: the artifact kind to re-fit
     "reason": "drift of dependence_e",  # required: why, for the logs
     "ts": 1700000000.0,                 # required: seconds since the epoch, when it was asked
     "statistic": "dependence_e",        # optional: the statistic that drifted
     "value": 0.12,                      # optional: its value when the drift was confirmed
     "source": "monitor@worker-1"}       # optional: who asked

Unknown fields are ignored, so producers may add context without breaking older services.

The CLI builds its parser from this module, so only light modules are imported at the top; the
fitting, Kafka and Faust-schema modules (seconds to import) are imported by the functions that use them.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import io
import json
import logging
import math
import re
import signal
import threading
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence, Union

import numpy as np

if TYPE_CHECKING:
    from fairstream.streams.config import PipelineConfig
    from fairstream.streams.control.registry import Active, ArtifactStore

__all__ = [
    "MIN_CELL_ROWS",
    "REFIT_KINDS",
    "Decision",
    "FileSource",
    "RefitJob",
    "RefitOutcome",
    "RefitRequest",
    "RefitRequestError",
    "RefitService",
    "ResearchWindow",
    "TopicSource",
    "add_refit_parser",
    "format_e",
    "format_outcome",
    "parse_duration",
    "parse_request",
    "read_research_file",
    "read_research_topic",
    "request_refit",
    "research_source",
    "run_every",
    "run_refit_command",
    "stratified_split",
]

log = logging.getLogger(__name__)

REFIT_KINDS = ("plan",)
"""Artifact kinds this module can re-fit (flows and scorers bring their own fit code later)."""

MIN_CELL_ROWS = 20
_KAFKA_API = (2, 5, 0)  # what the embedded broker (Tansu) answers correctly; Apache Kafka accepts it too
_MAX_REQUEST_BYTES = 64 * 1024
_MAX_REQUEST_ID = 200
_SEEN_REQUESTS = 10_000  # request ids remembered for de-duplication (oldest forgotten first)


# =============================================================================== research windows


@dataclass(frozen=True, eq=False)
class ResearchWindow:
    """Labelled research records as arrays; unpacks as ``X, s, u = window``.

    ``n_invalid`` counts the records that were skipped, ``invalid_examples`` holds a few of their
    reasons (the codec's dead-letter reasons), ``source`` says where the window came from.
    """

    X: np.ndarray
    s: np.ndarray
    u: np.ndarray
    keys: np.ndarray
    n_invalid: int = 0
    invalid_examples: tuple[str, ...] = ()
    source: str = "arrays"

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter((self.X, self.s, self.u))

    def __len__(self) -> int:
        return len(self.X)

    @classmethod
    def of(cls, X, s, u, keys=None, source: str = "arrays") -> "ResearchWindow":
        """A window from arrays (a notebook, a test); keys default to the row positions."""
        X = np.asarray(X, dtype=np.float64)
        keys = np.arange(len(X)).astype(str) if keys is None else np.asarray(keys).astype(str)
        return cls(X=X, s=np.asarray(s), u=np.asarray(u), keys=keys, source=source)

    def subset(self, rows: np.ndarray) -> "ResearchWindow":
        return ResearchWindow(self.X[rows], self.s[rows], self.u[rows], self.keys[rows], source=self.source)


def _window_from_values(values: list[bytes], config: "PipelineConfig", source: str, n_invalid: int = 0,
                        examples: Sequence[str] = ()) -> ResearchWindow:
    """Decode records.in-format values with the stream's own codec, so a window accepts what a worker accepts."""
    from fairstream.streams.worker.codec import decode_records

    decoded = decode_records(values, config)
    examples = (list(examples) + [reason for _, reason in decoded.errors])[:5]
    n_invalid += len(decoded.errors)
    if n_invalid:
        log.warning("%s: skipped %d invalid research record(s), e.g. %s", source, n_invalid, examples[:3])
    return ResearchWindow(decoded.X, decoded.s, decoded.u, decoded.keys, n_invalid, tuple(examples), source)


def read_research_topic(bootstrap: str, config: "PipelineConfig", last_n: int | None = None,
                        idle_seconds: float = 2.0, timeout: float = 300.0) -> ResearchWindow:
    """The latest ``last_n`` valid records on the research topic (all of them when ``last_n`` is None).

    Reads every partition from the beginning without a consumer group. A partition is read up to
    now once the consumer's fetch highwater is reached or a record stamped after the start shows
    up; ``end_offsets()`` is not used because the embedded broker (Tansu) reports wrong ones.
    Partitions the fetcher never reports on end the read after ``idle_seconds`` without data.
    "Latest" is by the records' Kafka timestamps across partitions; only ``last_n`` values per
    partition are kept in memory.
    """
    from kafka import KafkaConsumer, TopicPartition

    if last_n is not None and last_n < 1:
        raise ValueError(f"last_n must be a positive number of records or None (all), got {last_n!r}")
    topic = config.topics.research
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, api_version=_KAFKA_API, group_id=None,
                             enable_auto_commit=False, fetch_max_wait_ms=100,
                             max_partition_fetch_bytes=8 * 1024 * 1024)
    try:
        partitions = sorted(consumer.partitions_for_topic(topic) or ())
        if not partitions:
            log.warning("research topic %s does not exist: the window is empty", topic)
            return _window_from_values([], config, f"topic {topic}")
        assigned = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(assigned)
        consumer.seek_to_beginning()
        tails, n_invalid, examples = _read_tails(consumer, assigned, config, last_n, idle_seconds, timeout)
    finally:
        consumer.close()
    latest = sorted((entry for tail in tails.values() for entry in tail), key=lambda entry: entry[:3])
    values = [entry[3] for entry in (latest[-last_n:] if last_n else latest)]
    return _window_from_values(values, config, f"topic {topic}", n_invalid, examples)


def _read_tails(consumer, assigned: list, config: "PipelineConfig", last_n: int | None, idle_seconds: float,
                timeout: float) -> tuple[dict, int, list[str]]:
    """Per partition, the last ``last_n`` valid values as (timestamp, partition, offset, value)."""
    from fairstream.streams.worker.codec import decode_records

    started_ms = time.time() * 1000.0
    tails = {tp: deque(maxlen=last_n) for tp in assigned}
    caught_up: set = set()
    n_invalid, examples = 0, []
    deadline = time.monotonic() + timeout
    last_data = time.monotonic()
    while len(caught_up) < len(assigned):
        batches = consumer.poll(timeout_ms=200, max_records=50_000)
        for tp, messages in batches.items():
            decoded = decode_records([m.value for m in messages], config)
            n_invalid += len(decoded.errors)
            examples.extend(reason for _, reason in decoded.errors[: max(0, 5 - len(examples))])
            tails[tp].extend((messages[i].timestamp, tp.partition, messages[i].offset, messages[i].value)
                             for i in decoded.index.tolist())
            if any(m.timestamp >= started_ms for m in messages):
                caught_up.add(tp)
            last_data = time.monotonic()
        caught_up.update(tp for tp in assigned if _at_highwater(consumer, tp))
        if time.monotonic() - last_data >= idle_seconds:
            break
        if time.monotonic() > deadline:
            log.warning("stopped reading %s after %.0fs before reaching its end", assigned[0].topic, timeout)
            break
    return tails, n_invalid, examples


def _at_highwater(consumer, tp) -> bool:
    # The highwater comes with each fetch response (None before the first one) and, unlike
    # ListOffsets on Tansu, is right.
    highwater = consumer.highwater(tp)
    return highwater is not None and consumer.position(tp) >= highwater


def read_research_file(path: str | Path, config: "PipelineConfig") -> ResearchWindow:
    """A research window from a file: JSON lines in the ``records.in`` format, or CSV.

    CSV files have a header with the feature columns and ``s`` and ``u`` (or the pipeline's
    ``s_name``/``u_name``), optionally ``id``; other columns are ignored. Either way every row goes
    through the stream's codec, so invalid rows are skipped and counted with the same reasons.
    ``.csv`` files are read as CSV, ``.jsonl``/``.ndjson``/``.json`` as JSON lines, anything else
    by its first character.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if _looks_like_csv(path, text):
        values = _csv_values(text, config, path)
    else:
        values = [line.strip().encode("utf-8") for line in text.splitlines() if line.strip()]
    return _window_from_values(values, config, f"file {path}")


def _looks_like_csv(path: Path, text: str) -> bool:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return True
    if suffix in (".jsonl", ".ndjson", ".json"):
        return False
    return not text.lstrip().startswith("{")


def _csv_values(text: str, config: "PipelineConfig", path: Path) -> list[bytes]:
    """CSV rows as records.in JSON, so the codec validates them like any stream record."""
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    s_column = _label_column(header, "s", config.s_name, path)
    u_column = _label_column(header, "u", config.u_name, path)
    missing = [name for name in config.features if name not in header]
    if missing:
        raise ValueError(f"{path}: CSV header {header} lacks feature column(s) {missing}")
    groups = {str(g): g for g in config.groups}
    strata = {str(a): a for a in config.strata}
    values = []
    for line, row in enumerate(reader, start=2):
        record = {
            "id": row.get("id") or line,
            "features": {name: _number_or_text(row[name]) for name in config.features},
            "s": groups.get(row[s_column], row[s_column]),
            "u": strata.get(row[u_column], row[u_column]),
        }
        values.append(json.dumps(record).encode("utf-8"))
    return values


def _label_column(header: list[str], short: str, long: str, path: Path) -> str:
    for name in (short, long):
        if name in header:
            return name
    raise ValueError(f"{path}: CSV header {header} has no {short!r} (or {long!r}) column")


def _number_or_text(text: str | None):
    # Unparsable text stays text, so the codec rejects the row with its usual reason.
    try:
        number = float(text)
    except (TypeError, ValueError):
        return text
    return number if math.isfinite(number) else text


@dataclass(frozen=True)
class TopicSource:
    """The latest ``last_n`` records of the pipeline's research topic, read anew on every call."""

    bootstrap: str
    config: "PipelineConfig"
    last_n: int | None = 10_000

    def __call__(self) -> ResearchWindow:
        return read_research_topic(self.bootstrap, self.config, self.last_n)

    def __str__(self) -> str:
        return f"topic {self.config.topics.research} (last {self.last_n or 'all'} records)"


@dataclass(frozen=True)
class FileSource:
    """A JSON-lines or CSV research file, read anew on every call."""

    path: Path
    config: "PipelineConfig"

    def __call__(self) -> ResearchWindow:
        return read_research_file(self.path, self.config)

    def __str__(self) -> str:
        return f"file {self.path}"


Source = Union[Callable[[], ResearchWindow], ResearchWindow, tuple]


def research_source(option: str, bootstrap: str, config: "PipelineConfig", last_n: int | None) -> TopicSource | FileSource:
    """``--source``: ``topic`` for the research topic, anything else is a file path."""
    if option == "topic":
        return TopicSource(bootstrap, config, last_n)
    path = Path(option)
    if not path.is_file():
        raise FileNotFoundError(f"--source {option!r} is neither 'topic' nor an existing file")
    return FileSource(path, config)


def _resolve(source: Source) -> ResearchWindow:
    """A window from a source: a window itself, a callable returning one, or a bare ``(X, s, u)``."""
    window = source() if callable(source) else source
    if isinstance(window, tuple):
        window = ResearchWindow.of(*window)
    if not isinstance(window, ResearchWindow):
        raise TypeError(f"a research source gives a ResearchWindow or (X, s, u), got {type(window).__name__}")
    return window


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
        from fairstream.streams.control.registry import ArtifactStore, ControlClient

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
        window = _resolve(source)
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
        stale publishes, and refusal of records whose artifact does not verify.
        """
        from fairstream.repair.distributional import DistributionalRepair

        from fairstream.streams.control.registry import ArtifactRegistry, encode_control

        registry = ArtifactRegistry({self.kind: DistributionalRepair.from_artifact}, store=self.store)
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


# =============================================================================== scheduling


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds in ``"90s"``, ``"5m"``, ``"1h"``, ``"1h30m"``, ``"2d"``, ``"500ms"`` or a bare number of seconds.

    >>> parse_duration("90s"), parse_duration("5m"), parse_duration("1h30m"), parse_duration("2.5")
    (90.0, 300.0, 5400.0, 2.5)
    """
    cleaned = str(text).strip().lower().replace(" ", "")
    try:
        seconds = float(cleaned)
    except ValueError:
        parts = _DURATION.findall(cleaned)
        if not parts or "".join(number + unit for number, unit in parts) != cleaned:
            raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 5m, 1h, 1h30m, 2d)") from None
        seconds = sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"a duration must be positive, got {text!r}")
    return seconds


def run_every(job: RefitJob, source: Source, every_seconds: float, stop_event: threading.Event,
              on_outcome: Callable[[RefitOutcome], None] | None = None, max_runs: int | None = None) -> int:
    """Re-fit now and then every ``every_seconds`` until ``stop_event`` is set; returns the runs done.

    Runs start on a fixed grid (start + k * every), so they do not drift; a run that overruns its
    slot skips the slots it missed. A failed run (broker down, unreadable file) is logged and the
    schedule goes on: the next slot may succeed, and the workers keep serving the current plan.
    """
    if every_seconds <= 0:
        raise ValueError(f"every_seconds must be positive, got {every_seconds!r}")
    start, runs = time.monotonic(), 0
    while not stop_event.is_set() and (max_runs is None or runs < max_runs):
        try:
            outcome = job.run_once(source)
        except Exception:
            log.exception("scheduled re-fit of %s failed; next attempt in at most %.0fs", job.kind, every_seconds)
        else:
            if on_outcome is not None:
                on_outcome(outcome)
        runs += 1
        if max_runs is not None and runs >= max_runs:
            break
        elapsed = time.monotonic() - start
        stop_event.wait(every_seconds * (math.floor(elapsed / every_seconds) + 1) - elapsed)
    return runs


# =============================================================================== re-fit requests


class RefitRequestError(ValueError):
    """A ``refit.requests`` message that cannot be used; the message says why."""


@dataclass(frozen=True)
class RefitRequest:
    """One message on ``refit.requests`` (format in the module docstring)."""

    request_id: str
    kind: str
    reason: str
    ts: float
    statistic: str | None = None
    value: float | None = None
    source: str | None = None

    @classmethod
    def new(cls, reason: str, kind: str = "plan", statistic: str | None = None, value: float | None = None,
            source: str | None = None, request_id: str | None = None, ts: float | None = None) -> "RefitRequest":
        """A request with a fresh id and the current time unless given; validated like a parsed one."""
        request = cls(request_id=request_id or uuid.uuid4().hex, kind=kind, reason=reason,
                      ts=time.time() if ts is None else ts, statistic=statistic, value=value, source=source)
        try:
            return parse_request(request.to_json())
        except (TypeError, ValueError) as exc:  # NaN, or a value json cannot write
            raise RefitRequestError(f"invalid refit request: {exc}") from None

    def to_json(self) -> bytes:
        fields = {name: getattr(self, name) for name in self.__dataclass_fields__}
        return json.dumps(fields, sort_keys=True, allow_nan=False).encode("utf-8")


def parse_request(value: bytes | None) -> RefitRequest:
    """A validated :class:`RefitRequest`; :class:`RefitRequestError` says what is wrong."""
    if not value:
        raise RefitRequestError("empty refit request")
    if len(value) > _MAX_REQUEST_BYTES:
        raise RefitRequestError(f"refit request of {len(value)} bytes exceeds {_MAX_REQUEST_BYTES}")
    try:
        data = json.loads(bytes(value).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RefitRequestError(f"refit request is not UTF-8 JSON: {str(exc)[:200]}") from None
    if not isinstance(data, dict):
        raise RefitRequestError(f"a refit request must be a JSON object, got {type(data).__name__}")
    request_id = _text(data, "request_id", required=True)
    if len(request_id) > _MAX_REQUEST_ID:
        raise RefitRequestError(f"request_id is longer than {_MAX_REQUEST_ID} characters")
    return RefitRequest(request_id=request_id, kind=_text(data, "kind", required=True),
                        reason=_text(data, "reason", required=True), ts=_seconds(data, "ts", required=True),
                        statistic=_text(data, "statistic"), value=_seconds(data, "value"), source=_text(data, "source"))


def _text(data: dict, name: str, required: bool = False) -> str | None:
    value = data.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise RefitRequestError(f"refit request field {name!r} must be a non-empty string, got {value!r}")
    return value


def _seconds(data: dict, name: str, required: bool = False) -> float | None:
    value = data.get(name)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RefitRequestError(f"refit request field {name!r} must be a finite number, got {value!r}")
    return float(value)


def request_refit(bootstrap: str, config: "PipelineConfig", reason: str, kind: str = "plan",
                  statistic: str | None = None, value: float | None = None, source: str | None = None,
                  request_id: str | None = None, timeout: float = 30.0) -> RefitRequest:
    """Ask for a re-fit (the monitor calls this on confirmed drift); returns the request once acknowledged.

    Keyed by kind, so one kind's requests stay in order on one partition. From inside an event
    loop (a Faust agent), send ``RefitRequest.new(...).to_json()`` with the app's producer instead:
    this function blocks until the broker acknowledges.
    """
    from kafka import KafkaProducer

    request = RefitRequest.new(reason, kind=kind, statistic=statistic, value=value, source=source, request_id=request_id)
    producer = KafkaProducer(bootstrap_servers=bootstrap, api_version=_KAFKA_API, acks="all",
                             request_timeout_ms=int(timeout * 1000))
    try:
        producer.send(config.topics.refit_requests, key=kind.encode("utf-8"), value=request.to_json()).get(timeout)
    finally:
        producer.close()
    log.info("requested a re-fit of %s (%s): %s", kind, request.request_id, reason)
    return request


# =============================================================================== the service


@dataclass(frozen=True)
class Decision:
    """What the service did with a request, and why (also logged)."""

    request_id: str | None
    action: str  # queued | coalesced | duplicate | ignored | stale | invalid | refit | error
    reason: str
    at: float = field(default_factory=time.time)


class RefitService:
    """Answer ``refit.requests``: one consumer group per kind, requests de-duplicated, coalesced, rate-limited.

    - Only one service of a group handles each request (Kafka assigns each partition to one member).
    - A request id seen before is ignored (re-deliveries, a monitor retrying).
    - Requests waiting for a re-fit are coalesced: one re-fit answers all of them. Requests that
      arrive while a re-fit runs, or less than ``min_interval_seconds`` after the last one ended,
      wait and are answered together by at most one follow-up re-fit, once the interval has passed.
    - A request older than ``max_request_age_seconds`` is stale (a drift alarm from long ago says
      nothing about the data now) and is dropped.
    - Offsets are committed only when every request read so far has been answered, so a service
      that dies mid-way leaves its requests to the next member (at least once; the coalescing
      keeps a re-delivery to one extra re-fit at most).

    Run it with :meth:`serve` (until a stop event) or :meth:`process_pending` (bounded, for tests
    and one-shot use); :meth:`close` leaves the group.
    """

    def __init__(self, job: RefitJob, source: Source, min_interval_seconds: float = 300.0,
                 group_id: str | None = None, max_request_age_seconds: float | None = 86400.0,
                 poll_seconds: float = 0.5, max_poll_interval_seconds: float = 3600.0):
        if min_interval_seconds < 0:
            raise ValueError(f"min_interval_seconds must be >= 0, got {min_interval_seconds!r}")
        self.job = job
        self.source = source
        self.min_interval_seconds = min_interval_seconds
        self.group_id = group_id or f"{job.config.topics.prefix}.refit.{job.kind}"
        self.max_request_age_seconds = max_request_age_seconds
        self.poll_seconds = poll_seconds
        self.max_poll_interval_seconds = max_poll_interval_seconds
        self.decisions: deque[Decision] = deque(maxlen=1000)
        self.outcomes: deque[RefitOutcome] = deque(maxlen=100)
        self.refit_started: deque[float] = deque(maxlen=100)  # monotonic start of each re-fit
        self._pending: list[RefitRequest] = []
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._last_refit_end: float | None = None
        self._last_message: float = time.monotonic()
        self._consumer = None

    # ------------------------------------------------------------------ running

    def serve(self, stop_event: threading.Event) -> None:
        """Handle requests until ``stop_event`` is set, then leave the group."""
        log.info("re-fit service for %s: group %s on %s, min interval %.0fs", self.job.kind, self.group_id,
                 self.job.config.topics.refit_requests, self.min_interval_seconds)
        try:
            while not stop_event.is_set():
                self._step()
        finally:
            self.close()

    def process_pending(self, timeout: float, idle_seconds: float = 1.0) -> list[RefitOutcome]:
        """Handle requests for at most ``timeout`` seconds; return early once idle.

        Idle: partitions assigned, nothing waiting, and no request read for ``idle_seconds``.
        Returns the outcomes of the re-fits run during this call. The consumer stays in the group
        for the next call; :meth:`close` leaves it.
        """
        done_before = len(self.refit_started)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._step()
            if self._idle(idle_seconds):
                break
        ran = len(self.refit_started) - done_before
        return list(self.outcomes)[-ran:] if ran else []

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def __enter__(self) -> "RefitService":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ one step

    def _step(self) -> None:
        consumer = self._open()
        batches = consumer.poll(timeout_ms=int(self.poll_seconds * 1000), max_records=1000)
        messages = sorted((m for batch in batches.values() for m in batch), key=lambda m: (m.timestamp, m.partition, m.offset))
        for message in messages:
            self._admit(message)
        if messages:
            self._last_message = time.monotonic()
        if self._pending and self._due():
            self._refit()
        elif not self._pending and messages:
            self._commit()  # everything read is answered (duplicates, stale, ignored)

    def _open(self):
        if self._consumer is None:
            from kafka import KafkaConsumer

            from fairstream.streams.topics import ensure_topics

            ensure_topics(self.job.bootstrap, self.job.config.topics)  # subscribing to a missing topic waits silently
            self._consumer = KafkaConsumer(
                self.job.config.topics.refit_requests, bootstrap_servers=self.job.bootstrap, api_version=_KAFKA_API,
                group_id=self.group_id, enable_auto_commit=False,
                # A new group answers what is already waiting (coalesced into one re-fit) instead of
                # missing requests sent while no service ran.
                auto_offset_reset="earliest",
                # The group join takes about half the session timeout on Tansu (see app.py).
                session_timeout_ms=10_000, heartbeat_interval_ms=1_000,
                # A re-fit runs between polls; heartbeats go on in the background meanwhile.
                max_poll_interval_ms=int(self.max_poll_interval_seconds * 1000),
            )
            self._last_message = time.monotonic()
        return self._consumer

    def _admit(self, message) -> None:
        where = f"{message.topic}[{message.partition}]@{message.offset}"
        try:
            request = parse_request(message.value)
        except RefitRequestError as exc:
            self._decide(None, "invalid", f"{where}: {exc}; skipped")
            return
        rejection = self._rejection(request)
        if rejection is not None:
            self._decide(request.request_id, *rejection)
        else:
            self._queue(request)

    def _rejection(self, request: RefitRequest) -> tuple[str, str] | None:
        """(action, reason) when the request needs no re-fit; remembers ids of this kind."""
        if request.kind != self.job.kind:
            return "ignored", f"asks for kind {request.kind!r}; this service re-fits {self.job.kind!r}"
        if request.request_id in self._seen:
            return "duplicate", "this request id was already handled; ignored"
        self._remember(request.request_id)
        age = time.time() - request.ts
        if self.max_request_age_seconds is not None and age > self.max_request_age_seconds:
            return "stale", f"asked {age:.0f}s ago, over the {self.max_request_age_seconds:.0f}s limit; dropped"
        return None

    def _queue(self, request: RefitRequest) -> None:
        waiting = len(self._pending)
        self._pending.append(request)
        why = f"({request.reason})"
        wait = self._wait_seconds()
        if waiting:
            self._decide(request.request_id, "coalesced", f"{why} joins {waiting} waiting request(s): one re-fit answers all")
        elif wait > 0:
            self._decide(request.request_id, "queued",
                         f"{why} the last re-fit ended less than {self.min_interval_seconds:.0f}s ago: "
                         f"rate-limited, follow-up re-fit in {wait:.1f}s")
        else:
            self._decide(request.request_id, "queued", f"{why} re-fit starts now")

    def _remember(self, request_id: str) -> None:
        self._seen[request_id] = None
        if len(self._seen) > _SEEN_REQUESTS:
            self._seen.popitem(last=False)

    def _wait_seconds(self) -> float:
        if self._last_refit_end is None:
            return 0.0
        return self._last_refit_end + self.min_interval_seconds - time.monotonic()

    def _due(self) -> bool:
        return self._wait_seconds() <= 0

    def _idle(self, idle_seconds: float) -> bool:
        assigned = self._consumer is not None and bool(self._consumer.assignment())
        return assigned and not self._pending and time.monotonic() - self._last_message >= idle_seconds

    def _refit(self) -> None:
        answered, self._pending = self._pending, []
        ids = [request.request_id for request in answered]
        self.refit_started.append(time.monotonic())
        try:
            outcome = self.job.run_once(self.source)
        except Exception as exc:
            # Keep the requests (uncommitted): the next attempt comes after the min interval,
            # not in a tight loop against a broker that is down.
            self._pending = answered + self._pending
            log.exception("re-fit for requests %s failed", ids)
            self._decide(None, "error", f"re-fit for {len(ids)} request(s) {ids} failed: {type(exc).__name__}: {exc}; "
                                        f"retrying in {self.min_interval_seconds:.0f}s")
        else:
            self.outcomes.append(outcome)
            self._decide(None, "refit", f"re-fit for {len(ids)} request(s) {ids}: {outcome.reason}")
            self._commit()
        finally:
            self._last_refit_end = time.monotonic()

    def _commit(self) -> None:
        from kafka.errors import CommitFailedError

        try:
            self._consumer.commit()
        except CommitFailedError as exc:
            # The group rebalanced meanwhile: the new owner of those partitions gets the requests
            # again and re-fits at most once more. Not worth stopping the service for.
            log.warning("could not commit answered refit requests (%s); they may be answered again", exc)

    def _decide(self, request_id: str | None, action: str, reason: str) -> None:
        self.decisions.append(Decision(request_id, action, reason))
        log.info("refit request %s: %s: %s", request_id or "-", action, reason)


# =============================================================================== command line


def _duration_arg(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _fraction_arg(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a fraction strictly between 0 and 1, got {text}")
    return value


def _non_negative_arg(text: str) -> float:
    value = float(text)
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _positive_int_arg(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


_EPILOG = """\
examples:
  fairstream refit --kind plan                         re-fit once on the last 10000 research records
  fairstream refit --source research.jsonl             re-fit once on a file (JSON lines or CSV)
  fairstream refit --every 6h                          re-fit every 6 hours until stopped
  fairstream refit --serve --min-interval 10m          answer the monitor's requests on refit.requests

The candidate is published only when no plan is active or when its E on the holdout is at most
(1 + tolerance) times the current plan's; otherwise the reason, with both numbers, is printed.
The exit status is 0 whether or not it was published; non-zero means the run failed.
"""


def add_refit_parser(subparsers, broker_context: Callable, add_common: Callable[[argparse.ArgumentParser], None],
                     load_config: Callable[[argparse.Namespace], "PipelineConfig"]) -> argparse.ArgumentParser:
    """Add ``fairstream refit`` to the CLI's subparsers.

    ``broker_context(args)`` is a context manager yielding an object with ``.bootstrap`` (the CLI's
    ``_broker``), ``add_common(parser)`` adds ``--broker``/``--run-dir``/``--config`` (the CLI's
    ``_add_common``) and ``load_config(args)`` reads the pipeline (the CLI's ``_config``).
    """
    parser = subparsers.add_parser(
        "refit", help="fit, validate and publish a new repair plan (once, on a schedule, or on request)",
        # Line breaks by hand: the raw formatter keeps the epilog's example table aligned.
        description="Fit a new plan on a labelled research window, validate it against the active plan on\n"
                    "a holdout part of the window (dependence E after repair), and publish it on the\n"
                    "control topic if it is not worse; every worker then hot-swaps it.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(parser)
    parser.add_argument("--kind", choices=REFIT_KINDS, default="plan", help="artifact kind to re-fit (default: plan)")
    parser.add_argument("--source", default="topic", metavar="topic|PATH",
                        help="research window: 'topic' for the pipeline's research topic (default), or a file of "
                             "records.in JSON lines or a CSV with the feature columns, s and u")
    parser.add_argument("--last", type=_positive_int_arg, default=10_000, metavar="N",
                        help="with --source topic: use the latest N valid records (default: 10000)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--every", type=_duration_arg, metavar="DURATION",
                      help="re-fit now and then every DURATION (90s, 5m, 6h, 1h30m) until stopped")
    mode.add_argument("--serve", action="store_true",
                      help="answer re-fit requests from refit.requests until stopped (de-duplicated, coalesced)")
    parser.add_argument("--min-interval", type=_duration_arg, default=300.0, metavar="DURATION",
                        help="with --serve: at least this long between the end of one re-fit and the next (default: 5m)")
    parser.add_argument("--holdout", type=_fraction_arg, default=0.2, metavar="FRACTION",
                        help="fraction of every (u, s) cell held out for validation (default: 0.2)")
    parser.add_argument("--tolerance", type=_non_negative_arg, default=0.1, metavar="FRACTION",
                        help="refuse a candidate whose holdout E exceeds the current plan's by more than this "
                             "fraction (default: 0.1)")
    parser.add_argument("--n-q", type=_positive_int_arg, default=250, metavar="N", help="grid nodes per stratum and feature (default: 250)")
    parser.add_argument("--out-of-range", choices=("clamp", "reject"), default="clamp",
                        help="what the new plan does with values outside its grid (default: clamp)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the holdout split (default: 0)")
    parser.set_defaults(func=functools.partial(run_refit_command, broker_context=broker_context, load_config=load_config))
    return parser


def run_refit_command(args: argparse.Namespace, broker_context: Callable, load_config: Callable) -> int:
    """The handler of ``fairstream refit`` (bound by :func:`add_refit_parser`)."""
    from fairstream.streams.control.registry import ArtifactStore
    from fairstream.streams.topics import ensure_topics

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = load_config(args)
    with broker_context(args) as broker:
        ensure_topics(broker.bootstrap, config.topics)
        job = RefitJob(config, broker.bootstrap, ArtifactStore(config.artifact_dir), n_q=args.n_q,
                       holdout=args.holdout, tolerance=args.tolerance, seed=args.seed, out_of_range=args.out_of_range)
        source = research_source(args.source, broker.bootstrap, config, args.last)
        if args.serve or args.every:
            with _stop_on_signals() as stop:
                if args.serve:
                    RefitService(job, source, min_interval_seconds=args.min_interval).serve(stop)
                else:
                    run_every(job, source, args.every, stop, on_outcome=lambda o: print(format_outcome(o), flush=True))
            return 0
        print(format_outcome(job.run_once(source)))
    return 0


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGTERM (Kubernetes stopping the pod) or Ctrl-C, so loops end between re-fits."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
