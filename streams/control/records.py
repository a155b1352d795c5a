"""Control records: the message format of the control topic (one per publish or rollback of an artifact version).

Keys. The control topic is compacted on Apache Kafka: compaction keeps the last record per key. A
key per artifact kind (as before) let one record shadow the whole history of its kind: a garbage
record or a tombstone keyed ``plan`` left a new worker with no plan and rollback with no history.
Every record is therefore keyed by :func:`control_key`, unique to its content (kind, version,
action and a digest of the value), so compaction removes nothing but exact re-sends, and a
hostile record can shadow at most the one record whose key it copies. Workers replay every
surviving record in order and skip what they refuse (see the registry), so they serve the newest
version that survived.
"""

from __future__ import annotations

import hashlib
import json
import re

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
    try:
        data = json.loads(value) if value else None
    except (ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("event"), str) else None


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


def is_stale(record: ControlRecord, active_version: int | None) -> bool:
    """The version rule: a publish may not move a kind to a lower version, a rollback may."""
    return record.action == "publish" and active_version is not None and record.version < active_version
