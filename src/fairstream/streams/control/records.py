"""Control records: the message format of the control topic, and the version rule every reader applies.

Keys. The control topic is compacted on Apache Kafka: compaction keeps the last record per key. A
key per artifact kind (as before) let one record shadow the whole history of its kind: a garbage
record or a tombstone keyed ``plan`` left a new worker with no plan and rollback with no history.
Every record is therefore keyed by :func:`control_key`, unique to its content (kind, version,
action and a digest of the value), so compaction removes nothing but exact re-sends, and a
hostile record can shadow at most the one record whose key it copies. Workers replay every
surviving record in order and skip what they refuse (see the registry), so they serve the newest
version that survived.

Versions. A version names one artifact. :class:`VersionLedger` is the rule, applied in log order
(the topic has one partition, so every reader sees one order): a publish claims ``(kind, version)``
and is admitted only if its version is the next one of its kind, one above the highest claimed
before it; a rollback must name a claimed version and that version's sha256. Versions are safe
integers (at most :data:`MAX_VERSION`), so every JSON reader of an output reads them exactly. A
version may be skipped only as far as the offsets allow (see :meth:`VersionLedger.admit`): each
message since the kind's highest claim allows one, which is what compaction may have removed, so
one crafted record moves the numbering by at most one version per message on the topic and can
never squat a far version. Publishers propose "highest claimed + 1", write, read the log back and
publish again under the next version if an earlier record took theirs (a compare-and-set through
the log order; see the client). The registry of every worker and the client's history and listing
share the one ledger, so they agree by construction.

Audit trail. A record may say who acted (``actor``), why (``reason``) and the figures at that moment
(``statistics``, names to finite numbers); bounded (:data:`MAX_ACTOR`, :data:`MAX_REASON`,
:data:`MAX_STATISTICS`), and a record whose audit fields are out of bounds is refused like any other
invalid record. They are optional: a record without them is encoded, keyed and read as before.

Candidates and decisions. A publish may be a *candidate* (``candidate: true``): it claims its version
by the rule above but does not serve; it is its kind's *pending candidate* until a decision names it
(kind, version and sha256): ``promote`` (the shadow policy) or ``approve`` (a person) make it serve,
``retire`` (the shadow policy, or a publisher superseding it) or ``reject`` (a person) end it. A newer
version, a candidate or one published to serve, supersedes a pending one even without a retire record
(so a late decision on it cannot downgrade what serves). Decisions carry no artifact and are admitted
only for the pending candidate; a rollback names only a version that served (published to serve,
promoted or approved), never a candidate that was not promoted. See :class:`VersionLedger`.

Besides artifact records the topic carries notices (see :func:`read_message`): events (a re-embed
after a swap), worker announcements (what one worker serves, keyed per worker so compaction keeps
the latest) and tombstones (a publisher withdrawing the record that lost a version, so compaction
removes it). Readers decide what a message is by its key and its value together: a record counts
only under the control key its value implies, an announcement only under ``status/worker/<its
worker>``, an event only under its event key; anything else is refused, never taken for another
kind of message. No message can stop a reader: whatever one holds (invalid UTF-8, nesting deep
enough to exhaust the recursion limit, numbers out of range), it is refused, not raised.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import reprlib
import time
from dataclasses import dataclass, field

from fairstream.streams.schemas import ControlRecord

ACTIONS = ("publish", "rollback", "configure", "promote", "approve", "reject", "retire")
CONFIGURE, CONFIG_KIND = "configure", "config"
"""A ``configure`` record publishes a version of the pipeline's config (kind ``config``; its ``sha256`` is the
config's fingerprint, its ``blob_b64`` the settings): versioned by the same rule as an artifact (see
:mod:`fairstream.streams.control.pipeline_config`)."""
DECISIONS = ("promote", "approve", "reject", "retire")
"""The actions that decide a pending candidate; they carry no artifact."""
ACTIVATING = ("promote", "approve")
"""The decisions that make the candidate serve (``reject`` and ``retire`` end it without serving). Only
``approve``, ``reject`` and ``rollback`` are a person's (the CLI); ``promote`` and ``retire`` are the
shadow policy's (and a publisher's, superseding its own older candidate)."""
CANDIDATE_REFUSED, CANDIDATE_FAILED = "candidate.refused", "candidate.failed"
"""Two live shadow figures every reader understands: the records the candidate refused that the serving chain
repaired, and 1 while its chain has failed in shadow (an error in its code). The shadow policy retires such a
candidate; a person's approval of a failing one is refused unless forced."""
STATES = ("published", "candidate", "promoted", "approved", "rejected", "retired", "superseded")
"""What the ledger says of a claimed version (:meth:`VersionLedger.state`)."""
_SERVED = ("published", "promoted", "approved")  # the states of a version that served at some time
_DECIDED = {"promote": "promoted", "approve": "approved", "reject": "rejected", "retire": "retired"}
AUDIT_FIELDS = ("actor", "reason", "statistics")
"""The audit trail's fields of a record (who, why, the figures at that moment); optional, bounded."""
MAX_ACTOR, MAX_REASON = 200, 1000
"""The most characters of an actor and of a reason."""
MAX_STATISTICS, MAX_STATISTIC_NAME = 64, 100
"""The most statistics one record carries, and the most characters of a statistic's name."""
MAX_SIGNATURE = 200
"""The most characters of a signature (an Ed25519 signature is 88 in base64)."""
MAX_VERSION = 2**53 - 1
"""The highest version: every JSON reader (JavaScript's numbers included) reads versions up to it exactly."""
_LATEST_TIME = 253402300799.0  # 9999-12-31T23:59:59Z: any later "published_at" is not a time
_SHA256 = re.compile(r"[0-9a-f]{64}")
_KIND = re.compile(r"[a-z][a-z0-9_]{0,31}")  # a kind is one segment of the control key: no "/"
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 2, 60, 60


class ControlError(ValueError):
    """A control record that cannot be parsed, or a control operation that cannot be done."""


def shown(value) -> str:
    """``repr(value)`` cut short: a hostile message must not write megabytes into a log line.

    >>> shown("x" * 1000)
    "'xxxxxxxxxxxxxxxxxxxxxxxxxxx...xxxxxxxxxxxxxxxxxxxxxxxxxxxx'"
    """
    return _SHOWN.repr(value)


# --------------------------------------------------------------------------- control messages


TRUST_FIELDS = ("pipeline", "previous", "signer", "signature")
"""Who wrote a record and where it sits in the trail (checked by :mod:`~fairstream.streams.control.gate`)."""
_OMITTED_WHEN_NONE = (*AUDIT_FIELDS, "candidate", *TRUST_FIELDS)


def encode_control(record: ControlRecord) -> bytes:
    """The control message value: JSON of the record's fields.

    An audit field or ``candidate`` left None is left out, so a record without them is encoded (and
    keyed) as it was before they existed.
    """
    fields = {name: value for name, value in record.asdict().items()
              if value is not None or name not in _OMITTED_WHEN_NONE}
    return json.dumps(fields, sort_keys=True, allow_nan=False).encode("utf-8")


def decision_record(kind: str, version: int, sha256: str, action: str, actor: str, reason: str | None = None,
                    statistics: dict | None = None) -> ControlRecord:
    """A decision on the pending candidate ``version`` of ``kind`` (``sha256``: its artifact), now.

    The actor (required) and the reason must be what every reader takes (at most :data:`MAX_ACTOR` and
    :data:`MAX_REASON` characters), and the statistics finite numbers: :class:`ControlError` otherwise.
    Encode it with :func:`encode_control` and key it with :func:`control_key`, as any record.

    >>> decision_record("plan", 3, "a" * 64, "approve", "alice").action
    'approve'
    """
    if action not in DECISIONS:
        raise ControlError(f"a decision is one of {DECISIONS}, got {shown(action)}")
    for name, value, longest in (("actor", actor, MAX_ACTOR), ("reason", reason, MAX_REASON)):
        refusal = None if value is None and name == "reason" else audit_text_refusal(value, longest)
        if refusal is not None:  # every reader would refuse the record: refused here, never written
            raise ControlError(f"the {action} decision's {name} {refusal}")
    return ControlRecord(kind=kind, version=version, sha256=sha256, action=action, published_at=time.time(),
                         actor=actor, reason=reason, statistics=parse_statistics(statistics))


def control_key(record: ControlRecord, value: bytes) -> bytes:
    """The record's key on the control topic: ``<kind>/<version>/<action>/<sha256 of the value, 16 hex>``.

    The same message sent twice (a retry) gets the same key, so compaction keeps one copy; any two
    different records get different keys, so compaction never drops one for the other.
    """
    return f"{record.kind}/{record.version}/{record.action}/{hashlib.sha256(value).hexdigest()[:16]}".encode()


# --------------------------------------------------------------------------- events

REEMBED = "reembed"
"""The event a worker publishes after a live swap of the embedding module: templates embedded under
the previous version no longer compare with new embeddings and must be re-embedded."""
_EVENT_PREFIX = b"event/"


def reembed_event(previous, current) -> tuple[bytes, bytes]:
    """(key, value) of the re-embed event for a swap from ``previous`` to ``current`` (registry ``Active``s).

    Every worker that sees the swap sends the same bytes under the same key, so compaction keeps one
    and readers de-duplicate by key. Workers skip events when they replay the topic (see :func:`read_message`).
    """
    event = {"event": REEMBED, "kind": current.kind, "from_version": previous.version,
             "from_sha256": previous.sha256, "to_version": current.version, "to_sha256": current.sha256}
    return event_key(event), json.dumps(event, sort_keys=True).encode("utf-8")


def event_key(event: dict) -> bytes:
    """An event's key: ``event/<event>/<kind>/<from>-<to>/<to_sha256, 16 hex>``, the only key it is read under."""
    fields = [event.get(name) for name in ("event", "kind", "from_version", "to_version", "to_sha256")]
    name, kind, start, end, sha = (str(value) for value in fields)
    return f"event/{name}/{kind}/{start}-{end}/{sha[:16]}".encode()


def parse_event(value: bytes | None) -> dict | None:
    """The event a control message carries, or None when it is not an event (an artifact record, or garbage).

    >>> parse_event(b'{"event": "reembed", "kind": "embedding", "from_version": 1, "to_version": 2}')["to_version"]
    2
    >>> parse_event(b'{"kind": "plan", "version": 1}') is None
    True
    """
    data = _json_object(value)
    return data if data is not None and isinstance(data.get("event"), str) else None


# --------------------------------------------------------------------------- worker announcements

ANNOUNCEMENT = "worker"
SERVING, STOPPED = "serving", "stopped"
_ANNOUNCEMENT_PREFIX = f"status/{ANNOUNCEMENT}/".encode()


@dataclass(frozen=True)
class WorkerStatus:
    """What one worker serves, as it announced it on the control topic.

    ``worker`` is ``<app id>@<host>:<pid>``; ``serving`` holds ``(kind, version, sha256)`` for each
    kind of ``kinds`` (what the worker applies) it has loaded; ``at`` is the announcement's wall-clock
    time and ``every`` the seconds between two announcements of a running worker, so one older than
    :meth:`is_stale` says is from a worker that is gone. ``state`` is ``"stopped"`` after a clean stop.
    ``shadowing`` holds ``(kind, version, sha256)`` of each pending candidate the worker applies in
    shadow, and ``shadow`` the live figures of the candidate chain against the active one (names to
    finite numbers, at most :data:`MAX_STATISTICS`), or None; announcements written before them parse
    with neither.
    """

    worker: str
    app_id: str
    host: str
    pid: int
    at: float
    every: float
    kinds: tuple[str, ...]
    serving: tuple[tuple[str, int, str], ...]
    state: str = SERVING
    shadowing: tuple[tuple[str, int, str], ...] = ()
    shadow: dict | None = field(default=None, hash=False)

    def is_stale(self, now: float) -> bool:
        """True when two announcements were missed: the worker is gone (killed, host lost)."""
        return now - self.at > 2 * self.every

    def serves(self, kind: str, version: int, sha256: str) -> bool:
        """True when the worker applies this version of ``kind`` (and has not stopped)."""
        return self.state == SERVING and (kind, version, sha256) in self.serving


def announcement_key(worker: str) -> bytes:
    """The key of a worker's announcements, ``status/worker/<worker>``: compaction keeps each worker's latest."""
    return _ANNOUNCEMENT_PREFIX + worker.encode("utf-8", "surrogatepass")


def encode_announcement(status: WorkerStatus) -> tuple[bytes, bytes]:
    """(key, value) of an announcement: keyed per worker, so compaction keeps each worker's latest."""
    value = {"announcement": ANNOUNCEMENT, "worker": status.worker, "app_id": status.app_id, "host": status.host,
             "pid": status.pid, "at": status.at, "every": status.every, "kinds": list(status.kinds),
             "serving": [{"kind": k, "version": v, "sha256": h} for k, v, h in status.serving], "state": status.state}
    if status.shadowing:  # left out when empty: a worker without a candidate announces as before
        value["shadowing"] = [{"kind": k, "version": v, "sha256": h} for k, v, h in status.shadowing]
    if status.shadow is not None:
        value["shadow"] = status.shadow
    return announcement_key(status.worker), json.dumps(value, sort_keys=True).encode("utf-8")


def parse_announcement(value: bytes | None) -> WorkerStatus | None:
    """The worker status an announcement carries; None when the message is not one (or is malformed)."""
    data = _json_object(value)
    if data is None or data.get("announcement") != ANNOUNCEMENT:
        return None
    try:
        serving, shadowing = (tuple((str(s["kind"]), _version(s["version"]), str(s["sha256"])) for s in listed)
                              for listed in (data["serving"], data.get("shadowing", ())))
        return WorkerStatus(worker=str(data["worker"]), app_id=str(data["app_id"]), host=str(data["host"]),
                            pid=int(data["pid"]), at=_finite(data["at"]), every=_finite(data["every"]),
                            kinds=tuple(map(str, data["kinds"])), serving=serving, state=str(data["state"]),
                            shadowing=shadowing, shadow=parse_statistics(data.get("shadow")))
    except Exception:  # any shape a hostile writer can give (inf pid, nested lists, ...) means "not one"
        return None


def shadow_figures(figures: dict | None) -> dict[str, float] | None:
    """The figures an announcement may carry: names of 1 to 100 characters to finite numbers, at most 64.

    A live comparison may hold more, or an undefined one (NaN): those are left out (a figure is
    dropped, the announcement is not).

    >>> shadow_figures({"records": 2000, "active.E": float("nan"), "": 1.0})
    {'records': 2000.0}
    """
    if figures is None:
        return None
    kept = {name: float(value) for name, value in figures.items()
            if isinstance(name, str) and 0 < len(name) <= MAX_STATISTIC_NAME and _is_finite_number(value)}
    return dict(list(kept.items())[:MAX_STATISTICS])


def _finite(value) -> float:
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"not a finite number: {value!r}")
    return number


# --------------------------------------------------------------------------- reading a message

RECORD, ANNOUNCED, EVENT, TOMBSTONE, REFUSED = "record", "announcement", "event", "tombstone", "refused"
NOTICES = (ANNOUNCED, EVENT, TOMBSTONE)
"""What a message is when it is not an artifact record; readers skip notices (never refused, counted or listed)."""


class _ImpliedKey:
    def __repr__(self) -> str:
        return "IMPLIED_KEY"


IMPLIED_KEY = _ImpliedKey()
"""Pass as the key of a value that was not read from the topic (one the caller encoded itself): the
message is then taken under the key its value implies."""


@dataclass(frozen=True)
class ControlMessage:
    """What one message of the control topic is, decided by its key and its value together.

    ``what`` is :data:`RECORD` (``record`` holds it), :data:`ANNOUNCED` (``status``), :data:`EVENT`
    (``event``), :data:`TOMBSTONE` or :data:`REFUSED` (``refusal`` says why; ``record`` holds the
    record when the value is one but the key is not its own).
    """

    what: str
    record: ControlRecord | None = None
    status: WorkerStatus | None = None
    event: dict | None = None
    refusal: str | None = None


def read_message(key, value: bytes | None) -> ControlMessage:
    """What the message ``(key, value)`` is, for every reader of the control topic; never raises.

    A record is taken only under the control key its value implies (:func:`control_key`), an
    announcement only under its worker's key, an event only under its event key: a publish body
    keyed ``status/worker/...``, or a record keyed like another record, is refused.

    >>> plan = ControlRecord("plan", 1, "a" * 64, path="p")
    >>> value = encode_control(plan)
    >>> read_message(control_key(plan, value), value).record == plan
    True
    >>> read_message(b"status/worker/evil", value).refusal
    "keyed b'status/worker/evil', not plan/1/publish/..., the control key its value implies: a record is taken only
    under its own key"
    >>> read_message(b"status/worker/evil", b"{}").refusal
    'keyed as a worker announcement (status/worker/...), but the value is not the announcement of that worker'
    >>> read_message(b"x", b"[" * 5000).what
    'refused'
    >>> read_message(b"plan", None).what
    'tombstone'
    """
    try:
        return _read(key, value)
    except Exception as exc:  # a reader must outlive any message: RecursionError, MemoryError, a bug here
        return ControlMessage(REFUSED, refusal=f"unreadable control message ({type(exc).__name__}: {shown(str(exc))})")


def _read(key, value: bytes | None) -> ControlMessage:
    if value is None:
        return ControlMessage(TOMBSTONE)
    if key is IMPLIED_KEY:
        key = _implied_key(value)
    key = b"" if key is None else bytes(key)
    notice = _notice(key, value)
    if notice is not None and notice.what != REFUSED:
        return notice
    try:  # a record, or a record body under a notice's key (refused below, but listed as a record)
        record = parse_control(value)
    except ControlError as exc:
        return notice or ControlMessage(REFUSED, refusal=f"unparsable control message: {exc}")
    expected = control_key(record, value)
    if key != expected:
        return ControlMessage(REFUSED, record=record, refusal=(
            f"keyed {shown(key)}, not {expected.decode()}, the control key its value implies: a record is taken "
            "only under its own key"))
    return ControlMessage(RECORD, record=record)


def _notice(key: bytes, value: bytes) -> ControlMessage | None:
    """The announcement or event under its own key, REFUSED under a notice's key, None under any other key."""
    if key.startswith(_ANNOUNCEMENT_PREFIX):
        status = parse_announcement(value)
        if status is not None and key == announcement_key(status.worker):
            return ControlMessage(ANNOUNCED, status=status)
        return ControlMessage(REFUSED, refusal="keyed as a worker announcement (status/worker/...), but the value "
                                               "is not the announcement of that worker")
    if key.startswith(_EVENT_PREFIX):
        event = parse_event(value)
        if event is not None and key == event_key(event):
            return ControlMessage(EVENT, event=event)
        return ControlMessage(REFUSED, refusal=f"keyed as an event ({shown(key)}), but the value is not that event")
    return None


def _implied_key(value: bytes) -> bytes | None:
    event = parse_event(value)
    if event is not None:
        return event_key(event)
    status = parse_announcement(value)
    if status is not None:
        return announcement_key(status.worker)
    try:
        return control_key(parse_control(value), value)
    except ControlError:
        return None


def _json_object(value: bytes | None) -> dict | None:
    try:
        data = json.loads(value) if value else None
    except Exception:  # not JSON, not UTF-8, nested past the recursion limit, a 5,000-digit number...
        return None
    return data if isinstance(data, dict) else None


# --------------------------------------------------------------------------- the version rule


@dataclass(frozen=True)
class VersionState:
    """What the ledger says of one claimed version: ``name`` (one of :data:`STATES`), who made it so, where."""

    name: str
    actor: str | None
    offset: int


class VersionLedger:
    """The version rule, fed every artifact record of the control topic in log order, with its offset.

    :meth:`admit` returns None for a record that takes effect and the reason otherwise: a publish
    whose version is not the next one of its kind (a collision with an earlier publish, a stale
    re-send, or a gap), a rollback to a version that was never claimed, that names another artifact
    or that never served (a candidate not promoted), a decision on anything but the kind's pending
    candidate. Claims depend on the log alone, not on whether an artifact loads, so every reader of
    one log agrees; refused records change nothing.

    >>> ledger, sha = VersionLedger(), "a" * 64
    >>> ledger.admit(ControlRecord("plan", 1, sha, path="p"), offset=0), ledger.next_version("plan")
    (None, 2)
    >>> ledger.admit(ControlRecord("plan", 2**53 - 1, sha, path="p"), offset=1)
    'version gap: plan version 9007199254740991 skips versions after 1, the highest published:
     a publish takes the next version, 2'
    >>> ledger.admit(ControlRecord("plan", 9, sha, action="rollback", path="p"), offset=2)
    'rollback to plan version 9, which was never published (published: 1)'
    >>> ledger.admit(ControlRecord("plan", 2, sha, path="p", candidate=True), offset=3), ledger.pending("plan")
    (None, (2, 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'))
    >>> ledger.admit(ControlRecord("plan", 2, sha, action="rollback", path="p"), offset=4)
    'rollback to plan version 2, which never served (a pending candidate): a rollback names a version that served'
    >>> ledger.admit(decision_record("plan", 1, sha, "approve", "alice"), offset=5)
    'plan version 1 is not a pending candidate (pending: version 2)'
    >>> ledger.admit(decision_record("plan", 2, sha, "approve", "alice"), offset=6), ledger.state("plan", 2)
    (None, 'approved')
    >>> ledger.admit(decision_record("plan", 2, sha, "reject", "bob"), offset=7)
    'plan version 2 was already approved by alice at offset 6 (no candidate of plan is pending)'
    """

    def __init__(self):
        self._claims: dict[str, dict[int, str]] = {}  # kind -> version -> sha256 of the artifact it names
        self._highest: dict[str, tuple[int, int]] = {}  # kind -> (highest claimed version, offset of its claim)
        self._pending: dict[str, tuple[int, str]] = {}  # kind -> (version, sha256) of its pending candidate
        self._states: dict[tuple[str, int], VersionState] = {}  # (kind, version) -> what became of it

    def admit(self, record: ControlRecord, offset: int) -> str | None:
        """Apply ``record``, read at ``offset``; None if it takes effect, else why every reader ignores it.

        A publish takes the next version: one above the highest claimed of its kind. It may skip
        versions only as far as the messages since that claim allow, one each (``offset`` minus the
        claim's offset, minus one): a compacted log lacks the records compaction removed, and a
        publish after them keeps its version. Offsets survive compaction, so every reader, whether
        it read the log before or after compaction, reaches the same verdict, and a crafted record
        cannot squat a far version (each step costs a message on the topic).
        """
        claims = self._claims.setdefault(record.kind, {})
        if record.action == "rollback":
            return self._check_rollback(record, claims)
        if record.action in DECISIONS:
            refusal = self._check_decision(record)
            if refusal is None:
                del self._pending[record.kind]
                self._set_state(record, _DECIDED[record.action], offset)
            return refusal
        refusal = self._check_publish(record, claims, offset)
        if refusal is None:
            claims[record.version] = record.sha256
            self._highest[record.kind] = (record.version, offset)
            self._claim(record, offset)
        return refusal

    def next_version(self, kind: str) -> int:
        """The version a new publish of ``kind`` proposes: one above the highest claimed."""
        return 1 + self._highest.get(kind, (0, -1))[0]

    def claimed(self, kind: str, version: int) -> str | None:
        """The sha256 of the artifact ``version`` of ``kind`` names, or None if it was never published."""
        return self._claims.get(kind, {}).get(version)

    def pending(self, kind: str) -> tuple[int, str] | None:
        """(version, sha256) of the pending candidate of ``kind``, or None when none waits for a decision."""
        return self._pending.get(kind)

    def state(self, kind: str, version: int) -> str | None:
        """What became of ``version`` of ``kind`` (one of :data:`STATES`), or None if it was never published."""
        state = self._states.get((kind, version))
        return None if state is None else state.name

    def served(self, kind: str, version: int) -> bool:
        """True when ``version`` of ``kind`` served at some time: a rollback may name it."""
        return self.state(kind, version) in _SERVED

    def ever_served(self, kind: str) -> bool:
        """True when some version of ``kind`` served at some time (published to serve, promoted or approved)."""
        return any(state.name in _SERVED for (named, _), state in self._states.items() if named == kind)

    def _claim(self, record: ControlRecord, offset: int) -> None:
        # A newer version ends the pending candidate, with or without a retire record for it: a newer candidate
        # replaces it, and one published to serve must not be downgraded by a later decision on the older one.
        older = self._pending.pop(record.kind, None)
        if older is not None:
            by = (f"the publish of candidate version {record.version}" if record.candidate
                  else f"version {record.version}, published to serve")
            self._states[(record.kind, older[0])] = VersionState("superseded", by, offset)
        if not record.candidate:
            self._set_state(record, "published", offset)
            return
        self._pending[record.kind] = (record.version, record.sha256)
        self._set_state(record, "candidate", offset)

    def _set_state(self, record: ControlRecord, name: str, offset: int) -> None:
        self._states[(record.kind, record.version)] = VersionState(name, record.actor, offset)

    def _check_decision(self, record: ControlRecord) -> str | None:
        pending = self._pending.get(record.kind)
        if pending is None or pending[0] != record.version:
            now = f"pending: version {pending[0]}" if pending else f"no candidate of {record.kind} is pending"
            state = self._states.get((record.kind, record.version))
            if state is None or state.name == "published":
                return f"{record.kind} version {record.version} is not a pending candidate ({now})"
            decided = f"{state.name} by {state.actor or 'someone unnamed'} at offset {state.offset}"
            return f"{record.kind} version {record.version} was already {decided} ({now})"
        if pending[1] != record.sha256:
            return (f"{record.action} of {record.kind} version {record.version} names sha256 {record.sha256[:12]}, but "
                    f"candidate version {record.version} is {pending[1][:12]}")
        return None

    def _check_publish(self, record: ControlRecord, claims: dict[int, str], offset: int) -> str | None:
        highest, claimed_at = self._highest.get(record.kind, (0, -1))
        if record.version <= highest:
            return self._refuse_publish(record, claims, highest)
        reach = highest + max(1, offset - claimed_at)
        if record.version <= reach:
            return None
        skipped = f"version gap: {record.kind} version {record.version} skips versions after {highest}"
        if reach == highest + 1:
            return f"{skipped}, the highest published: a publish takes the next version, {highest + 1}"
        return (f"{skipped}, the highest published: a publish takes the next version, {highest + 1}, or at most "
                f"{reach}, one more per message written since (compaction may have removed records)")

    @staticmethod
    def _refuse_publish(record: ControlRecord, claims: dict[int, str], highest: int) -> str:
        owner = claims.get(record.version)
        if owner == record.sha256:
            return f"{record.kind} version {record.version} was already published with this artifact (a re-send)"
        if owner is not None:
            return (f"version collision: {record.kind} version {record.version} already names sha256 {owner[:12]}, "
                    f"an earlier publish took it")
        return (f"stale publish: {record.kind} version {highest} was published before it, and a publish must "
                f"take the next version (only a rollback may go lower)")

    def _check_rollback(self, record: ControlRecord, claims: dict[int, str]) -> str | None:
        owner = claims.get(record.version)
        if owner is None:
            published = ", ".join(map(str, sorted(claims))) or "none"
            return (f"rollback to {record.kind} version {record.version}, which was never published "
                    f"(published: {published})")
        if owner != record.sha256:
            return (f"rollback to {record.kind} version {record.version} names sha256 {record.sha256[:12]}, but that "
                    f"version is {owner[:12]}")
        if not self.served(record.kind, record.version):  # a rollback must not bypass the promotion policy
            state = self._states[(record.kind, record.version)]
            what = "a pending candidate" if state.name == "candidate" else \
                f"a candidate {state.name} by {state.actor or 'someone unnamed'} at offset {state.offset}"
            return (f"rollback to {record.kind} version {record.version}, which never served ({what}): a rollback "
                    "names a version that served")
        return None


def parse_control(value: bytes | None) -> ControlRecord:
    """A validated :class:`ControlRecord` from a message value; :class:`ControlError` says what is wrong.

    Nothing else is raised, whatever the value holds.
    """
    if value is None:
        raise ControlError("empty control message (a tombstone): it withdraws a record, it is not one")
    try:
        # Only JSON's own numbers: NaN, Infinity and 1e999 are no JSON a signature's canonical bytes can hold, and
        # one such field anywhere would make every signed pipeline's reader refuse it differently or fail.
        data = json.loads(value, parse_constant=_not_a_number, parse_float=_finite_float)
    except Exception as exc:  # ValueError, UnicodeDecodeError, RecursionError (deep nesting), ...
        raise ControlError(f"control message is not JSON: {type(exc).__name__}: {shown(str(exc))}") from None
    if not isinstance(data, dict):
        raise ControlError(f"control message must be a JSON object, got {type(data).__name__}")
    try:
        return _record(data)
    except ControlError:
        raise
    except Exception as exc:  # a shape no check foresaw: still one record's refusal, not a reader's crash
        raise ControlError(f"unreadable control record: {type(exc).__name__}: {shown(str(exc))}") from None


def _not_a_number(text: str):
    raise ValueError(f"{text} is not a JSON number")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text[:40]} is out of a float's range")
    return number


def _record(data: dict) -> ControlRecord:
    action = _action(data.get("action", "publish"))
    _check_transport(data, action)
    kind = _kind(data.get("kind"))
    if (action == CONFIGURE) != (kind == CONFIG_KIND):  # a config is not an artifact, nor an artifact a config
        raise ControlError(f"a {CONFIGURE} record is of kind {CONFIG_KIND!r} and only it is: got a {action} of kind "
                           f"{kind!r}")
    if action == CONFIGURE and data.get("blob_b64") is None:
        raise ControlError("a configure record carries the pipeline's settings inline (blob_b64), not by path")
    return ControlRecord(
        kind=kind,
        version=_version(data.get("version")),
        sha256=_sha256_field(data.get("sha256")),
        action=action,
        blob_b64=_optional(data, "blob_b64", str),
        path=_optional(data, "path", str),
        published_at=_published_at(data.get("published_at")),
        actor=_bounded_text(data, "actor", MAX_ACTOR),
        reason=_bounded_text(data, "reason", MAX_REASON),
        statistics=parse_statistics(data.get("statistics")),
        candidate=_candidate(data, action),
        pipeline=_bounded_text(data, "pipeline", MAX_ACTOR),
        previous=None if data.get("previous") is None else _sha256_named(data["previous"], "previous"),
        signer=_bounded_text(data, "signer", MAX_ACTOR),
        signature=_bounded_text(data, "signature", MAX_SIGNATURE),
    )


def _candidate(data: dict, action: str) -> bool | None:
    """``candidate``: true on a candidate publish; absent or false (None: not a candidate, encoded as before)."""
    value = data.get("candidate")
    if value is None or value is False:
        return None
    if value is not True:
        raise ControlError(f"control record field 'candidate' must be true, false or left out, got {shown(value)}")
    if action != "publish":
        raise ControlError(f"only a publish may be a candidate, not a {action}")
    return True


def _field(data: dict, name: str, kind: type):
    value = data.get(name)
    if not isinstance(value, kind) or not value:
        raise ControlError(f"control record field {name!r} must be a non-empty {kind.__name__}, got {shown(value)}")
    return value


def _optional(data: dict, name: str, kind: type):
    return None if data.get(name) is None else _field(data, name, kind)


def _kind(value) -> str:
    if not isinstance(value, str) or not _KIND.fullmatch(value):
        raise ControlError(f"control record field 'kind' must be an artifact kind (a lowercase name of up to 32 "
                           f"letters, digits and '_'), got {shown(value)}")
    return value


def _version(value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_VERSION:
        raise ControlError(f"control record version must be an integer from 1 to {MAX_VERSION} (2**53 - 1, read "
                           f"exactly by every JSON reader), got {shown(value)}")
    return value


def _sha256_field(value) -> str:
    return _sha256_named(value, "sha256")


def _sha256_named(value, name: str) -> str:
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise ControlError(f"control record {name} must be 64 lowercase hex digits, got {shown(value)}")
    return value


def _action(value) -> str:
    if value not in ACTIONS:
        raise ControlError(f"control record action must be one of {ACTIONS}, got {shown(value)}")
    return value


def _published_at(value) -> float | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= _LATEST_TIME:
        raise ControlError(f"control record published_at must be seconds since 1970 (up to the year 9999), got "
                           f"{shown(value)}")
    return value


def audit_text_refusal(value, longest: int) -> str | None:
    """Why ``value`` cannot be an actor or a reason of at most ``longest`` characters, or None if it can.

    >>> audit_text_refusal("alice", 200) is None, audit_text_refusal(" ", 200), audit_text_refusal("x" * 201, 200)
    (True, 'must not be empty', 'must be at most 200 characters, got 201')
    """
    if not isinstance(value, str):
        return f"must be a string, got {shown(value)}"
    if not value.strip():
        return "must not be empty"
    if len(value) > longest:
        return f"must be at most {longest} characters, got {len(value)}"
    return None


def _bounded_text(data: dict, name: str, longest: int) -> str | None:
    """An optional audit text: None, or a non-blank string of at most ``longest`` characters."""
    value = data.get(name)
    refusal = None if value is None else audit_text_refusal(value, longest)
    if refusal is not None:
        raise ControlError(f"control record field {name!r} {refusal}")
    return value


def parse_statistics(value) -> dict[str, float] | None:
    """The optional figures of the audit trail: a flat JSON object of names to finite numbers, bounded.

    >>> parse_statistics({"E": 0.5, "current": 1})
    {'E': 0.5, 'current': 1.0}
    >>> try:
    ...     parse_statistics({"E": [0.5]})
    ... except ControlError as exc:
    ...     print(exc)
    control record statistic 'E' must be a finite number, got [0.5]
    """
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_STATISTICS:
        raise ControlError(f"control record field 'statistics' must be an object of at most {MAX_STATISTICS} "
                           f"names to numbers, got {shown(value)}")
    figures = {}
    for name, number in value.items():
        if not isinstance(name, str) or not 0 < len(name) <= MAX_STATISTIC_NAME:
            raise ControlError(f"control record statistic names must be 1 to {MAX_STATISTIC_NAME} characters, got "
                               f"{shown(name)}")
        if not _is_finite_number(number):
            raise ControlError(f"control record statistic {shown(name)} must be a finite number, got {shown(number)}")
        figures[name] = float(number)
    return figures


def _is_finite_number(value) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


def _check_transport(data: dict, action: str) -> None:
    """A publish or a rollback carries its artifact as exactly one of blob_b64 or path; a decision carries none."""
    given = [name for name in ("blob_b64", "path") if data.get(name) is not None]
    if action in DECISIONS:
        if given:
            raise ControlError(f"{_article(action)} {action} decision decides a candidate already published and "
                               f"carries no artifact, got {given}")
        return
    if len(given) != 1:
        raise ControlError(
            f"a control record carries its artifact as exactly one of blob_b64 or path, got {given or 'neither'}"
        )


def _article(word: str) -> str:
    """``a`` or ``an`` before ``word`` (by its first letter: every action's name reads so)."""
    return "an" if word[:1] in "aeiou" else "a"
