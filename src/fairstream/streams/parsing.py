"""Text every room of streams/ reads: broker addresses, durations and RFC 3339 times.

Shared here, below the rooms, so that the worker, the re-fit service and the operations tools parse
them the same way without importing one another (``tests/test_layers.py``).

>>> parse_broker_url("kafka://k1:9092;k2:9093").bootstrap
'k1:9092,k2:9093'
>>> parse_duration("90s"), parse_duration("5m"), parse_duration("1h30m"), parse_duration("2.5")
(90.0, 300.0, 5400.0, 2.5)
>>> parse_duration("0m", positive=False)
0.0
>>> parse_time("1970-01-01T00:01:00.5Z")
60.5
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime

# --------------------------------------------------------------------------- broker addresses


@dataclass(frozen=True)
class BrokerAddress:
    """Where clients find a broker: ``bootstrap`` for kafka-python/aiokafka, ``url`` for Faust."""

    hosts: tuple[tuple[str, int], ...]

    @property
    def bootstrap(self) -> str:
        """``host:port,...`` for Kafka clients."""
        return ",".join(f"{host}:{port}" for host, port in self.hosts)

    @property
    def url(self) -> str:
        # Faust separates several brokers with ';' and wants the scheme on each of them.
        """``kafka://host:port,...`` for ``--broker``."""
        return ";".join(f"kafka://{host}:{port}" for host, port in self.hosts)


def parse_broker_url(url: str) -> BrokerAddress:
    """Parse ``kafka://h1:9092;kafka://h2:9092``, ``h1:9092,h2:9092`` or a mix into an address."""
    hosts = []
    for part in url.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        if "://" in part:
            scheme, part = part.split("://", 1)
            if scheme != "kafka":
                raise ValueError(f"unsupported broker scheme {scheme!r} in {url!r}; use kafka://")
        host, sep, port = part.rstrip("/").rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"broker address {part!r} in {url!r} is not host:port")
        hosts.append((host, int(port)))
    if not hosts:
        raise ValueError(f"no broker address in {url!r}")
    return BrokerAddress(tuple(hosts))


# --------------------------------------------------------------------------- durations

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str, positive: bool = True) -> float:
    """Seconds in ``"90s"``, ``"5m"``, ``"1h"``, ``"1h30m"``, ``"2d"``, ``"500ms"`` or a bare number of seconds.

    Prometheus' durations (``for: 5m``) are among them. A duration must be positive, or, with ``positive=False``
    (an alert rule's ``for: 0m``), at least 0.
    """
    cleaned = str(text).strip().lower().replace(" ", "")
    try:
        seconds = float(cleaned)
    except ValueError:
        parts = _DURATION.findall(cleaned)
        if not parts or "".join(number + unit for number, unit in parts) != cleaned:
            raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 5m, 1h, 1h30m, 2d)") from None
        seconds = sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        raise ValueError(f"a duration must be {'positive' if positive else 'at least 0'}, got {text!r}")
    return seconds


# --------------------------------------------------------------------------- times

_RFC3339 = re.compile(r"^(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


def parse_time(text: str) -> float:
    """An RFC 3339 timestamp (Prometheus' ``activeAt``, Alertmanager's ``startsAt``; nanoseconds, 'Z') as Unix
    seconds."""
    match = _RFC3339.match(text)
    if match is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    base, fraction, zone = match.groups()
    stamp = datetime.fromisoformat(base + ("+00:00" if zone == "Z" else zone)).timestamp()
    return stamp + (float("0." + fraction) if fraction else 0.0)
