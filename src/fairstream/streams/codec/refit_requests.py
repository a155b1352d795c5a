"""Re-fit requests (``refit.requests``): asking the re-fit service for a new artifact of one kind.

Wire format: key = the artifact kind, value = UTF-8 JSON::

    {"request_id": "2b1f...",            # required, unique per request: re-deliveries are ignored
     "kind": "plan",                     # required: the artifact kind to re-fit
     "reason": "drift of dependence_e",  # required: why, for the logs
     "ts": 1700000000.0,                 # required: seconds since the epoch, when it was asked
     "statistic": "dependence_e",        # optional: the statistic that drifted
     "value": 0.12,                      # optional: its value when the drift was confirmed
     "source": "monitor@worker-1",       # optional: who asked
     "version": 3}                       # optional: the version of the kind serving when the drift was confirmed

``version`` is a JSON integer from 0 to 2**63 - 1 (true and false are refused): the re-fit service drops a request
whose version of the kind no longer serves (a newer one was promoted since), since its drift was measured on a
chain the pipeline no longer runs. A request without one (a person's, an Alertmanager alert's) is about whatever
serves.

Unknown fields are ignored, so producers may add context without breaking older services.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass

from fairstream.models.kinds import DEFAULT_KIND

from .json_text import describe

_MAX_REQUEST_BYTES = 64 * 1024
_MAX_REQUEST_ID = 200
_MAX_VERSION = 2**63 - 1  # a Kafka-style signed 64-bit integer: what every reader of the control topic can hold


class RefitRequestError(ValueError):
    """A ``refit.requests`` message that cannot be used; the message says why."""


@dataclass(frozen=True)
class RefitRequest:
    """One message on ``refit.requests`` (format in the module docstring)."""

    request_id: str
    kind: str
    reason: str
    ts: float
    statistic: str | None = None
    value: float | None = None
    source: str | None = None
    version: int | None = None

    @classmethod
    def new(cls, reason: str, kind: str = DEFAULT_KIND, statistic: str | None = None, value: float | None = None,
            source: str | None = None, request_id: str | None = None, ts: float | None = None,
            version: int | None = None) -> "RefitRequest":
        """A request with a fresh id and the current time unless given; validated like a parsed one.

        Parameters
        ----------
        reason : str
            Why, for the logs and the audit trail.
        kind : str
            The artifact kind to re-fit.
        statistic, value : str or None, float or None
            The statistic that drifted and its value when the drift was confirmed.
        source : str or None
            Who asks (the service tells its triggers apart by it).
        request_id : str or None
            Unique per request; a fresh one by default.
        ts : float or None
            When it was asked, seconds since the epoch; now by default.
        version : int or None
            The version of ``kind`` serving when the drift was confirmed; None when the request is about whatever
            serves.

        Returns
        -------
        RefitRequest
            The request, as :func:`parse_request` would read it back.

        Raises
        ------
        RefitRequestError
            When a field is out of its range (the same checks as a parsed request).
        """
        request = cls(request_id=request_id or uuid.uuid4().hex, kind=kind, reason=reason,
                      ts=time.time() if ts is None else ts, statistic=statistic, value=value, source=source,
                      version=version)
        try:
            return parse_request(request.to_json())
        except (TypeError, ValueError) as exc:  # NaN, or a value json cannot write
            raise RefitRequestError(f"invalid refit request: {exc}") from None

    def to_json(self) -> bytes:
        """The message value (UTF-8 JSON); a request without a version leaves the field out, as older producers do."""
        fields = {name: getattr(self, name) for name in self.__dataclass_fields__}
        if self.version is None:
            del fields["version"]
        return json.dumps(fields, sort_keys=True, allow_nan=False).encode("utf-8")


def parse_request(value: bytes | None) -> RefitRequest:
    """A validated :class:`RefitRequest`; :class:`RefitRequestError` says what is wrong."""
    if not value:
        raise RefitRequestError("empty refit request")
    if len(value) > _MAX_REQUEST_BYTES:
        raise RefitRequestError(f"refit request of {len(value)} bytes exceeds {_MAX_REQUEST_BYTES}")
    try:
        data = json.loads(bytes(value).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RefitRequestError(f"refit request is not UTF-8 JSON: {str(exc)[:200]}") from None
    if not isinstance(data, dict):
        raise RefitRequestError(f"a refit request must be a JSON object, got {type(data).__name__}")
    try:
        return _request_of(data)
    except RefitRequestError:
        raise
    except Exception as exc:  # whatever else a field makes a check raise: the request is refused, not the reader
        raise RefitRequestError(f"refit request could not be read ({type(exc).__name__}: {str(exc)[:200]})") from None


def _request_of(data: dict) -> RefitRequest:
    request_id = _text(data, "request_id", required=True)
    if len(request_id) > _MAX_REQUEST_ID:
        raise RefitRequestError(f"request_id is longer than {_MAX_REQUEST_ID} characters")
    return RefitRequest(request_id=request_id, kind=_text(data, "kind", required=True),
                        reason=_text(data, "reason", required=True), ts=_seconds(data, "ts", required=True),
                        statistic=_text(data, "statistic"), value=_seconds(data, "value"), source=_text(data, "source"),
                        version=_version(data))


def _text(data: dict, name: str, required: bool = False) -> str | None:
    value = data.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise RefitRequestError(f"refit request field {name!r} must be a non-empty string, got {describe(value)}")
    return value


def _seconds(data: dict, name: str, required: bool = False) -> float | None:
    value = data.get(name)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):  # 10**400 too
        raise RefitRequestError(f"refit request field {name!r} must be a finite number, got {describe(value)}")
    return float(value)


def _version(data: dict) -> int | None:
    value = data.get("version")
    if value is None:
        return None
    # bool is an int to Python, but true is no version; a float (3.0) is refused too: versions are counted, not measured
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_VERSION:
        raise RefitRequestError(f"refit request field 'version' must be an integer from 0 to {_MAX_VERSION}, "
                                f"got {describe(value)}")
    return value


def _finite(number) -> bool:
    try:
        return math.isfinite(number)  # an int beyond the float range overflows here
    except OverflowError:
        return False
