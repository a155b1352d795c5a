"""Artifact versions on the control topic: the store, the publisher's client and the workers' registry.

A re-fit job publishes an artifact through :class:`ControlClient`: the encoded artifact goes into
the content-addressed :class:`ArtifactStore` and a :class:`~fairstream.streams.worker.schemas.ControlRecord`
(key = kind) goes onto the one-partition control topic, carrying the artifact inline while it is
small and as a store path otherwise. Every worker runs :func:`follow_control`, which replays the
topic from the beginning without a consumer group and feeds each record to its
:class:`ArtifactRegistry`. The registry verifies the artifact, builds the runtime module with the
kind's loader and swaps it in with a single assignment; anything wrong is refused, counted and
logged while the previous version keeps serving.

Version rule, shared by the client and every registry: a ``publish`` whose version is lower than
the active one is stale (a replay out of order) and ignored; a ``rollback`` may go lower. Because
the topic has one partition, every worker sees the same order and reaches the same state.

Limits worth knowing: the control topic is compacted with one key per kind, so once Apache Kafka
compacts a segment only the newest record per kind is left; :meth:`ControlClient.history` (and so
version numbering and rollback) then sees only what survived. Two publishers racing can give the
same version number to two artifacts; workers then serve whichever came last in the log.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import os
import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Mapping

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from fairstream.repair import artifacts
from fairstream.repair.artifacts import Artifact, ArtifactError

from fairstream.streams.worker.schemas import ControlRecord
from fairstream.streams.topics import TopicConfig, ensure_topics_async

__all__ = [
    "DEFAULT_INLINE_LIMIT",
    "UNKNOWN_KIND",
    "Active",
    "ArtifactRegistry",
    "ArtifactStore",
    "ControlClient",
    "ControlError",
    "encode_control",
    "follow_control",
    "parse_control",
]

log = logging.getLogger(__name__)

DEFAULT_INLINE_LIMIT = 512 * 1024
"""Encoded artifacts up to this many bytes travel inside the control message (base64 adds 1/3)."""

UNKNOWN_KIND = "_unknown"
"""Counter label for records that name no configured kind or cannot be parsed; it cannot clash
with a real kind (those start with a letter), and keeps the label set bounded."""

ACTIONS = ("publish", "rollback")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_STORE_SUFFIX = ".fsa"
# Kafka clients default to 1 MiB per request/fetch; an inline blob near the limit plus base64 and
# JSON overhead must still fit, so the limits follow inline_limit.
_MIN_MESSAGE_BYTES = 1024 * 1024
_MESSAGE_OVERHEAD = 64 * 1024


class ControlError(ValueError):
    """A control record that cannot be parsed, or a control operation that cannot be done."""


# --------------------------------------------------------------------------- the store


class ArtifactStore:
    """Encoded artifacts on disk, one file per payload: ``<root>/<sha256>.fsa``.

    The name is the payload's sha256, so a file holds the same arrays whatever version number a
    control record gives them; :meth:`get` re-verifies the hash, so a file changed on disk is refused.
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def path_for(self, sha256: str) -> Path:
        # The hash may come from a Kafka message: insist on 64 hex digits, so it cannot be a path.
        if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
            raise ArtifactError(f"artifact store keys are 64 lowercase hex digits (a sha256), got {sha256!r}")
        return self.root / f"{sha256}{_STORE_SUFFIX}"

    def put(self, artifact: Artifact) -> Path:
        """Store ``artifact`` (atomic write) and return its path; storing it again changes nothing.

        A file already holding the same payload is kept even if its version number differs
        (workers take the version from the control record). The parameters are sealed in the
        payload, so the same hash means the same behaviour; a different kind or extra is refused.
        """
        path = self.path_for(artifact.sha256)
        existing = self._readable(artifact.sha256) if path.exists() else None
        if existing is not None:
            _check_same_behaviour(existing, artifact)
            return path
        self.root.mkdir(parents=True, exist_ok=True)
        artifacts.atomic_write(path, artifacts.encode(artifact))
        return path

    def get(self, sha256: str) -> Artifact:
        """The artifact whose payload has this sha256, verified (size, hash) before it is parsed."""
        path = self.path_for(sha256)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            raise ArtifactError(f"artifact {sha256[:12]} is not in the store {self.root} (no {path.name})") from None
        artifact = artifacts.decode(blob)
        if artifact.sha256 != sha256:
            raise ArtifactError(f"store file {path} holds payload {artifact.sha256[:12]}, not {sha256[:12]}; refused")
        return artifact

    def _readable(self, sha256: str) -> Artifact | None:
        try:
            return self.get(sha256)
        except ArtifactError as exc:
            log.warning("replacing damaged artifact store file for %s: %s", sha256[:12], exc)
            return None


def _check_same_behaviour(stored: Artifact, new: Artifact) -> None:
    fields = ("kind", "parameters", "extra", "schema_version")
    differing = [name for name in fields if getattr(stored.manifest, name) != getattr(new.manifest, name)]
    if differing:
        raise ArtifactError(
            f"the store already holds payload {new.sha256[:12]} with different {', '.join(differing)}; a store "
            "keyed by payload hash cannot hold both (re-fit, or change the arrays, to publish these settings)"
        )


# --------------------------------------------------------------------------- control messages


def encode_control(record: ControlRecord) -> bytes:
    """The control message value: JSON of the record's fields."""
    return json.dumps(record.asdict(), sort_keys=True, allow_nan=False).encode("utf-8")


def parse_control(value: bytes | None) -> ControlRecord:
    """A validated :class:`ControlRecord` from a message value; :class:`ControlError` says what is wrong."""
    if value is None:
        raise ControlError("empty control message (a tombstone); control records are never deleted")
    try:
        data = json.loads(value)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ControlError(f"control message is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ControlError(f"control message must be a JSON object, got {type(data).__name__}")
    _check_one_transport(data)
    return ControlRecord(
        kind=_field(data, "kind", str),
        version=_positive_int(data.get("version")),
        sha256=_sha256_field(data.get("sha256")),
        action=_action(data.get("action", "publish")),
        blob_b64=_optional(data, "blob_b64", str),
        path=_optional(data, "path", str),
        published_at=_published_at(data.get("published_at")),
    )


def _field(data: dict, name: str, kind: type):
    value = data.get(name)
    if not isinstance(value, kind) or not value:
        raise ControlError(f"control record field {name!r} must be a non-empty {kind.__name__}, got {value!r}")
    return value


def _optional(data: dict, name: str, kind: type):
    return None if data.get(name) is None else _field(data, name, kind)


def _positive_int(value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ControlError(f"control record version must be a positive integer, got {value!r}")
    return value


def _sha256_field(value) -> str:
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise ControlError(f"control record sha256 must be 64 lowercase hex digits, got {value!r}")
    return value


def _action(value) -> str:
    if value not in ACTIONS:
        raise ControlError(f"control record action must be one of {ACTIONS}, got {value!r}")
    return value


def _published_at(value) -> float | None:
    if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
        raise ControlError(f"control record published_at must be a number of seconds, got {value!r}")
    return value


def _check_one_transport(data: dict) -> None:
    given = [name for name in ("blob_b64", "path") if data.get(name) is not None]
    if len(given) != 1:
        raise ControlError(
            f"a control record carries its artifact as exactly one of blob_b64 or path, got {given or 'neither'}"
        )


def _is_stale(record: ControlRecord, active_version: int | None) -> bool:
    """The version rule: a publish may not move a kind to a lower version, a rollback may."""
    return record.action == "publish" and active_version is not None and record.version < active_version


# --------------------------------------------------------------------------- the worker's registry


@dataclass(frozen=True)
class Active:
    """The artifact a worker serves for one kind, and the runtime module built from it."""

    kind: str
    version: int
    sha256: str
    artifact: Artifact
    module: object


class ArtifactRegistry:
    """The artifact versions one worker serves, swapped atomically as control records arrive.

    ``loaders`` maps each kind to a function building the runtime module from an artifact (e.g.
    ``DistributionalRepair.from_artifact``); records of other kinds are refused. ``store`` resolves
    records that travel by path; ``on_change(active)`` runs after each swap and
    ``on_refuse(kind, reason)`` after each refusal (for metrics; ``kind`` is :data:`UNKNOWN_KIND`
    when the record names no configured kind).
    """

    def __init__(
        self,
        loaders: Mapping[str, Callable[[Artifact], object]],
        store: ArtifactStore | None = None,
        on_change: Callable[[Active], None] | None = None,
        on_refuse: Callable[[str, str], None] | None = None,
    ):
        self.loaders = dict(loaders)
        self.store = store
        self.on_change = on_change
        self.on_refuse = on_refuse
        self.accepted_total: Counter[str] = Counter()
        self.refused_total: Counter[str] = Counter()
        self._active: Mapping[str, Active] = MappingProxyType({})

    def current(self, kind: str) -> Active | None:
        """What ``kind`` is served with now, or None before its first accepted record."""
        return self._active.get(kind)

    def snapshot(self) -> Mapping[str, Active]:
        """Every kind's active artifact, as one consistent read-only mapping."""
        return self._active

    def apply(self, value: bytes | None) -> bool:
        """Verify and activate one control message; False (logged, counted) if it is refused."""
        try:
            record = parse_control(value)
        except ControlError as exc:
            return self._refuse(UNKNOWN_KIND, "unparsable control message", str(exc))
        label = record.kind if record.kind in self.loaders else UNKNOWN_KIND
        what = f"{record.action} of {record.kind} version {record.version} (sha256 {record.sha256[:12]})"
        try:
            active = self._build(record)
        except Exception as exc:  # loaders are arbitrary code; whatever they raise is a refusal
            return self._refuse(label, what, f"{type(exc).__name__}: {exc}")
        # One assignment of a fresh mapping: readers see the old state or the new one, never a mix.
        self._active = MappingProxyType({**self._active, record.kind: active})
        self.accepted_total[record.kind] += 1
        log.info("activated %s", what)
        self._notify_change(active)
        return True

    def _build(self, record: ControlRecord) -> Active:
        loader = self.loaders.get(record.kind)
        if loader is None:
            raise ControlError(f"no loader for artifact kind {record.kind!r} (configured: {sorted(self.loaders)})")
        active = self.current(record.kind)
        if _is_stale(record, active and active.version):
            raise ControlError(f"stale publish: version {active.version} is active and only a rollback may go lower")
        artifact = self._fetch(record)
        if artifact.kind != record.kind:
            raise ControlError(f"the record is for kind {record.kind!r}, the artifact is a {artifact.kind!r}")
        if artifact.sha256 != record.sha256:
            raise ControlError(
                f"the record names sha256 {record.sha256[:12]}, the artifact's payload is {artifact.sha256[:12]}"
            )
        if artifact.version != record.version:
            # The store keeps one file per payload, so a re-published payload may carry an older
            # number in its manifest; the control record is what numbers versions.
            artifact = artifacts.with_version(artifact, record.version)
        module = loader(artifact)
        return Active(record.kind, record.version, record.sha256, artifact, module)

    def _fetch(self, record: ControlRecord) -> Artifact:
        if record.blob_b64 is not None:
            try:
                blob = base64.b64decode(record.blob_b64, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ControlError(f"inline blob is not valid base64: {exc}") from None
            return artifacts.decode(blob, kind=record.kind)
        if self.store is None:
            raise ControlError(f"the artifact travels by path ({record.path}) but this worker has no artifact store")
        # Looked up by hash in this worker's own store, not at the record's path: stores may be
        # mounted at different places, and a message must not make a worker open arbitrary files.
        return self.store.get(record.sha256)

    def _refuse(self, label: str, what: str, reason: str) -> bool:
        self.refused_total[label] += 1
        active = self.current(label)
        keeps = f"; still serving version {active.version}" if active else ""
        log.warning("refused %s: %s%s", what, reason, keeps)
        if self.on_refuse is not None:
            _call_safely(self.on_refuse, label, reason)
        return False

    def _notify_change(self, active: Active) -> None:
        if self.on_change is not None:
            _call_safely(self.on_change, active)


def _call_safely(callback: Callable, *args) -> None:
    # A metrics hook that fails must not undo a swap or stop the follower.
    try:
        callback(*args)
    except Exception:
        log.exception("artifact registry callback %r failed", callback)


# --------------------------------------------------------------------------- following the topic


def _message_limit(inline_limit: int) -> int:
    return max(_MIN_MESSAGE_BYTES, 4 * inline_limit // 3 + _MESSAGE_OVERHEAD)


def _control_consumer(bootstrap: str, max_fetch_bytes: int = _MIN_MESSAGE_BYTES * 16) -> AIOKafkaConsumer:
    # No group: every reader gets every record (a group would split them) and commits nothing.
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=max_fetch_bytes,
        fetch_max_bytes=max_fetch_bytes,
    )


async def _open_at_beginning(consumer: AIOKafkaConsumer, topic: str) -> tuple[TopicPartition, int]:
    """Assign the control partition, rewind it, and return it with its current end offset."""
    partition = TopicPartition(topic, 0)
    consumer.assign([partition])
    await consumer.seek_to_beginning(partition)
    end = (await consumer.end_offsets([partition]))[partition]
    return partition, end


async def follow_control(
    registry: ArtifactRegistry,
    bootstrap: str,
    topic: str,
    ready: asyncio.Event | None = None,
    poll_ms: int = 100,
) -> None:
    """Apply every control record, from the beginning, for ever; set ``ready`` once caught up.

    "Caught up" means past the end offset the topic had when following started, so a worker does
    not process data before it knows the latest published artifacts. Records are applied in a
    thread (decoding and building a large module must not stall the event loop); cancellation
    stops the consumer and re-raises ``CancelledError``. The topic must exist.
    """
    consumer = _control_consumer(bootstrap)
    await consumer.start()
    try:
        partition, end = await _open_at_beginning(consumer, topic)
        log.info("following %s from the beginning (%d records to replay)", topic, end)
        caught_up = False
        while True:
            if not caught_up and await consumer.position(partition) >= end:
                caught_up = True
                log.info("caught up with %s at offset %d", topic, end)
                if ready is not None:
                    ready.set()
            batch = await consumer.getmany(partition, timeout_ms=poll_ms)
            for message in batch.get(partition, []):
                await asyncio.to_thread(registry.apply, message.value)
    finally:
        await consumer.stop()


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
        return self.topics.control

    # ------------------------------------------------------------------ async API

    async def history(self) -> list[ControlRecord]:
        """Every readable record on the control topic, in log order, up to its current end."""
        await self._ensure_topic()
        consumer = _control_consumer(self.bootstrap, _message_limit(self.inline_limit) * 16)
        await consumer.start()
        try:
            messages = await self._read_to_end(consumer)
        finally:
            await consumer.stop()
        return _parse_history(messages)

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
        return asyncio.run(self.history())

    def publish_sync(self, artifact: Artifact) -> ControlRecord:
        return asyncio.run(self.publish(artifact))

    def rollback_sync(self, kind: str) -> ControlRecord:
        return asyncio.run(self.rollback(kind))

    def listing_sync(self) -> list[dict]:
        return asyncio.run(self.listing())

    # ------------------------------------------------------------------ plumbing

    async def _ensure_topic(self) -> None:
        # Only when the control topic is missing: an existing pipeline whose data topics differ
        # from this TopicConfig must still be able to list and publish.
        if self._topic_checked:
            return
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=int(self.timeout * 1000))
        await admin.start()
        try:
            exists = self.topic in await admin.list_topics()
        finally:
            await admin.close()
        if not exists:
            await ensure_topics_async(self.bootstrap, self.topics, self.timeout)
        self._topic_checked = True

    async def _read_to_end(self, consumer: AIOKafkaConsumer) -> list:
        partition, end = await _open_at_beginning(consumer, self.topic)
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
            acks="all",
            max_request_size=_message_limit(self.inline_limit),
            request_timeout_ms=int(self.timeout * 1000),
        )
        await producer.start()
        try:
            await producer.send_and_wait(self.topic, value, key=record.kind.encode("utf-8"), partition=0)
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
        if _is_stale(record, versions[-1] if versions else None):
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
