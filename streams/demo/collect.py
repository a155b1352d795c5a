"""Read what a topic holds, incrementally, without joining a consumer group.

Used by the demo's live summary and report, and by the integration tests: every partition is
assigned by hand and read from the beginning, so reading never disturbs the workers' groups.
"""

from __future__ import annotations

import time
from typing import Callable

from kafka import KafkaConsumer, TopicPartition

from fairstream.streams.kafka import KAFKA_API_VERSION, kafka_python_options


class TopicReader:
    """``poll()`` returns the messages that arrived since the last call, over all partitions."""

    def __init__(self, bootstrap: str, topic: str):
        self.topic = topic
        self._consumer = KafkaConsumer(bootstrap_servers=bootstrap, api_version=KAFKA_API_VERSION, enable_auto_commit=False,
                                       group_id=None, fetch_max_wait_ms=50, max_partition_fetch_bytes=8 * 1024 * 1024,
                                       **kafka_python_options())
        partitions = self._consumer.partitions_for_topic(topic) or {0}
        self._consumer.assign([TopicPartition(topic, p) for p in sorted(partitions)])
        self._consumer.seek_to_beginning()

    def poll(self, timeout_ms: int = 200) -> list:
        """The records that arrived within ``timeout_ms``."""
        batches = self._consumer.poll(timeout_ms=timeout_ms, max_records=100_000)
        return [message for messages in batches.values() for message in messages]

    def close(self) -> None:
        """Close the consumer."""
        self._consumer.close()

    def __enter__(self) -> "TopicReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def collect_until(readers: dict[str, TopicReader], done: Callable[[dict[str, list]], bool], timeout: float,
                  on_poll: Callable[[dict[str, list]], None] | None = None) -> dict[str, list]:
    """Poll every reader until ``done(collected)`` or ``timeout`` seconds; returns all messages by name."""
    collected: dict[str, list] = {name: [] for name in readers}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, reader in readers.items():
            collected[name].extend(reader.poll(timeout_ms=100))
        if on_poll:
            on_poll(collected)
        if done(collected):
            break
    return collected
