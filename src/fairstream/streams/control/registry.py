"""The worker's artifact registry: control records verified, loaded as modules, and swapped atomically.

Every worker runs :func:`follow_control`, which replays the control topic from the beginning
without a consumer group and feeds each record to its :class:`ArtifactRegistry`. The registry
verifies the artifact, builds the module with the kind's loader (which also checks the module
against the pipeline, see :mod:`fairstream.repair.protocol`) and swaps it in with a single
assignment; anything wrong is refused, counted and logged while the previous version keeps serving.

Version rule, shared by the client and every registry (:class:`~fairstream.streams.control.records.VersionLedger`):
a ``publish`` must take the next version of its kind, one above the highest before it in the log (a
later record claiming a taken version is a collision, one far above a gap; both refused and
counted); a ``rollback`` may go lower but only to a version that served (never to a candidate that
was not promoted or approved), and must name that version's sha256; a decision names the kind's
pending candidate. Because the topic has one partition, every worker sees the same order and
reaches the same state.

Messages are read by key and value together (:func:`~fairstream.streams.control.records.read_message`),
and none can stop the follower: garbage, deep nesting, a record under a key that is not its own,
even a bug in this code on one record, is a refusal (logged, counted), and the follower goes on.

Announcements: the worker's follower (``follow_control(..., worker=...)``) announces on the control
topic what the worker serves (kind, version, sha256 per kind it applies) once it has caught up,
after every swap, every few minutes, and when it stops; ``fairstream artifacts list`` shows them
beside each version.

Start-up rule: a new worker replays every record that survived compaction, in order; a record it
refuses (garbage, a tampered artifact, a version collision) or skips (a tombstone) changes
nothing, so it serves the newest version that survived. With per-record keys
(:func:`~fairstream.streams.control.records.control_key`) one hostile record can shadow at most one
version, never the history of a kind, and the versions after it still take effect: a publish may
skip one version per message since the highest claim of its kind, and compaction keeps offsets.

Candidates: a candidate publish the ledger admits is built like any version (loaded, checked
against the pipeline) and kept beside the active artifacts (:meth:`ArtifactRegistry.served`: one
immutable :class:`Served` holds both, so a reader never sees a mix) while it waits for a decision;
``promote``/``approve`` make the built candidate active (``on_change``), ``reject``/``retire`` or a
newer version (a candidate or one published to serve) drop it; ``on_candidate(kind, candidate or
None)`` reports each arrival and departure. A worker restarted mid-shadow replays the same records and ends with the same candidate.
While it shadows a candidate the announcer also names it (``shadowing``) and, at most every
:data:`SHADOW_ANNOUNCE_EVERY` seconds when they changed, the live figures of the comparison
(``shadow``).

A pipeline config that disagrees with the artifact (a feature renamed in one of them) is refused
at load, at start as at a swap, and logged as an error naming both sides; :meth:`ArtifactRegistry.explain_missing`
says why a kind has nothing to serve, for the worker's hold-input message.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import logging
import os
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from fairstream.models.kinds import MODULE_KINDS, load_module
from fairstream.repair import artifacts
from fairstream.repair.artifacts import Artifact
from fairstream.repair.protocol import IncompatibleArtifact, PipelineSchema
from fairstream.streams.kafka import aiokafka_options
from fairstream.streams.schemas import ControlRecord

from .gate import Authority
from .records import (
    ACTIVATING,
    CONFIGURE,
    DECISIONS,
    IMPLIED_KEY,
    NOTICES,
    REFUSED,
    SERVING,
    STOPPED,
    ControlError,
    ControlMessage,
    VersionLedger,
    WorkerStatus,
    encode_announcement,
    read_message,
    shadow_figures,
    shown,
)
from .store import ArtifactStore

log = logging.getLogger(__name__)
UNKNOWN_KIND = "_unknown"
"""Counter label for records that name no configured kind or cannot be parsed; it cannot clash
with a real kind (those start with a letter), and keeps the label set bounded."""
# Kafka clients default to 1 MiB per request/fetch; an inline blob near the limit plus base64 and
# JSON overhead must still fit, so the limits follow inline_limit.
_MIN_MESSAGE_BYTES = 1024 * 1024
_MESSAGE_OVERHEAD = 64 * 1024

# --------------------------------------------------------------------------- the worker's registry


@dataclass(frozen=True)
class Active:
    """The artifact a worker serves for one kind, and the runtime module built from it."""

    kind: str
    version: int
    sha256: str
    artifact: Artifact
    module: object


@dataclass(frozen=True)
class Served:
    """What a worker serves (``active``, per kind) and what it shadows (``candidates``: each kind's built pending
    candidate), read together: one immutable value, replaced by one assignment."""

    active: Mapping[str, Active]
    candidates: Mapping[str, Active]


_NOTHING_SERVED = Served(MappingProxyType({}), MappingProxyType({}))


def module_loaders(schema: PipelineSchema) -> dict[str, Callable[[Artifact], object]]:
    """A loader per known artifact kind that builds the module and checks it against ``schema`` (at load time)."""
    return {kind: functools.partial(load_module, schema=schema) for kind in MODULE_KINDS}


class ArtifactRegistry:
    """The artifact versions one worker serves, swapped atomically as control records arrive.

    ``loaders`` maps each kind to a function building the runtime module from an artifact (e.g.
    ``DistributionalRepair.from_artifact``); records of other kinds are refused. ``store`` resolves
    records that travel by path; ``on_change(active)`` runs after each swap (a promoted or approved
    candidate included), ``on_candidate(kind, candidate)`` after a built candidate arrives (an
    ``Active``) or leaves (None: promoted, rejected, retired or superseded), and
    ``on_refuse(kind, reason, category)`` after each refusal (for metrics; ``kind`` is :data:`UNKNOWN_KIND`
    when the record names no configured kind, ``category`` one of :data:`~.gate.CATEGORIES`), and
    ``on_config(record)`` after a ``configure`` record publishes a version of the pipeline's config.
    ``authority`` is the pipeline's (:class:`~.gate.Authority`): every record passes its gate (signer,
    role, promotion policy, place in the trail) before the version rule.

    Parameters
    ----------
    loaders : mapping of str to callable
        Per artifact kind, a function ``Artifact -> module`` (see ``module_loaders``).
    store : ArtifactStore or None, default=None
        The content-addressed store that resolves records travelling by path; None accepts inline
        artifacts only.
    on_change : callable or None, default=None
        ``on_change(active)``, called after each swap.
    on_refuse : callable or None, default=None
        ``on_refuse(kind, reason, category)``, called after each refused record.
    on_candidate : callable or None, default=None
        ``on_candidate(kind, candidate)``, called when a built candidate arrives or leaves (None).
    authority : Authority or None, default=None
        The pipeline's trust and promotion policy; None reads unsigned records under no policy.
    on_config : callable or None, default=None
        ``on_config(record)``, called when a version of the pipeline's config is published.
    """

    def __init__(
        self,
        loaders: Mapping[str, Callable[[Artifact], object]],
        store: ArtifactStore | None = None,
        on_change: Callable[[Active], None] | None = None,
        on_refuse: Callable[[str, str], None] | None = None,
        on_candidate: Callable[[str, Active | None], None] | None = None,
        authority: Authority | None = None,
        on_config: Callable[[ControlRecord], None] | None = None,
    ):
        self.loaders = dict(loaders)
        self.store = store
        self.on_change = on_change
        self.on_refuse = on_refuse
        self.on_candidate = on_candidate
        self.accepted_total: Counter[str] = Counter()
        self.refused_total: Counter[str] = Counter()
        self.ledger = VersionLedger()
        self.gate = (authority or Authority()).gate()
        self.on_config = on_config
        self.config_record: ControlRecord | None = None  # the pipeline's active config, once one is published
        self._served = _NOTHING_SERVED
        self._refusals: dict[str, str] = {}  # kind -> its last refusal, for explain_missing
        self._next_offset = 0  # the offset a message given without one is taken to have

    def current(self, kind: str) -> Active | None:
        """What ``kind`` is served with now, or None before its first accepted record.

        Parameters
        ----------
        kind : str
            An artifact kind.

        Returns
        -------
        Active or None
            The serving artifact and its built module.
        """
        return self._served.active.get(kind)

    def candidate(self, kind: str) -> Active | None:
        """The built pending candidate of ``kind``, or None.

        Parameters
        ----------
        kind : str
            An artifact kind.

        Returns
        -------
        Active or None
            The pending candidate and its built module.
        """
        return self._served.candidates.get(kind)

    def snapshot(self) -> Mapping[str, Active]:
        """Every kind's active artifact, as one consistent read-only mapping.

        Returns
        -------
        mapping of str to Active
            The active artifact of every kind that has one.
        """
        return self._served.active

    def served(self) -> Served:
        """The active artifacts and the built pending candidates, from one consistent state.

        Returns
        -------
        Served
            The active artifacts and pending candidates, read together.
        """
        return self._served

    def explain_missing(self, kind: str) -> tuple[int, str]:
        """(log level, message) saying why ``kind`` has no active artifact: a first candidate awaiting approval,
        its last refusal, or none published."""
        waiting = self.candidate(kind)
        if waiting is not None:  # under promotion "approve" even the first version serves only once approved
            return logging.WARNING, (f"no {kind} serves yet: candidate version {waiting.version} awaits approval "
                                     f"(fairstream artifacts approve {kind} {waiting.version} --by NAME --reason TEXT)")
        refusal = self._refusals.get(kind)
        if refusal is None:
            return logging.WARNING, f"no {kind} artifact loaded yet: holding input until one is published"
        return logging.ERROR, (f"no usable {kind} artifact: the last one was refused ({refusal}); holding input "
                               "(nothing is dead-lettered) until a compatible one is published or the config is fixed")

    def apply(self, value: bytes | None, key=IMPLIED_KEY, offset: int | None = None) -> bool:
        """Verify and activate one control message; False (logged, counted) if it is refused.

        ``key`` and ``offset`` are the message's on the topic (the follower passes both); a value the
        caller encoded itself may come without them (taken under the key it implies, at the offset
        after the previous message). Notices on the control topic (events, worker announcements,
        tombstones) are not artifacts: skipped, not refused. A record the version rule refuses (a
        collision, a gap, a rollback to a version never published) is refused before its artifact is
        even fetched. Nothing a message holds can raise out of here.

        Parameters
        ----------
        value : bytes or None
            The control message's value; None is a tombstone.
        key : bytes or str, optional
            The message's key; by default the key its value implies.
        offset : int or None, default=None
            The message's offset in the control topic; None takes the next one.

        Returns
        -------
        bool
            Whether the message was accepted.
        """
        offset = self._next_offset if offset is None else offset
        self._next_offset = offset + 1
        try:
            return self._apply(read_message(key, value), value, offset)
        except Exception as exc:  # a bug on one message must not stop the follower (and with it every swap)
            log.exception("unexpected error on the control message at offset %d", offset)
            return self._refuse(UNKNOWN_KIND, f"the control message at offset {offset}",
                                f"{type(exc).__name__}: {shown(str(exc))}", category="unreadable")

    def _apply(self, message: ControlMessage, value: bytes | None, offset: int) -> bool:
        if message.what in NOTICES:
            return False
        if message.what == REFUSED:  # unreadable, or under a key that is not its own: it names no kind we trust
            what = _what(message.record) if message.record else f"the control message at offset {offset}"
            return self._refuse(UNKNOWN_KIND, what, message.refusal, category="unreadable")
        record = message.record
        label = record.kind if record.kind in self.loaders else UNKNOWN_KIND
        what = _what(record)
        verdict = self.gate.admit(record, value, offset, self.ledger)  # before loading: it depends on the log alone
        if verdict.refusal is not None:
            signer = f" (signed {verdict.signer!r})" if verdict.signer else ""
            return self._refuse(label, f"{what}{signer}", verdict.refusal, category=verdict.category)
        if verdict.remark is not None:
            log.warning("%s (signed %r) takes effect, but the trail is broken before it: %s", what, verdict.signer,
                        verdict.remark)
        if record.action == CONFIGURE:
            return self._configure(record)
        if record.action in DECISIONS:
            return self._decide(record, label, what)
        if record.action == "publish":  # the ledger superseded any pending candidate, whether or not this loads
            self._drop_candidate(record.kind)
        try:
            built = build_active(record, self.loaders, self.store)
        except Exception as exc:  # loaders are arbitrary code; whatever they raise is a refusal
            reason, level = load_refusal(exc)
            return self._refuse(label, what, reason, level, category="load")
        if record.candidate:
            self._set(candidates={**self._served.candidates, record.kind: built})
            log.info("shadowing %s as the pending candidate", what)
            self._notify(self.on_candidate, record.kind, built)
        else:
            self._activate(built, what)
        self.accepted_total[record.kind] += 1
        return True

    def _decide(self, record: ControlRecord, label: str, what: str) -> bool:
        """A decision the ledger admitted: the built candidate serves (promote, approve) or leaves."""
        built = self.candidate(record.kind)
        if built is None or (built.version, built.sha256) != (record.version, record.sha256):
            if record.action in ACTIVATING:
                return self._refuse(label, what, f"candidate {record.kind} version {record.version} was never built "
                                                 "here (its load was refused)", category="load")
        elif record.action in ACTIVATING:
            self._activate(built, what, candidates=_without(self._served.candidates, record.kind))
            self._notify(self.on_candidate, record.kind, None)
        else:
            self._drop_candidate(record.kind)
        log.info("%s (%s)", what, shown(record.reason) if record.reason else "no reason given")
        self.accepted_total[record.kind] += 1
        return True

    def _activate(self, active: Active, what: str, candidates: Mapping[str, Active] | None = None) -> None:
        self._set(active={**self._served.active, active.kind: active}, candidates=candidates)
        log.info("activated %s", what)
        self._notify(self.on_change, active)

    def _drop_candidate(self, kind: str) -> None:
        if kind in self._served.candidates:
            self._set(candidates=_without(self._served.candidates, kind))
            self._notify(self.on_candidate, kind, None)

    def _set(self, active: Mapping[str, Active] | None = None, candidates: Mapping[str, Active] | None = None) -> None:
        # One assignment of a fresh immutable state: readers see the old state or the new one, never a mix.
        self._served = Served(self._served.active if active is None else MappingProxyType(dict(active)),
                              self._served.candidates if candidates is None else MappingProxyType(dict(candidates)))

    def _configure(self, record: ControlRecord) -> bool:
        """A version of the pipeline's config took effect: the worker compares its own with it (``on_config``)."""
        self.config_record = record
        log.info("the pipeline's config is now version %d (fingerprint %s, by %s)", record.version,
                 record.sha256[:12], record.actor or "someone unnamed")
        self._notify(self.on_config, record)
        return True

    def _refuse(self, label: str, what: str, reason: str, level: int = logging.WARNING,
                category: str = "version") -> bool:
        self.refused_total[label] += 1
        if label != UNKNOWN_KIND:
            self._refusals[label] = f"{what}: {reason}"
        active = self.current(label)
        keeps = f"; still serving version {active.version}" if active else ""
        # Formatted here, not by the logger: a worker holds back repeats of one message template for a few seconds
        # (health.RepeatedLogFilter), and each refused record is its own event (two forged records, two lines).
        log.log(level, f"refused {what}: {reason}{keeps}")
        if self.on_refuse is not None:
            _call_safely(self.on_refuse, label, reason, category)
        return False

    @staticmethod
    def _notify(callback: Callable | None, *args) -> None:
        if callback is not None:
            _call_safely(callback, *args)


def _without(mapping: Mapping[str, Active], kind: str) -> dict[str, Active]:
    return {name: value for name, value in mapping.items() if name != kind}


def build_active(record: ControlRecord, loaders: Mapping[str, Callable[[Artifact], object]],
                 store: ArtifactStore | None) -> Active:
    """The module ``record`` names, fetched, verified and built as every worker builds it; raises why it cannot be.

    Shared by the registry (what a worker activates) and the client's listing (what it marks active).
    """
    loader = loaders.get(record.kind)
    if loader is None:
        raise ControlError(f"no loader for artifact kind {record.kind!r} (configured: {sorted(loaders)})")
    artifact = fetch_artifact(record, store)
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


def fetch_artifact(record: ControlRecord, store: ArtifactStore | None) -> Artifact:
    """The artifact of ``record``: its inline blob, else the store's file of its sha256 (size and hash checked)."""
    if record.blob_b64 is not None:
        try:
            blob = base64.b64decode(record.blob_b64, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ControlError(f"inline blob is not valid base64: {exc}") from None
        return artifacts.decode(blob, kind=record.kind)
    if store is None:
        raise ControlError(f"the artifact travels by path ({shown(record.path)}) but this worker has no artifact "
                           "store")
    # Looked up by hash in this reader's own store, not at the record's path: stores may be
    # mounted at different places, and a message must not make a worker open arbitrary files.
    return store.get(record.sha256)


def load_refusal(exc: Exception) -> tuple[str, int]:
    """(reason, log level) of a record whose module :func:`build_active` could not build."""
    if isinstance(exc, IncompatibleArtifact):  # a valid artifact that does not fit this pipeline's config
        return f"the pipeline config and the artifact disagree: {exc}", logging.ERROR
    return f"{type(exc).__name__}: {exc}", logging.WARNING


def _what(record: ControlRecord) -> str:
    return f"{record.action} of {record.kind} version {record.version} (sha256 {record.sha256[:12]})"


def _call_safely(callback: Callable, *args) -> None:
    # A metrics hook that fails must not undo a swap or stop the follower.
    try:
        callback(*args)
    except Exception:
        log.exception("artifact registry callback %r failed", callback)


# --------------------------------------------------------------------------- following the topic


def message_limit(inline_limit: int) -> int:
    """The Kafka request/fetch size that carries an inline artifact of ``inline_limit`` bytes."""
    return max(_MIN_MESSAGE_BYTES, 4 * inline_limit // 3 + _MESSAGE_OVERHEAD)


def control_consumer(bootstrap: str, max_fetch_bytes: int = _MIN_MESSAGE_BYTES * 16) -> AIOKafkaConsumer:
    # No group: every reader gets every record (a group would split them) and commits nothing.
    """A group-less consumer of the control topic (every reader sees every record)."""
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        **aiokafka_options(),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=max_fetch_bytes,
        fetch_max_bytes=max_fetch_bytes,
    )


async def open_at_beginning(consumer: AIOKafkaConsumer, topic: str) -> tuple[TopicPartition, int]:
    """Assign the control partition, rewind it, and return it with its current end offset."""
    partition = TopicPartition(topic, 0)
    consumer.assign([partition])
    await consumer.seek_to_beginning(partition)
    end = (await consumer.end_offsets([partition]))[partition]
    return partition, end


ANNOUNCE_EVERY = 300.0
"""Seconds between two announcements of a worker whose versions did not change (a heartbeat)."""
SHADOW_ANNOUNCE_EVERY = 5.0
"""While a candidate is shadowed: the most often its live figures are announced (when they changed)."""
_ANNOUNCE_TIMEOUT = 10.0
_ANNOUNCE_RETRY = 15.0


@dataclass(frozen=True)
class WorkerIdentity:
    """Who a worker is on the control topic: ``<app id>@<host>:<pid>``, and the kinds it applies."""

    app_id: str
    kinds: tuple[str, ...]
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)

    @classmethod
    def of(cls, app_id: str, config) -> "WorkerIdentity":
        """A worker of ``config``'s pipeline: it applies the record chain, and the embedding module if configured."""
        return cls(app_id, (*config.records.chain, *config.embeddings.chain))

    @property
    def name(self) -> str:
        """``<app id>@<host>:<pid>``: one running worker process."""
        return f"{self.app_id}@{self.host}:{self.pid}"


class Announcer:
    """Announces what one worker serves on the control topic: when it changes, every ``every`` seconds, at stop.

    While a candidate is shadowed, its live figures (``shadow_figures()``, None without a candidate)
    are announced too, when they changed and at most every ``shadow_every`` seconds. A failed
    announcement is logged and retried later; it never stops the follower (serving matters more
    than being listed).
    """

    def __init__(self, worker: WorkerIdentity, bootstrap: str, topic: str, every: float = ANNOUNCE_EVERY,
                 shadow_figures: Callable[[], dict | None] | None = None,
                 shadow_every: float = SHADOW_ANNOUNCE_EVERY):
        self.worker, self.bootstrap, self.topic, self.every = worker, bootstrap, topic, every
        self.shadow_figures, self.shadow_every = shadow_figures, shadow_every
        self._producer: AIOKafkaProducer | None = None
        self._announced: tuple | None = None  # (serving, shadowing) of the last delivered announcement
        self._figures: dict | None = None  # the figures of the last delivered announcement
        self._due = 0.0  # monotonic time of the next heartbeat (or retry)
        self._figures_due = 0.0  # monotonic time from which changed figures may be announced
        self.clock = time.monotonic  # seconds, for the heartbeat and the figures' pace (a test sets its own)

    def status(self, served: Served, state: str = SERVING, figures: bool = True) -> WorkerStatus:
        """The worker's status now, from one registry state (with the live shadow figures unless not ``figures``)."""
        serving, shadowing = ((tuple((kind, of[kind].version, of[kind].sha256) for kind in self.worker.kinds
                                     if kind in of)) for of in (served.active, served.candidates))
        live = self._live_figures() if figures and shadowing and state == SERVING else None
        return WorkerStatus(self.worker.name, self.worker.app_id, self.worker.host, self.worker.pid, time.time(),
                            self.every, self.worker.kinds, serving, state, shadowing, live)

    async def update(self, served: Served) -> None:
        """Announce if what the worker serves or shadows changed, its shadow figures are due, or a heartbeat is."""
        now = self.clock()
        status = self.status(served, figures=False)
        changed = (status.serving, status.shadowing) != self._announced
        if not (changed or now >= self._figures_due or now >= self._due):
            return  # nothing can be due: the figures are not even read (the follower polls every 100 ms)
        status = self.status(served)
        figures_due = status.shadow != self._figures and now >= self._figures_due
        if changed or figures_due or now >= self._due:
            if await self._send(status):
                self._announced, self._figures = (status.serving, status.shadowing), status.shadow
                self._due, self._figures_due = now + self.every, now + self.shadow_every
            else:
                self._due = now + _ANNOUNCE_RETRY

    async def close(self, served: Served) -> None:
        """Announce that the worker stopped (if it ever announced), then close the producer."""
        if self._announced is not None:
            await self._send(self.status(served, STOPPED))
        if self._producer is not None:
            try:
                await asyncio.wait_for(self._producer.stop(), _ANNOUNCE_TIMEOUT)
            except (KafkaError, asyncio.TimeoutError, OSError) as exc:
                log.warning("could not close the announcement producer cleanly: %s", exc)

    def _live_figures(self) -> dict[str, float] | None:
        if self.shadow_figures is None:
            return None
        try:
            return shadow_figures(self.shadow_figures())
        except Exception:  # the comparison is the worker's; its failure must not stop the announcements
            log.exception("could not read the shadow figures to announce")
            return None

    async def _send(self, status: WorkerStatus) -> bool:
        key, value = encode_announcement(status)
        try:
            producer = await self._started_producer()
            await asyncio.wait_for(producer.send_and_wait(self.topic, value, key=key, partition=0), _ANNOUNCE_TIMEOUT)
        except (KafkaError, asyncio.TimeoutError, OSError) as exc:
            # A timeout's str() is empty: name the exception, so the line always says why.
            log.warning("could not announce what %s serves on %s (retrying in %.0fs): %s", self.worker.name,
                        self.topic, _ANNOUNCE_RETRY, str(exc) or type(exc).__name__)
            return False
        log.info("announced on %s: %s %s", self.topic, self.worker.name, _describe(status))
        return True

    async def _started_producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, **aiokafka_options(), acks="all",
                                        request_timeout_ms=int(_ANNOUNCE_TIMEOUT * 1000))
            try:
                await asyncio.wait_for(producer.start(), _ANNOUNCE_TIMEOUT)
            except BaseException:
                await producer.stop()  # a half-started client holds connections
                raise
            self._producer = producer
        return self._producer


def _describe(status: WorkerStatus) -> str:
    if status.state == STOPPED:
        return "stopped"
    shadows = "".join(f", shadows candidate {kind} v{version}" for kind, version, _ in status.shadowing)
    serving = ", ".join(f"{kind} v{version}" for kind, version, _ in status.serving) or (
        "nothing yet" if status.kinds else "no module (monitors the records as they come)")
    return f"serves {serving}{shadows}"


class ControlLogRewritten(RuntimeError):
    """The control topic's log is no longer the one the follower replayed (re-created or truncated).

    The registry's state (version ledger, active artifacts) belongs to the old log, so it cannot
    go on; the worker must exit and a restarted one replays the new log from the beginning.
    """


class LogContinuity:
    """Notices that the control partition's log was re-created or truncated under its follower.

    The signs, from the follower's fetches: the high watermark below the follower's position, or
    lower than one seen before; or a record below the position (the client reset its position
    after an out-of-range fetch). A broker with memory-only storage restarted, or an operator who
    deleted and re-created the topic, shows them; a fetch above the end of the new log is not an
    error on every broker, so without this check the follower would wait for ever at its old
    position while the new log's records pile up below it.
    """

    def __init__(self, topic: str, position: int):
        self.topic, self.position, self.highwater = topic, position, 0

    def check(self, messages, highwater: int | None) -> None:
        """Raise :class:`ControlLogRewritten` if the fetched ``messages`` or ``highwater`` belong to a new log."""
        if messages and messages[0].offset < self.position:
            self._fail(f"it returned offset {messages[0].offset}", highwater)
        if highwater is not None and (highwater < self.position or highwater < self.highwater):
            self._fail(f"its high watermark is {highwater}", highwater)

    def advance(self, position: int, highwater: int | None) -> None:
        """Record the follower's position and the high watermark after a batch was applied."""
        if position < self.position:  # the client rewound without being asked to: a reset after out-of-range
            self._fail(f"the client moved back to offset {position}", highwater)
        self.position = position
        self.highwater = max(self.highwater, highwater or 0)

    def _fail(self, sign: str, highwater: int | None) -> None:
        log.critical("the control topic %s was re-created or truncated: the follower was at offset %d (high "
                     "watermark %d) and %s (new high watermark %s); its state belongs to the old log, so the "
                     "worker stops (restarted, it replays the new log from the beginning)",
                     self.topic, self.position, self.highwater, sign, highwater)
        raise ControlLogRewritten(f"the control topic {self.topic} was re-created or truncated: the follower was "
                                  f"at offset {self.position}, {sign} (new high watermark {highwater})")


async def follow_control(
    registry: ArtifactRegistry,
    bootstrap: str,
    topic: str,
    ready: asyncio.Event | None = None,
    poll_ms: int = 100,
    worker: WorkerIdentity | None = None,
    announce_every: float = ANNOUNCE_EVERY,
    shadow_figures: Callable[[], dict | None] | None = None,
) -> None:
    """Apply every control record, from the beginning, for ever; set ``ready`` once caught up.

    "Caught up" means past the high watermark of the first fetches, so a worker does not process
    data before it knows the latest published artifacts. (The fetch's high watermark, not the
    ListOffsets end offset, which the embedded broker under-reports: a worker restarted after a
    publish would otherwise start serving the previous version.) Records are applied in a thread
    (decoding and building a large module must not stall the event loop); cancellation stops the
    consumer and re-raises ``CancelledError``. The topic must exist. A log that was re-created or
    truncated under the follower raises :class:`ControlLogRewritten` (see :class:`LogContinuity`).

    With ``worker``, what the worker serves is announced on the topic once caught up, after each
    swap, every ``announce_every`` seconds and when the follower stops (see :class:`Announcer`); while a
    candidate is shadowed, ``shadow_figures()`` (the live comparison's figures, None without one) at
    most every :data:`SHADOW_ANNOUNCE_EVERY` seconds when they changed.
    """
    consumer = control_consumer(bootstrap)
    announcer = None if worker is None else Announcer(worker, bootstrap, topic, announce_every, shadow_figures)
    await consumer.start()
    try:
        partition, end = await open_at_beginning(consumer, topic)
        log.info("following %s from the beginning (about %d records to replay)", topic, end)
        caught_up = False
        log_check = LogContinuity(topic, await consumer.position(partition))
        while True:
            batch = await consumer.getmany(partition, timeout_ms=poll_ms)
            highwater = consumer.highwater(partition)
            log_check.check(batch.get(partition, []), highwater)  # before applying: a new log's records are not ours
            for message in batch.get(partition, []):
                await asyncio.to_thread(registry.apply, message.value, message.key, message.offset)
            log_check.advance(await consumer.position(partition), highwater)
            if not caught_up and highwater is not None and await consumer.position(partition) >= max(end, highwater):
                caught_up = True
                log.info("caught up with %s at offset %d", topic, highwater)
                if ready is not None:
                    ready.set()
            if caught_up and announcer is not None:
                await announcer.update(registry.served())
    finally:
        try:
            if announcer is not None:
                await announcer.close(registry.served())
        finally:
            await consumer.stop()
