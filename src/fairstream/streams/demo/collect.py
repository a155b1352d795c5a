"""Read what a topic holds, incrementally, without joining a consumer group.

Used by the demo's live summary and report, by ``fairstream tail`` and by the integration tests:
every partition is assigned by hand and read from the beginning, so reading never disturbs the
workers' groups.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable

from kafka import KafkaConsumer, TopicPartition

from fairstream.streams.kafka import KAFKA_API_VERSION, kafka_python_options


class UnknownTopicError(LookupError):
    """The broker has no topic of that name."""


class TopicReader:
    """``poll()`` returns the messages that arrived since the last call, over all partitions.

    With ``must_exist`` a topic the broker does not have raises :class:`UnknownTopicError` (and is
    not auto-created); otherwise partition 0 of it is read, once something creates it.
    """

    def __init__(self, bootstrap: str, topic: str, must_exist: bool = False):
        self.topic = topic
        self._consumer = KafkaConsumer(bootstrap_servers=bootstrap, api_version=KAFKA_API_VERSION, enable_auto_commit=False,
                                       group_id=None, fetch_max_wait_ms=50, max_partition_fetch_bytes=8 * 1024 * 1024,
                                       allow_auto_create_topics=not must_exist, **kafka_python_options())
        partitions = self._consumer.partitions_for_topic(topic)
        if not partitions and must_exist:
            self._consumer.close()
            raise UnknownTopicError(topic)
        self.partitions = [TopicPartition(topic, p) for p in sorted(partitions or {0})]
        self._consumer.assign(self.partitions)
        self._consumer.seek_to_beginning()

    def poll(self, timeout_ms: int = 200) -> list:
        """The records that arrived within ``timeout_ms``."""
        batches = self._consumer.poll(timeout_ms=timeout_ms, max_records=100_000)
        return [message for messages in batches.values() for message in messages]

    def at_end(self) -> bool:
        """Whether every partition has been read up to its fetch highwater (the broker's ListOffsets can be wrong)."""
        for tp in self.partitions:
            highwater = self._consumer.highwater(tp)  # None before the partition's first fetch response
            if highwater is None or self._consumer.position(tp) < highwater:
                return False
        return True

    def skip_to_last(self, n: int) -> list:
        """Move every partition that is more than ``n`` records before its highwater to ``n`` before it.

        Returns the partitions moved. A partition's highwater is known once a fetch has answered for it.
        """
        moved = []
        for tp in self.partitions:
            highwater = self._consumer.highwater(tp)
            if highwater is not None and self._consumer.position(tp) < highwater - n:
                self._consumer.seek(tp, highwater - n)
                moved.append(tp)
        return moved

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


def last_messages(reader: TopicReader, n: int, timeout: float) -> list:
    """The last ``n`` messages of the reader's topic, oldest first (by timestamp over its partitions).

    Reads every partition to its end, skipping to ``n`` records before the end once the first fetch
    tells where that is; while the topic holds fewer than ``n``, waits for more until ``timeout``
    seconds have passed (then returns fewer).
    """
    tails = {tp: deque(maxlen=n) for tp in reader.partitions}
    deadline = time.monotonic() + timeout
    while True:
        for message in reader.poll(timeout_ms=100):
            tails[TopicPartition(message.topic, message.partition)].append(message)
        for tp in reader.skip_to_last(n):
            tails[tp].clear()  # what was read of it lies before the skipped part: not among its last n
        held = sum(len(tail) for tail in tails.values())
        if (held >= n and reader.at_end()) or time.monotonic() >= deadline:
            break
    newest = sorted((m for tail in tails.values() for m in tail), key=lambda m: (m.timestamp, m.partition, m.offset))
    return newest[-n:] if n else []
