"""Every Prometheus metric a worker exports, in one place (names follow Prometheus conventions).

Labels are bounded: ``agent`` (records, embeddings, monitor), ``kind`` (artifact kinds), and for
fairness statistics ``statistic``, ``stage`` (before/after repair), ``stratum`` (configured strata
and "all"), ``feature`` (configured features and "all") and ``group_pair`` (pairs of configured
groups and "all"). Record ids or values never become labels.

Statistics (label ``statistic``): ``dependence_e``, ``w1``, ``dp_difference``, ``dp_ratio``,
``conditional_dp``, ``eopp``, ``mdp``, ``out_of_range_rate``. Verification rates of the embeddings
stream (``fairstream_verification``) are labelled ``rate`` and ``group``.
"""

from __future__ import annotations

import errno
import json
import threading
from http import HTTPStatus
from typing import Callable
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

RECORDS_IN = Counter("fairstream_records_in_total", "Messages taken from an input topic", ["agent"])
RECORDS_REPAIRED = Counter("fairstream_records_repaired_total", "Records sent repaired", ["agent"])
RECORDS_DEAD = Counter("fairstream_records_dead_lettered_total", "Messages sent to the dead-letter topic", ["agent"])
RECORDS_OUT_OF_RANGE = Counter("fairstream_records_out_of_range_total",
                               "Records with a value outside the plan's range (clamped or refused by policy)", ["agent"])
RECORDS_S_IMPUTED = Counter("fairstream_records_s_imputed_total",
                            "Records repaired under an imputed protected attribute (left out of the fairness statistics)",
                            ["agent"])
BATCH_SECONDS = Histogram("fairstream_batch_duration_seconds", "Time to process one batch, decode to delivered output",
                          ["agent"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0))
RECORD_LATENCY = Histogram("fairstream_record_latency_seconds", "Time from a record's ts to its repaired output",
                           ["agent"], buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0))
ARTIFACT_VERSION = Gauge("fairstream_artifact_version", "Version of the artifact in use (absent: none loaded)", ["kind"])
ARTIFACT_REFUSED = Counter("fairstream_artifacts_refused_total", "Control records refused (bad hash, bad payload)", ["kind"])
INPUT_HELD = Gauge("fairstream_input_held", "1 while an agent holds its input: an artifact it applies is not loaded",
                   ["agent"])
CONSUMER_LAG = Gauge("fairstream_consumer_lag_records", "Records on the input partitions not yet processed", ["agent"])

FAIRNESS = Gauge("fairstream_fairness", "A fairness statistic over the monitor's sliding window",
                 ["statistic", "stage", "stratum", "feature", "group_pair", "window"])
WINDOW_RECORDS = Gauge("fairstream_monitor_window_records", "Records in the monitor's window", ["window"])
DRIFT_EVENTS = Counter("fairstream_drift_events_total", "Confirmed drift of a fairness statistic (after hysteresis)",
                       ["statistic", "detector"])
MONITOR_CPU = Counter("fairstream_monitor_cpu_seconds_total",
                      "CPU seconds the fairness monitor spent (compare with process_cpu_seconds_total)")
VERIFICATION = Gauge("fairstream_verification", "Verification rates of labelled embeddings over the monitor's window "
                     "at the threshold calibrated per module version at [agents.embeddings] far (far, frr per group; "
                     "fnmr, far_overall, bfar, bfrr, threshold: group all)",
                     ["rate", "group", "window"])
VERIFICATION_PAIRS = Gauge("fairstream_verification_pairs", "Labelled pairs behind the verification rates",
                           ["kind", "window"])
REEMBED_EVENTS = Counter("fairstream_reembed_events_total",
                         "Re-embed events sent after a live swap of the embedding module")
MONITOR_ERRORS = Counter("fairstream_monitor_errors_total",
                         "Delivered batches a monitor could not observe (logged; the records were delivered and "
                         "committed, and the worker keeps consuming)", ["monitor"])
REFIT_REQUESTS = Counter("fairstream_refit_requests_total", "Re-fit requests sent to refit.requests", ["kind", "reason"])
EVENT_TIME_SKEWED = Counter("fairstream_records_event_time_skewed_total",
                            "Records whose ts was further than monitor.max_event_time_skew from the worker's clock "
                            "(the monitor's time window used their arrival time)", ["agent"])


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
