"""Avro records with a schema registry (``[topics] format = "avro"``): the Confluent wire format, both ways.

Wire format: a magic byte 0, the writer schema's id (4 bytes, big-endian), the Avro binary body
(the Confluent Schema Registry framing). Reading, the writer schema is fetched from the registry by
its id (once per id); a message that is not in this framing, names an id the registry does not know,
or whose body does not decode, becomes an exception with a one-line reason (the worker dead-letters
it with its original bytes), never an error for the batch. A registry that cannot be reached is not
the message's fault: that raises (:class:`RegistryUnavailable`).

Writing, each input schema gets one output schema (:func:`output_schema`): the input record with the
repaired features widened to ``double`` and one optional field at ``[output] field`` holding what
fairstream adds (:data:`ADDED_FIELDS`), every added field optional, so the output subject
``<output topic>-value`` evolves as the input does under BACKWARD compatibility (set on the subject
before the first registration). A producer that adds an optional field mid-stream gets a new output
schema that keeps it. Provenance is written as JSON text: its shape (one entry per kind of a chain that
changes at any hot swap) would otherwise change the output schema with the chain. The serializers are
confluent-kafka's (``AvroSerializer``/``AvroDeserializer`` over fastavro).

>>> avro = AvroFormat("http://127.0.0.1:8081", "loans", "loans.repaired")  # doctest: +SKIP
>>> objects = avro.deserialize(values)  # doctest: +SKIP
>>> avro.serialize(outputs, [schema_id(value) for value in kept_values])  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import json
import struct
import threading
from typing import Any, Sequence

MAGIC_BYTE = 0
HEADER_BYTES = 5  # the magic byte and the 4-byte schema id
COMPATIBILITY = "BACKWARD"
_MISSING_SCHEMA = 404  # the registry's answer to an unknown schema id

ADDED_FIELDS: tuple[tuple[str, Any], ...] = (
    ("original", {"type": "map", "values": ["null", "double"]}),
    ("features", {"type": "map", "values": "double"}),
    ("score", "double"),
    ("decision", "int"),
    ("s_imputed", "boolean"),
    ("input_digest", "string"),
    ("provenance", "string"),
)
"""What fairstream may add under ``[output] field``, each optional (null by default): the original values of
features repaired in place, the repaired features (``repaired = "under"``), the score and decision of the chain,
whether s was imputed, the sha256 of the input message, and the provenance as JSON text."""
ADDED_RECORD = "FairstreamOutput"
_NUMERIC = ("int", "long", "float", "double")


class AvroError(ValueError):
    """An Avro schema fairstream cannot derive an output from, or an output schema the registry refused."""


class RegistryUnavailable(RuntimeError):
    """The schema registry could not be asked (connection refused, timeout, a 5xx): not a message's fault."""


def schema_id(value: bytes) -> int:
    """The writer schema id of a message in the Confluent framing (its caller checked the framing).

    >>> schema_id(bytes([0, 0, 0, 1, 2, 42]))
    258
    """
    return struct.unpack_from(">I", value, 1)[0]


def framing_problem(value: bytes | None) -> str | None:
    """Why ``value`` is not in the Confluent framing, or None if it is.

    >>> framing_problem(b'{"id": 1}')
    'not Confluent Avro: first byte 0x7b, expected the magic byte 0x00'
    """
    if value is None:
        return "not Confluent Avro: the message has no value (a tombstone)"
    if len(value) <= HEADER_BYTES:
        return f"not Confluent Avro: {len(value)} bytes, fewer than the 6 of a magic byte, a schema id and a body"
    if value[0] != MAGIC_BYTE:
        return f"not Confluent Avro: first byte 0x{value[0]:02x}, expected the magic byte 0x00"
    return None


# --------------------------------------------------------------------------- the output schema


def output_schema(input_schema: dict, output_path: Sequence[str] = ("fairstream",),
                  repaired_paths: Sequence[Sequence[str]] = ()) -> dict:
    """The output record schema of an input record schema.

    Parameters
    ----------
    input_schema : dict
        The input's Avro record schema (parsed JSON).
    output_path : sequence of str
        ``[output] field`` as keys: the optional record of :data:`ADDED_FIELDS` goes there (records on the way
        are created, optional, when the input has none).
    repaired_paths : sequence of paths
        Fields whose values are replaced by repaired ones (``repaired = "in_place"``): a numeric type there
        becomes ``double`` (an int read as a double is a promotion Avro allows, so readers of the input
        schema's data still read the output's).

    Returns
    -------
    dict
        The input schema with those changes; every field it had, in its order.

    >>> loan = {"type": "record", "name": "Loan", "fields": [{"name": "amount", "type": "int"}]}
    >>> out = output_schema(loan, repaired_paths=[("amount",)])
    >>> [(f["name"], f["type"] if f["name"] == "amount" else f["default"]) for f in out["fields"]]
    [('amount', 'double'), ('fairstream', None)]
    """
    if not isinstance(input_schema, dict) or input_schema.get("type") != "record":
        raise AvroError(f"the input schema must be an Avro record, got {json.dumps(input_schema)[:200]}")
    schema = copy.deepcopy(input_schema)
    for path in repaired_paths:
        _widen(schema, tuple(path))
    _add_output_field(schema, tuple(output_path))
    return schema


def _added_record() -> dict:
    return {"type": "record", "name": ADDED_RECORD, "namespace": "io.fairstream",
            "fields": [{"name": name, "type": ["null", kind], "default": None} for name, kind in ADDED_FIELDS]}


def _record_of(field_type) -> dict | None:
    """The record a field holds: the type itself, or the one record branch of a union (e.g. ``["null", record]``)."""
    if isinstance(field_type, dict) and field_type.get("type") == "record":
        return field_type
    if isinstance(field_type, list):
        records = [branch for branch in field_type if isinstance(branch, dict) and branch.get("type") == "record"]
        return records[0] if len(records) == 1 else None
    return None


def _field(record: dict, name: str) -> dict | None:
    return next((field for field in record["fields"] if field["name"] == name), None)


def _widen(record: dict, path: tuple[str, ...]) -> None:
    """The numeric type at ``path`` becomes double (keeping a union's other branches); a path the schema does not
    hold is left alone: records lacking it are dead-lettered by the mapping."""
    for key in path[:-1]:
        inner = _field(record, key)
        record = _record_of(inner["type"]) if inner is not None else None
        if record is None:
            return
    field = _field(record, path[-1])
    if field is None:
        return
    kind = field["type"]
    if kind in _NUMERIC:
        field["type"] = "double"
    elif isinstance(kind, list) and any(branch in _NUMERIC for branch in kind):
        branches = [branch for branch in kind if branch not in _NUMERIC]
        branches.insert(next(i for i, branch in enumerate(kind) if branch in _NUMERIC), "double")
        field["type"] = branches
        if field.get("default") is not None and not isinstance(field["default"], (int, float)):
            field.pop("default")  # a default must match the first branch; a numeric one still does


def _add_output_field(record: dict, path: tuple[str, ...]) -> None:
    """The optional :data:`ADDED_RECORD` at ``path``; an input field of that name is replaced (re-processed outputs)."""
    for depth, key in enumerate(path[:-1]):
        inner = _field(record, key)
        nested = _record_of(inner["type"]) if inner is not None else None
        if nested is None:
            if inner is not None:
                raise AvroError(f"output field {'.'.join(path)}: the input field {'.'.join(path[:depth + 1])} is "
                                f"not a record, so nothing can be written under it")
            nested = {"type": "record", "name": f"{ADDED_RECORD}_{'_'.join(path[:depth + 1])}",
                      "namespace": "io.fairstream", "fields": []}
            record["fields"].append({"name": key, "type": ["null", nested], "default": None})
        record = nested
    field = {"name": path[-1], "type": ["null", _added_record()], "default": None}
    existing = _field(record, path[-1])
    if existing is None:
        record["fields"].append(field)
    else:
        record["fields"][record["fields"].index(existing)] = field


# --------------------------------------------------------------------------- the format


class AvroFormat:
    """Avro in the Confluent wire format on the input and output topics, with a Confluent-compatible registry.

    Parameters
    ----------
    registry_url : str
        The registry's base URL (``[schema_registry] url``); for Apicurio Registry ``.../apis/ccompat/v7``.
    input_topic, output_topic : str
        The topics; the output schema is registered under ``<output_topic>-value``.
    output_field : sequence of str
        ``[output] field`` as keys (see :func:`output_schema`).
    repaired_paths : sequence of paths
        The feature paths repaired in place (empty when ``repaired = "under"``).
    client : SchemaRegistryClient, optional
        A client to share; default one of its own on ``registry_url``.
    """

    def __init__(self, registry_url: str, input_topic: str, output_topic: str,
                 output_field: Sequence[str] = ("fairstream",), repaired_paths: Sequence[Sequence[str]] = (),
                 client=None):
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroDeserializer

        self.input_topic, self.output_topic = input_topic, output_topic
        self.output_field = tuple(output_field)
        self.repaired_paths = tuple(tuple(path) for path in repaired_paths)
        self.client = client if client is not None else SchemaRegistryClient({"url": registry_url})
        self._deserializer = AvroDeserializer(self.client)
        self._serializers: dict[int, Any] = {}  # input schema id -> its output's serializer
        self._lock = threading.Lock()  # one worker thread per input shares the format
        self._compatibility_set = False

    @classmethod
    def for_config(cls, config) -> "AvroFormat":
        """The format of a pipeline with ``[topics] format = "avro"`` and a ``[mapping]``.

        Parameters
        ----------
        config : PipelineConfig
            Its ``[schema_registry] url``, topics, ``[output]`` layout and the paths of its mapped features.

        Returns
        -------
        AvroFormat
            The format (its registry client is created, nothing is asked yet).
        """
        in_place = config.output.repaired == "in_place"
        paths = [config.mapping.feature(name).path for name in config.features] if in_place else []
        return cls(config.schema_registry.url, config.topics.records_in, config.topics.records_repaired,
                   output_field=config.output.path, repaired_paths=paths)

    @property
    def subject(self) -> str:
        """The output schema's subject (TopicNameStrategy)."""
        return f"{self.output_topic}-value"

    # --- reading

    def deserialize(self, values: Sequence[bytes | None]) -> list[dict | Exception]:
        """Each message as a dict, or an exception whose one-line message says why it cannot be read.

        Raises :class:`RegistryUnavailable` only when the registry cannot be asked (the batch is then not
        processed: no record is dead-lettered for the registry's outage).
        """
        return [self._deserialize_one(value) for value in values]

    def _deserialize_one(self, value: bytes | None) -> dict | Exception:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        problem = framing_problem(value)
        if problem is not None:
            return AvroError(problem)
        try:
            record = self._deserializer(value)
        except SchemaRegistryError as exc:
            if exc.http_status_code == _MISSING_SCHEMA:
                return AvroError(f"schema id {schema_id(value)} is unknown to the schema registry")
            raise RegistryUnavailable(f"the schema registry failed on schema id {schema_id(value)}: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - whatever a body makes fastavro raise is that message's reason
            if _is_transport_error(exc):
                raise RegistryUnavailable(f"the schema registry cannot be reached: {exc}") from exc
            return AvroError(f"Avro body does not decode with schema id {schema_id(value)}: "
                             f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
        if not isinstance(record, dict):
            return AvroError(f"schema id {schema_id(value)} is not an Avro record schema")
        return record

    def input_schema(self, input_id: int) -> dict:
        """The input schema registered under ``input_id`` (parsed; the client caches it)."""
        return json.loads(self.client.get_schema(input_id).schema_str)

    # --- writing

    def output_schema(self, input_schema: dict) -> dict:
        """The output schema of ``input_schema`` under this format's layout (:func:`output_schema`)."""
        return output_schema(input_schema, self.output_field, self.repaired_paths)

    def register_output(self, input_id: int) -> int:
        """Register the output schema of input schema ``input_id`` under :attr:`subject` (BACKWARD); its id."""
        from confluent_kafka.schema_registry import Schema

        text = json.dumps(self.output_schema(self.input_schema(input_id)))
        registered = self.client.register_schema(self.subject, Schema(text, "AVRO"))
        if not self._compatibility_set:
            # After the first registration: a registry may know no subject before it (Apicurio answers 404), and
            # the first version of a subject has nothing to be compatible with.
            self.client.set_compatibility(self.subject, COMPATIBILITY)
            self._compatibility_set = True
        return registered

    def serialize(self, objects: Sequence[dict], input_ids: Sequence[int]) -> list[bytes | Exception]:
        """Each output record in the Confluent wire format under the output schema of its input's schema.

        Parameters
        ----------
        objects : sequence of dict
            The output records (input fields kept, what fairstream adds at ``[output] field``).
        input_ids : sequence of int
            The writer schema id of each output's input message (:func:`schema_id`).

        Returns
        -------
        list of bytes or Exception
            The encoded outputs; an output the registry refused the schema of (an input schema change that is
            not BACKWARD-compatible on the output subject), or that does not fit its schema, is an exception
            with a one-line reason (its input is dead-lettered). :class:`RegistryUnavailable` if the registry
            cannot be asked.
        """
        from confluent_kafka.serialization import MessageField, SerializationContext

        context = SerializationContext(self.output_topic, MessageField.VALUE)
        return [self._serialize_one(obj, input_id, context) for obj, input_id in zip(objects, input_ids, strict=True)]

    def _serialize_one(self, obj: dict, input_id: int, context) -> bytes | Exception:
        try:
            serializer = self._serializer_for(input_id)
        except AvroError as exc:
            return exc
        try:
            return serializer(self._with_provenance_text(obj), context)
        except Exception as exc:  # noqa: BLE001 - a value that does not fit the schema is that output's reason
            if _is_transport_error(exc):
                raise RegistryUnavailable(f"the schema registry cannot be reached: {exc}") from exc
            return AvroError(f"the output does not fit the output schema of input schema id {input_id}: "
                             f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}")

    def _serializer_for(self, input_id: int):
        """The serializer of input schema ``input_id``'s output, registering its schema the first time.

        A refusal (the registry's, or an input schema no output can be derived from) is kept, as the serializer
        would be: every later output of that input schema gets the same reason without asking again.
        """
        from confluent_kafka.schema_registry.avro import AvroSerializer

        with self._lock:
            if input_id not in self._serializers:
                try:
                    self.register_output(input_id)
                    text = json.dumps(self.output_schema(self.input_schema(input_id)))
                    # Registered: the serializer's own registration finds it in the client's cache. fastavro's
                    # "strict allow default" (without "strict"): a key the schema has no field for raises instead
                    # of vanishing from the output, and an absent field takes its default.
                    self._serializers[input_id] = AvroSerializer(self.client, text, conf={
                        "validate.strict.allow.default": True})
                except AvroError as exc:
                    self._serializers[input_id] = AvroError(
                        f"no output schema for input schema id {input_id}: {exc}")
                except Exception as exc:
                    self._serializers[input_id] = self._refusal(input_id, exc)
            found = self._serializers[input_id]
        if isinstance(found, AvroError):
            raise found
        return found

    def _refusal(self, input_id: int, exc: Exception) -> AvroError:
        """The reason of a registration the registry refused; raises when it was not the registry's answer."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        if _is_transport_error(exc):
            raise RegistryUnavailable(f"the schema registry cannot be reached: {exc}") from exc
        if not isinstance(exc, SchemaRegistryError):
            raise exc
        if exc.http_status_code is None or exc.http_status_code >= 500:
            raise RegistryUnavailable(f"the schema registry failed: {exc}") from exc
        return AvroError(f"the output schema of input schema id {input_id} was refused under subject "
                         f"{self.subject} ({COMPATIBILITY}): {' '.join(str(exc.error_message).split())[:200]}")

    def _with_provenance_text(self, obj: dict) -> dict:
        """``obj`` with the provenance at ``[output] field`` as JSON text (a copy of the path only)."""
        added = _get(obj, self.output_field)
        if not isinstance(added, dict) or added.get("provenance") is None or isinstance(added["provenance"], str):
            return obj
        text = json.dumps(added["provenance"], separators=(",", ":"), sort_keys=True)
        return _replace(obj, self.output_field, {**added, "provenance": text})


def _get(obj, path: tuple[str, ...]):
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _replace(obj: dict, path: tuple[str, ...], value) -> dict:
    """A copy of ``obj`` along ``path`` with ``value`` at its end (the rest shared, not copied)."""
    if not path:
        return value
    return {**obj, path[0]: _replace(obj[path[0]], path[1:], value)}


def _is_transport_error(exc: Exception) -> bool:
    """True for the registry client's connection and timeout errors (its HTTP client is httpx2 on Python >= 3.10)."""
    import httpx2

    return isinstance(exc, (httpx2.TransportError, ConnectionError, TimeoutError))
