"""Artifacts: the one file format for every frozen fairness module.

An artifact is what a re-fit job publishes and every stream worker hot-swaps: an OT repair plan, a
flow preprocessor's weights, a fair scorer, an embedding module. It is a JSON *manifest* (what it
is: kind, version, parameters, fit-time metrics, a fingerprint of the fit data) plus an ``.npz``
*payload* of plain arrays, pinned by the manifest's sha256 and size. The payload is read with
``allow_pickle=False`` and only after its size and hash are checked, so loading never runs code.

Two encodings of the same artifact: ``<name>.json`` + ``<name>.npz`` on disk (:func:`save`,
:func:`load`) and one blob per Kafka message (:func:`encode`, :func:`decode`). Which arrays a
kind's payload must hold is declared with :mod:`fairstream.repair.array_layout`.

>>> import numpy as np
>>> plan = pack("plan", {"coupling": np.eye(2) / 2}, parameters={"n_quantiles": 2})
>>> copy = decode(encode(plan), kind="plan")
>>> copy.arrays["coupling"].tolist(), copy.sha256 == plan.sha256
([[0.5, 0.0], [0.0, 0.5]], True)
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import struct
import tempfile
import zipfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

__all__ = [
    "PARAMETERS_ARRAY",
    "SCHEMA_VERSION",
    "ArrayInfo",
    "Artifact",
    "ArtifactError",
    "Manifest",
    "decode",
    "encode",
    "fingerprint_arrays",
    "load",
    "pack",
    "save",
    "with_version",
]

SCHEMA_VERSION = 1
"""Version of the manifest/payload format written by this module; newer ones are refused."""

# Blob layout: magic | manifest length (uint32, big-endian) | manifest JSON | payload. The magic
# borrows PNG's trick (high byte, CR LF, ^Z, LF) so text-mode mangling in transit is detected.
_BLOB_MAGIC = b"\x89FSA\r\n\x1a\n"
_BLOB_LENGTH = struct.Struct(">I")
_MAX_MANIFEST_BYTES = 16 * 2**20

# Object arrays would need pickle, structured (void) ones lose their fields in the audit listing.
_ALLOWED_DTYPE_KINDS = "biufcSUmM"
_KIND_PATTERN = re.compile(r"[a-z][a-z0-9_-]{0,63}")
# Array names become zip member names: no slashes or leading dots, so no path-like entries.
_NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")
_SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")
# A fixed zip timestamp (the earliest zip can store) makes the payload bytes deterministic.
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
_REQUIRED_FIELDS = (
    "kind", "schema_version", "version", "created", "parameters", "metrics",
    "data_fingerprint", "payload_sha256", "payload_size", "arrays",
)


class ArtifactError(ValueError):
    """An artifact that cannot be built, saved or trusted; the message says which check failed."""


# ---------------------------------------------------------------------------------------------
# manifest


@dataclass(frozen=True)
class ArrayInfo:
    """Audit entry for one payload array: its name, numpy dtype string and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @classmethod
    def of(cls, name: str, array: np.ndarray) -> ArrayInfo:
        """The shape, dtype and size of one array."""
        return cls(name, array.dtype.str, tuple(int(n) for n in array.shape))

    def to_dict(self) -> dict:
        """As the manifest stores it."""
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, entry: Any) -> ArrayInfo:
        """From the manifest's entry; raises :class:`ArtifactError` on a malformed one."""
        if not isinstance(entry, dict) or set(entry) != {"name", "dtype", "shape"}:
            raise ArtifactError(f"manifest 'arrays' entries must have name, dtype and shape, got {entry!r}")
        name, dtype, shape = entry["name"], entry["dtype"], entry["shape"]
        if not isinstance(name, str) or not isinstance(dtype, str) or not isinstance(shape, list):
            raise ArtifactError(f"malformed manifest 'arrays' entry {entry!r}")
        if not all(_is_int(n) and n >= 0 for n in shape):
            raise ArtifactError(f"array {name!r} has an invalid shape {shape!r} in the manifest")
        return cls(name, dtype, tuple(shape))


@dataclass(frozen=True)
class Manifest:
    """The JSON half of an artifact. Unknown keys read from newer writers are kept in ``extra``."""

    kind: str
    version: int
    created: str
    parameters: dict
    metrics: dict
    data_fingerprint: str | None
    payload_sha256: str
    payload_size: int
    arrays: tuple[ArrayInfo, ...]
    schema_version: int = SCHEMA_VERSION
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Every way of making a manifest (pack, parsing, dataclasses.replace) passes through here.
        _check_schema_version(self.schema_version)
        _check_kind(self.kind)
        _check_version(self.version)
        _check_created(self.created)
        _check_dict(self.parameters, "parameters")
        _check_dict(self.metrics, "metrics")
        _check_fingerprint(self.data_fingerprint, "data_fingerprint")
        _check_sha256(self.payload_sha256)
        _check_size(self.payload_size)
        _check_array_listing(self.arrays)
        reserved = sorted(set(_check_dict(self.extra, "extra")) & set(_REQUIRED_FIELDS))
        if reserved:
            raise ArtifactError(f"extra manifest keys may not redefine standard fields: {reserved}")

    def to_dict(self) -> dict:
        """The manifest as a JSON-ready dict."""
        fields = {
            "kind": self.kind,
            "schema_version": self.schema_version,
            "version": self.version,
            "created": self.created,
            "parameters": self.parameters,
            "metrics": self.metrics,
            "data_fingerprint": self.data_fingerprint,
            "payload_sha256": self.payload_sha256,
            "payload_size": self.payload_size,
            "arrays": [info.to_dict() for info in self.arrays],
        }
        return {**fields, **self.extra}

    def to_json(self) -> bytes:
        """Deterministic, strict (no NaN) JSON: the same manifest always gives the same bytes."""
        text = json.dumps(self.to_dict(), indent=2, ensure_ascii=True, allow_nan=False)
        return text.encode("ascii") + b"\n"

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        """Parse and validate a manifest's JSON text."""
        if len(data) > _MAX_MANIFEST_BYTES:
            raise ArtifactError(f"artifact manifest is {len(data)} bytes, over the {_MAX_MANIFEST_BYTES} limit")
        try:
            parsed = json.loads(data, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ArtifactError(f"unreadable artifact manifest JSON: {exc}") from None
        return cls.from_dict(parsed)

    @classmethod
    def from_dict(cls, data: Any) -> Manifest:
        """Validate a parsed manifest; raises :class:`ArtifactError` naming the bad field."""
        if not isinstance(data, dict):
            raise ArtifactError(f"artifact manifest must be a JSON object, got {type(data).__name__}")
        # The schema version decides how to read everything else, so it is checked first.
        _check_schema_version(data.get("schema_version"))
        missing = [key for key in _REQUIRED_FIELDS if key not in data]
        if missing:
            raise ArtifactError(f"artifact manifest is missing required field(s): {', '.join(missing)}")
        arrays = data["arrays"]
        if not isinstance(arrays, list):
            raise ArtifactError(f"manifest field 'arrays' must be a list, got {arrays!r}")
        return cls(
            arrays=tuple(ArrayInfo.from_dict(entry) for entry in arrays),
            extra={key: value for key, value in data.items() if key not in _REQUIRED_FIELDS},
            **{key: data[key] for key in _REQUIRED_FIELDS if key != "arrays"},
        )


def _no_duplicate_keys(pairs: list) -> dict:
    # Two "payload_sha256" keys would let two readers disagree on what was verified.
    keys = [key for key, _ in pairs]
    duplicates = sorted({key for key in keys if keys.count(key) > 1})
    if duplicates:
        raise ValueError(f"duplicate key(s) {duplicates}")
    return dict(pairs)


def _no_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_schema_version(value: Any) -> None:
    if value is None:
        raise ArtifactError("artifact manifest is missing required field(s): schema_version")
    if not _is_int(value) or value < 1:
        raise ArtifactError(f"artifact schema_version must be a positive integer, got {value!r}")
    if value > SCHEMA_VERSION:
        raise ArtifactError(
            f"artifact schema_version {value} is newer than this fairstream supports ({SCHEMA_VERSION}); "
            "upgrade fairstream to load it"
        )


def _check_kind(kind: Any) -> None:
    if not isinstance(kind, str) or not _KIND_PATTERN.fullmatch(kind):
        raise ArtifactError(f"artifact kind must match {_KIND_PATTERN.pattern} (e.g. 'plan'), got {kind!r}")


def _check_version(version: Any) -> None:
    if not _is_int(version) or version < 1:
        raise ArtifactError(f"artifact version must be a positive integer, got {version!r}")


def _check_created(created: Any) -> str:
    if isinstance(created, str):
        try:
            # Python 3.10's fromisoformat does not accept the "Z" suffix.
            parsed = datetime.fromisoformat(created[:-1] + "+00:00" if created.endswith("Z") else created)
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is not None:
            return created
    raise ArtifactError(f"artifact 'created' must be an ISO-8601 timestamp with a time zone, got {created!r}")


def _check_dict(value: Any, name: str) -> dict:
    if not isinstance(value, dict):
        raise ArtifactError(f"manifest field {name!r} must be a JSON object, got {value!r}")
    return value


def _check_sha256(value: Any) -> None:
    if not isinstance(value, str) or not _SHA256_PATTERN.fullmatch(value):
        raise ArtifactError(f"manifest field 'payload_sha256' must be 64 lowercase hex digits, got {value!r}")


def _check_fingerprint(value: Any, name: str) -> None:
    if value is not None and (not isinstance(value, str) or not _SHA256_PATTERN.fullmatch(value)):
        raise ArtifactError(f"{name} must be null or 64 lowercase hex digits (a sha256), got {value!r}")


def _check_size(value: Any) -> None:
    if not _is_int(value) or value < 0:
        raise ArtifactError(f"manifest field 'payload_size' must be a non-negative integer, got {value!r}")


def _check_array_listing(arrays: tuple[ArrayInfo, ...]) -> None:
    names = [info.name for info in arrays]
    if len(set(names)) != len(names):
        raise ArtifactError(f"manifest lists duplicate array names: {names}")
    for info in arrays:
        _check_array_name(info.name)
        try:
            kind = np.dtype(info.dtype).kind
        except (TypeError, ValueError):
            raise ArtifactError(f"array {info.name!r} has an unknown dtype {info.dtype!r}") from None
        _check_dtype_kind(info.name, kind)


def _check_array_name(name: Any) -> None:
    if not isinstance(name, str) or not _NAME_PATTERN.fullmatch(name):
        raise ArtifactError(f"array name must match {_NAME_PATTERN.pattern}, got {name!r}")


def _check_dtype_kind(name: str, kind: str) -> None:
    if kind == "O":
        raise ArtifactError(f"array {name!r} has dtype object; it would need pickle, which artifacts never use")
    if kind not in _ALLOWED_DTYPE_KINDS:
        raise ArtifactError(
            f"array {name!r} has an unsupported dtype kind {kind!r}; use numbers, bools or strings "
            "(store each field of a structured array as its own array)"
        )


# ---------------------------------------------------------------------------------------------
# the artifact


@dataclass(frozen=True, eq=False, repr=False)
class Artifact:
    """A manifest, its read-only arrays and the exact payload bytes the manifest's hash covers.

    Build one with :func:`pack`, :func:`load`, :func:`decode` or :meth:`from_bytes`; the
    constructor checks that the payload matches the manifest's size, hash and array listing.

    Parameters
    ----------
    manifest : Manifest
        Kind, versions, parameters, metrics and the payload's sha256 and size.
    arrays : mapping of str to ndarray
        The payload's arrays by name; stored read-only.
    payload : bytes
        The exact ``.npz`` bytes the manifest's hash covers.

    Examples
    --------
    >>> import numpy as np
    >>> art = pack("scorer", {"w": np.array([1.0, -2.0])}, parameters={"lambda": 0.1})
    >>> art.kind, art.version, len(art.sha256)
    ('scorer', 1, 64)
    """

    manifest: Manifest
    arrays: Mapping[str, np.ndarray]
    payload: bytes

    def __post_init__(self) -> None:
        _verify_payload(self.manifest, self.payload)
        _verify_arrays(self.manifest, self.arrays)
        _verify_sealed_parameters(self.manifest, self.arrays)
        frozen = {}
        for name, array in self.arrays.items():
            array = array.view()  # a view, so the caller's own array stays writable
            array.flags.writeable = False
            frozen[name] = array
        object.__setattr__(self, "arrays", MappingProxyType(frozen))

    @property
    def kind(self) -> str:
        """The artifact kind (``plan``, ``scorer``, ...)."""
        return self.manifest.kind

    @property
    def version(self) -> int:
        """The artifact's version number."""
        return self.manifest.version

    @property
    def sha256(self) -> str:
        """sha256 hex of the payload; it identifies the arrays whatever the version number."""
        return self.manifest.payload_sha256

    @property
    def parameters(self) -> dict:
        """The sealed parameters (read-only)."""
        return self.manifest.parameters

    @property
    def metrics(self) -> dict:
        """The fit-time metrics (read-only)."""
        return self.manifest.metrics

    def to_bytes(self) -> tuple[bytes, bytes]:
        """``(manifest_json, payload)``: the contents of the ``.json`` and ``.npz`` files."""
        return self.manifest.to_json(), self.payload

    @classmethod
    def from_bytes(cls, manifest_json: bytes, payload: bytes, kind: str | None = None) -> Artifact:
        """Parse and verify an artifact; ``kind`` (if given) must match the manifest's."""
        manifest = Manifest.from_json(manifest_json)
        return _open(manifest, payload, kind)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Artifact):
            return NotImplemented
        return self.manifest == other.manifest and self.payload == other.payload

    __hash__ = None  # the manifest holds dicts

    def __repr__(self) -> str:
        names = list(self.arrays)
        return f"Artifact(kind={self.kind!r}, version={self.version}, sha256={self.sha256[:12]!r}..., arrays={names})"


def _verify_payload(manifest: Manifest, payload: bytes) -> None:
    if len(payload) != manifest.payload_size:
        raise ArtifactError(_size_mismatch(manifest.payload_size, len(payload)))
    actual = hashlib.sha256(payload).hexdigest()
    if actual != manifest.payload_sha256:
        raise ArtifactError(
            f"payload sha256 mismatch: manifest says {manifest.payload_sha256}, payload is {actual}; refusing to load"
        )


def _size_mismatch(expected: int, actual: int) -> str:
    return (
        f"payload size mismatch: manifest says {expected} bytes, payload is {actual} bytes "
        "(truncated or padded); refusing to load"
    )


def _check_expected_kind(manifest: Manifest, kind: str | None) -> None:
    if kind is not None and manifest.kind != kind:
        raise ArtifactError(f"expected an artifact of kind {kind!r}, got kind {manifest.kind!r}")


def _verify_arrays(manifest: Manifest, arrays: Mapping[str, np.ndarray]) -> None:
    listed = [info.name for info in manifest.arrays]
    if list(arrays) != listed:
        raise ArtifactError(f"payload holds arrays {list(arrays)}, the manifest lists {listed}; refusing to load")
    for info in manifest.arrays:
        actual = ArrayInfo.of(info.name, arrays[info.name])
        if actual != info:
            raise ArtifactError(
                f"array {info.name!r} is {actual.dtype} {actual.shape} in the payload, but the manifest "
                f"says {info.dtype} {info.shape}; refusing to load"
            )


PARAMETERS_ARRAY = "__parameters__"
"""The payload array holding the sealed parameters: every payload has it, no kind declares it."""


def _seal(parameters: Mapping[str, Any]) -> np.ndarray:
    """The parameters as canonical JSON in a 0-d string array, so the payload hash covers them.

    Estimators rebuild their behaviour from ``parameters`` (a plan's repair amount, its
    out-of-range policy); without the seal, editing the manifest would change what an artifact
    does while its payload hash still verified.
    """
    return np.array(json.dumps(parameters, sort_keys=True, separators=(",", ":"), allow_nan=False))


def _verify_sealed_parameters(manifest: Manifest, arrays: Mapping[str, np.ndarray]) -> None:
    if PARAMETERS_ARRAY not in arrays:
        raise ArtifactError(f"payload has no sealed parameters ({PARAMETERS_ARRAY!r}); refusing to load")
    if json.loads(str(arrays[PARAMETERS_ARRAY])) != manifest.parameters:
        raise ArtifactError("manifest parameters differ from the parameters sealed in the payload; refusing to load")


def _open(manifest: Manifest, payload: bytes, kind: str | None) -> Artifact:
    """Check kind, size and hash, and only then parse the payload."""
    _check_expected_kind(manifest, kind)
    _verify_payload(manifest, payload)
    return Artifact(manifest, _read_npz(payload), payload)


def _read_npz(payload: bytes) -> dict[str, np.ndarray]:
    try:
        loaded = np.load(io.BytesIO(payload), allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise ArtifactError("payload is not an npz archive; refusing to load")
        with loaded as archive:
            return {name: archive[name] for name in archive.files}
    except ArtifactError:
        raise
    except (ValueError, OSError, EOFError, KeyError, MemoryError, zipfile.BadZipFile) as exc:
        # np.load raises ValueError for object arrays *before* unpickling anything.
        raise ArtifactError(f"unreadable artifact payload: {exc}; refusing to load") from None


# ---------------------------------------------------------------------------------------------
# building


def pack(
    kind: str,
    arrays: Mapping[str, Any],
    parameters: Mapping[str, Any],
    metrics: Mapping[str, Any] | None = None,
    data_fingerprint: str | None = None,
    version: int = 1,
    created: datetime | str | None = None,
    compress: bool = False,
    extra: Mapping[str, Any] | None = None,
) -> Artifact:
    """Freeze arrays and their configuration into an artifact.

    ``parameters`` and ``metrics`` must be JSON-serialisable (numpy scalars are converted; NaN and
    inf are refused, the manifest is strict JSON). Arrays are copied to C order. The payload bytes
    are deterministic for a given numpy version: zip timestamps are pinned to 1980-01-01, unlike
    ``np.savez``, which stamps the current time. With ``compress=True`` they also depend on zlib.
    ``created`` defaults to now (UTC); pass it to make the manifest reproducible too.

    >>> import numpy as np
    >>> a = pack("plan", {"q": np.arange(3)}, {"k": 3}, created="2024-01-01T00:00:00Z")
    >>> b = pack("plan", {"q": np.arange(3)}, {"k": 3}, created="2024-01-01T00:00:00Z")
    >>> a == b, a.to_bytes() == b.to_bytes()
    (True, True)
    """
    if PARAMETERS_ARRAY in arrays:
        raise ArtifactError(f"array name {PARAMETERS_ARRAY!r} is reserved for the sealed parameters")
    parameters = _json_clean(parameters, "parameters")
    plain = _plain_arrays({**arrays, PARAMETERS_ARRAY: _seal(parameters)})
    payload = _write_npz(plain, compress)
    manifest = Manifest(
        kind=kind,
        version=version,
        created=_format_created(created),
        parameters=parameters,
        metrics=_json_clean(metrics or {}, "metrics"),
        data_fingerprint=data_fingerprint,
        payload_sha256=hashlib.sha256(payload).hexdigest(),
        payload_size=len(payload),
        arrays=tuple(ArrayInfo.of(name, array) for name, array in plain.items()),
        extra=_json_clean(extra or {}, "extra"),
    )
    return Artifact(manifest, plain, payload)


def with_version(artifact: Artifact, version: int) -> Artifact:
    """A copy with another version number; the payload and its sha256 are unchanged.

    >>> import numpy as np
    >>> art = pack("plan", {"q": np.arange(3)}, {})
    >>> bumped = with_version(art, 2)
    >>> bumped.version, bumped.sha256 == art.sha256
    (2, True)
    """
    manifest = dataclasses.replace(artifact.manifest, version=version)
    return Artifact(manifest, artifact.arrays, artifact.payload)


def _plain_arrays(arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
    if not isinstance(arrays, Mapping):
        raise ArtifactError(f"arrays must be a mapping of name -> array, got {type(arrays).__name__}")
    plain = {}
    for name, value in arrays.items():
        _check_array_name(name)
        # A C-ordered private copy: equal values give equal payloads, and later edits to the
        # caller's array cannot drift away from the hashed bytes. (np.array keeps 0-d arrays 0-d.)
        array = np.array(value, order="C", copy=True)
        _check_dtype_kind(name, array.dtype.kind)
        plain[name] = array
    return plain


def _write_npz(arrays: Mapping[str, np.ndarray], compress: bool) -> bytes:
    """The ``np.savez`` format, but with fixed zip metadata so equal arrays give equal bytes."""
    compression = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=compression) as archive:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(name + ".npy", date_time=_ZIP_EPOCH)
            info.compress_type = compression
            info.create_system = 3  # ZipInfo defaults to the host OS; pin it to "unix"
            info.external_attr = 0o644 << 16
            with archive.open(info, "w", force_zip64=True) as member:  # np.savez also forces zip64
                np.lib.format.write_array(member, array, allow_pickle=False)
    return buffer.getvalue()


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} {value!r} is not JSON-serialisable")


def _json_clean(value: Any, name: str) -> Any:
    """``value`` as it will read back from the manifest (tuples become lists, numpy scalars numbers)."""
    try:
        return json.loads(json.dumps(value, allow_nan=False, default=_json_default))
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"{name} must be strict JSON (no NaN/inf, no arbitrary objects): {exc}") from None


def _format_created(created: datetime | str | None) -> str:
    if created is None:
        created = datetime.now(timezone.utc)
    if isinstance(created, datetime):
        if created.tzinfo is None:
            raise ArtifactError("'created' must be timezone-aware (a naive datetime is ambiguous)")
        return created.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return _check_created(created)


# ---------------------------------------------------------------------------------------------
# files


def save(artifact: Artifact, path: str | os.PathLike) -> Path:
    """Write ``<name>.json`` and ``<name>.npz`` atomically; return the manifest's path.

    ``path`` is an existing directory (the name is then ``<kind>-v<version>``) or the file name,
    with or without the ``.json``/``.npz`` suffix. The payload is written before the manifest, so a
    reader never pairs a new manifest with an old payload; the reverse pairing, possible for an
    instant while overwriting, is refused by the hash check.

    Parameters
    ----------
    artifact : Artifact
        The artifact to write.
    path : str or os.PathLike
        An existing directory, or the file name with or without the ``.json``/``.npz`` suffix.

    Returns
    -------
    pathlib.Path
        The path of the written manifest (``.json``).

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> art = pack("plan", {"q": np.arange(3)}, {})
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     print(save(art, tmp).name, load(tmp + "/plan-v1", kind="plan") == art)
    plan-v1.json True
    """
    target = Path(path)
    if target.is_dir():
        target = target / f"{artifact.kind}-v{artifact.version}"
    manifest_path, payload_path = _file_pair(target)
    manifest_path.parent.mkdir(parents=True, exist_ok=True)
    manifest_json, payload = artifact.to_bytes()
    atomic_write(payload_path, payload)
    atomic_write(manifest_path, manifest_json)
    return manifest_path


def load(path: str | os.PathLike, kind: str | None = None) -> Artifact:
    """Read an artifact written by :func:`save`, verifying size and sha256 before parsing the payload.

    ``path`` may name the ``.json``, the ``.npz`` or their common stem. ``kind`` (if given) must
    match the manifest's, so a scorer is never loaded where a plan is expected.

    Parameters
    ----------
    path : str or os.PathLike
        The ``.json``, the ``.npz`` or their common stem.
    kind : str or None, default=None
        The expected artifact kind; None accepts any kind.

    Returns
    -------
    Artifact
        The verified artifact, its arrays read-only.
    """
    manifest_path, payload_path = _file_pair(Path(path))
    manifest_json, size = _read_file(manifest_path, "manifest", _MAX_MANIFEST_BYTES)
    if size > _MAX_MANIFEST_BYTES:
        raise ArtifactError(f"artifact manifest {manifest_path} is {size} bytes, over the {_MAX_MANIFEST_BYTES} limit")
    manifest = Manifest.from_json(manifest_json)
    _check_expected_kind(manifest, kind)
    payload, size = _read_file(payload_path, "payload", manifest.payload_size)
    if size != manifest.payload_size:  # checked on the file size, before reading a wrong-sized file
        raise ArtifactError(_size_mismatch(manifest.payload_size, size))
    return _open(manifest, payload, kind)


def _file_pair(path: Path) -> tuple[Path, Path]:
    stem = path.with_suffix("") if path.suffix in (".json", ".npz") else path
    return stem.with_name(stem.name + ".json"), stem.with_name(stem.name + ".npz")


def _read_file(path: Path, what: str, max_size: int) -> tuple[bytes, int]:
    """The file's bytes, or only its size if it is over ``max_size`` (refused without reading it)."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            return (handle.read() if size <= max_size else b""), size
    except FileNotFoundError:
        raise ArtifactError(f"artifact {what} file not found: {path}") from None


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never half of one."""
    # A temp file in the same directory, then os.replace: readers see the old file or the new one,
    # never a half-written one.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; workers running as other users must read it
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------------------------------------
# one blob (one Kafka message)


def encode(artifact: Artifact) -> bytes:
    """The artifact as one blob: magic, manifest length (uint32 BE), manifest JSON, payload.

    >>> import numpy as np
    >>> art = pack("flow", {"w": np.ones((2, 2), dtype=np.float32)}, {"layers": 1})
    >>> decode(encode(art)) == art
    True
    """
    manifest_json, payload = artifact.to_bytes()
    return _BLOB_MAGIC + _BLOB_LENGTH.pack(len(manifest_json)) + manifest_json + payload


def decode(blob: bytes, kind: str | None = None) -> Artifact:
    """Parse a blob from :func:`encode`, with the same checks as :func:`load`."""
    blob = bytes(blob)
    header = len(_BLOB_MAGIC) + _BLOB_LENGTH.size
    if not blob.startswith(_BLOB_MAGIC):
        raise ArtifactError("not a fairstream artifact blob (bad magic header)")
    if len(blob) < header:
        raise ArtifactError(f"truncated artifact blob: {len(blob)} bytes, shorter than its {header}-byte header")
    (manifest_size,) = _BLOB_LENGTH.unpack_from(blob, len(_BLOB_MAGIC))
    if manifest_size > _MAX_MANIFEST_BYTES:
        raise ArtifactError(f"artifact manifest is {manifest_size} bytes, over the {_MAX_MANIFEST_BYTES} limit")
    if len(blob) < header + manifest_size:
        raise ArtifactError(
            f"truncated artifact blob: the header announces a {manifest_size}-byte manifest, "
            f"only {len(blob) - header} bytes follow"
        )
    manifest = Manifest.from_json(blob[header:header + manifest_size])
    return _open(manifest, blob[header + manifest_size:], kind)


# ---------------------------------------------------------------------------------------------
# fingerprints


def fingerprint_arrays(*arrays: Any) -> str:
    """sha256 hex over the dtype, shape and bytes of each array, in order.

    Used as the fingerprint of fit data and of plans. Memory layout and byte order do not change
    it (arrays are hashed C-ordered, little-endian); values, dtype, shape and order do.

    >>> import numpy as np
    >>> x = np.arange(6.0).reshape(2, 3)
    >>> fingerprint_arrays(x) == fingerprint_arrays(np.asfortranarray(x))
    True
    >>> fingerprint_arrays(x, x[0]) == fingerprint_arrays(x[0], x)
    False
    """
    digest = hashlib.sha256(b"fairstream.fingerprint/1\n")
    for position, value in enumerate(arrays):
        array = np.asarray(value)
        _check_dtype_kind(f"#{position}", array.dtype.kind)
        array = array.astype(array.dtype.newbyteorder("<"), copy=False)
        # The byte count in the header frames each array, so ([1, 2], [3]) != ([1], [2, 3]).
        digest.update(f"{array.dtype.str}|{array.shape}|{array.nbytes}\n".encode("ascii"))
        digest.update(array.tobytes(order="C"))
    return digest.hexdigest()
