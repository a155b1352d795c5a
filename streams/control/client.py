"""The publisher's client of the control topic: publish, roll back and list artifact versions.

Every record is sent under its own :func:`~fairstream.streams.control.records.control_key`, so the
history survives compaction and rollback can always go back.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from fairstream.repair import artifacts
from fairstream.repair.artifacts import Artifact, ArtifactError
from fairstream.streams.kafka import aiokafka_options
from fairstream.streams.schemas import ControlRecord
from fairstream.streams.topics import TopicConfig, ensure_topics_async

from .records import ControlError, control_key, encode_control, is_stale, parse_control, parse_event
from .registry import control_consumer, message_limit, open_at_beginning
from .store import ArtifactStore

log = logging.getLogger(__name__)

DEFAULT_INLINE_LIMIT = 512 * 1024
"""Encoded artifacts up to this many bytes travel inside the control message (base64 adds 1/3)."""
# Kafka clients default to 1 MiB per request/fetch; an inline blob near the limit plus base64 and
# JSON overhead must still fit, so the limits follow inline_limit.
_MIN_MESSAGE_BYTES = 1024 * 1024
_MESSAGE_OVERHEAD = 64 * 1024

# --------------------------------------------------------------------------- the publisher's client


class ControlClient:
    """Publish, roll back and list artifact versions on the control topic.

    Each ``async`` method has a ``*_sync`` twin for the CLI. The control topic is created (with the
    rest of the pipeline's topics) when it does not exist yet.
    """

    def __init__(
        self,
        bootstrap: str,
        topics: TopicConfig,
        store: ArtifactStore,
        inline_limit: int = DEFAULT_INLINE_LIMIT,
        timeout: float = 30.0,
    ):
        if inline_limit < 0:
            raise ValueError(f"inline_limit must be >= 0 bytes, got {inline_limit}")
        self.bootstrap = bootstrap
        self.topics = topics
        self.store = store
        self.inline_limit = inline_limit
        self.timeout = timeout
        self._topic_checked = False

    @property
    def topic(self) -> str:
        """The control topic's name."""
        return self.topics.control

    # ------------------------------------------------------------------ async API

    async def _messages(self) -> list:
        """Every message on the control topic, in log order, up to its current end."""
        await self._ensure_topic()
        consumer = control_consumer(self.bootstrap, message_limit(self.inline_limit) * 16)
        await consumer.start()
        try:
            return await self._read_to_end(consumer)
        finally:
            await consumer.stop()

    async def history(self) -> list[ControlRecord]:
        """Every readable record on the control topic, in log order, up to its current end."""
        return _parse_history(await self._messages())

    async def events(self) -> list[dict]:
        """Every event on the control topic (e.g. re-embed notices), in log order, de-duplicated by key."""
        seen: dict[bytes, dict] = {}
        for message in await self._messages():
            event = parse_event(message.value)
            if event is not None:
                seen.setdefault(message.key, event)
        return list(seen.values())

    async def publish(self, artifact: Artifact) -> ControlRecord:
        """Publish ``artifact`` as the next version of its kind; returns the delivered record."""
        history = await self.history()
        version = 1 + max((r.version for r in history if r.kind == artifact.kind), default=0)
        artifact = artifacts.with_version(artifact, version)
        path = self.store.put(artifact)
        blob = artifacts.encode(artifact)
        inline = len(blob) <= self.inline_limit
        record = ControlRecord(
            kind=artifact.kind,
            version=version,
            sha256=artifact.sha256,
            action="publish",
            blob_b64=base64.b64encode(blob).decode("ascii") if inline else None,
            path=None if inline else str(path.resolve()),
            published_at=time.time(),
        )
        await self._send(record)
        log.info("published %s version %d (sha256 %s, %s)", record.kind, version, record.sha256[:12],
                 "inline" if inline else f"by path {record.path}")
        return record

    async def rollback(self, kind: str) -> ControlRecord:
        """Re-activate the version ``kind`` served before the active one; returns the delivered record."""
        stacks = _activation_stacks(await self.history())
        if kind not in stacks:
            known = ", ".join(sorted(stacks)) or "none"
            raise ControlError(f"no artifact of kind {kind!r} was ever published (kinds on {self.topic}: {known})")
        stack = stacks[kind]
        if len(stack) < 2:
            raise ControlError(f"nothing to roll back to: no {kind} version was active before version {stack[-1].version}")
        target = stack[-2]
        self._check_loadable(target)
        record = ControlRecord(
            kind=kind,
            version=target.version,
            sha256=target.sha256,
            action="rollback",
            blob_b64=target.blob_b64,
            path=target.path,
            published_at=time.time(),
        )
        await self._send(record)
        log.info("rolled %s back from version %d to %d", kind, stack[-1].version, target.version)
        return record

    async def listing(self) -> list[dict]:
        """One row per control record (log order), for ``fairstream artifacts list``."""
        history = await self.history()
        active = {id(stack[-1]) for stack in _activation_stacks(history).values()}
        return [_row(record, id(record) in active) for record in history]

    # ------------------------------------------------------------------ sync twins for the CLI

    def history_sync(self) -> list[ControlRecord]:
        """Blocking :meth:`history`."""
        return asyncio.run(self.history())

    def events_sync(self) -> list[dict]:
        """Blocking :meth:`events`."""
        return asyncio.run(self.events())

    def publish_sync(self, artifact: Artifact) -> ControlRecord:
        """Blocking :meth:`publish`."""
        return asyncio.run(self.publish(artifact))

    def rollback_sync(self, kind: str) -> ControlRecord:
        """Blocking :meth:`rollback`."""
        return asyncio.run(self.rollback(kind))

    def listing_sync(self) -> list[dict]:
        """Blocking :meth:`listing`."""
        return asyncio.run(self.listing())

    # ------------------------------------------------------------------ plumbing

    async def _ensure_topic(self) -> None:
        # Only when the control topic is missing: an existing pipeline whose data topics differ
        # from this TopicConfig must still be able to list and publish.
        if self._topic_checked:
            return
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=int(self.timeout * 1000),
                                    **aiokafka_options())
        await admin.start()
        try:
            exists = self.topic in await admin.list_topics()
        finally:
            await admin.close()
        if not exists:
            await ensure_topics_async(self.bootstrap, self.topics, self.timeout)
        self._topic_checked = True

    async def _read_to_end(self, consumer: AIOKafkaConsumer) -> list:
        partition, end = await open_at_beginning(consumer, self.topic)
        deadline = time.monotonic() + self.timeout
        messages = []
        while await consumer.position(partition) < end:
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {self.topic} up to offset {end} within {self.timeout:.0f}s")
            batch = await consumer.getmany(partition, timeout_ms=200)
            messages.extend(batch.get(partition, []))
        return messages

    async def _send(self, record: ControlRecord) -> None:
        await self._ensure_topic()
        value = encode_control(record)
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            **aiokafka_options(),
            acks="all",
            max_request_size=message_limit(self.inline_limit),
            request_timeout_ms=int(self.timeout * 1000),
        )
        await producer.start()
        try:
            await producer.send_and_wait(self.topic, value, key=control_key(record, value), partition=0)
        finally:
            await producer.stop()

    def _check_loadable(self, record: ControlRecord) -> None:
        """Refuse to send a rollback every worker would refuse (blob or store file damaged)."""
        try:
            if record.blob_b64 is not None:
                artifact = artifacts.decode(base64.b64decode(record.blob_b64, validate=True), kind=record.kind)
            else:
                artifact = self.store.get(record.sha256)
        except (ArtifactError, binascii.Error) as exc:
            raise ControlError(f"cannot roll back to {record.kind} version {record.version}: {exc}") from None
        if artifact.sha256 != record.sha256:
            raise ControlError(
                f"cannot roll back to {record.kind} version {record.version}: its blob does not match its sha256"
            )


def _parse_history(messages: list) -> list[ControlRecord]:
    records = []
    for message in messages:
        if parse_event(message.value) is not None:  # notices such as re-embed events, not artifact records
            continue
        try:
            records.append(parse_control(message.value))
        except ControlError as exc:
            log.warning("skipping unreadable control record at offset %d: %s", message.offset, exc)
    return records


def _activation_stacks(history: list[ControlRecord]) -> dict[str, list[ControlRecord]]:
    """Per kind, the versions that are active or can be rolled back to, the active one last.

    A publish pushes (stale ones are skipped, by the workers' rule), a rollback pops back to its
    version, so rolling back twice goes two versions back rather than toggling between two.
    """
    stacks: dict[str, list[ControlRecord]] = {}
    for record in history:
        stack = stacks.setdefault(record.kind, [])
        versions = [entry.version for entry in stack]
        if is_stale(record, versions[-1] if versions else None):
            continue
        if record.action == "rollback" and record.version in versions:
            del stack[versions.index(record.version):]
        elif versions and versions[-1] == record.version:
            stack.pop()  # the same version again: it replaces itself, it is not a new step
        stack.append(record)
    return stacks


def _row(record: ControlRecord, active: bool) -> dict:
    return {
        "kind": record.kind,
        "version": record.version,
        "sha256": record.sha256[:12],
        "action": record.action,
        "published_at": record.published_at,
        "via": "inline" if record.blob_b64 is not None else "path",
        "active": active,
    }
