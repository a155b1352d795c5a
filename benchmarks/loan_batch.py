"""The loan section of ``benchmarks/batch_logic.py`` (issue 31): a team's own records against fairstream's envelope.

Every contestant serves the same fitted plan (``loan_records.loan_plan``) on the same applications, 1,000-record
batches of confluent-kafka messages; CPU us a record of this thread (median over the batches, then the median of
``ROUNDS`` rounds that alternate the contestants, since the machine's load drifts): decode, chain (``apply_chain``),
encode, and total (``RecordRepairer.process``: decode, chain, encode, output keys and budget, routes, monitor arrays).
"""

from __future__ import annotations

import hashlib
import io
import json
import statistics
import struct
import tempfile

import msgspec
import numpy as np

from fairstream.repair.protocol import apply_chain
from fairstream.streams.codec.mapped import MappedRecords
from fairstream.streams.codec.records import decode_records
from fairstream.streams.codec.repaired import encode_repaired, provenance
from fairstream.streams.control.registry import Active
from fairstream.streams.worker.processing import RecordRepairer
from loan_records import LOAN_TOPIC, avro_schema, loan_config, loan_plan, loan_record, messages

BATCH = 1000
ROUNDS = 3
PASS_THROUGH_TARGET_US = 2.0
SIZES = (("loan", "loan"), ("loan2k", "loan + 40 fields"))


class Contestant:
    """One row: how a batch is decoded and encoded, and the whole batch logic (None where it cannot run)."""

    def __init__(self, label, batches, decode, encode, process=None):
        self.label, self.batches, self.decode, self.encode, self.process = label, batches, decode, encode, process
        self.size = statistics.mean(len(m.value()) for m in batches[0])
        self.times: dict[str, list[float]] = {"decode": [], "chain": [], "encode": [], "total": []}

    def measure(self, module, per_record_us) -> None:
        decoded = {id(b): self.decode(b) for b in self.batches}
        applied = {id(b): apply_chain([module], decoded[id(b)].batch()) for b in self.batches}
        self.times["decode"].append(per_record_us(self.decode, self.batches))
        self.times["chain"].append(per_record_us(lambda b: apply_chain([module], decoded[id(b)].batch()),
                                                 self.batches))
        self.times["encode"].append(per_record_us(lambda b: self.encode(decoded[id(b)], applied[id(b)]),
                                                  self.batches))
        if self.process is not None:
            self.times["total"].append(per_record_us(self.process, self.batches))
        else:  # the parts alone
            self.times["total"].append(sum(self.times[part][-1] for part in ("decode", "chain", "encode")))

    def us(self, part: str) -> float:
        return statistics.median(self.times[part])


def _batches(pairs, topic, kafka_messages) -> list:
    found = kafka_messages(pairs, topic)
    return [found[i:i + BATCH] for i in range(0, len(found), BATCH)]


def _ok_rows(applied) -> list[int]:
    return np.flatnonzero(applied.ok).tolist()


def envelope(n, active, prov, kafka_messages) -> Contestant:
    config = loan_config(mapped=False)
    agent = RecordRepairer(config)
    return Contestant(
        "envelope (JSON), today", _batches(messages(n, "envelope"), config.topics.records_in, kafka_messages),
        lambda b: decode_records([m.value() for m in b], config),
        lambda d, a: encode_repaired(d.fields, d.X, a.X, config, prov),
        lambda b: agent.process(b, active))


def json_loans(kind, label, repaired, n, active, prov, kafka_messages) -> Contestant:
    config = loan_config(repaired=repaired)
    agent, codec = RecordRepairer(config), MappedRecords(config)

    def encode(d, a):
        rows = _ok_rows(a)
        return codec.encode(d, rows, a.X[rows], prov)
    return Contestant(f"JSON {repaired}, {label}", _batches(messages(n, kind), LOAN_TOPIC, kafka_messages),
                      lambda b: codec.decode([m.value() for m in b], [m.key() for m in b]), encode,
                      lambda b: agent.process(b, active))


# --------------------------------------------------------------------------- Avro


def start_registry(stack) -> str:
    """A real Apicurio Registry for the run (its Confluent API url), stopped when ``stack`` closes."""
    from fairstream.streams.ops.schema_registry import SchemaRegistry

    registry = SchemaRegistry(stack.enter_context(tempfile.TemporaryDirectory(prefix="fairstream-registry-")))
    stack.enter_context(registry)
    return registry.url


def avro_registry(kind, label, repaired, n, active, prov, kafka_messages, url) -> Contestant:
    """Loans in the Confluent wire format, registered by confluent-kafka's AvroSerializer as a producer does, read
    and written by the worker's AvroFormat (and the whole RecordRepairer once the Avro wiring is in the worker)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from fairstream.streams.codec.avro import AvroFormat, schema_id

    topic = f"bench-{kind}-{repaired}-{id(prov) % 10_000}"
    config = loan_config(repaired=repaired, fmt="avro", registry_url=url,
                         topics={"input": topic, "output": f"{topic}.fair"})
    records = [json.loads(value) for _, value in messages(n, kind)]
    producer = AvroSerializer(SchemaRegistryClient({"url": url}), json.dumps(avro_schema(records[0])))
    context = SerializationContext(topic, MessageField.VALUE)
    pairs = [(r["application_id"].encode(), producer(r, context)) for r in records]
    agent, codec = RecordRepairer(config), MappedRecords(config)
    avro = getattr(agent, "avro", None)
    wired = avro is not None
    avro = avro if wired else AvroFormat.for_config(config)
    input_id = schema_id(pairs[0][1])

    def decode(b):
        values = [m.value() for m in b]
        return codec.decode_objects(avro.deserialize(values), [m.key() for m in b], values)

    def encode(d, a):
        rows = _ok_rows(a)
        objects = [obj for _, obj in codec.repaired_objects(d, rows, a.X[rows], prov)[0]]
        return avro.serialize(objects, [input_id] * len(objects))
    return Contestant(f"Avro {repaired}, {label}", _batches(pairs, topic, kafka_messages), decode, encode,
                      (lambda b: agent.process(b, active)) if wired else None)


def avro_schemaless(kind, label, repaired, n, active, prov, kafka_messages) -> Contestant:
    """The same records in the same framing, read and written by fastavro's schemaless reader and writer (what
    confluent-kafka's serializers call) in place of AvroFormat's calls: no registry."""
    import fastavro

    from fairstream.streams.codec.avro import output_schema

    config = loan_config(repaired=repaired)
    records = [json.loads(value) for _, value in messages(n, kind)]
    schema = avro_schema(records[0])
    reader = fastavro.parse_schema(schema)
    paths = [config.mapping.feature(name).path for name in config.features] if repaired == "in_place" else []
    writer = fastavro.parse_schema(output_schema(schema, ("fairstream",), paths))
    header = b"\x00" + struct.pack(">I", 1)

    def framed(record, parsed) -> bytes:
        buffer = io.BytesIO()
        buffer.write(header)
        fastavro.schemaless_writer(buffer, parsed, record)
        return buffer.getvalue()

    pairs = [(r["application_id"].encode(), framed(r, reader)) for r in records]
    codec = MappedRecords(config)

    def decode(b):
        values = [m.value() for m in b]
        objects = [fastavro.schemaless_reader(io.BytesIO(memoryview(v)[5:]), reader, reader) for v in values]
        return codec.decode_objects(objects, [m.key() for m in b], values)

    def encode(d, a):
        rows = _ok_rows(a)
        out = []
        for _, obj in codec.repaired_objects(d, rows, a.X[rows], prov)[0]:
            obj["fairstream"]["provenance"] = json.dumps(obj["fairstream"]["provenance"], separators=(",", ":"),
                                                         sort_keys=True)
            out.append(framed(obj, writer))
        return out
    return Contestant(f"Avro {repaired}, {label}", _batches(pairs, LOAN_TOPIC, kafka_messages), decode, encode)


# --------------------------------------------------------------------------- the report


def loan_report(n_batches: int, avro_mode: str, registry_url: str, per_record_us, kafka_messages) -> None:
    import contextlib

    module = loan_plan()
    active = Active("plan", 1, "0" * 64, None, module)
    prov = provenance([("plan", 1, "0" * 64, module.seed)])
    n = BATCH * max(3, min(n_batches, 10))  # 10,000 records a contestant at most: ~19 MB of 2 KB records each
    with contextlib.ExitStack() as stack:
        base = envelope(n, active, prov, kafka_messages)
        groups = {"JSON": [json_loans(kind, label, mode, n, active, prov, kafka_messages)
                           for mode in ("under", "in_place") for kind, label in SIZES]}
        avro_note = ""
        if avro_mode == "registry":
            try:
                url = registry_url or start_registry(stack)
                groups["Avro"] = [avro_registry(kind, label, mode, n, active, prov, kafka_messages, url)
                                  for mode in ("under", "in_place") for kind, label in SIZES]
                wired = groups["Avro"][0].process is not None
                avro_note = (f"Avro: a real schema registry ({'given' if registry_url else 'Apicurio, started for the run'}"
                             f", {url}), confluent-kafka's AvroSerializer/AvroDeserializer through AvroFormat" +
                             ("; total: RecordRepairer.process" if wired else
                              "; the worker does not read Avro yet: total is decode + chain + encode"))
            except Exception as exc:  # noqa: BLE001 - no registry here: say so and measure fastavro's calls
                avro_note = f"Avro: no schema registry could be used ({type(exc).__name__}: {str(exc)[:120]}); "
                avro_mode = "fastavro"
        if avro_mode == "fastavro":
            groups["Avro"] = [avro_schemaless(kind, label, mode, n, active, prov, kafka_messages)
                              for mode in ("under", "in_place") for kind, label in SIZES]
            avro_note += ("Avro: fastavro schemaless reader/writer on the same records (no registry); "
                          "total is decode + chain + encode")
        contestants = [base, *(c for group in groups.values() for c in group)]
        for _ in range(ROUNDS):
            for contestant in contestants:
                contestant.measure(module, per_record_us)
        digest = {kind: per_record_us(lambda b: [hashlib.sha256(m.value()).hexdigest()[:32] for m in b], batches)
                  for kind, batches in (("loan", groups["JSON"][0].batches), ("loan2k", groups["JSON"][1].batches))}
        skip = {kind: per_record_us(lambda b: list(map(_SKIP.decode, [m.value() for m in b])), batches)
                for kind, batches in (("loan", groups["JSON"][0].batches), ("loan2k", groups["JSON"][1].batches))}

    print(f"a team's own topic (issue 31): the loan records through the plan, {BATCH}-record batches, CPU us/record "
          f"(median of {ROUNDS} alternated rounds of the median over {n // BATCH} batches):")
    print(f"  {'':34}{'bytes':>7}{'decode':>8}{'chain':>8}{'encode':>8}{'total':>8}{'x envelope':>12}")
    for c in contestants:
        print(f"  {c.label:34}{c.size:7.0f}{c.us('decode'):8.2f}{c.us('chain'):8.2f}{c.us('encode'):8.2f}"
              f"{c.us('total'):8.2f}{c.us('total') / base.us('total'):12.2f}")
    print(f"  {avro_note}")
    print(f"pass-through of 40 fields (~{groups['JSON'][1].size - groups['JSON'][0].size:.0f} more bytes a record), "
          "total of the loan record with them minus without, same mode:")
    for name, group in groups.items():
        for small, large in (group[0:2], group[2:4]):
            added = large.us("total") - small.us("total")
            verdict = "" if name != "JSON" else (f"   target <= {PASS_THROUGH_TARGET_US:.1f}: "
                                                 f"{'met' if added <= PASS_THROUGH_TARGET_US else 'MISSED'}")
            print(f"  {name} {small.label.split(',')[0].split()[-1]:<9} +{added:5.2f} us  (decode "
                  f"+{large.us('decode') - small.us('decode'):.2f}, encode +{large.us('encode') - small.us('encode'):.2f})"
                  f"{verdict}")
    print(f"  what any input of that size pays: its sha256 input_digest +{digest['loan2k'] - digest['loan']:.2f} us; "
          f"msgspec reading past the fields it skips +{skip['loan2k'] - skip['loan']:.2f} us")


class _Id(msgspec.Struct):
    application_id: str


_SKIP = msgspec.json.Decoder(_Id)  # one field read, every other skipped: the floor of a typed decode of a record
