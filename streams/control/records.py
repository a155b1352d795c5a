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
and is admitted only if its version is above every version of its kind claimed before it; a
rollback must name a claimed version and that version's sha256. Publishers propose "highest
claimed + 1", write, read the log back and publish again under the next version if an earlier
record took theirs (a compare-and-set through the log order; see the client). The registry of
every worker and the client's history and listing share the one ledger, so they agree by
construction.

Besides artifact records the topic carries notices, which no reader takes for a record (see
:func:`notice`): events (a re-embed after a swap), worker announcements (what one worker serves,
keyed per worker so compaction keeps the latest) and tombstones (a publisher withdrawing the
record that lost a version, so compaction removes it).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from fairstream.streams.schemas import ControlRecord

ACTIONS = ("publish", "rollback")
_SHA256 = re.compile(r"[0-9a-f]{64}")

class ControlError(ValueError):
    """A control record that cannot be parsed, or a control operation that cannot be done."""


# --------------------------------------------------------------------------- control messages


def encode_control(record: ControlRecord) -> bytes:
    """The control message value: JSON of the record's fields."""
    return json.dumps(record.asdict(), sort_keys=True, allow_nan=False).encode("utf-8")


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


def reembed_event(previous, current) -> tuple[bytes, bytes]:
    """(key, value) of the re-embed event for a swap from ``previous`` to ``current`` (registry ``Active``s).

    Every worker that sees the swap sends the same bytes under the same key, so compaction keeps one
    and readers de-duplicate by key. Workers skip events when they replay the topic (see :func:`parse_event`).
    """
    event = {"event": REEMBED, "kind": current.kind, "from_version": previous.version,
             "from_sha256": previous.sha256, "to_version": current.version, "to_sha256": current.sha256}
    key = f"event/{REEMBED}/{current.kind}/{previous.version}-{current.version}/{current.sha256[:16]}"
    return key.encode(), json.dumps(event, sort_keys=True).encode("utf-8")


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


@dataclass(frozen=True)
class WorkerStatus:
    """What one worker serves, as it announced it on the control topic.

    ``worker`` is ``<app id>@<host>:<pid>``; ``serving`` holds ``(kind, version, sha256)`` for each
    kind of ``kinds`` (what the worker applies) it has loaded; ``at`` is the announcement's wall-clock
    time and ``every`` the seconds between two announcements of a running worker, so one older than
    :meth:`is_stale` says is from a worker that is gone. ``state`` is ``"stopped"`` after a clean stop.
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

    def is_stale(self, now: float) -> bool:
        """True when two announcements were missed: the worker is gone (killed, host lost)."""
        return now - self.at > 2 * self.every

    def serves(self, kind: str, version: int, sha256: str) -> bool:
        """True when the worker applies this version of ``kind`` (and has not stopped)."""
        return self.state == SERVING and (kind, version, sha256) in self.serving


def encode_announcement(status: WorkerStatus) -> tuple[bytes, bytes]:
    """(key, value) of an announcement: keyed per worker, so compaction keeps each worker's latest."""
    value = {"announcement": ANNOUNCEMENT, "worker": status.worker, "app_id": status.app_id, "host": status.host,
             "pid": status.pid, "at": status.at, "every": status.every, "kinds": list(status.kinds),
             "serving": [{"kind": k, "version": v, "sha256": h} for k, v, h in status.serving], "state": status.state}
    return f"status/{ANNOUNCEMENT}/{status.worker}".encode(), json.dumps(value, sort_keys=True).encode("utf-8")


def parse_announcement(value: bytes | None) -> WorkerStatus | None:
    """The worker status an announcement carries; None when the message is not one (or is malformed)."""
    data = _json_object(value)
    if data is None or data.get("announcement") != ANNOUNCEMENT:
        return None
    try:
        serving = tuple((s["kind"], int(s["version"]), s["sha256"]) for s in data["serving"])
        return WorkerStatus(worker=str(data["worker"]), app_id=str(data["app_id"]), host=str(data["host"]),
                            pid=int(data["pid"]), at=float(data["at"]), every=float(data["every"]),
                            kinds=tuple(map(str, data["kinds"])), serving=serving, state=str(data["state"]))
    except (KeyError, TypeError, ValueError):
        return None


def notice(value: bytes | None) -> str | None:
    """What a control message is when it is not an artifact record: "event", "announcement" or "tombstone".

    Every reader (the registry, the client's history) skips notices before it parses records, so an
    announcement or an event is never refused, counted or listed as a publish.

    >>> notice(None), notice(b'{"event": "reembed"}'), notice(b'{"announcement": "worker"}')
    ('tombstone', 'event', 'announcement')
    >>> notice(b'{"kind": "plan", "version": 1}') is None
    True
    """
    if value is None:
        return "tombstone"
    if parse_event(value) is not None:
        return "event"
    data = _json_object(value)
    return "announcement" if data is not None and data.get("announcement") == ANNOUNCEMENT else None


def _json_object(value: bytes | None) -> dict | None:
    try:
        data = json.loads(value) if value else None
    except (ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


# --------------------------------------------------------------------------- the version rule


class VersionLedger:
    """The version rule, fed every artifact record of the control topic in log order.

    :meth:`admit` returns None for a record that takes effect and the reason otherwise: a publish
    whose version is not above every version of its kind claimed so far (a collision with an
    earlier publish, or a stale re-send), a rollback to a version that was never claimed or that
    names another artifact. Claims depend on the log alone, not on whether an artifact loads, so
    every reader of one log agrees; refused records change nothing.

    >>> ledger, sha = VersionLedger(), "a" * 64
    >>> ledger.admit(ControlRecord("plan", 1, sha, path="p")), ledger.next_version("plan")
    (None, 2)
    >>> ledger.admit(ControlRecord("plan", 9, sha, action="rollback", path="p"))
    'rollback to plan version 9, which was never published (published: 1)'
    """

    def __init__(self):
        self._claims: dict[str, dict[int, str]] = {}  # kind -> version -> sha256 of the artifact it names

    def admit(self, record: ControlRecord) -> str | None:
        """Apply ``record`` to the ledger; None if it takes effect, else why every reader ignores it."""
        claims = self._claims.setdefault(record.kind, {})
        if record.action == "rollback":
            return self._check_rollback(record, claims)
        if claims and record.version <= max(claims):
            return self._refuse_publish(record, claims)
        claims[record.version] = record.sha256
        return None

    def next_version(self, kind: str) -> int:
        """The version a new publish of ``kind`` proposes: one above the highest claimed."""
        return 1 + max(self._claims.get(kind, {}), default=0)

    def claimed(self, kind: str, version: int) -> str | None:
        """The sha256 of the artifact ``version`` of ``kind`` names, or None if it was never published."""
        return self._claims.get(kind, {}).get(version)

    @staticmethod
    def _refuse_publish(record: ControlRecord, claims: dict[int, str]) -> str:
        owner = claims.get(record.version)
        if owner == record.sha256:
            return f"{record.kind} version {record.version} was already published with this artifact (a re-send)"
        if owner is not None:
            return (f"version collision: {record.kind} version {record.version} already names sha256 {owner[:12]}, "
                    f"an earlier publish took it")
        return (f"stale publish: {record.kind} version {max(claims)} was published before it, and a publish must "
                f"take a version above every earlier one (only a rollback may go lower)")

    @staticmethod
    def _check_rollback(record: ControlRecord, claims: dict[int, str]) -> str | None:
        owner = claims.get(record.version)
        if owner is None:
            published = ", ".join(map(str, sorted(claims))) or "none"
            return (f"rollback to {record.kind} version {record.version}, which was never published "
                    f"(published: {published})")
        if owner != record.sha256:
            return (f"rollback to {record.kind} version {record.version} names sha256 {record.sha256[:12]}, but that "
                    f"version is {owner[:12]}")
        return None


def parse_control(value: bytes | None) -> ControlRecord:
    """A validated :class:`ControlRecord` from a message value; :class:`ControlError` says what is wrong."""
    if value is None:
        raise ControlError("empty control message (a tombstone): it withdraws a record, it is not one")
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
