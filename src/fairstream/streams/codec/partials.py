"""Partial aggregates (``<prefix>.stats``): what a worker tells the pipeline's monitoring agent.

A worker counts every record it delivers into the monitor's mergeable accumulators (counts and histograms,
:mod:`fairstream.repair.measure.accumulators`) of the record's event-time slice (``monitor.slice_seconds``), and
sends what it counted since its last message as one :class:`Partial`: per slice, the records and every
accumulator's counts. The agent adds the partials of every worker slice by slice, so the pipeline's statistics
are those of all its records, whatever worker counted them (:mod:`fairstream.streams.agent`).

A candidate chain measured in shadow is sent the same way (``role = "candidate"``) with, in ``paired``, the
sufficient statistics of the per-record paired comparison of the two chains on the same records
(:data:`PAIRED_FIELDS` per compared figure and group): what the agent's promotion test reads.

Format: ``FSP1``, the length of a JSON header (4 bytes, big-endian), the header, then every array's raw bytes
concatenated and compressed once (zlib). The header names each array with its dtype (numbers only: no object,
nothing a reader would unpickle), shape and place; a reader checks each against the bytes it has. One buffer, not
an archive of small files: a worker's second of counts is a few kB and costs about a millisecond to write. Integer
count arrays travel sparse (the indices and values of their non-zero cells: a batch fills few of a histogram's
cells). The header names the
pipeline, the worker, the chain's versions, the slice length and a digest of the configured features, groups
and strata: the agent refuses a partial counted under another layout (one line naming the worker and what
differs), never mixes it in.

>>> import numpy as np
>>> from fairstream.repair.measure.accumulators import PositiveRateAccumulator
>>> acc = PositiveRateAccumulator([0, 1]).update([1, 0, 1], [0, 1, 1])
>>> part = Partial("p", "w1", "active", (("plan", 3),), 10.0, 1.0, "d", {17: (3, {("dp", "label"): acc})})
>>> back = decode_partial(encode_partial(part), ["0", "1"], ["all"])
>>> back.slices[17][0], back.slices[17][1]["dp", "label"].value().difference
(3, 0.5)
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from fairstream.repair.measure.accumulators import (
    DecisionRateAccumulator,
    HistogramDependenceAccumulator,
    PositiveRateAccumulator,
    RateAccumulator,
    WassersteinAccumulator,
    configured_labels,
)
from fairstream.repair.measure.mdp import MatchedDPAccumulator
from fairstream.repair.measure.otf import OTF0Accumulator

FORMAT = "fairstream.partial/1"
MAGIC = b"FSP1"
NUMBERS = frozenset("fiu")
"""The dtype kinds an array may have (floats, signed and unsigned integers): nothing else is ever read."""
AGENT_SUFFIX = ".monitor"
"""The monitoring agent's app id is the pipeline's with this suffix (``<app id>.monitor``): its consumer group on the
stats topic, and its name when it announces the pipeline's shadow figures on the control topic."""
MAX_PARTIAL_BYTES = 8 * 1024 * 1024
"""A message larger than this is refused unread (a worker's second of counts is a few tens of kB)."""

MAX_SLICES = 600
"""Slices one message may carry (a worker sends a few a second)."""
MAX_PROTOTYPES = 1000
"""Settings the decoder's cache keeps (a chain version has a dozen; past this it starts afresh)."""
MAX_INDEX = 2**40
"""A slice index beyond this (in slices of event time) is not a time."""

PAIRED_FIELDS = ("n", "active", "active_sq", "change", "change_sq")
"""Per cell of a paired figure: records, sums of the active chain's value x and x^2, of the change d (candidate
minus active) and d^2."""

_TYPES = {"dependence": HistogramDependenceAccumulator, "wasserstein": WassersteinAccumulator,
          "positive_rate": PositiveRateAccumulator, "decision_rate": DecisionRateAccumulator,
          "rate": RateAccumulator, "matched_dp": MatchedDPAccumulator, "otf": OTF0Accumulator}
_NAMES = {kind: name for name, kind in _TYPES.items()}
_OTF_ARRAYS = ("priority_", "scores_", "X_", "s_", "y_")
_EXPECTED = {"dependence_e": ("dependence",), "w1": ("wasserstein",), "dp": ("positive_rate", "decision_rate"),
             "eopp": ("decision_rate",), "mdp": ("matched_dp",), "otf": ("otf",), "out_of_range_rate": ("rate",)}
"""Each statistic's accumulator type: a message that files counts under another is refused."""


class PartialError(ValueError):
    """A stats message that cannot be read, or was counted under another layout; the message says which."""


@dataclass
class Partial:
    """What one worker counted since its last message, for one chain.

    Parameters
    ----------
    pipeline, worker : str
        The pipeline's name and the worker that counted (its app id, host and pid).
    role : {"active", "candidate"}
        The chain that serves, or a candidate measured in shadow on the same records.
    chain : tuple of (kind, version)
        The chain's versions, in order (empty: a monitor-only pipeline's records as they came).
    sent : float
        When the worker sent it (its clock, seconds).
    slice_seconds : float
        The slice length it counted in (``monitor.slice_seconds``).
    layout : str
        :func:`layout_digest` of the worker's features, groups and strata.
    slices : dict, default={}
        Slice index (``floor(ts / slice_seconds)``) -> (records, {(statistic, stage): accumulator}).
    paired : dict, default={}
        Only with ``role = "candidate"``: figure -> {field of :data:`PAIRED_FIELDS`: array per cell}.
    active : tuple, default=()
        Only with ``role = "candidate"``: the active chain's versions the candidate was paired with.
    refused : int, default=0
        Only with ``role = "candidate"``: records the candidate refused that the active chain delivered.
    failed : str, default=""
        Only with ``role = "candidate"``: why the candidate chain failed in shadow ("" if it did not).
    """

    pipeline: str
    worker: str
    role: str
    chain: tuple
    sent: float
    slice_seconds: float
    layout: str
    slices: dict = field(default_factory=dict)
    paired: dict = field(default_factory=dict)
    active: tuple = ()
    refused: int = 0
    failed: str = ""

    @property
    def records(self) -> int:
        """Records counted in every slice."""
        return sum(n for n, _ in self.slices.values())


def layout_digest(features, groups, strata) -> str:
    """A short digest of what the counts are indexed by: a partial counted under another layout cannot be added."""
    text = json.dumps([list(map(str, features)), list(map(str, groups)), list(map(str, strata))])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def encode_partial(partial: Partial) -> bytes:
    """The message of ``partial`` (see the module docstring)."""
    arrays: dict[str, np.ndarray] = {}
    settings: dict[str, dict] = {}
    slices = []
    for i, (index, (records, accumulators)) in enumerate(sorted(partial.slices.items())):
        keys = []
        for (statistic, stage), accumulator in sorted(accumulators.items()):
            setting = _settings_id(accumulator, settings, arrays)
            keys.append([statistic, stage, setting])
            _put_counts(arrays, f"s{i}/{statistic}/{stage}", accumulator)
        slices.append({"index": int(index), "records": int(records), "keys": keys})
    paired = {}
    for name, cells in partial.paired.items():
        paired[name] = list(map(str, cells["cells"]))
        for name_field in PAIRED_FIELDS:
            arrays[f"p/{name}/{name_field}"] = np.asarray(cells[name_field], dtype=np.float64)
    header = {"format": FORMAT, "pipeline": partial.pipeline, "worker": partial.worker, "role": partial.role,
              "chain": [list(c) for c in partial.chain], "active": [list(c) for c in partial.active],
              "sent": partial.sent, "slice_seconds": partial.slice_seconds, "layout": partial.layout,
              "settings": settings, "slices": slices, "paired": paired, "refused": int(partial.refused),
              "failed": str(partial.failed)[:500]}
    return pack(header, arrays)


def pack(header: dict, arrays: dict[str, np.ndarray]) -> bytes:
    """``header`` (with the arrays' layout added) and the arrays in one buffer (see the module docstring)."""
    layout, parts, offset = [], [], 0
    for name, value in arrays.items():
        value = np.ascontiguousarray(value)
        layout.append([name, value.dtype.str, list(value.shape), offset])
        parts.append(value.tobytes())
        offset += value.nbytes
    text = json.dumps({**header, "arrays": layout}).encode()
    return MAGIC + struct.pack(">I", len(text)) + text + zlib.compress(b"".join(parts), 1)


def unpack(value: bytes) -> tuple[dict, dict[str, np.ndarray]]:
    """The header and the arrays of :func:`pack`'s buffer; a ValueError names what does not fit."""
    if value[:4] != MAGIC or len(value) < 8:
        raise ValueError("no FSP1 magic")
    (length,) = struct.unpack(">I", value[4:8])
    header = json.loads(value[8:8 + length])
    decompressor = zlib.decompressobj()
    data = decompressor.decompress(value[8 + length:], MAX_PARTIAL_BYTES * 16)  # a bounded inflate, not a bomb
    if decompressor.unconsumed_tail:
        raise ValueError("the arrays inflate beyond the bound")
    arrays = {}
    for name, dtype, shape, offset in header.pop("arrays"):
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        if dtype.kind not in NUMBERS or offset < 0 or offset + count * dtype.itemsize > len(data):
            raise ValueError(f"array {name!r} ({dtype.str}, {shape}) does not fit the message")
        arrays[name] = np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)
    return header, arrays


def decode_partial(value: bytes, groups, strata, prototypes: dict | None = None) -> Partial:
    """The :class:`Partial` of a stats message, its accumulators built over the configured ``groups`` and ``strata``.

    ``prototypes`` (a dict the caller keeps) holds one accumulator per settings id met: the accumulators of later
    messages with the same settings share them, so merging them skips comparing their edges.

    Raises :class:`PartialError` naming what is wrong: not a readable archive, another format, a count array of
    the wrong shape, an array that is not numbers (never unpickled: numbers are all it reads).
    """
    if not isinstance(value, (bytes, bytearray)) or len(value) > MAX_PARTIAL_BYTES:
        raise PartialError(f"not a stats message (a value of {len(value or b'')} bytes)")
    try:
        header, arrays = unpack(bytes(value))
    except Exception as exc:  # any way the bytes are not a stats message: refused in one line
        raise PartialError(f"not a readable stats message ({type(exc).__name__}: {str(exc)[:120]})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise PartialError(f"not a {FORMAT} message")
    cache = {} if prototypes is None else prototypes
    if len(cache) > MAX_PROTOTYPES:
        cache.clear()
    try:
        return _partial(header, arrays, configured_labels(list(groups), "groups"),
                        configured_labels(list(strata), "strata"), cache)
    except Exception as exc:  # whatever a malformed message makes a check raise: the message is refused, not the reader
        raise PartialError(f"a malformed stats message from {str(header.get('worker'))[:100]!r} "
                           f"({type(exc).__name__}: {str(exc)[:160]})") from None


def _partial(header: dict, arrays: dict, groups: np.ndarray, strata: np.ndarray, prototypes: dict) -> Partial:
    fresh = {}
    for setting, spec in _mapping(header["settings"], "settings").items():
        if setting not in prototypes:
            # the id is the digest of the settings: one a sender names falsely would poison every later message
            built = _prototype(spec, setting, arrays, groups, strata)
            if _settings_digest(built) != setting:
                raise ValueError(f"settings {str(setting)[:20]!r} do not match their digest")
            fresh[setting] = built
    known = {**prototypes, **fresh}
    entries = header["slices"]
    if not isinstance(entries, list) or len(entries) > MAX_SLICES:
        raise ValueError(f"slices must be a list of at most {MAX_SLICES}")
    slices = {}
    for i, entry in enumerate(entries):
        index, records = _whole(entry["index"], -MAX_INDEX, MAX_INDEX), _whole(entry["records"], 1, 2**53)
        accumulators = {}
        for statistic, stage, setting in entry["keys"]:
            prototype = known[setting]
            if _NAMES[type(prototype)] not in _EXPECTED[statistic]:
                raise ValueError(f"{statistic} counted in a {_NAMES[type(prototype)]} accumulator")
            accumulators[str(statistic), str(stage)] = _with_counts(prototype, arrays, f"s{i}/{statistic}/{stage}")
        slices[index] = (records, accumulators)
    paired = {str(name): _paired(name, cells, arrays) for name, cells in _mapping(header["paired"], "paired").items()}
    prototypes.update(fresh)  # cached once the whole message read
    return Partial(str(header["pipeline"]), str(header["worker"]), str(header["role"]),
                   tuple((str(k), _whole(v, 0, 2**63 - 1)) for k, v in header["chain"]),
                   _finite(header["sent"]), _finite(header["slice_seconds"]), str(header["layout"]), slices, paired,
                   tuple((str(k), _whole(v, 0, 2**63 - 1)) for k, v in header["active"]),
                   _whole(header["refused"], 0, 2**53), str(header["failed"]))


def _mapping(value, name: str) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be an object")
    return value


def _whole(value, lowest: int, highest: int) -> int:
    """An integer of the header within [lowest, highest] (bool, float and text refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or not lowest <= value <= highest:
        raise ValueError(f"expected an integer in [{lowest}, {highest}], got {str(value)[:30]}")
    return value


def _finite(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(float(value)):
        raise ValueError(f"expected a finite number, got {str(value)[:30]}")
    return float(value)


def _paired(name, cells, arrays: dict) -> dict:
    """One paired figure's sums, checked: one finite entry per cell, counts and squares never negative."""
    if not isinstance(cells, list) or not 0 < len(cells) <= 1000:
        raise ValueError(f"paired figure {str(name)[:40]!r} needs a list of cells")
    sums = {"cells": tuple(map(str, cells)), **{f: arrays[f"p/{name}/{f}"] for f in PAIRED_FIELDS}}
    for field_name in PAIRED_FIELDS:
        value = sums[field_name]
        if value.shape != (len(cells),) or not np.isfinite(value).all():
            raise ValueError(f"paired figure {str(name)[:40]!r}: {field_name} is not one finite number per cell")
        if field_name in ("n", "active_sq", "change_sq") and (value < 0).any():
            raise ValueError(f"paired figure {str(name)[:40]!r}: {field_name} is negative")
    return sums


# --------------------------------------------------------------------------- accumulators to arrays and back


def _spec(accumulator) -> tuple[dict, list | None]:
    """What an accumulator's counts are indexed by, beyond the groups and strata: (spec, edges or None)."""
    kind = _NAMES[type(accumulator)]
    spec: dict = {"type": kind}
    edges = getattr(accumulator, "edges", None) if kind in ("dependence", "wasserstein") else None
    if kind == "dependence":
        spec["alpha"] = accumulator.alpha
    if kind == "otf":
        spec.update(notion=accumulator.notion, eps=accumulator.eps, max_rows=accumulator.max_rows)
    return spec, edges


def _settings_digest(accumulator) -> str:
    """The settings id: a digest of the spec and the edges, so an id always means the same bins."""
    spec, edges = _spec(accumulator)
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode())
    for e in edges or ():
        digest.update(np.ascontiguousarray(e, dtype=np.float64).tobytes())
    return digest.hexdigest()[:12]


def _settings_id(accumulator, settings: dict, arrays: dict) -> str:
    """The id of the accumulator's settings in the message (added once; histograms carry their edges)."""
    spec, edges = _spec(accumulator)
    setting = _settings_digest(accumulator)
    if setting not in settings:
        if edges is not None:
            spec["features"] = len(edges)
            for k, e in enumerate(edges):
                arrays[f"e/{setting}/{k}"] = np.asarray(e, dtype=np.float64)
        settings[setting] = spec
    return setting


def _prototype(spec: dict, setting: str, arrays: dict, groups: np.ndarray, strata: np.ndarray):
    kind = spec["type"]
    groups, strata = groups.tolist(), strata.tolist()
    if kind in ("dependence", "wasserstein"):
        edges = [arrays[f"e/{setting}/{k}"] for k in range(int(spec["features"]))]
        if kind == "dependence":
            return HistogramDependenceAccumulator(edges, groups, strata, alpha=float(spec["alpha"]))
        return WassersteinAccumulator(edges, groups, strata)
    if kind == "rate":
        return RateAccumulator(strata)
    if kind == "otf":
        return OTF0Accumulator(groups, notion=str(spec["notion"]), eps=float(spec["eps"]),
                               max_rows=int(spec["max_rows"]))
    return _TYPES[kind](groups, strata)


def _put_counts(arrays: dict, prefix: str, accumulator) -> None:
    if isinstance(accumulator, OTF0Accumulator):
        for name in _OTF_ARRAYS:
            value = getattr(accumulator, name)
            if value is not None:
                arrays[f"{prefix}/{name}"] = value
        return
    for name in accumulator._counts:
        value = getattr(accumulator, name)
        if isinstance(value, list):
            for k, part in enumerate(value):
                _put_array(arrays, f"{prefix}/{name}/{k}", part)
        else:
            _put_array(arrays, f"{prefix}/{name}", np.asarray(value))


def _put_array(arrays: dict, name: str, value: np.ndarray) -> None:
    """Integer counts sparse (indices and values of the non-zero cells, and the shape); floats as they are."""
    if value.dtype.kind in "iu":
        flat = value.ravel()
        where = np.flatnonzero(flat)
        arrays[f"{name}/i"] = where.astype(np.uint32 if flat.size < 2**32 else np.uint64)
        values = flat[where]
        small = not len(values) or (values.min() >= np.iinfo(np.int32).min and values.max() <= np.iinfo(np.int32).max)
        arrays[f"{name}/v"] = values.astype(np.int32 if small else np.int64)
        arrays[f"{name}/shape"] = np.asarray(value.shape, dtype=np.int64)
    else:
        arrays[name] = value


def _get_array(arrays: dict, name: str, like: np.ndarray) -> np.ndarray:
    if f"{name}/i" in arrays:
        shape = tuple(int(n) for n in arrays[f"{name}/shape"])
        if shape != like.shape:
            raise ValueError(f"{name} has shape {shape}, expected {like.shape}")
        flat = np.zeros(like.size, dtype=like.dtype)
        values = arrays[f"{name}/v"]
        if (values < 0).any():
            raise ValueError(f"{name} holds a negative count")
        flat[arrays[f"{name}/i"].astype(np.intp)] = values
        return flat.reshape(shape)
    value = arrays[name]
    if value.shape != like.shape:
        raise ValueError(f"{name} has shape {value.shape}, expected {like.shape}")
    if not np.isfinite(value).all() or (value < 0).any():
        raise ValueError(f"{name} holds a count that is negative or not finite")
    return np.array(value, dtype=like.dtype)  # a copy: the message's buffer is read-only


def _with_counts(prototype, arrays: dict, prefix: str):
    """A copy of ``prototype`` (sharing its settings) holding the counts stored under ``prefix``."""
    if isinstance(prototype, OTF0Accumulator):
        made = prototype.fresh()
        for name in _OTF_ARRAYS:
            if f"{prefix}/{name}" in arrays:
                setattr(made, name, np.array(arrays[f"{prefix}/{name}"]))
        n = made.scores_.shape[0]
        if made.X_ is not None and (made.X_.ndim != 2 or len(made.X_) != n) or any(
                getattr(made, name).shape != (n,) for name in ("priority_", "s_", "y_")) or n > made.max_rows \
                or not (np.isfinite(made.scores_).all() and (made.X_ is None or np.isfinite(made.X_).all())) \
                or ((made.s_ < 0) | (made.s_ >= len(made.groups))).any():
            raise ValueError(f"{prefix}: OTF's sample is not one finite row per score of a configured group")
        return made
    counts = {}
    for name in prototype._counts:
        like = getattr(prototype, name)
        if isinstance(like, list):
            counts[name] = [_get_array(arrays, f"{prefix}/{name}/{k}", part) for k, part in enumerate(like)]
        else:
            counts[name] = _get_array(arrays, f"{prefix}/{name}", np.asarray(like))
            if not isinstance(like, np.ndarray):
                counts[name] = type(like)(counts[name])
    return prototype._of_counts(**counts)
