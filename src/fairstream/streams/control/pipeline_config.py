"""One config per pipeline: the settings every worker of a pipeline must share, their fingerprint, and the keys where
two differ.

A pipeline's config is published on its control topic as a versioned record (``fairstream config publish``: a
``configure`` record whose ``sha256`` is :func:`fingerprint` of :func:`encode_settings`). A worker compares its own
settings with the active version after replaying the topic (:func:`check_config`): one whose settings differ takes
no partitions, so a worker with another chain or other ranges cannot join a running pipeline and treat part of its
records otherwise. The settings are a flat mapping of dotted keys (``records.artifact``, ``valid_ranges.age``) to
JSON values, so a difference names its keys.

>>> from dataclasses import replace
>>> from fairstream.streams.config import adult_config
>>> mine = settings_of(adult_config())
>>> theirs = settings_of(adult_config(valid_ranges={"age": (18.0, 99.0)}))
>>> differing_keys(mine, theirs)
['valid_ranges.age', 'valid_ranges.hours-per-week']
>>> mine["records.artifact"], len(fingerprint(encode_settings(mine)))
(['plan'], 64)
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import math
from dataclasses import dataclass, fields

from fairstream.streams.mapping import mapping_table
from fairstream.streams.schemas import ControlRecord

from .records import CONFIG_KIND, CONFIGURE, ControlError, shown
from .trust import Trust

EXCLUDED = ("artifact_dir", "monitor.metrics_port", "kafka.*", "schema_registry.*")
"""Keys left out of the shared settings: each worker's own, which may differ between workers of one pipeline without
any record being treated differently. ``artifact_dir``: the store is mounted at another path on each host (what it
holds is named by sha256 in the records); ``monitor.metrics_port``: two workers on one host need two ports;
``kafka.*``: each worker has its own principal (user, password file, TLS certificate and key, CA bundle), and the
protocol and mechanism follow how that host reaches the brokers; ``schema_registry.*``: only the registry's URL,
which a host may reach through another address (the schemas it reads are named by the topics, which are shared).
``trust`` is shared as the fingerprint of the keys and roles it trusts, not as its path (mounted anywhere)."""
MOST_KEYS_SHOWN = 10
"""A line names at most this many differing keys, then how many more."""


def settings_of(config) -> dict:
    """The settings ``config``'s workers must share, as dotted keys to JSON values (see :data:`EXCLUDED`).

    Parameters
    ----------
    config : PipelineConfig
        The pipeline config (its trust file is read: its fingerprint is a setting).

    Returns
    -------
    dict
        Dotted key -> JSON value (lists, not tuples; an infinite bound as the string ``"inf"`` or ``"-inf"``).
    """
    nested = {
        "name": config.name, "features": config.features, "groups": config.groups, "strata": config.strata,
        "s_name": config.s_name, "u_name": config.u_name, "label": config.label,
        "max_message_bytes": config.max_message_bytes, "include_original": config.include_original,
        "valid_ranges": dict(config.valid_ranges), "promotion": config.promotion,
        "trust": Trust.load(config.trust).fingerprint(),
        "topics": {**_fields(config.topics), "partitions": config.topics.partitions_setting},
        "records": {**_fields(config.records), "artifact": config.records.chain},
        "embeddings": _fields(config.embeddings),
        "monitor": {**_fields(config.monitor, "metrics_port"), "statistic": config.monitor.statistics,
                    "threshold": config.monitor.thresholds},
        "shadow": {**_fields(config.shadow), "statistic": config.shadow.statistics},
        "delivery": _fields(config.delivery),
        "mapping": None if config.mapping is None else mapping_table(config.mapping),
        "output": _fields(config.output),
    }
    return dict(_flat(nested, ""))


def encode_settings(settings: dict) -> bytes:
    """The canonical bytes of ``settings``: JSON with sorted keys and no spaces (what is published and fingerprinted).

    Parameters
    ----------
    settings : dict
        Dotted key -> JSON value (:func:`settings_of`).

    Returns
    -------
    bytes
        UTF-8 JSON.
    """
    return json.dumps(settings, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")


def fingerprint(settings_bytes: bytes) -> str:
    """The fingerprint of encoded settings: their sha256.

    Parameters
    ----------
    settings_bytes : bytes
        :func:`encode_settings` of the settings.

    Returns
    -------
    str
        64 lowercase hex digits.
    """
    return hashlib.sha256(settings_bytes).hexdigest()


def decode_settings(record: ControlRecord) -> dict:
    """The settings a ``configure`` record publishes; a :class:`ControlError` in one line for anything else.

    Parameters
    ----------
    record : ControlRecord
        A ``configure`` record (kind ``config``).

    Returns
    -------
    dict
        Dotted key -> JSON value.
    """
    if record.action != CONFIGURE or record.kind != CONFIG_KIND:
        raise ControlError(f"not a pipeline config: a {shown(record.action)} record of kind {shown(record.kind)}")
    if not record.blob_b64:
        raise ControlError(f"config version {record.version} carries no settings (blob_b64)")
    try:
        raw = base64.b64decode(record.blob_b64, validate=True)
    except (binascii.Error, ValueError):
        raise ControlError(f"config version {record.version}: its settings are not base64") from None
    if fingerprint(raw) != record.sha256:
        raise ControlError(f"config version {record.version}: its settings do not match its fingerprint "
                           f"{shown(record.sha256)} (altered or garbled)")
    try:
        settings = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ControlError(f"config version {record.version}: its settings are not UTF-8 JSON") from None
    if not isinstance(settings, dict):
        raise ControlError(f"config version {record.version}: its settings are not a JSON object of keys to values, "
                           f"got {type(settings).__name__}")
    return settings


def differing_keys(mine: dict, theirs: dict) -> list[str]:
    """The keys whose values differ between two settings, a key that only one has included.

    Parameters
    ----------
    mine, theirs : dict
        Dotted key -> JSON value.

    Returns
    -------
    list of str
        Sorted dotted keys.
    """
    return sorted(key for key in set(mine) | set(theirs)
                  if key not in mine or key not in theirs or _canonical(mine[key]) != _canonical(theirs[key]))


def shown_keys(keys: list[str], most: int = MOST_KEYS_SHOWN) -> str:
    """``keys`` for a line: comma-separated, at most ``most`` of them and how many more.

    Parameters
    ----------
    keys : list of str
        Dotted keys.
    most : int, default=MOST_KEYS_SHOWN
        How many are named.

    Returns
    -------
    str
        E.g. ``"records.artifact, valid_ranges.age"``.
    """
    more = f" and {len(keys) - most} more" if len(keys) > most else ""
    return ", ".join(keys[:most]) + more


@dataclass(frozen=True)
class ConfigCheck:
    """What a worker makes of its config against the pipeline's active one (:func:`check_config`).

    Parameters
    ----------
    admitted : bool
        Whether it may take partitions.
    version : int or None
        The active config's version (None: none published).
    differing : tuple of str
        The keys where its settings differ from the active ones (empty when they match or none is published).
    line : str or None
        The one line to log (None: nothing to say).
    level : int
        The line's logging level.
    """

    admitted: bool
    version: int | None = None
    differing: tuple[str, ...] = ()
    line: str | None = None
    level: int = logging.INFO

    def blocker(self) -> str | None:
        """Why the worker is not ready (``/readyz``), or None when it is admitted.

        Returns
        -------
        str or None
            One reason.
        """
        if self.admitted:
            return None
        if self.version is None:
            return "config: no config is published for this signed pipeline (it takes no partitions)"
        if not self.differing:
            return f"config: the pipeline's active config version {self.version} cannot be read (it takes no partitions)"
        return (f"config: differs from the pipeline's active config version {self.version} in "
                f"{shown_keys(list(self.differing))} (it takes no partitions)")


def check_config(settings: dict, record: ControlRecord | None, signed: bool) -> ConfigCheck:
    """Whether a worker with ``settings`` may take partitions of a pipeline whose active config is ``record``.

    Equal fingerprints (or equal settings): yes. Another config: no (it holds). None published: yes on an
    unsigned pipeline (with a warning that one should be), no on a signed one (it holds until one is).

    Parameters
    ----------
    settings : dict
        The worker's own settings (:func:`settings_of`).
    record : ControlRecord or None
        The pipeline's active ``configure`` record, None if none was published.
    signed : bool
        Whether the pipeline is signed (it names a trust file).

    Returns
    -------
    ConfigCheck
        The verdict and its line.
    """
    if record is None:
        if signed:
            return ConfigCheck(False, line="no config is published for this signed pipeline: this worker takes no "
                                           "partitions until one is (fairstream config publish --config FILE --key "
                                           "FILE)", level=logging.ERROR)
        return ConfigCheck(True, line="no config is published for this pipeline: a worker with another config (another "
                                      "chain, other ranges) can join it and treat part of its records otherwise; "
                                      "publish it (fairstream config publish --config FILE) so that such workers "
                                      "cannot join", level=logging.WARNING)
    if record.sha256 == fingerprint(encode_settings(settings)):
        return ConfigCheck(True, record.version, line=f"this worker's config is the pipeline's active config version "
                                                      f"{record.version}")
    try:
        differing = differing_keys(settings, decode_settings(record))
    except (ControlError, ValueError, RecursionError) as exc:  # whatever a record holds: a hold, never a lost check
        return ConfigCheck(False, record.version, line=f"the pipeline's active config version {record.version} cannot "
                                                       f"be read ({exc}): this worker takes no partitions until a "
                                                       "readable one is published (fairstream config publish)",
                           level=logging.ERROR)
    if not differing:  # the same settings, encoded by another writer: the same config
        return ConfigCheck(True, record.version, line=f"this worker's config is the pipeline's active config version "
                                                      f"{record.version}")
    return ConfigCheck(False, record.version, tuple(differing),
                       f"this worker's config differs from the pipeline's active config version {record.version} in "
                       f"{shown_keys(differing)}: it takes no partitions until the pipeline's config is published "
                       "with its settings (fairstream config publish) or it runs the active one", logging.ERROR)


def _fields(section, *left_out: str) -> dict:
    return {f.name: getattr(section, f.name) for f in fields(section) if f.name not in left_out}


def _flat(value, prefix: str):
    """(dotted key, JSON value) pairs of a nested dict: tables become keys, everything else a value."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _flat(inner, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, _json(value)


def _json(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "inf", "-inf" (NaN is refused by the config's checks)
    if isinstance(value, (tuple, list)):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json(v) for k, v in value.items()}
    return value


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
