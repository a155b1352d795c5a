"""Every Prometheus metric a worker exports, in one place (names follow Prometheus conventions).

Every family carries the label ``pipeline`` first (the worker's ``[pipeline] name``), so workers of
several pipelines on one Prometheus stay apart. The families are module globals; a worker reaches
them through one :class:`PipelineMetrics` made in ``create_app``, which fills in ``pipeline`` (so no
call site names it, and two apps of different pipelines in one process export separate series).
``fairstream_worker_info`` is 1 for each running worker's pipeline: Prometheus' own ``up`` has no
``pipeline`` label, so the worker-down rule takes it from there.

Other labels are bounded: ``agent`` (records, embeddings), ``kind`` (artifact kinds), and for
fairness statistics ``role`` (right after ``pipeline``: ``active``, the chain that serves, or ``candidate``, a
pending candidate chain measured in shadow on the same batches; alerts read ``role="active"`` only),
``statistic``, ``stage`` (before/after repair; ``label`` for the labels'
rates), ``stratum`` (configured strata and "all"), ``feature`` (configured features and "all"),
``group_pair`` (pairs of configured groups and "all") and ``window`` (count, time), and ``key`` (a dotted key of
the pipeline's shared config, :func:`fairstream.streams.control.pipeline_config.settings_of`). Record ids or
values never become labels.

``fairstream_config_version`` is the version of the pipeline's active config, ``fairstream_config_held`` 1 while the
worker takes no partitions for its config, and ``fairstream_config_differs`` 1 for each key where its config differs
from the active one (absent when they match).

Fairness statistics, one family per unit (:data:`FAIRNESS_FAMILIES`); in every one **0 is fair and
higher is worse**, and the value is what the monitor's ``monitor.threshold`` and the alert rules
compare:

- ``fairstream_fairness_dependence``: ``dependence_e``, the dependence E between the group and the
  features (unitless, >= 0);
- ``fairstream_fairness_wasserstein``: ``w1``, the W1 distance between the groups' distributions of
  a feature, in that feature's own units (>= 0);
- ``fairstream_fairness_rate_gap``: ``dp_difference``, ``conditional_dp``, ``eopp``, ``mdp``, a
  difference of positive rates (or of scores, for mdp) between groups (0..1);
- ``fairstream_fairness_ratio_gap``: ``dp_ratio``, exported as 1 - lowest rate / highest rate
  (0..1; the four-fifths rule is 0.2);
- ``fairstream_fairness_transport_cost``: ``otf``, the OTF0 cost per record of moving the scores to
  fair ones (score units, >= 0);
- ``fairstream_out_of_range_ratio``: ``out_of_range_rate``, the share of records with a value outside
  the plan's range (0..1).

``fairstream_candidate_version`` (labels ``kind``) is the version of the pending candidate of a kind this worker
shadows; it is absent while the kind has none (as ``fairstream_artifact_version`` is the version that serves).

Verification rates of the embeddings stream (``fairstream_verification``) are labelled ``rate`` and
``group``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import threading
from http import HTTPStatus
from typing import Callable
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

PIPELINE = "pipeline"  # the first label of every family


def _labels(*names: str) -> list[str]:
    return [PIPELINE, *names]


WORKER_INFO = Gauge("fairstream_worker_info", "1 while a worker of this pipeline is up (alerts join it onto `up`)",
                    _labels())
RECORDS_IN = Counter("fairstream_records_in_total", "Messages taken from an input topic", _labels("agent"))
RECORDS_REPAIRED = Counter("fairstream_records_repaired_total", "Records sent repaired", _labels("agent"))
RECORDS_DEAD = Counter("fairstream_records_dead_lettered_total", "Messages sent to the dead-letter topic",
                       _labels("agent"))
RECORDS_OUT_OF_RANGE = Counter("fairstream_records_out_of_range_total",
                               "Records with a value outside the plan's range (clamped or refused by policy)",
                               _labels("agent"))
RECORDS_GROUP_IMPUTED = Counter("fairstream_records_group_imputed_total",
                                "Records repaired under an imputed protected attribute (left out of the fairness "
                                "statistics)", _labels("agent"))
BATCH_SECONDS = Histogram("fairstream_batch_duration_seconds", "Time to process one batch, decode to delivered output",
                          _labels("agent"), buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0))
RECORD_LATENCY = Histogram("fairstream_record_latency_seconds",
                           "Time from a record's ts to its repaired output (a sample of each batch's records)",
                           _labels("agent"), buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0))
ARTIFACT_VERSION = Gauge("fairstream_artifact_version", "Version of the artifact in use (absent: none loaded)",
                         _labels("kind"))
CANDIDATE_VERSION = Gauge("fairstream_candidate_version",
                          "Version of the pending candidate measured in shadow (absent: no candidate of the kind)",
                          _labels("kind"))
ARTIFACT_REFUSED = Counter("fairstream_artifacts_refused_total", "Control records refused, by why: unreadable, "
                           "unsigned, untrusted, role, pipeline, policy, stale, replay, version, load",
                           _labels("kind", "reason"))
INPUT_HELD = Gauge("fairstream_input_held", "1 while an agent holds its input: an artifact it applies is not loaded",
                   _labels("agent"))
CONSUMER_LAG = Gauge("fairstream_consumer_lag_records", "Records on the input partitions not yet processed",
                     _labels("agent"))

SCOPES = ("pipeline", "worker")
"""The ``scope`` label of the fairness families: the pipeline's figures (the monitoring agent's, over every worker's
records: what alerts, dashboards and the runbook read) or one worker's own (over its partitions: a diagnostic)."""
ROLES = ("active", "candidate")
"""The ``role`` label of the fairness families: the chain that serves, or a pending candidate measured in shadow."""
_FAIRNESS_LABELS = _labels("role", "statistic", "stage", "stratum", "feature", "group_pair", "window", "scope")
_OVER_WINDOW = "over the monitor's sliding window; 0 is fair, higher is worse"
FAIRNESS_DEPENDENCE = Gauge("fairstream_fairness_dependence",
                            f"Dependence E between group and features (unitless) {_OVER_WINDOW}", _FAIRNESS_LABELS)
FAIRNESS_WASSERSTEIN = Gauge("fairstream_fairness_wasserstein",
                             f"W1 distance between the groups, in the feature's own units, {_OVER_WINDOW}",
                             _FAIRNESS_LABELS)
FAIRNESS_RATE_GAP = Gauge("fairstream_fairness_rate_gap",
                          f"Gap between the groups' positive rates or scores (0..1) {_OVER_WINDOW}", _FAIRNESS_LABELS)
FAIRNESS_RATIO_GAP = Gauge("fairstream_fairness_ratio_gap",
                           f"1 - lowest / highest positive rate of the groups (0..1; four-fifths rule: 0.2) "
                           f"{_OVER_WINDOW}", _FAIRNESS_LABELS)
FAIRNESS_TRANSPORT_COST = Gauge("fairstream_fairness_transport_cost",
                                f"OTF0 cost per record of making the scores fair (score units) {_OVER_WINDOW}",
                                _FAIRNESS_LABELS)
OUT_OF_RANGE_RATIO = Gauge("fairstream_out_of_range_ratio",
                           f"Share of records with a value outside the plan's range (0..1) {_OVER_WINDOW}",
                           _FAIRNESS_LABELS)

_FAIRNESS_GAUGES: dict[str, Gauge] = {
    "dependence_e": FAIRNESS_DEPENDENCE,
    "w1": FAIRNESS_WASSERSTEIN,
    **dict.fromkeys(("dp_difference", "conditional_dp", "eopp", "mdp"), FAIRNESS_RATE_GAP),
    "dp_ratio": FAIRNESS_RATIO_GAP,
    "otf": FAIRNESS_TRANSPORT_COST,
    "out_of_range_rate": OUT_OF_RANGE_RATIO,
}
FAIRNESS_FAMILIES: dict[str, str] = {statistic: gauge.describe()[0].name
                                     for statistic, gauge in _FAIRNESS_GAUGES.items()}
"""Statistic (the ``statistic`` label) -> the family that exports it; rules, dashboards and the demo read this."""
_EXPORTED = {"dp_ratio": lambda ratio: 1.0 - ratio}  # a ratio is unfair when low: exported so that higher is worse


def fairness_family(statistic: str) -> str:
    """The name of the family that exports ``statistic`` (a KeyError names an unknown one)."""
    return FAIRNESS_FAMILIES[statistic]


def exported_value(statistic: str, value: float) -> float:
    """What the family of ``statistic`` exports for the monitor's ``value`` (dp_ratio: 1 - ratio; others: itself)."""
    return float(_EXPORTED.get(statistic, float)(value))


WINDOW_RECORDS = Gauge("fairstream_monitor_window_records", "Records in the monitor's window", _labels("window", "scope"))
GROUP_RECORDS = Gauge("fairstream_window_group_records", "Records of each configured group in the window",
                      _labels("role", "window", "group", "scope"))
UNMEASURABLE = Gauge("fairstream_fairness_unmeasurable",
                     "1 while the statistics between groups are not reported over a window: the group holds no "
                     "records there (reason no_records) or fewer than monitor.min_group_records (too_few_records)",
                     _labels("role", "window", "group", "reason", "scope"))
DRIFT_EVENTS = Counter("fairstream_drift_events_total", "Confirmed drift of a fairness statistic (after hysteresis)",
                       _labels("statistic", "detector"))
MONITOR_CPU = Counter("fairstream_monitor_cpu_seconds_total",
                      "CPU seconds the fairness monitor spent (compare with process_cpu_seconds_total)", _labels())
VERIFICATION = Gauge("fairstream_verification", "Verification rates of labelled embeddings over the monitor's window "
                     "at the threshold calibrated per module version at [agents.embeddings] far (far, frr per group; "
                     "fnmr, far_overall, bfar, bfrr, threshold: group all)",
                     _labels("rate", "group", "window"))
VERIFICATION_PAIRS = Gauge("fairstream_verification_pairs", "Labelled pairs behind the verification rates",
                           _labels("kind", "window"))
REEMBED_EVENTS = Counter("fairstream_reembed_events_total",
                         "Re-embed events sent after a live swap of the embedding module", _labels())
MONITOR_ERRORS = Counter("fairstream_monitor_errors_total",
                         "Delivered batches a monitor could not observe (logged; the records were delivered and "
                         "committed, and the worker keeps consuming)", _labels("monitor"))
REFIT_REQUESTS = Counter("fairstream_refit_requests_total", "Re-fit requests sent to refit.requests",
                         _labels("kind", "reason"))
AGENT_INFO = Gauge("fairstream_agent_info", "1 while a monitoring agent of this pipeline is up", _labels())
AGENT_ACTIVE = Gauge("fairstream_agent_active",
                     "1 while this monitoring agent reads the stats topic (the pipeline's), 0 while it stands by",
                     _labels())
AGENT_PARTIALS = Counter("fairstream_agent_partials_total",
                         "Partial aggregates the monitoring agent took from the stats topic (merged or refused)",
                         _labels("outcome"))
AGENT_LAST_PARTIAL = Gauge("fairstream_agent_last_partial_timestamp_seconds",
                           "When the monitoring agent last merged a worker's partial aggregates (its clock)", _labels())
AGENT_SLICE_END = Gauge("fairstream_agent_slice_end_timestamp_seconds",
                        "Event time up to which the pipeline's windows hold every slice closed", _labels())
AGENT_LATE_RECORDS = Gauge("fairstream_agent_late_records",
                           "Records whose counts reached the agent after their slice closed (in the windows, not in "
                           "the detectors), serving chain", _labels())
STATS_MESSAGES = Counter("fairstream_stats_messages_total",
                         "Partial aggregates sent to the stats topic (for the pipeline's monitoring agent)", _labels())
EVENT_TIME_SKEWED = Counter("fairstream_records_event_time_skewed_total",
                            "Records whose ts was further than monitor.max_event_time_skew from the worker's clock "
                            "(the monitor's time window used their arrival time)", _labels("agent"))
CONFIG_VERSION = Gauge("fairstream_config_version",
                       "Version of the pipeline's active config on its control topic (absent: none published)",
                       _labels())
CONFIG_DIFFERS = Gauge("fairstream_config_differs",
                       "1 for each key where this worker's config differs from the pipeline's active one (it takes no "
                       "partitions); absent when they match", _labels("key"))
CONFIG_HELD = Gauge("fairstream_config_held",
                    "1 while this worker takes no partitions for its config: it differs from the pipeline's active "
                    "one, or the pipeline is signed and has none published", _labels())


class Bound:
    """One family with ``pipeline`` filled in: :meth:`labels` takes the other labels, in order.

    :meth:`clear` removes this pipeline's series only (those made through this view), never another
    pipeline's in the same process.
    """

    def __init__(self, family, pipeline: str):
        self.family, self.pipeline = family, pipeline
        self._made: set[tuple[str, ...]] = set()
        self._lock = threading.Lock()

    def labels(self, *values):
        """The child for these label values (after ``pipeline``)."""
        key = (self.pipeline, *map(str, values))
        with self._lock:
            self._made.add(key)
        return self.family.labels(*key)

    def remove(self, *values) -> None:
        """Remove the series of these label values (after ``pipeline``), if it exists (e.g. a candidate that left)."""
        key = (self.pipeline, *map(str, values))
        with self._lock:
            self._made.discard(key)
        with contextlib.suppress(KeyError):
            self.family.remove(*key)

    def keep(self, selected: Callable[[tuple], bool], kept: set) -> None:
        """Remove this pipeline's series whose labels (after ``pipeline``) are ``selected`` and not in ``kept``."""
        with self._lock:
            gone = {key for key in self._made if selected(key[1:]) and key[1:] not in kept}
            self._made -= gone
        for key in gone:
            with contextlib.suppress(KeyError):
                self.family.remove(*key)

    def clear(self, first: str | None = None) -> None:
        """Remove every series of this pipeline in the family (a stale value must not outlive its cause), or only
        those whose first label after ``pipeline`` is ``first``."""
        with self._lock:
            made = {key for key in self._made if first is None or key[1] == first}
            self._made -= made
        for key in made:
            with contextlib.suppress(KeyError):  # another view of the same pipeline removed it
                self.family.remove(*key)


class PipelineMetrics:
    """Every family seen from one pipeline (``create_app`` makes one and hands it to what counts)."""

    def __init__(self, pipeline: str, process: str = "worker"):
        self.pipeline = pipeline
        (WORKER_INFO if process == "worker" else AGENT_INFO).labels(pipeline).set(1)
        self.records_in = Bound(RECORDS_IN, pipeline)
        self.records_repaired = Bound(RECORDS_REPAIRED, pipeline)
        self.records_dead = Bound(RECORDS_DEAD, pipeline)
        self.records_out_of_range = Bound(RECORDS_OUT_OF_RANGE, pipeline)
        self.records_group_imputed = Bound(RECORDS_GROUP_IMPUTED, pipeline)
        self.event_time_skewed = Bound(EVENT_TIME_SKEWED, pipeline)
        self.batch_seconds = Bound(BATCH_SECONDS, pipeline)
        self.record_latency = Bound(RECORD_LATENCY, pipeline)
        self.artifact_version = Bound(ARTIFACT_VERSION, pipeline)
        self.candidate_version = Bound(CANDIDATE_VERSION, pipeline)
        self.artifact_refused = Bound(ARTIFACT_REFUSED, pipeline)
        self.input_held = Bound(INPUT_HELD, pipeline)
        self.consumer_lag = Bound(CONSUMER_LAG, pipeline)
        self.window_records = Bound(WINDOW_RECORDS, pipeline)
        self.group_records = Bound(GROUP_RECORDS, pipeline)
        self.unmeasurable = Bound(UNMEASURABLE, pipeline)
        self.drift_events = Bound(DRIFT_EVENTS, pipeline)
        self.verification = Bound(VERIFICATION, pipeline)
        self.verification_pairs = Bound(VERIFICATION_PAIRS, pipeline)
        self.monitor_errors = Bound(MONITOR_ERRORS, pipeline)
        self.refit_requests = Bound(REFIT_REQUESTS, pipeline)
        # Families without other labels: the child itself (exported at 0 from the start).
        self.monitor_cpu = MONITOR_CPU.labels(pipeline)
        self.agent_partials = Bound(AGENT_PARTIALS, pipeline)
        # Each process exports the series of its own work only: a worker never looks like a standby agent.
        if process == "worker":
            self.stats_messages = STATS_MESSAGES.labels(pipeline)
            self.config_version = Bound(CONFIG_VERSION, pipeline)  # labels() without values: absent until set
            self.config_differs = Bound(CONFIG_DIFFERS, pipeline)
            self.config_held = CONFIG_HELD.labels(pipeline)
        else:
            self.agent_state = AGENT_ACTIVE.labels(pipeline)
            self.agent_last_partial = AGENT_LAST_PARTIAL.labels(pipeline)
            self.agent_slice_end = AGENT_SLICE_END.labels(pipeline)
            self.agent_late_records = AGENT_LATE_RECORDS.labels(pipeline)
        self.reembed_events = REEMBED_EVENTS.labels(pipeline)
        self._fairness = {statistic: Bound(gauge, pipeline) for statistic, gauge in _FAIRNESS_GAUGES.items()}

    def set_fairness(self, statistic: str, stage: str, stratum: str, feature: str, group_pair: str, window: str,
                     value: float, role: str = "active", scope: str = "worker") -> None:
        """Export one monitor row of the ``role`` chain in its statistic's family (dp_ratio as 1 - ratio: see
        :func:`exported_value`), as the pipeline's figure or one worker's (``scope``)."""
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
        self._fairness[statistic].labels(_role(role), statistic, stage, stratum, feature, group_pair, window,
                                         scope).set(exported_value(statistic, value))

    def replace_fairness(self, role: str, scope: str, window: str, rows: list[tuple], short: dict[str, str],
                         records: tuple | None) -> None:
        """Export one window's measurable rows of the ``role`` chain (``scope``'s figures), the records of each group
        in it and the groups that make the rest unmeasurable (``short``: group -> reason); series of that window no
        longer exported are removed after the new values are set, so a scrape never sees a series missing."""
        fresh: dict[Bound, set] = {}
        for statistic, stage, stratum, feature, pair, value in rows:
            self.set_fairness(statistic, stage, stratum, feature, pair, window, value, role=role, scope=scope)
            fresh.setdefault(self._fairness[statistic], set()).add(
                (role, statistic, stage, stratum, feature, pair, window, scope))
        if records is not None:
            counts, groups, _ = records
            for group, n in zip(groups, counts.sum(axis=0)):
                self.group_records.labels(role, window, group, scope).set(float(n))
        for group, reason in short.items():
            self.unmeasurable.labels(role, window, group, reason, scope).set(1)
        fresh[self.unmeasurable] = {(role, window, group, reason, scope) for group, reason in short.items()}
        for bound in set(self._fairness.values()):
            bound.keep(lambda key: key[0] == role and key[6] == window and key[7] == scope, fresh.get(bound, set()))
        self.unmeasurable.keep(lambda key: key[0] == role and key[1] == window and key[4] == scope,
                               fresh[self.unmeasurable])

    def clear_fairness(self, role: str | None = None) -> None:
        """Remove this pipeline's fairness statistics of ``role`` (None: both), e.g. for a new chain version, one
        that cannot be measured, or a candidate that left."""
        role = None if role is None else _role(role)
        for bound in (*self._fairness.values(), self.group_records, self.unmeasurable):
            bound.clear(role)


def _role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return role


class MetricsPortError(RuntimeError):
    """The /metrics endpoint cannot listen on the configured port (taken, or not allowed)."""


Route = Callable[[], tuple[int, dict]]  # () -> (HTTP status, JSON body)


def serve(port: int | str, addr: str = "0.0.0.0", routes: dict[str, Route] | None = None) -> int | None:
    """Serve /metrics, and ``routes`` (path -> answer, e.g. /healthz, /readyz), on ``port``; returns the port.

    ``port`` 0 is any free port, "off" no endpoint (None). One server in a thread for every path. A
    taken port is a :class:`MetricsPortError` that says so and how to choose another: two workers on
    one host cannot share a port.
    """
    if port == "off":
        return None
    try:
        server = make_server(addr, int(port), _routed(make_wsgi_app(), routes or {}), ThreadingWSGIServer,
                             handler_class=_QuietHandler)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise MetricsPortError(
                f"metrics port {port} is already in use on this host (another worker?): give each worker its own "
                "port with --metrics-port PORT or [monitor] metrics_port, or 0 for any free port") from None
        raise MetricsPortError(f"cannot serve /metrics on port {port}: {exc.strerror or exc}") from None
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server.server_port


def _routed(metrics_app, routes: dict[str, Route]):
    """A WSGI app answering ``routes`` with JSON and every other path with the Prometheus exposition."""

    def app(environ, start_response):
        route = routes.get(environ.get("PATH_INFO", ""))
        if route is None:
            return metrics_app(environ, start_response)
        status, body = route()
        payload = (json.dumps(body) + "\n").encode()
        start_response(f"{status} {HTTPStatus(status).phrase}",
                       [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))])
        return [payload]

    return app


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape or probe."""

    def log_message(self, format, *args) -> None:  # noqa: A002 (the base class's name)
        pass
