"""The re-fit service's Alertmanager webhook: a firing drift alert becomes a re-fit request.

Prometheus users route alerts through Alertmanager. With ``fairstream refit --serve --webhook-port
9095`` the service also listens for Alertmanager's webhook notifications (payload version 4, the
``webhook_configs`` receiver of deploy/alertmanager/alertmanager.yml). Each firing
``FairstreamFairnessDrift`` alert of the service's own pipeline (its ``pipeline`` label: every
fairstream rule aggregates by it) becomes one :class:`~fairstream.streams.codec.refit_requests.RefitRequest`; other
alerts, resolved ones, alerts of another pipeline or without a ``pipeline`` label (not from a
fairstream worker of this pipeline) and drift of a statistic the pipeline does not monitor are
skipped (answered 200, logged), so one Alertmanager can route every pipeline's alerts to every
pipeline's service. A payload Alertmanager
could not have sent (not JSON, not version 4, an alert without string labels and annotations, ...)
is answered 400 with a one-line reason and publishes nothing.

**Published, not handed over in memory.** The webhook sends the request to ``refit.requests``
(keyed by kind, like the monitor's) and answers 200 only once the broker has acknowledged it:

- the service's one consumer logic (de-duplication, coalescing with the monitor's requests for the
  same drift, rate limit, staleness, commit after the answer) applies to both triggers;
- nothing is lost: a service that dies after the 200 leaves the request on the topic for the next
  member of its group, and a request that cannot be published is a 503, which Alertmanager retries;
- with several service replicas, whichever one Alertmanager reaches, the member that owns the
  partition answers.

**One id per alert firing.** The request id is a hash of the alert's ``fingerprint`` (its label
set) and ``startsAt``. Alertmanager repeats a firing alert (every ``repeat_interval``, whenever its
group changes, once per Alertmanager replica) with the same fingerprint and start, so every repeat
carries the same id and the service drops it as a duplicate; the next firing, after the alert
resolved, starts later and is a new request. The request's ``ts`` is ``startsAt``: the time the
drift was seen, which the service compares with the monitor's own request (see
:func:`~fairstream.streams.refit.service.same_drift`).

**Authenticated.** Every POST needs ``Authorization: Bearer <token>``; the token comes from a file
or ``$FAIRSTREAM_WEBHOOK_TOKEN`` (:func:`load_token`) and is compared in constant time. It is never
logged or echoed. ``GET /healthz`` answers without it (for probes).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import json
import logging
import os
import ssl
import threading
from collections.abc import Callable, Iterator, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Self

from fairstream.models.kinds import DEFAULT_KIND
from fairstream.streams.codec.refit_requests import RefitRequest, RefitRequestError
from fairstream.streams.parsing import parse_time

from .requests import RequestPublisher
from .service import ALERT_SOURCE_PREFIX, TRIGGERS

if TYPE_CHECKING:
    from fairstream.streams.config import PipelineConfig

log = logging.getLogger(__name__)

DRIFT_ALERTS = ("FairstreamFairnessDrift",)
"""Alerts that ask for a re-fit (the names in deploy/prometheus/alerts.yml)."""
TOKEN_ENV = "FAIRSTREAM_WEBHOOK_TOKEN"
MIN_TOKEN_CHARS = 16
WEBHOOK_PATH = "/alertmanager"
HEALTH_PATH = "/healthz"
DEFAULT_PORT = 9095
MAX_BODY_BYTES = 1024 * 1024  # a notification of a few hundred alerts; Alertmanager's max_alerts bounds it


class WebhookConfigError(ValueError):
    """The webhook cannot start as configured (no usable token, no --serve); the message says why."""


class WebhookPayloadError(ValueError):
    """A notification that is not an Alertmanager webhook payload of version 4; the message says why."""


# --------------------------------------------------------------------------- token


def load_token(path: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The shared token: the file at ``path`` if given, else ``$FAIRSTREAM_WEBHOOK_TOKEN``; surrounding blanks removed.

    Refuses an empty or short token: a webhook that anyone on the network can call would let them
    trigger re-fits at will. The error names where the token was looked for, never its value.
    """
    environ = os.environ if environ is None else environ
    where = f"file {path}" if path else f"${TOKEN_ENV}"
    try:
        token = (Path(path).read_text(encoding="utf-8") if path else environ.get(TOKEN_ENV, "")).strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or "not a UTF-8 text file"
        raise WebhookConfigError(f"--webhook-token-file {path}: {reason}") from None
    if len(token) < MIN_TOKEN_CHARS:
        raise WebhookConfigError(f"the webhook token from {where} is empty or shorter than {MIN_TOKEN_CHARS} "
                                 "characters; generate one with `openssl rand -hex 32`")
    return token


def token_matches(header: str | None, token: str) -> bool:
    """True when an ``Authorization`` header carries ``Bearer <token>`` (constant-time comparison)."""
    scheme, _, given = (header or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode("utf-8"), token.encode("utf-8"))


# --------------------------------------------------------------------------- payload -> requests


def alert_request_id(fingerprint: str, starts_at: str) -> str:
    """The request id of one firing of one alert: the same for all of Alertmanager's repeats of it."""
    digest = hashlib.sha256(f"{fingerprint}\n{starts_at}".encode()).hexdigest()
    return f"alert-{digest[:32]}"


ALERT_STATUSES = ("firing", "resolved")


def alert_requests(payload: object, kind: str = DEFAULT_KIND, alertnames: tuple[str, ...] = DRIFT_ALERTS,
                   statistics: tuple[str, ...] | None = None, pipeline: str | None = None
                   ) -> tuple[list[RefitRequest], list[str]]:
    """The re-fit requests a webhook notification asks for, and why each other alert was skipped.

    Raises :class:`WebhookPayloadError` (one line) for anything Alertmanager could not have sent: a
    payload that is not version 4 with a list of alerts, or any alert that is not an object with
    string ``status``, ``fingerprint``, RFC 3339 ``startsAt`` and string-to-string ``labels`` and
    ``annotations``. The whole notification is checked before any request is made, so a refused one
    publishes nothing. Well-formed alerts that ask for no re-fit (another alert, resolved, another
    ``pipeline`` label than ``pipeline`` when given, or a statistic outside ``statistics`` when given)
    are skipped with their reason.
    """
    if not isinstance(payload, dict):
        raise WebhookPayloadError(f"the notification must be a JSON object, got {type(payload).__name__}")
    if payload.get("version") != "4":
        raise WebhookPayloadError(f"unsupported webhook payload version {_shown(payload.get('version'))} "
                                  "(expected '4')")
    alerts = payload.get("alerts")
    if not isinstance(alerts, list):
        raise WebhookPayloadError(f"the notification has no list of alerts (alerts is {type(alerts).__name__})")
    for position, alert in enumerate(alerts):
        _check_alert(alert, position)
    requests, skipped = [], []
    for position, alert in enumerate(alerts):
        request = _alert_request(alert, position, kind, alertnames, statistics, pipeline)
        if isinstance(request, str):
            skipped.append(f"alert {position}: {request}")
        else:
            requests.append(request)
    return requests, skipped


def _shown(value: object, limit: int = 60) -> str:
    """A value for a one-line error: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _check_alert(alert: object, position: int) -> None:
    """Raise :class:`WebhookPayloadError` naming alert ``position`` and its field unless it has Alertmanager's shape."""
    where = f"alert {position}"
    if not isinstance(alert, dict):
        raise WebhookPayloadError(f"{where} must be a JSON object, got {type(alert).__name__}")
    for field in ("labels", "annotations"):
        pairs = alert.get(field)
        if not isinstance(pairs, dict):
            raise WebhookPayloadError(f"{where}: {field} must be an object of strings, got {type(pairs).__name__}")
        for key, value in pairs.items():
            if not isinstance(value, str):
                raise WebhookPayloadError(f"{where}: {field}[{_shown(key)}] must be a string, got "
                                          f"{type(value).__name__}")
    if alert.get("status") not in ALERT_STATUSES:
        raise WebhookPayloadError(f"{where}: status must be 'firing' or 'resolved', got {_shown(alert.get('status'))}")
    fingerprint, starts_at = alert.get("fingerprint"), alert.get("startsAt")
    if not isinstance(fingerprint, str) or not fingerprint:
        raise WebhookPayloadError(f"{where}: fingerprint must be a non-empty string, got {_shown(fingerprint)}")
    if not isinstance(starts_at, str):
        raise WebhookPayloadError(f"{where}: startsAt must be an RFC 3339 time, got {_shown(starts_at)}")
    try:
        parse_time(starts_at)
    except (ValueError, OverflowError, OSError):
        raise WebhookPayloadError(f"{where}: startsAt must be an RFC 3339 time, got {_shown(starts_at)}") from None


def _alert_request(alert: dict, position: int, kind: str, alertnames: tuple[str, ...],
                   statistics: tuple[str, ...] | None, pipeline: str | None) -> RefitRequest | str:
    """The request for one checked alert, or why it asks for none (a string)."""
    labels = alert["labels"]
    name = labels.get("alertname")
    if name not in alertnames:
        return f"{name} does not ask for a re-fit (only {', '.join(alertnames)})"
    if alert["status"] != "firing":
        return f"{name} is {alert['status']}, not firing"
    if pipeline is not None and labels.get("pipeline") != pipeline:
        if "pipeline" not in labels:
            return f"{name} has no pipeline label (this service re-fits pipeline {pipeline!r} only)"
        return f"{name} is for pipeline {_shown(labels['pipeline'])}, not this service's {pipeline!r}"
    statistic = labels.get("statistic")
    if statistics is not None and statistic not in statistics:
        return f"{name} is for statistic {_shown(statistic)}, which this pipeline does not monitor " \
               f"(it monitors {', '.join(statistics)})"
    instance = labels.get("instance", "unknown")
    summary = alert["annotations"].get("summary") or name
    try:
        return RefitRequest.new(f"Alertmanager: {summary[:500]}", kind=kind, statistic=statistic,
                                source=f"{ALERT_SOURCE_PREFIX}{name}@{instance}",
                                request_id=alert_request_id(alert["fingerprint"], alert["startsAt"]),
                                ts=parse_time(alert["startsAt"]))
    except RefitRequestError as exc:  # e.g. an empty statistic label, which Alertmanager never sends
        raise WebhookPayloadError(f"alert {position}: {name}: {exc}") from None


# --------------------------------------------------------------------------- the HTTP endpoint


class AlertWebhook:
    """An HTTP endpoint for Alertmanager (``POST /alertmanager``) that publishes a re-fit request per firing drift alert.

    ``publish(request)`` sends one request and returns once it is durable (a
    :class:`~fairstream.streams.refit.requests.RequestPublisher`); an exception from it answers
    503, so Alertmanager retries the notification. ``statistics``: the monitored ones (the CLI passes
    the pipeline's ``monitor.statistic``); drift of another is answered 200 and logged, not re-fitted;
    None accepts any. ``pipeline``: the pipeline's name (the CLI passes ``[pipeline] name``); an alert
    whose ``pipeline`` label differs, or has none, is answered 200 and logged; None accepts any. Serves
    on a thread of its own from :meth:`start`
    (or the context manager) until :meth:`stop`; ``port=0`` picks a free port (see :attr:`port`).
    """

    def __init__(self, publish: Callable[[RefitRequest], object], token: str, host: str = "127.0.0.1",
                 port: int = DEFAULT_PORT, kind: str = DEFAULT_KIND, path: str = WEBHOOK_PATH,
                 alertnames: tuple[str, ...] = DRIFT_ALERTS, max_body_bytes: int = MAX_BODY_BYTES,
                 statistics: tuple[str, ...] | None = None, pipeline: str | None = None,
                 tls: tuple[str, str] | None = None):
        if len(token) < MIN_TOKEN_CHARS:
            raise WebhookConfigError(f"the webhook token must have at least {MIN_TOKEN_CHARS} characters")
        self.publish = publish
        self.host, self.kind, self.path = host, kind, path
        self.alertnames, self.max_body_bytes = alertnames, max_body_bytes
        self.statistics = statistics  # the monitored ones; None: any
        self.pipeline = pipeline  # the alerts' pipeline label it acts on; None: any
        self._token = token
        self._tls = tls  # (certificate chain file, key file): HTTPS, so the token never crosses a network in clear
        self._requested_port = port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:  # never the token
        state = f"on {self.host}:{self.port}{self.path}" if self._server else "stopped"
        return f"<AlertWebhook {state} kind={self.kind}>"

    @property
    def port(self) -> int:
        """The port it listens on (known once started)."""
        if self._server is None:
            raise RuntimeError("the webhook is not started")
        return self._server.server_address[1]

    def start(self) -> Self:
        """Listen and serve on a daemon thread."""
        handler = type("Handler", (_Handler,), {"webhook": self})
        try:
            self._server = ThreadingHTTPServer((self.host, self._requested_port), handler)
        except (OSError, OverflowError) as exc:  # taken port, an address not of this host, a host that does not resolve
            raise WebhookConfigError(f"the webhook cannot listen on {self.host}:{self._requested_port}: "
                                     f"{getattr(exc, 'strerror', None) or exc}") from None
        self._server.daemon_threads = True
        if self._tls is not None:
            self._server.socket = self._tls_context().wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, name="alert-webhook", daemon=True)
        self._thread.start()
        log.info("Alertmanager webhook on %s://%s:%d%s (re-fits %s on %s of pipeline %s)",
                 "https" if self._tls else "http", self.host, self.port, self.path, self.kind,
                 ", ".join(self.alertnames), self.pipeline or "any")
        if self._tls is None and self.host not in ("127.0.0.1", "::1", "localhost"):
            log.warning("the webhook listens on %s without TLS: its bearer token crosses the network in clear "
                        "(--webhook-tls-cert and --webhook-tls-key, or a TLS proxy in front)", self.host)
        return self

    def _tls_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(*self._tls)
        except (OSError, ssl.SSLError) as exc:
            self._server.server_close()
            raise WebhookConfigError(f"the webhook's TLS certificate {self._tls[0]} and key {self._tls[1]} cannot be "
                                     f"used: {getattr(exc, 'strerror', None) or exc}") from None
        return context

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(10)
            self._server = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def authorized(self, header: str | None) -> bool:
        """True when ``header`` (an ``Authorization`` value) carries this webhook's token."""
        return token_matches(header, self._token)

    def handle(self, body: bytes) -> tuple[HTTPStatus, dict]:
        """Answer one authorised notification: (status, JSON reply)."""
        try:
            payload = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            return self._refused(f"not UTF-8 JSON: {str(exc)[:200]}")
        try:
            requests, skipped = alert_requests(payload, self.kind, self.alertnames, self.statistics, self.pipeline)
        except WebhookPayloadError as exc:
            return self._refused(str(exc))
        for reason in skipped:
            log.info("Alertmanager alert skipped: %s", reason)
        published = []
        for request in requests:
            try:
                self.publish(request)
            except Exception as exc:  # noqa: BLE001 (any failure to publish: Alertmanager retries on 5xx)
                log.warning("could not publish re-fit request %s: %r", request.request_id, exc)
                return HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"could not publish the re-fit request: {exc!r}",
                                                        "published": published}
            published.append(request.request_id)
            log.info("re-fit requested by Alertmanager (%s, %s): %s", request.request_id, request.source, request.reason)
        return HTTPStatus.OK, {"published": published, "skipped": skipped}

    @staticmethod
    def _refused(error: str) -> tuple[HTTPStatus, dict]:
        """A 400 for a payload Alertmanager could not have sent, logged whatever its cause."""
        log.warning("refused an Alertmanager notification: %s", error)
        return HTTPStatus.BAD_REQUEST, {"error": error}


class _Handler(BaseHTTPRequestHandler):
    """One HTTP exchange; ``webhook`` is set on a subclass per :class:`AlertWebhook`."""

    webhook: AlertWebhook
    server_version = "fairstream-refit-webhook"
    sys_version = ""

    def do_GET(self) -> None:
        if self.path == HEALTH_PATH:
            self._reply(HTTPStatus.OK, {"status": "ok"})
        elif self.path == self.webhook.path:
            self._reply(HTTPStatus.METHOD_NOT_ALLOWED, {"error": "POST only"}, {"Allow": "POST"})
        else:
            self._reply(HTTPStatus.NOT_FOUND, {"error": "not found"})

    def do_POST(self) -> None:
        if self.path != self.webhook.path:
            self._reply(HTTPStatus.NOT_FOUND, {"error": "not found"})
            return
        if not self.webhook.authorized(self.headers.get("Authorization")):
            # The body is not read: close the connection instead of draining what a stranger sent.
            self.close_connection = True
            self._reply(HTTPStatus.UNAUTHORIZED, {"error": "missing or wrong bearer token"},
                        {"WWW-Authenticate": 'Bearer realm="fairstream-refit"', "Connection": "close"})
            return
        body = self._body()
        if body is None:
            return
        try:
            answer = self.webhook.handle(body)
        except Exception as exc:  # noqa: BLE001 (a bug must still answer, not drop the connection)
            log.exception("the webhook failed on a notification")
            answer = HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {type(exc).__name__}"}
        self._reply(*answer)

    def _body(self) -> bytes | None:
        """The request body, or None after answering 411/413 (closing the connection)."""
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            length = -1
        if length < 0 or length > self.webhook.max_body_bytes:
            status = HTTPStatus.LENGTH_REQUIRED if length < 0 else HTTPStatus.REQUEST_ENTITY_TOO_LARGE
            self.close_connection = True
            self._reply(status, {"error": f"a Content-Length of at most {self.webhook.max_body_bytes} bytes is required"},
                        {"Connection": "close"})
            return None
        return self.rfile.read(length)

    def _reply(self, status: HTTPStatus, body: dict, headers: dict | None = None) -> None:
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args) -> None:
        # The request line and status only (no headers, so never the token), at debug level.
        log.debug("webhook %s: " + format, self.address_string(), *args)


# --------------------------------------------------------------------------- command line


def _triggers_arg(text: str) -> tuple[str, ...]:
    triggers = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [t for t in triggers if t not in TRIGGERS]
    if unknown or not triggers:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(TRIGGERS)}, got {text!r}")
    return triggers


def add_webhook_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--webhook-port``, ``--webhook-host``, ``--webhook-token-file`` and ``--triggers`` to ``fairstream refit``."""
    parser.add_argument("--webhook-port", type=_webhook_port_arg, metavar="PORT",
                        help=f"with --serve: also accept Alertmanager webhook notifications on this port (POST "
                             f"{WEBHOOK_PATH}; {DEFAULT_PORT} in the deploy files); a firing drift alert becomes a "
                             "re-fit request. Off by default")
    parser.add_argument("--webhook-host", default="127.0.0.1", metavar="ADDRESS",
                        help="with --webhook-port: the address to listen on (default: 127.0.0.1, this host only; "
                             "0.0.0.0 for every interface, behind TLS: see docs/production.md)")
    parser.add_argument("--webhook-tls-cert", metavar="FILE",
                        help="with --webhook-port: serve HTTPS with this certificate chain (PEM), with --webhook-tls-key")
    parser.add_argument("--webhook-tls-key", metavar="FILE", help="the TLS certificate's private key (PEM)")
    parser.add_argument("--webhook-token-file", metavar="PATH",
                        help=f"with --webhook-port: file holding the bearer token Alertmanager sends "
                             f"(default: ${TOKEN_ENV})")
    parser.add_argument("--triggers", type=_triggers_arg, default=TRIGGERS, metavar="LIST",
                        help="with --serve: which requests to answer, a comma-separated list of "
                             f"{', '.join(TRIGGERS)} (default: all). The monitor's and Alertmanager's requests "
                             "for one drift are answered once")


def _tls_files(args: argparse.Namespace) -> tuple[str, str] | None:
    """(certificate, key) of ``--webhook-tls-cert`` and ``--webhook-tls-key``: both or neither."""
    cert, key = getattr(args, "webhook_tls_cert", None), getattr(args, "webhook_tls_key", None)
    if bool(cert) != bool(key):
        raise WebhookConfigError("--webhook-tls-cert and --webhook-tls-key go together (a certificate and its key)")
    return (cert, key) if cert else None


def _webhook_port_arg(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port 0-65535 (0 = any free port), got {text!r}")
    return int(text)


def webhook_token_from_args(args: argparse.Namespace) -> str | None:
    """The token of the webhook ``args`` ask for (None: no webhook), checked before anything connects.

    The webhook options without ``--serve``, or the token options without ``--webhook-port``, are
    refused rather than ignored: a one-shot re-fit would otherwise run and exit 0 with no webhook.
    """
    if args.webhook_port is None:
        given = [option for option, value in (("--webhook-token-file", args.webhook_token_file),
                                              ("--webhook-tls-cert", getattr(args, "webhook_tls_cert", None)),
                                              ("--webhook-tls-key", getattr(args, "webhook_tls_key", None))) if value]
        if given:
            raise WebhookConfigError(f"{given[0]} needs --webhook-port (and --serve)")
        return None
    if not getattr(args, "serve", False):
        raise WebhookConfigError("--webhook-port needs --serve: the webhook's requests are answered by the service")
    _tls_files(args)
    return load_token(args.webhook_token_file)


@contextlib.contextmanager
def webhook_from_args(args: argparse.Namespace, bootstrap: str, config: PipelineConfig, kind: str,
                      token: str | None = None, signer=None) -> Iterator[AlertWebhook | None]:
    """The webhook ``args`` ask for, turning drift alerts into re-fits of ``kind``, serving while the block runs.

    Yields None when ``--webhook-port`` is not given. ``token``: from :func:`webhook_token_from_args`, read
    before connecting (else read here). ``signer`` signs each request it sends (a signed pipeline's re-fit
    service takes only requests signed by a requester's key: the token guards HTTP, the signature the topic).
    """
    token = token or webhook_token_from_args(args)
    if token is None:
        yield None
        return
    with RequestPublisher(bootstrap, config.topics.refit_requests, signer=signer) as publish, \
            AlertWebhook(publish, token, host=args.webhook_host, port=args.webhook_port, kind=kind,
                         statistics=config.monitor.statistics, pipeline=config.name, tls=_tls_files(args)) as webhook:
        yield webhook
