"""The worker's health, as a supervisor sees it: ``/healthz``, ``/readyz``, and logs that stay readable.

Both endpoints are served with ``/metrics`` on the metrics port (:func:`.metrics.serve`), from the
HTTP server's thread; each answer is computed *on the worker's event loop*, so an answer at all
proves that the loop runs:

- ``/healthz`` (liveness): 200 while the event loop answers within :data:`LOOP_ANSWER_SECONDS`, 503
  otherwise (a loop blocked or wedged: restart the process), and 503 if the worker's services have
  not started within :data:`START_SECONDS`. An error the worker cannot recover from does not wait
  for this probe: it ends the process with a non-zero status.
- ``/readyz`` (readiness): 200 while the worker is consuming: the control topic replayed, every
  artifact its inputs apply loaded, partitions assigned to at least one input, and every input that
  owns partitions has made progress within :data:`READY_WITHIN_SECONDS` (committed a batch, or read
  every partition to its end with the broker answering). 503 with the reasons otherwise: while the
  group rebalances, while the broker is away, while an artifact is missing, while the worker holds for
  its config (it differs from the pipeline's active config version, naming the keys, or a signed
  pipeline has none published: it takes no partitions), or for a worker that owns no partitions (more
  workers than partitions).

While the broker is away, the Kafka clients log every failed attempt (about 190 lines a second
from a worker); :class:`RepeatedLogFilter` keeps one line per cause every few seconds, with a count.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from typing import Callable, Sequence

log = logging.getLogger(__name__)

HEALTHZ = "/healthz"
READYZ = "/readyz"
READY_WITHIN_SECONDS = 20.0  # an input that owns partitions and made no progress for this long is not consuming
LOOP_ANSWER_SECONDS = 5.0  # /healthz: the event loop must answer within this
START_SECONDS = 120.0  # /healthz: a worker whose services have not started by then is not alive either
LOG_REPEAT_SECONDS = 5.0  # at most one line per cause this often (RepeatedLogFilter)

Answer = tuple[int, dict]  # HTTP status, JSON body


class WorkerHealth:
    """What ``/healthz`` and ``/readyz`` answer for one worker (see the module docstring)."""

    def __init__(self, ready_within: float = READY_WITHIN_SECONDS, answer_within: float = LOOP_ANSWER_SECONDS,
                 start_within: float = START_SECONDS):
        self.ready_within, self.answer_within, self.start_within = ready_within, answer_within, start_within
        self.created = time.monotonic()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.inputs: Sequence = ()  # objects with progress() -> consumer.Progress
        self.blockers: Callable[[], list[str]] = lambda: ["starting"]

    def watch(self, inputs: Sequence, blockers: Callable[[], list[str]]) -> None:
        """Judge these inputs; ``blockers()`` lists what keeps the worker from consuming at all (missing artifacts)."""
        self.inputs, self.blockers = inputs, blockers

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the worker runs on (called from it, once the worker's services start)."""
        self.loop = loop

    def reasons(self) -> list[str]:
        """Why the worker is not consuming now; empty while it is (runs on the event loop)."""
        reasons = list(self.blockers())
        progress = [i.progress() for i in self.inputs]
        for p in progress:
            if p.partitions and (p.seconds_since is None or p.seconds_since > self.ready_within):
                idle = "never" if p.seconds_since is None else f"not for {p.seconds_since:.0f} s"
                error = f"; last error {p.last_error}" if p.last_error else ""
                reasons.append(f"{p.agent}: owns {p.partitions} partitions but consumed {idle} "
                               f"(no batch committed, not caught up){error}")
        if not any(p.partitions for p in progress):
            reasons.append("no input partitions assigned (joining or rebalancing, or more workers than partitions)")
        return reasons

    def healthz(self) -> Answer:
        """Liveness: does the event loop answer? (Called from the HTTP server's thread.)"""
        if self.loop is None:
            if time.monotonic() - self.created > self.start_within:
                return 503, {"alive": False, "reason": f"the worker's services did not start within "
                                                       f"{self.start_within:g} s"}
            return 200, {"alive": True, "starting": True}
        try:
            self._on_loop(lambda: None)
        except concurrent.futures.TimeoutError:
            return 503, {"alive": False, "reason": f"the event loop did not answer within {self.answer_within:g} s"}
        except RuntimeError as exc:  # the loop is closed: the process is on its way out
            return 503, {"alive": False, "reason": str(exc)}
        return 200, {"alive": True}

    def readyz(self) -> Answer:
        """Readiness: is the worker consuming? (Called from the HTTP server's thread.)"""
        if self.loop is None:
            return 503, {"ready": False, "reasons": ["starting"]}
        try:
            reasons = self._on_loop(self.reasons)
        except concurrent.futures.TimeoutError:
            reasons = [f"the event loop did not answer within {self.answer_within:g} s"]
        except RuntimeError as exc:
            reasons = [str(exc)]
        return (503, {"ready": False, "reasons": reasons}) if reasons else (200, {"ready": True})

    def _on_loop(self, function: Callable):
        """``function()`` run on the event loop; TimeoutError if the loop does not run it in time."""
        answer: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            if answer.set_running_or_notify_cancel():  # False: the asker gave up already
                try:
                    answer.set_result(function())
                except Exception as exc:  # a bug in a check: the probe says so rather than hang
                    answer.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        try:
            return answer.result(timeout=self.answer_within)
        finally:
            answer.cancel()


class RepeatedLogFilter(logging.Filter):
    """At most one line per cause every ``every`` seconds, for warnings and errors; the next says how many were held.

    The cause is the logger, the level and the message *template* (``record.msg`` before its
    arguments), so "Unable connect to node with id 0: ..." repeated 60 times a second is one cause.
    Debug and info lines pass untouched. Install one filter per handler.
    """

    MAX_CAUSES = 1024  # templates are finite, but f-string messages are not: forget old causes beyond this

    def __init__(self, every: float = LOG_REPEAT_SECONDS, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.every, self.clock = every, clock
        self._causes: dict[tuple, list] = {}  # cause -> [time shown, lines held back since]
        self._lock = threading.Lock()  # Kafka clients and the HTTP server log from other threads

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        cause = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        with self._lock:
            seen = self._causes.get(cause)
            if seen is not None and now - seen[0] < self.every:
                seen[1] += 1
                return False
            if len(self._causes) >= self.MAX_CAUSES:
                self._forget(now)
            self._causes[cause] = [now, 0]
        if seen is not None and seen[1]:
            record.msg = f"{record.getMessage()} [{seen[1]} more like this in the last {now - seen[0]:.0f} s]"
            record.args = ()
        return True

    def _forget(self, now: float) -> None:
        for cause in [c for c, (shown, held) in self._causes.items() if now - shown >= self.every]:
            del self._causes[cause]
        if len(self._causes) >= self.MAX_CAUSES:
            self._causes.clear()


def quiet_repeats(logger: logging.Logger, every: float = LOG_REPEAT_SECONDS) -> None:
    """Add a :class:`RepeatedLogFilter` to each of ``logger``'s handlers (where records from every logger end up)."""
    for handler in logger.handlers:
        if not any(isinstance(f, RepeatedLogFilter) for f in handler.filters):
            handler.addFilter(RepeatedLogFilter(every))
