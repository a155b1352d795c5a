"""replay: what it sends, and what it says when the broker stops acknowledging."""

from __future__ import annotations

import logging

import kafka

from fairstream.streams.demo.replay import replay


class _Future:
    def __init__(self, ok: bool):
        self.ok = ok
        self.exception = None if ok else kafka.errors.KafkaTimeoutError("Batch for records.in-0 expired")

    def succeeded(self) -> bool:
        return self.ok


class _DyingProducer:
    """Acknowledges the first two records, then the broker is gone (it was killed under the replay)."""

    def __init__(self, **config):
        self.sent = 0

    def send(self, topic, key, value):
        self.sent += 1
        return _Future(self.sent <= 2)

    def flush(self):
        pass

    def close(self):
        pass


def test_records_the_broker_did_not_acknowledge_are_counted_and_the_reason_logged(monkeypatch, caplog):
    monkeypatch.setattr(kafka, "KafkaProducer", _DyingProducer)
    messages = [(b"k%d" % i, b"{}") for i in range(5)]
    with caplog.at_level(logging.WARNING, logger="fairstream"):
        assert replay("127.0.0.1:1", "records.in", messages, progress=False) == 2
    assert "3 of 5 records were not acknowledged by the broker at 127.0.0.1:1: KafkaTimeoutError" in caplog.text
