"""Asking for a re-fit from outside a worker: one :class:`~fairstream.streams.codec.RefitRequest` onto ``refit.requests``."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from fairstream.streams.codec import RefitRequest
from fairstream.streams.kafka import KAFKA_API_VERSION

if TYPE_CHECKING:
    from fairstream.streams.config import PipelineConfig

log = logging.getLogger(__name__)


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
    producer = KafkaProducer(bootstrap_servers=bootstrap, api_version=KAFKA_API_VERSION, acks="all",
                             request_timeout_ms=int(timeout * 1000))
    try:
        producer.send(config.topics.refit_requests, key=kind.encode("utf-8"), value=request.to_json()).get(timeout)
    finally:
        producer.close()
    log.info("requested a re-fit of %s (%s): %s", kind, request.request_id, reason)
    return request
