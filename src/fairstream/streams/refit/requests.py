"""Asking for a re-fit from outside a worker: one
:class:`~fairstream.streams.codec.refit_requests.RefitRequest` onto ``refit.requests``."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Self

from fairstream.streams.codec.refit_requests import RefitRequest
from fairstream.streams.kafka import KAFKA_API_VERSION, kafka_python_options

if TYPE_CHECKING:
    from fairstream.streams.config import PipelineConfig

log = logging.getLogger(__name__)


class RequestPublisher:
    """Sends requests to ``refit.requests`` and returns once the broker has acknowledged each one.

    Keyed by kind, so one kind's requests stay in order on one partition (the monitor's and the
    Alertmanager webhook's requests for a plan meet there). One producer, opened at the first send
    and shared by the threads that call it (kafka-python's producer is thread-safe); :meth:`close`
    flushes and closes it.
    """

    def __init__(self, bootstrap: str, topic: str, timeout: float = 30.0, signer=None):
        self.bootstrap = bootstrap
        self.signer = signer  # signs each request (a signed pipeline's re-fit service takes only a requester's)
        self.topic = topic
        self.timeout = timeout
        self._producer = None
        self._lock = threading.Lock()

    def __call__(self, request: RefitRequest) -> RefitRequest:
        """Send ``request`` and wait for the acknowledgement (raises the client's error on failure)."""
        # Signed for this topic: a copy written to another pipeline's requests is refused there.
        value = request.to_json() if self.signer is None else self.signer.sign_json(request.to_json(),
                                                                                    pipeline=self.topic)
        future = self._open().send(self.topic, key=request.kind.encode("utf-8"), value=value)
        future.get(self.timeout)
        return request

    def close(self) -> None:
        """Flush and close the producer (a later send opens a new one)."""
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            producer.close(timeout=self.timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _open(self):
        with self._lock:
            if self._producer is None:
                from kafka import KafkaProducer

                self._producer = KafkaProducer(bootstrap_servers=self.bootstrap, api_version=KAFKA_API_VERSION,
                                               acks="all", request_timeout_ms=int(self.timeout * 1000),
                                               **kafka_python_options())
            return self._producer


def request_refit(bootstrap: str, config: PipelineConfig, reason: str, kind: str | None = None,
                  statistic: str | None = None, value: float | None = None, source: str | None = None,
                  request_id: str | None = None, timeout: float = 30.0) -> RefitRequest:
    """Ask for a re-fit (the monitor calls this on confirmed drift); returns the request once acknowledged.

    From inside an event loop (a Faust agent), send ``RefitRequest.new(...).to_json()`` with the
    app's producer instead: this function blocks until the broker acknowledges.
    """
    kind = kind or config.refit_kind  # the kind the monitor asks for
    request = RefitRequest.new(reason, kind=kind, statistic=statistic, value=value, source=source, request_id=request_id)
    with RequestPublisher(bootstrap, config.topics.refit_requests, timeout) as publish:
        publish(request)
    log.info("requested a re-fit of %s (%s): %s", kind, request.request_id, reason)
    return request
