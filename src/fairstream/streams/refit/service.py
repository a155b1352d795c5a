"""The re-fit service (``fairstream refit --serve``): answers re-fit requests, de-duplicated, coalesced, rate-limited.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Self

from fairstream.streams.codec.partials import AGENT_SUFFIX
from fairstream.streams.codec.refit_requests import RefitRequest, RefitRequestError, parse_request
from fairstream.streams.control.trust import ROLE_OF, Trust, TrustError
from fairstream.streams.kafka import KAFKA_API_VERSION, kafka_python_options

from .job import RefitJob, RefitOutcome
from .sources import Source

log = logging.getLogger(__name__)
_SEEN_REQUESTS = 10_000  # request ids remembered for de-duplication (oldest forgotten first)
_UNREAD = object()  # the serving version, not read yet in this step
# Decisions an operator should see: a drift no re-fit will answer, a request no requester's key signed.
_WARNED = frozenset({"superseded", "unauthorised"})

# Where a request comes from, told by its ``source``. The pipeline's monitoring agent signs its requests
# "<app id>.monitor@<host>:<pid>" (streams/agent/service.py); workers before the agent signed "monitor@<app id>",
# and such requests may still wait on the topic: both are the monitor trigger. The Alertmanager webhook (webhook.py) signs
# "alertmanager:<alert name>@<instance>". Anything else (a person, a script) is "other".
MONITOR_SOURCE_PREFIX = "monitor@"
ALERT_SOURCE_PREFIX = "alertmanager:"
TRIGGERS = ("monitor", "alertmanager", "other")

ALERT_WINDOW_SECONDS = 360.0
"""How far a drift alert's start may lie after the monitor request that reports the same drift. The
drift rule (deploy/prometheus/alerts.yml) fires on drift events counted over the last 5m; one more
minute covers the scrape, the rule evaluation and Alertmanager's group wait."""
CLOCK_SKEW_SECONDS = 30.0
"""How far the alert's start may lie *before* the monitor's request: Prometheus and the workers run on
different hosts, whose clocks may disagree by this much."""


def trigger_of(request: RefitRequest) -> str:
    """``monitor``, ``alertmanager`` or ``other``: which trigger sent ``request`` (from its source)."""
    source = request.source or ""
    if source.startswith(ALERT_SOURCE_PREFIX):  # first: an alert's name may end in ".monitor" too
        return "alertmanager"
    app_id, at, _ = source.partition("@")
    if source.startswith(MONITOR_SOURCE_PREFIX) or (at and app_id.endswith(AGENT_SUFFIX)):
        return "monitor"
    return "other"


@dataclass(frozen=True)
class _DriftReport:
    """A drift request the service accepted, kept to recognise the same drift reported by the other trigger."""

    trigger: str
    statistic: str | None
    ts: float
    request_id: str


def same_drift(monitor_ts: float, alert_ts: float, window: float = ALERT_WINDOW_SECONDS) -> bool:
    """True when an alert that started firing at ``alert_ts`` counts the drift the monitor reported at ``monitor_ts``.

    The monitor sends its request when it counts the drift event; Prometheus sees the counter move at
    its next scrape and the alert fires then, so the alert starts after the request, by at most
    ``window`` (less the clock skew allowed before it).
    """
    return -CLOCK_SKEW_SECONDS <= alert_ts - monitor_ts <= window


# =============================================================================== the service


@dataclass(frozen=True)
class Decision:
    """What the service did with a request, and why (also logged)."""

    request_id: str | None
    action: str  # queued | coalesced | duplicate | ignored | stale | superseded | invalid | refit | error
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
    - A request that names the version it is about (the monitoring agent's do) is superseded, and
      dropped with one warning, when that version of the kind no longer serves: a newer one was
      promoted since (or it was rolled back), so its drift was measured on a chain the pipeline no
      longer runs. What serves is read from the control topic as the job reads it
      (:meth:`RefitJob.current`), at most once per poll, and again before a waiting re-fit starts
      (a request may wait out the rate limit while a newer version is promoted). When it cannot be
      read the request is taken. A request without a version (a person's, an alert's) is about
      whatever serves.
    - Two triggers report drift: the worker's monitor (its own requests) and Prometheus through the
      Alertmanager webhook (:mod:`~fairstream.streams.refit.webhook`). A deployment answers either
      or both (``triggers``); with both, one drift is answered once: a request of one trigger that
      reports the same statistic as an accepted request of the other, within the alert's window
      (:func:`same_drift`), is a duplicate. Requests from elsewhere (``other``) are never matched.
    - Offsets are committed only when every request read so far has been answered, so a service
      that dies mid-way leaves its requests to the next member (at least once; the coalescing
      keeps a re-delivery to one extra re-fit at most).

    Run it with :meth:`serve` (until a stop event) or :meth:`process_pending` (bounded, for tests
    and one-shot use); :meth:`close` leaves the group.
    """

    def __init__(self, job: RefitJob, source: Source, min_interval_seconds: float = 300.0,
                 group_id: str | None = None, max_request_age_seconds: float | None = 86400.0,
                 poll_seconds: float = 0.5, max_poll_interval_seconds: float = 3600.0,
                 triggers: Iterable[str] = TRIGGERS, alert_window_seconds: float = ALERT_WINDOW_SECONDS):
        if min_interval_seconds < 0:
            raise ValueError(f"min_interval_seconds must be >= 0, got {min_interval_seconds!r}")
        self.triggers = tuple(triggers)
        unknown = sorted(set(self.triggers) - set(TRIGGERS))
        if unknown or not self.triggers:
            raise ValueError(f"triggers must be some of {', '.join(TRIGGERS)}, got {', '.join(self.triggers) or 'none'}")
        self.job = job
        self.trust = Trust.load(job.config.trust)  # the pipeline's: who may request a re-fit (the requester role)
        self.source = source
        self.min_interval_seconds = min_interval_seconds
        self.group_id = group_id or f"{job.config.topics.prefix}.refit.{job.kind}"
        self.max_request_age_seconds = max_request_age_seconds
        self.poll_seconds = poll_seconds
        self.max_poll_interval_seconds = max_poll_interval_seconds
        self.alert_window_seconds = alert_window_seconds
        self.decisions: deque[Decision] = deque(maxlen=1000)
        self.outcomes: deque[RefitOutcome] = deque(maxlen=100)
        self.refit_started: deque[float] = deque(maxlen=100)  # monotonic start of each re-fit
        self._pending: list[RefitRequest] = []
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._drift_reports: deque[_DriftReport] = deque(maxlen=1000)
        self._last_refit_end: float | None = None
        self._last_message: float = time.monotonic()
        self._serving: int | None | object = _UNREAD
        self._consumer = None

    # ------------------------------------------------------------------ running

    def serve(self, stop_event: threading.Event) -> None:
        """Handle requests until ``stop_event`` is set, then leave the group."""
        log.info("re-fit service for %s: group %s on %s, min interval %.0fs, triggers %s", self.job.kind,
                 self.group_id, self.job.config.topics.refit_requests, self.min_interval_seconds, ",".join(self.triggers))
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
        """Close the request consumer."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ one step

    def _step(self) -> None:
        self._serving = _UNREAD  # a promotion may have happened since the last poll
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
                self.job.config.topics.refit_requests, bootstrap_servers=self.job.bootstrap, api_version=KAFKA_API_VERSION,
                **kafka_python_options(),
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
        refusal = self._unauthorised(message.value)
        if refusal is not None:  # the webhook's token guards HTTP; on the topic, only a requester's signature counts
            self._decide(request.request_id, "unauthorised", f"{where}: {refusal}; skipped")
            return
        rejection = self._rejection(request)
        if rejection is not None:
            self._decide(request.request_id, *rejection)
        else:
            self._queue(request)

    def _unauthorised(self, value: bytes) -> str | None:
        """Why a signed pipeline refuses this request (not signed by a key with the requester role), or None."""
        trust = self.trust
        if not trust.signed:
            return None
        try:
            data = json.loads(value)
            trust.signer_of(data, ROLE_OF["request"])
        except (TrustError, ValueError, RecursionError) as exc:
            return f"refused: {exc}"
        topic = self.job.config.topics.refit_requests
        if data.get("pipeline") != topic:
            return f"refused: signed for {str(data.get('pipeline'))[:100]!r}, not for {topic}: a copy from elsewhere"
        return None

    def _rejection(self, request: RefitRequest) -> tuple[str, str] | None:
        """(action, reason) when the request needs no re-fit; remembers ids of this kind."""
        if request.kind != self.job.kind:
            return "ignored", f"asks for kind {request.kind!r}; this service re-fits {self.job.kind!r}"
        trigger = trigger_of(request)
        if trigger not in self.triggers:
            return "ignored", f"sent by the {trigger} trigger; this service answers {', '.join(self.triggers)}"
        if request.request_id in self._seen:
            return "duplicate", "this request id was already handled; ignored"
        self._remember(request.request_id)
        age = time.time() - request.ts
        if self.max_request_age_seconds is not None and age > self.max_request_age_seconds:
            return "stale", f"asked {age:.0f}s ago, over the {self.max_request_age_seconds:.0f}s limit; dropped"
        replaced = self._replaced(request)
        if replaced is not None:
            return "superseded", replaced
        twin = self._same_drift_from_other_trigger(request, trigger)
        if twin is not None:
            return "duplicate", (f"the same drift of {request.statistic} as {twin.trigger} request {twin.request_id} "
                                 f"({abs(request.ts - twin.ts):.0f}s apart): one re-fit answers both")
        return None

    def _replaced(self, request: RefitRequest) -> str | None:
        """Why ``request`` is about a version that no longer serves, or None (it names none, it serves, or unknown)."""
        if request.version is None:
            return None
        serving = self._serving_version()
        if serving is None or serving == request.version:
            return None
        since = "a newer version was promoted since" if serving > request.version else "it was rolled back since"
        return (f"about {request.kind} version {request.version}, but {request.kind} version {serving} serves now "
                f"({since}): its drift was measured on a chain no longer running; dropped")

    def _serving_version(self) -> int | None:
        """The version of the job's kind the workers serve now (None: none, or unknown), read once per step."""
        if self._serving is _UNREAD:
            self._serving = self._read_serving_version()
        return self._serving

    def _read_serving_version(self) -> int | None:
        try:
            current = self.job.current()
        except Exception as exc:  # a broker or store failing now must not drop a drift: the request is taken
            log.warning("could not read which %s version serves (%s: %s); requests naming a version are taken",
                        self.job.kind, type(exc).__name__, exc)
            return None
        return None if current is None else current.version

    def _same_drift_from_other_trigger(self, request: RefitRequest, trigger: str) -> _DriftReport | None:
        """An accepted request of the other drift trigger that reports the drift ``request`` reports, if any."""
        if trigger == "other":
            return None
        for report in reversed(self._drift_reports):
            if report.trigger == trigger or report.statistic != request.statistic:
                continue
            monitor_ts, alert_ts = (request.ts, report.ts) if trigger == "monitor" else (report.ts, request.ts)
            if same_drift(monitor_ts, alert_ts, self.alert_window_seconds):
                return report
        return None

    def _queue(self, request: RefitRequest) -> None:
        waiting = len(self._pending)
        self._pending.append(request)
        self._drift_reports.append(_DriftReport(trigger_of(request), request.statistic, request.ts, request.request_id))
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

    def _still_serving(self, requests: list[RefitRequest]) -> list[RefitRequest]:
        """``requests`` less those whose version was replaced while they waited (each dropped with its decision)."""
        kept = []
        for request in requests:
            replaced = self._replaced(request)
            if replaced is None:
                kept.append(request)
            else:
                self._decide(request.request_id, "superseded", replaced)
        return kept

    def _refit(self) -> None:
        answered, self._pending = self._still_serving(self._pending), []
        if not answered:  # every waiting request was about a replaced version: nothing to re-fit
            self._commit()
            return
        ids = [request.request_id for request in answered]
        self.refit_started.append(time.monotonic())
        try:
            trigger = "; ".join(dict.fromkeys(request.reason for request in answered))  # the audit trail's reason
            outcome = self.job.run_once(self.source, trigger=trigger or None)
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
        level = logging.WARNING if action in _WARNED else logging.INFO
        log.log(level, "refit request %s: %s: %s", request_id or "-", action, reason)
