"""The publisher's client of the control topic: publish, decide on candidates, roll back and list artifact versions.

Every record is sent under its own :func:`~fairstream.streams.control.records.control_key`, so the
history survives compaction and rollback can always go back. Versions follow the one rule of
:class:`~fairstream.streams.control.records.VersionLedger`, which the workers' registries apply
too: :meth:`ControlClient.publish` proposes the highest version claimed so far plus one, writes,
reads the log back to its own record and, if an earlier record took that version (another
publisher at the same moment), withdraws its record and publishes again under the next version.

A candidate (``publish(..., candidate=True)``, or as :func:`publish_mode` decides from the pipeline's
``promotion`` and the log: :meth:`ControlClient.publish_under`) waits for a decision:
:meth:`ControlClient.decide` writes ``approve`` or ``reject`` (a person's) and ``promote`` or ``retire``
(a service's), then reads the log back to it (another decision may have come first); a new candidate
retires the pending one first, under the publisher's name. Anything the ledger would refuse is refused
here before it is written, in one line naming the kind and version.

The listing is what the workers do, not what the log says alone: a version whose artifact cannot
be loaded (missing store file, damaged blob, or, with the pipeline's schema, one that does not fit)
is marked refused, and the version active before it stays active, as the workers' registry decides
(:func:`~fairstream.streams.control.registry.build_active` is the registry's own check).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import functools
import getpass
import logging
import socket
import time
from dataclasses import dataclass, field

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from fairstream.models.kinds import load_module
from fairstream.repair import artifacts
from fairstream.repair.artifacts import Artifact
from fairstream.repair.protocol import IncompatibleArtifact, PipelineSchema
from fairstream.streams.kafka import aiokafka_options
from fairstream.streams.schemas import ControlRecord
from fairstream.streams.topics import TopicConfig, ensure_topics_async

from .records import (
    ACTIVATING,
    CONFIG_KIND,
    CONFIGURE,
    ANNOUNCED,
    CANDIDATE_FAILED,
    CANDIDATE_REFUSED,
    DECISIONS,
    EVENT,
    MAX_ACTOR,
    MAX_REASON,
    RECORD,
    ControlError,
    VersionLedger,
    WorkerStatus,
    audit_text_refusal,
    control_key,
    decision_record,
    encode_control,
    parse_statistics,
    read_message,
    shown,
)
from .gate import Authority, ControlGate, PublishMode, Verdict, publish_mode, seal
from .registry import build_active, control_consumer, load_refusal, message_limit, module_loaders, open_at_beginning
from .store import ArtifactStore

log = logging.getLogger(__name__)

DEFAULT_INLINE_LIMIT = 512 * 1024
"""Encoded artifacts up to this many bytes travel inside the control message (base64 adds 1/3)."""
PUBLISH_ATTEMPTS = 8
"""How many versions one publish tries before giving up (each loss means another publisher took one)."""


# --------------------------------------------------------------------------- who acts


@functools.lru_cache(maxsize=None)
def default_actor() -> str:
    """Who acts when no one is named: ``<user>@<host>`` of this process (computed once)."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name (a container without a passwd entry): still say where it came from
        user = "unknown"
    return f"{user}@{socket.gethostname()}"[:MAX_ACTOR]


def check_audit(actor: str | None, reason: str | None, names: tuple[str, str] = ("the actor", "the reason")) -> None:
    """Refuse an actor or a reason every reader would refuse (:class:`ControlError` saying which, by ``names``)."""
    for name, value, longest in zip(names, (actor, reason), (MAX_ACTOR, MAX_REASON)):
        refusal = None if value is None else audit_text_refusal(value, longest)
        if refusal is not None:
            raise ControlError(f"{name} {refusal}")


@dataclass(frozen=True)
class Published:
    """What a publish under the pipeline's promotion delivered (:meth:`ControlClient.publish_under`).

    Attributes
    ----------
    record : ControlRecord
        The delivered publish record (``record.candidate`` says whether it is a candidate).
    mode : PublishMode
        What :func:`publish_mode` decided, and why (for the caller to print).
    """

    record: ControlRecord
    mode: PublishMode


# --------------------------------------------------------------------------- the log as every reader resolves it


@dataclass(frozen=True)
class Entry:
    """One artifact record of the control topic, and why every reader ignores it (None: it takes effect).

    A record is ignored when the pipeline's gate refuses it (its signer, role, promotion policy or place in the
    trail: :mod:`~fairstream.streams.control.gate`), when the version rule refuses it, or when it came under a key
    that is not its own. ``signer`` is the verified signer (or, when refused, the one it claims), ``category`` the
    refusal's kind (:data:`~fairstream.streams.control.gate.CATEGORIES`), ``remark`` a break in the trail before an
    admitted record.
    """

    offset: int
    record: ControlRecord
    refusal: str | None
    signer: str | None = None
    category: str | None = None
    remark: str | None = None
    altered: bool = False

    @property
    def breaks_trail(self) -> bool:
        """Whether this record shows the trail was rewritten (:attr:`~.gate.Verdict.breaks_trail`)."""
        return Verdict(self.refusal, self.signer, self.category, self.remark, self.altered).breaks_trail


@dataclass
class ControlLog:
    """The control topic read in log order through one :class:`VersionLedger`, as a worker's registry reads it.

    ``entries`` are the artifact records (refused ones included, with the reason), ``workers`` the
    latest announcement of each worker, ``events`` the events de-duplicated by key, ``skipped`` the
    (offset, reason) of each message no reader takes; ``next_offset`` is the offset after the last
    message read. ``shadow`` keeps, per shadowed (kind, version), each worker's latest announcement
    that carried live figures for it (see :meth:`shadow_figures`).
    """

    ledger: VersionLedger = field(default_factory=VersionLedger)
    gate: ControlGate = field(default_factory=lambda: Authority().gate())
    entries: list[Entry] = field(default_factory=list)
    workers: dict[str, WorkerStatus] = field(default_factory=dict)
    events: dict[bytes, dict] = field(default_factory=dict)
    skipped: list[tuple[int, str]] = field(default_factory=list)
    next_offset: int = 0
    shadow: dict[tuple[str, int], dict[str, WorkerStatus]] = field(default_factory=dict)

    def add(self, message) -> None:
        """Read one message (in log order), by its key and value as a worker reads it; never raises.

        A message that is no record, announcement or event under its key is skipped (see
        :meth:`warn_skipped`); a record under a key that is not its own is kept as an entry every
        worker ignores.
        """
        self.next_offset = message.offset + 1
        read = read_message(message.key, message.value)
        if read.what == ANNOUNCED:
            self.workers[read.status.worker] = read.status
            self._keep_figures(read.status)
        elif read.what == EVENT:
            self.events.setdefault(message.key, read.event)
        elif read.what == RECORD:
            verdict = self.gate.admit(read.record, message.value, message.offset, self.ledger)
            self.entries.append(Entry(message.offset, read.record, verdict.refusal, verdict.signer, verdict.category,
                                      verdict.remark, verdict.altered))
        elif read.record is not None:  # refused: a record under another key (never a claim)
            self.entries.append(Entry(message.offset, read.record, read.refusal, read.record.signer,
                                      "unreadable"))
        elif read.refusal is not None:
            self.skipped.append((message.offset, read.refusal))

    def warn_skipped(self) -> None:
        """One warning for every message skipped (a topic full of garbage is one line, not one per message)."""
        if self.skipped:
            offsets = ", ".join(str(offset) for offset, _ in self.skipped[:5]) + (", ..." if len(self.skipped) > 5
                                                                                  else "")
            log.warning("skipped %d control message(s) that no reader takes (at offsets %s); the first: %s",
                        len(self.skipped), offsets, self.skipped[0][1])

    def trail(self) -> list[Entry]:
        """Every record of the audit trail in log order, refused ones included (with why and who they claim)."""
        return list(self.entries)

    def history(self) -> list[ControlRecord]:
        """The records that take effect, in log order."""
        return [entry.record for entry in self.entries if entry.refusal is None]

    def at(self, offset: int) -> Entry | None:
        """The artifact record at ``offset``, if one was read there."""
        return next((entry for entry in reversed(self.entries) if entry.offset == offset), None)

    def published(self, kind: str, version: int) -> ControlRecord | None:
        """The publish that claimed ``version`` of ``kind``, or None if none did."""
        return next((e.record for e in self.entries if e.refusal is None and e.record.action == "publish"
                     and (e.record.kind, e.record.version) == (kind, version)), None)

    def pending(self, kind: str) -> ControlRecord | None:
        """The publish of the pending candidate of ``kind`` (waiting for a decision), or None."""
        pending = self.ledger.pending(kind)
        return None if pending is None else self.published(kind, pending[0])

    def decisions(self, kind: str, version: int) -> list[Entry]:
        """Every decision naming ``version`` of ``kind``, in log order; refused ones too (with the reason)."""
        return [e for e in self.entries if e.record.action in DECISIONS and (e.record.kind, e.record.version) ==
                (kind, version)]

    def shadow_figures(self, kind: str, version: int) -> dict[str, WorkerStatus]:
        """Per worker, its latest announcement with live figures (``status.shadow``) of candidate ``version``.

        Announcements are keyed per worker, so on a compacted topic only each worker's latest survives:
        the figures of a candidate decided long ago may be gone (the decision's statistics keep them).
        """
        return dict(self.shadow.get((kind, version), {}))

    def _keep_figures(self, status: WorkerStatus) -> None:
        if status.shadow is None:
            return
        for kind, version, _ in status.shadowing:
            self.shadow.setdefault((kind, version), {})[status.worker] = status


# --------------------------------------------------------------------------- the publisher's client


class ControlClient:
    """Publish, roll back and list artifact versions on the control topic.

    Each ``async`` method has a ``*_sync`` twin for the CLI. The control topic is created (with the
    rest of the pipeline's topics) when it does not exist yet. ``schema`` is the pipeline's: with
    it, the listing and rollback check artifacts as the pipeline's workers do (they load and fit);
    without, only that they load. ``authority`` is the pipeline's (:class:`~.gate.Authority`: its trust
    and promotion policy): the client reads the log through the same gate as the workers, and refuses
    before writing what they would refuse. ``signer`` signs every record written (None: unsigned).
    """

    def __init__(
        self,
        bootstrap: str,
        topics: TopicConfig,
        store: ArtifactStore,
        inline_limit: int = DEFAULT_INLINE_LIMIT,
        timeout: float = 30.0,
        schema: PipelineSchema | None = None,
        authority: Authority | None = None,
        signer=None,
    ):
        if inline_limit < 0:
            raise ValueError(f"inline_limit must be >= 0 bytes, got {inline_limit}")
        self.bootstrap = bootstrap
        self.topics = topics
        self.store = store
        self.loaders = module_loaders(schema or PipelineSchema())  # the workers' loaders, checks included
        self.inline_limit = inline_limit
        self.timeout = timeout
        self.authority = authority or Authority(pipeline=topics.control)
        self.signer = signer
        self._topic_checked = False

    @classmethod
    def of(cls, config, bootstrap: str, signer=None, store: ArtifactStore | None = None,
           **options) -> "ControlClient":
        """The client of ``config``'s pipeline: its topics, store, schema and authority (trust file read now).

        Parameters
        ----------
        config : PipelineConfig
            The pipeline.
        bootstrap : str
            Kafka bootstrap servers.
        signer : Signer or None, default=None
            Who signs what this client writes.
        store : ArtifactStore or None, default=None
            The artifact store (default: the config's ``artifact_dir``).
        **options
            ``inline_limit``, ``timeout``.

        Returns
        -------
        ControlClient
            The pipeline's client.
        """
        return cls(bootstrap, config.topics, store or ArtifactStore(config.artifact_dir), schema=config.schema(),
                   authority=Authority.of(config), signer=signer, **options)

    def _log(self) -> "ControlLog":
        return ControlLog(gate=self.authority.gate())

    @property
    def topic(self) -> str:
        """The control topic's name."""
        return self.topics.control

    # ------------------------------------------------------------------ async API

    async def read(self) -> ControlLog:
        """The control topic from its beginning to its current end, resolved by the pipeline's gate and version rule."""
        control = self._log()
        async with self._reader() as reader:
            await reader.read_to_end(control)
        control.warn_skipped()
        return control

    async def history(self) -> list[ControlRecord]:
        """Every record that takes effect (collisions and other refusals left out), in log order."""
        return (await self.read()).history()

    async def events(self) -> list[dict]:
        """Every event on the control topic (e.g. re-embed notices), in log order, de-duplicated by key."""
        return list((await self.read()).events.values())

    async def workers(self) -> list[WorkerStatus]:
        """The latest announcement of every worker that announced on the control topic, in log order."""
        return list((await self.read()).workers.values())

    async def publish(self, artifact: Artifact, actor: str | None = None, reason: str | None = None,
                      statistics: dict[str, float] | None = None, candidate: bool = False) -> ControlRecord:
        """Publish ``artifact`` as the next version of its kind; returns the delivered record.

        The record carries the audit trail: ``actor`` (default :func:`default_actor`), ``reason`` and
        ``statistics`` (names to finite numbers: the figures that decided the publish).
        Compare-and-set through the log order: propose the next version, write, read back to the
        written record; if an earlier record took the version, withdraw ours (a tombstone under its
        key, so compaction removes it) and try the next one.

        With ``candidate``, the version does not serve: it waits, shadowed by the workers, for a
        decision (see :meth:`decide`); it supersedes a candidate of the kind still pending.
        :meth:`publish_under` lets the pipeline's ``promotion`` decide instead.
        """
        record, _ = await self._publish(artifact, _audit(actor, reason, statistics), candidate)
        return record

    async def publish_under(self, artifact: Artifact, promotion: str, actor: str | None = None,
                            reason: str | None = None, statistics: dict[str, float] | None = None) -> Published:
        """:meth:`publish` ``artifact``, a candidate or not as :func:`publish_mode` decides from ``promotion`` and the
        log (decided again on each attempt: another publisher may have changed the log); returns the delivered
        record and what was decided, and why."""
        return Published(*await self._publish(artifact, _audit(actor, reason, statistics), promotion=promotion))

    async def _publish(self, artifact: Artifact, audit: dict, candidate: bool = False,
                       promotion: str | None = None) -> tuple[ControlRecord, PublishMode | None]:
        """:meth:`publish`'s compare-and-set loop: the delivered record, and the mode ``promotion`` decided (None
        without one)."""
        modes = []

        def proposal(control: ControlLog) -> ControlRecord:
            wanted = candidate
            if promotion is not None:  # decided again on each attempt: another publisher may have changed the log
                modes.append(publish_mode(promotion, control.ledger, artifact.kind))
                wanted = modes[-1].candidate
            return self._publish_record(artifact, control.ledger.next_version(artifact.kind), audit, wanted)

        def twin(control: ControlLog, record: ControlRecord) -> ControlRecord | None:
            same = control.published(record.kind, record.version)  # a twin publish of this very artifact won
            return same if same is not None and same.sha256 == record.sha256 else None

        record = await self._write(proposal, f"refusing to publish {artifact.kind}", retry=("stale", "version"),
                                   twin=twin)
        log.info("published %s%s version %d (sha256 %s, %s)", "candidate " if record.candidate else "", record.kind,
                 record.version, record.sha256[:12], "inline" if record.blob_b64 else f"by path {record.path}")
        return record, (modes[-1] if modes else None)

    async def _write(self, proposal, refusing: str, retry: tuple[str, ...] = ("stale",), twin=None) -> ControlRecord:
        """Write ``proposal(log)`` after the trail's last record, signed, and read it back; the record that took effect.

        Compare-and-set through the log order: what every reader would refuse is refused here before it is written
        (:class:`ControlError` with the reason); a record every reader refuses once written, for a reason in ``retry``
        (another record came first: ``stale`` in the trail, a ``version`` taken), is withdrawn (a tombstone under its
        key) and proposed again on the log as it is now, at most :data:`PUBLISH_ATTEMPTS` times. ``twin(log,
        record)`` may name an identical record that won instead.
        """
        async with self._reader() as reader, self._producer() as producer:
            control = self._log()
            await reader.read_to_end(control)
            control.warn_skipped()
            for _ in range(PUBLISH_ATTEMPTS):
                record, key, value = seal(proposal(control), control.gate.head, self.authority.pipeline, self.signer)
                refusal = control.gate.copy().admit(record, value, control.next_offset, copy.deepcopy(control.ledger))
                if refusal.refusal is not None:
                    raise ControlError(f"{refusing}: {refusal.refusal}")
                offset = (await producer.send_and_wait(self.topic, value, key=key, partition=0)).offset
                try:
                    await reader.read_through(control, offset)
                except TimeoutError:
                    raise ControlError(f"the {record.action} of {record.kind} version {record.version} was written at "
                                       f"offset {offset} of {self.topic}, but it could not be read back to confirm it "
                                       "took effect: see `fairstream artifacts history`") from None
                mine = control.at(offset)
                if mine is not None and mine.refusal is None:
                    return record
                if record.action in ("publish", CONFIGURE):  # a claim that lost its version: compaction removes it
                    await producer.send_and_wait(self.topic, None, key=key, partition=0)
                # A decision or a rollback that lost stays in the trail, refused: who tried to decide is audited too.
                won = twin(control, record) if twin is not None else None
                if won is not None:
                    return won
                why = "it was not read back" if mine is None else mine.refusal
                if mine is None or mine.category not in retry:
                    raise ControlError(f"the {record.action} of {record.kind} version {record.version} did not take "
                                       f"effect (every reader ignores it): {why}")
                log.warning("the %s of %s version %d lost a race to another record (%s); writing it again",
                            record.action, record.kind, record.version, why)
        raise ControlError(f"could not write to {self.topic}: {PUBLISH_ATTEMPTS} attempts in a row lost the race to "
                           "other writers")

    async def decide(self, kind: str, version: int, action: str, actor: str | None = None, reason: str | None = None,
                     statistics: dict[str, float] | None = None, force: bool = False) -> ControlRecord:
        """Write a decision on the pending candidate ``version`` of ``kind``; returns the record, which takes effect.

        A promotion or approval of a candidate whose workers announced that its chain failed in shadow
        (:data:`~.records.CANDIDATE_FAILED`) is refused unless ``force``: once serving, it would fail on the live
        records it failed on in shadow.

        ``action``: ``approve`` or ``reject`` (a person), ``promote`` or ``retire`` (a service). Without
        ``statistics``, the record carries the live shadow figures the candidate's workers last announced
        (:func:`live_figures`): what the person saw when deciding.
        Whatever every reader would refuse (not the pending candidate, already decided) is refused
        here before anything is written, and so is promoting or approving a candidate no worker can
        load. Then, like :meth:`publish`, the log is read back to the written record: if another
        decision came first (two people at once, or a person and the shadow policy), every reader
        ignores this one, and :class:`ControlError` says so and who decided.
        """
        if action not in DECISIONS:
            raise ControlError(f"a decision is one of {', '.join(DECISIONS)}, got {action!r}")

        def proposal(control: ControlLog) -> ControlRecord:
            live = live_figures(control, kind, version)
            if action in ACTIVATING and not force and live and live.get(CANDIDATE_FAILED):
                raise ControlError(f"refusing to {action} {kind} version {version}: its chain failed in shadow on the "
                                   f"workers' live records (it refused {live.get(CANDIDATE_REFUSED, 0):.0f} of them); "
                                   "--force does it anyway")
            audit = _audit(actor, reason, statistics if statistics is not None else live)
            record = decision_record(kind, version, control.ledger.claimed(kind, version) or "0" * 64, action, **audit)
            cannot = self._load_refusal(control.published(kind, version)) if action in ACTIVATING else None
            if cannot is not None and control.ledger.pending(kind) == (version, record.sha256):
                raise ControlError(f"cannot {action} {kind} version {version}: every worker refuses its artifact: "
                                   f"{cannot}")
            return record

        record = await self._write(proposal, f"refusing to {action}")
        log.info("%s: %s version %d (sha256 %s)", action, kind, version, record.sha256[:12])
        return record

    async def rollback(self, kind: str, version: int | None = None, actor: str | None = None,
                       reason: str | None = None) -> ControlRecord:
        """Re-activate ``version`` of ``kind`` (default: the one active before the current one); returns the record.

        ``actor`` (default :func:`default_actor`) and ``reason`` go into the record (the audit trail).

        Only a version in the history can be named; anything the workers' version rule would
        refuse is refused here, before anything is written.
        """
        audit = _audit(actor, reason, None)
        chosen: list[int] = []  # the target, chosen on the first reading: a retry after a lost race keeps it

        def proposal(control: ControlLog) -> ControlRecord:
            stacks = _activation_stacks(control.history())
            if kind not in stacks:
                if control.ledger.next_version(kind) > 1:
                    raise ControlError(f"no {kind} version ever served on {self.topic} (only candidates that were "
                                       "never promoted or approved): nothing to roll back to")
                known = ", ".join(sorted(stacks)) or "none"
                raise ControlError(f"no artifact of kind {kind!r} was ever published (kinds on {self.topic}: {known})")
            target = self._rollback_target(control, stacks[kind], kind, chosen[0] if chosen else version)
            chosen[:] = [target.version]
            cannot = self._load_refusal(target)  # refuse to send a rollback every worker would refuse
            if cannot is not None:
                raise ControlError(f"cannot roll back to {kind} version {target.version}: {cannot}")
            log.info("rolling %s back from version %d to %d", kind, stacks[kind][-1].version, target.version)
            return ControlRecord(kind=kind, version=target.version, sha256=target.sha256, action="rollback",
                                 blob_b64=target.blob_b64, path=target.path, published_at=time.time(), **audit)

        return await self._write(proposal, "refusing to roll back")

    async def configure(self, settings: bytes, fingerprint: str, actor: str | None = None,
                        reason: str | None = None) -> ControlRecord:
        """Publish the pipeline's config (``settings``, its ``fingerprint``) as its next version; returns the record.

        Parameters
        ----------
        settings : bytes
            The config's settings as its workers compare them (:mod:`~.pipeline_config`).
        fingerprint : str
            Their sha256 (64 hex digits).
        actor, reason : str or None
            Who and why, for the audit trail.

        Returns
        -------
        ControlRecord
            The delivered ``configure`` record.
        """
        audit = _audit(actor, reason, None)

        def proposal(control: ControlLog) -> ControlRecord:
            return ControlRecord(kind=CONFIG_KIND, version=control.ledger.next_version(CONFIG_KIND), sha256=fingerprint,
                                 action=CONFIGURE, blob_b64=base64.b64encode(settings).decode("ascii"),
                                 published_at=time.time(), **audit)

        return await self._write(proposal, "refusing to publish the pipeline's config", retry=("stale", "version"))

    def configure_sync(self, settings: bytes, fingerprint: str, actor: str | None = None,
                       reason: str | None = None) -> ControlRecord:
        """Blocking :meth:`configure`."""
        return asyncio.run(self.configure(settings, fingerprint, actor, reason))

    async def listing(self) -> list[dict]:
        """One row per artifact record (log order) with its verdict, for ``fairstream artifacts list``.

        ``refused``: why every worker ignores the record (``refused_at`` "log": the version rule or
        its key) or refuses its artifact (``refused_at`` "load": the registry's own build fails here:
        a missing store file, a damaged blob, with a schema a module that does not fit); None if it
        takes effect. ``active``: the version the workers serve, as their registry decides: the last
        record that takes effect, activates (a publish that is no candidate, a rollback, a promotion or
        approval) and loads. ``state``: what became of the record's version, ``"active"`` for the version
        served, else the ledger's (:meth:`~fairstream.streams.control.records.VersionLedger.state`);
        ``candidate``, ``actor`` and ``reason`` are the record's. ``served_by``: the workers that announced
        they serve this version, on the last record of it the version rule admits (the ground truth, even
        where this client's store or schema differs from the workers').
        """
        return self._listing(await self.read())

    async def status(self) -> tuple[list[dict], list[WorkerStatus]]:
        """:meth:`listing` and :meth:`workers` from one read of the topic."""
        control = await self.read()
        return self._listing(control), list(control.workers.values())

    def _listing(self, control: ControlLog) -> list[dict]:
        unloadable = self._unloadable(control)
        taking = [e for e in control.entries if e.refusal is None]
        active = {e.record.kind: e for e in taking if e.offset not in unloadable and _activates(e.record)}
        active_version = {kind: entry.record.version for kind, entry in active.items()}
        last_of_version = {(e.record.kind, e.record.version): e.offset for e in taking}
        now = time.time()
        rows = []
        for entry in control.entries:
            record = entry.record
            if record.action == CONFIGURE:  # the pipeline's config, not an artifact: `fairstream config` lists it
                continue
            shows_workers = entry.refusal is None and last_of_version[(record.kind, record.version)] == entry.offset
            workers = [w for w in control.workers.values() if shows_workers
                       and w.serves(record.kind, record.version, record.sha256)]
            state = ("active" if active_version.get(record.kind) == record.version
                     else control.ledger.state(record.kind, record.version))
            rows.append(_row(entry, active.get(record.kind) is entry, unloadable.get(entry.offset), workers, now,
                             state))
        return rows

    # ------------------------------------------------------------------ sync twins for the CLI

    def history_sync(self) -> list[ControlRecord]:
        """Blocking :meth:`history`."""
        return asyncio.run(self.history())

    def events_sync(self) -> list[dict]:
        """Blocking :meth:`events`."""
        return asyncio.run(self.events())

    def workers_sync(self) -> list[WorkerStatus]:
        """Blocking :meth:`workers`."""
        return asyncio.run(self.workers())

    def publish_sync(self, artifact: Artifact, actor: str | None = None, reason: str | None = None,
                     statistics: dict[str, float] | None = None, candidate: bool = False) -> ControlRecord:
        """Blocking :meth:`publish`."""
        return asyncio.run(self.publish(artifact, actor, reason, statistics, candidate))

    def publish_under_sync(self, artifact: Artifact, promotion: str, actor: str | None = None,
                           reason: str | None = None, statistics: dict[str, float] | None = None) -> Published:
        """Blocking :meth:`publish_under`."""
        return asyncio.run(self.publish_under(artifact, promotion, actor, reason, statistics))

    def decide_sync(self, kind: str, version: int, action: str, actor: str | None = None, reason: str | None = None,
                    statistics: dict[str, float] | None = None, force: bool = False) -> ControlRecord:
        """Blocking :meth:`decide`."""
        return asyncio.run(self.decide(kind, version, action, actor, reason, statistics, force))

    def read_sync(self) -> ControlLog:
        """Blocking :meth:`read`."""
        return asyncio.run(self.read())

    def rollback_sync(self, kind: str, version: int | None = None, actor: str | None = None,
                      reason: str | None = None) -> ControlRecord:
        """Blocking :meth:`rollback`."""
        return asyncio.run(self.rollback(kind, version, actor, reason))

    def listing_sync(self) -> list[dict]:
        """Blocking :meth:`listing`."""
        return asyncio.run(self.listing())

    def status_sync(self) -> tuple[list[dict], list[WorkerStatus]]:
        """Blocking :meth:`status`."""
        return asyncio.run(self.status())

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

    @contextlib.asynccontextmanager
    async def _reader(self):
        await self._ensure_topic()
        consumer = control_consumer(self.bootstrap, message_limit(self.inline_limit) * 16)
        await consumer.start()
        try:
            partition, end = await open_at_beginning(consumer, self.topic)
            yield _Reader(consumer, partition, end, self.timeout, self.topic)
        finally:
            await consumer.stop()

    @contextlib.asynccontextmanager
    async def _producer(self):
        await self._ensure_topic()
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            **aiokafka_options(),
            acks="all",
            max_request_size=message_limit(self.inline_limit),
            request_timeout_ms=int(self.timeout * 1000),
        )
        await producer.start()
        try:
            yield producer
        finally:
            await producer.stop()

    def _publish_record(self, artifact: Artifact, version: int, audit: dict, candidate: bool = False) -> ControlRecord:
        artifact = artifacts.with_version(artifact, version)
        path = self.store.put(artifact)
        blob = artifacts.encode(artifact)
        inline = len(blob) <= self.inline_limit
        return ControlRecord(
            kind=artifact.kind,
            version=version,
            sha256=artifact.sha256,
            action="publish",
            blob_b64=base64.b64encode(blob).decode("ascii") if inline else None,
            path=None if inline else str(path.resolve()),
            published_at=time.time(),
            candidate=True if candidate else None,  # left out of the message unless true
            **audit,
        )

    def _rollback_target(self, control: ControlLog, stack: list[ControlRecord], kind: str,
                         version: int | None) -> ControlRecord:
        if version is None:
            if len(stack) < 2:
                raise ControlError(f"nothing to roll back to: no {kind} version was active before version "
                                   f"{stack[-1].version}")
            return stack[-2]
        target = control.published(kind, version)
        if target is None:
            published = ", ".join(str(r.version) for r in control.history() if r.kind == kind and r.action == "publish")
            raise ControlError(f"{kind} version {version} was never published on {self.topic} (published: "
                               f"{published or 'none'}); a rollback names a version in the history")
        if stack[-1].version == version:
            raise ControlError(f"{kind} version {version} is already active; nothing to roll back")
        return target

    def _load_refusal(self, record: ControlRecord) -> str | None:
        """Why every worker would refuse ``record``'s artifact at load (the registry's own build), or None."""
        try:
            build_active(record, self.loaders, self.store)
        except Exception as exc:  # whatever the registry would count as a refusal
            return load_refusal(exc)[0]
        return None

    def _unloadable(self, control: ControlLog) -> dict[int, str]:
        """offset -> why the workers refuse the artifact, for each record the version rule admits."""
        reasons, seen, publishes = {}, {}, {}
        for entry in control.entries:
            if entry.refusal is None and entry.record.action != CONFIGURE:
                record = entry.record
                if record.action in DECISIONS:  # no artifact: a promotion loads as its candidate's publish did
                    publish = publishes.get((record.kind, record.version))
                    if record.action in ACTIVATING and publish in reasons:
                        reasons[entry.offset] = reasons[publish]
                    continue
                if record.action == "publish":
                    publishes[(record.kind, record.version)] = entry.offset
                same = (record.kind, record.sha256, record.blob_b64)  # a rollback loads as its publish did
                if same not in seen:
                    seen[same] = self._load_refusal(record)
                if seen[same] is not None:
                    reasons[entry.offset] = seen[same]
        return reasons


@dataclass
class _Reader:
    """A group-less consumer at the control partition, reading into a :class:`ControlLog`."""

    consumer: object
    partition: object
    end: int
    timeout: float
    topic: str

    async def read_to_end(self, control: ControlLog) -> None:
        """Read up to the end as of now: past the ListOffsets end and the fetch's high watermark.

        (The embedded broker under-reports the ListOffsets end, so at least one fetch is made.)
        """
        await self._read(control, lambda position, highwater: position >= max(self.end, highwater or 0), fetch=True)

    async def read_through(self, control: ControlLog, offset: int) -> None:
        """Read up to and including ``offset`` (a record this client just wrote)."""
        await self._read(control, lambda position, highwater: position > offset)

    async def _read(self, control: ControlLog, done, fetch: bool = False) -> None:
        deadline = time.monotonic() + self.timeout
        while fetch or not done(await self.consumer.position(self.partition), self.consumer.highwater(self.partition)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {self.topic} up to its end within {self.timeout:.0f}s")
            batch = await self.consumer.getmany(self.partition, timeout_ms=200)
            for message in batch.get(self.partition, []):
                control.add(message)
            fetch = False


def check_fits(artifact: Artifact, schema: PipelineSchema, pipeline: str) -> None:
    """Refuse an artifact every worker of ``pipeline`` would refuse at load: the workers' own load and check.

    ``pipeline`` names the pipeline in the message (e.g. its name and config file).
    """
    try:
        load_module(artifact, schema)
    except IncompatibleArtifact as exc:
        raise IncompatibleArtifact(f"the {artifact.kind} does not fit the pipeline {pipeline}: {exc}; every worker "
                                   "would refuse it at load (--force publishes it anyway)") from None


def live_figures(control: ControlLog, kind: str, version: int) -> dict[str, float] | None:
    """The live shadow figures of candidate ``version`` of ``kind``: those of the worker that measured it on the most
    records, as it last announced them (None when no worker announced any)."""
    announced = [status.shadow for status in control.shadow_figures(kind, version).values() if status.shadow]
    return max(announced, key=lambda figures: figures.get("records", 0.0), default=None)


def _audit(actor: str | None, reason: str | None, statistics: dict | None) -> dict:
    """The audit fields of a record to write, checked by the readers' own rules (refused here, never on the topic)."""
    actor = default_actor() if actor is None else actor
    check_audit(actor, reason)
    return {"actor": actor, "reason": reason, "statistics": parse_statistics(statistics)}


def _activation_stacks(history: list[ControlRecord]) -> dict[str, list[ControlRecord]]:
    """Per kind, the versions that are active or can be rolled back to, the active one last.

    ``history`` holds only records the version rule admits. A publish pushes, a rollback pops back
    to its version, so rolling back twice goes two versions back rather than toggling between two.
    A candidate publish does not push (it does not serve); its promotion or approval pushes the
    candidate's publish (which carries the artifact a rollback to it names); reject and retire change
    nothing.
    """
    stacks: dict[str, list[ControlRecord]] = {}
    candidates: dict[tuple[str, int], ControlRecord] = {}
    for record in history:
        activated = _activated(record, candidates)
        if activated is None:
            continue
        stack = stacks.setdefault(record.kind, [])
        versions = [entry.version for entry in stack]
        if record.action == "rollback" and record.version in versions:
            del stack[versions.index(record.version):]
        stack.append(activated)
    return stacks


def _activated(record: ControlRecord, candidates: dict[tuple[str, int], ControlRecord]) -> ControlRecord | None:
    """The record that serves from ``record`` on (a promotion serves its candidate's publish), or None."""
    if record.candidate:
        candidates[(record.kind, record.version)] = record
        return None
    if record.action in ACTIVATING:
        return candidates.get((record.kind, record.version))
    return None if record.action in DECISIONS or record.action == CONFIGURE else record


def _activates(record: ControlRecord) -> bool:
    """True for a record after which its version serves: a publish (not a candidate), a rollback, a promotion."""
    return record.action in ACTIVATING or record.action == "rollback" or (record.action == "publish"
                                                                          and not record.candidate)


def _row(entry: Entry, active: bool, unloadable: str | None, workers: list[WorkerStatus], now: float,
         state: str | None) -> dict:
    record = entry.record
    refused_at = "log" if entry.refusal is not None else "load" if unloadable is not None else None
    via = "inline" if record.blob_b64 is not None else "path" if record.path is not None else "-"
    return {
        "kind": record.kind,
        "version": record.version,
        "sha256": record.sha256[:12],
        "action": record.action,
        "candidate": bool(record.candidate),
        "state": state,
        "actor": record.actor,
        "reason": record.reason,
        "published_at": record.published_at,
        "via": via,
        "active": active,
        "refused": entry.refusal or unloadable,
        "refused_at": refused_at,
        "served_by": [{"worker": w.worker, "age": max(0.0, now - w.at), "stale": w.is_stale(now)} for w in workers],
    }
