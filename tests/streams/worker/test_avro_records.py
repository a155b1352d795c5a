"""A worker end to end on Avro loan records: a real worker process, Apache Kafka and a real schema registry.

The loan records of issue 31 arrive as a team's producer writes them (Confluent Avro, its schema registered under
``loan-applications-value``) and come out on the output topic as Avro, every field they had, the repaired values in
place with the originals and the provenance; a producer that adds a field mid-stream loses nothing; a message
that is not Avro is dead-lettered with its original bytes and one reason.
"""

from __future__ import annotations

import base64
import json
import time

import numpy as np
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from fairstream.models.plan import DistributionalRepair
from fairstream.streams.codec.avro import schema_id
from fairstream.streams.config import PipelineConfig
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.demo.collect import TopicReader
from fairstream.streams.ops.schema_registry import SchemaRegistry
from fairstream.streams.ops.supervise import WorkerProcess
from fairstream.streams.topics import ensure_topics
from tests.polling import wait_for
from tests.streams.codec.test_avro import LOAN, LOAN_SCHEMA, LOAN_SCHEMA_V2

pytestmark = pytest.mark.integration

INPUT, OUTPUT = "loan-applications", "loan-applications.repaired"


def loan_config(registry_url: str, artifact_dir: str, prefix: str = "avro-loans", input_topic: str = INPUT,
                output_topic: str = OUTPUT) -> PipelineConfig:
    return PipelineConfig.from_dict({
        "pipeline": {"name": "loans", "features": ["age", "income"], "groups": ["female", "male"],
                     "strata": ["north", "south"], "artifact_dir": artifact_dir},
        "topics": {"prefix": prefix, "input": input_topic, "output": output_topic, "format": "avro"},
        "mapping": {"id": "application_id", "time": {"path": "submitted_at", "format": "iso8601"},
                    "s": {"path": "applicant.sex", "values": {"F": "female", "M": "male"}}, "u": "branch",
                    "features": {"age": "applicant.age", "income": "applicant.income"}},
        "schema_registry": {"url": registry_url},
    })


def loans(n: int, prefix: str, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{**LOAN, "application_id": f"{prefix}-{i}",
             "applicant": {"age": int(rng.integers(20, 70)), "income": int(rng.integers(20_000, 120_000)),
                           "sex": "F" if i % 2 else "M"},
             "branch": "north" if i % 3 else "south"} for i in range(n)]


def as_arrays(records: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    X = np.array([[r["applicant"]["age"], r["applicant"]["income"]] for r in records], dtype=float)
    s = np.array(["female" if r["applicant"]["sex"] == "F" else "male" for r in records], dtype=object)
    u = np.array([r["branch"] for r in records], dtype=object)
    return X, s, u


def fitted_plan() -> DistributionalRepair:
    return DistributionalRepair(n_q=50).fit(*as_arrays(loans(4000, "research", seed=1)))


class Topics:
    """The team's producer (confluent-kafka's AvroSerializer) and a reader of the outputs and dead letters."""

    def __init__(self, bootstrap: str, registry_url: str, config: PipelineConfig):
        self.bootstrap, self.config = bootstrap, config
        self.client = SchemaRegistryClient({"url": registry_url})
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        self.deserializer = AvroDeserializer(self.client)

    def send(self, schema: dict, records: list[dict], raw: list[tuple[bytes, bytes]] = ()) -> dict[str, bytes]:
        serializer = AvroSerializer(self.client, json.dumps(schema))
        sent = {}
        for record in records:
            value = serializer(record, SerializationContext(INPUT, MessageField.VALUE))
            sent[record["application_id"]] = value
            self.producer.produce(INPUT, value, record["application_id"].encode())
        for key, value in raw:
            sent[key.decode()] = value
            self.producer.produce(INPUT, value, key)
        assert self.producer.flush(30) == 0
        return sent

    def outputs(self, ids: set, worker: WorkerProcess, timeout: float = 180.0) -> tuple[dict, dict]:
        repaired, dead = {}, {}
        with TopicReader(self.bootstrap, OUTPUT) as out, TopicReader(self.bootstrap, self.config.topics.dlq) as dlq:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and not ids <= repaired.keys() | dead.keys():
                for message in out.poll():
                    record = self.deserializer(message.value, SerializationContext(OUTPUT, MessageField.VALUE))
                    repaired[record["application_id"]] = (record, message.value)
                for message in dlq.poll():
                    letter = json.loads(message.value)
                    dead[base64.b64decode(letter["key_b64"]).decode()] = letter
                assert worker.running, worker.log_tail()
        assert ids <= repaired.keys() | dead.keys(), f"missing {sorted(ids - repaired.keys() - dead.keys())[:5]}"
        return repaired, dead


@pytest.fixture(scope="module")
def live(broker, schema_registry, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("avro-worker")
    config = loan_config(schema_registry.url, str(run_dir / "artifacts"))
    ensure_topics(broker.bootstrap, config.topics)
    control = ControlClient(broker.bootstrap, config.topics, ArtifactStore(config.artifact_dir))
    plan = fitted_plan()
    control.publish_sync(plan.to_artifact())
    worker = WorkerProcess(config, broker.bootstrap, run_dir).start()
    try:
        topics = Topics(broker.bootstrap, schema_registry.url, config)
        topics.outputs(set(topics.send(LOAN_SCHEMA, loans(1, "warmup"))), worker, timeout=240)
        yield topics, worker, plan
    finally:
        worker.stop()


def test_avro_loan_records_come_out_as_avro_with_every_field_the_repaired_values_and_provenance(live):
    topics, worker, plan = live
    records = loans(40, "A")
    sent = topics.send(LOAN_SCHEMA, records)
    repaired, dead = topics.outputs(set(sent), worker)
    assert not dead, next(iter(dead.values()))["reason"]
    for record in records:
        out, value = repaired[record["application_id"]]
        assert schema_id(value) != schema_id(sent[record["application_id"]])  # the output subject's schema
        passed = {key: out[key] for key in LOAN if key != "applicant"}
        assert passed == {key: record[key] for key in LOAN if key != "applicant"}
        assert out["applicant"]["sex"] == record["applicant"]["sex"]
        added = out["fairstream"]
        assert added["original"] == {"age": record["applicant"]["age"], "income": record["applicant"]["income"]}
        assert json.loads(added["provenance"])["version"] == 1 and len(added["input_digest"]) > 0
    xs = np.array([[repaired[r["application_id"]][0]["applicant"][f] for f in ("age", "income")] for r in records])
    assert np.array_equal(xs, plan.transform(*as_arrays(records), keys=[r["application_id"] for r in records]))


def test_a_producer_adding_a_field_mid_stream_loses_nothing(live):
    topics, worker, _ = live
    before, after = loans(5, "B"), [{**r, "campaign": "spring"} for r in loans(5, "C")]
    sent = {**topics.send(LOAN_SCHEMA, before), **topics.send(LOAN_SCHEMA_V2, after)}
    repaired, dead = topics.outputs(set(sent), worker)
    assert not dead
    assert all(repaired[r["application_id"]][0]["campaign"] == "spring" for r in after)
    assert all("campaign" not in repaired[r["application_id"]][0] for r in before)


def test_a_message_that_is_not_avro_is_dead_lettered_with_its_original_bytes(live):
    topics, worker, _ = live
    junk = json.dumps(LOAN).encode()
    sent = topics.send(LOAN_SCHEMA, loans(2, "D"), raw=[(b"not-avro", junk)])
    repaired, dead = topics.outputs(set(sent), worker)
    assert set(dead) == {"not-avro"} and {"D-0", "D-1"} <= set(repaired)
    assert dead["not-avro"]["reason"] == "not Confluent Avro: first byte 0x7b, expected the magic byte 0x00"
    assert base64.b64decode(dead["not-avro"]["original_b64"]) == junk


def test_a_registry_outage_stops_the_worker_and_dead_letters_nothing(broker, tmp_path):
    """Known schemas are cached (an outage is not noticed); a new one cannot be read, so the worker exits 1 with
    the batch uncommitted (a restart replays it) instead of dead-lettering records for the registry's fault."""
    with SchemaRegistry(tmp_path / "registry") as registry:
        config = loan_config(registry.url, str(tmp_path / "artifacts"), "avro-outage", "outage-in", "outage-out")
        ensure_topics(broker.bootstrap, config.topics)
        ControlClient(broker.bootstrap, config.topics, ArtifactStore(config.artifact_dir)).publish_sync(
            fitted_plan().to_artifact())
        worker = WorkerProcess(config, broker.bootstrap, tmp_path).start()
        try:
            client = SchemaRegistryClient({"url": registry.url})
            old = AvroSerializer(client, json.dumps(LOAN_SCHEMA))
            new = AvroSerializer(client, json.dumps(LOAN_SCHEMA_V2))
            context = SerializationContext("outage-in", MessageField.VALUE)
            producer = Producer({"bootstrap.servers": broker.bootstrap})
            producer.produce("outage-in", old(loans(1, "E")[0], context), b"E-0")
            assert producer.flush(30) == 0
            read = AvroDeserializer(client)
            with TopicReader(broker.bootstrap, "outage-out") as out:
                wait_for(lambda: [m for m in out.poll() if read(m.value)["application_id"] == "E-0"], 180,
                         "the first record's output")
            unseen = new({**loans(1, "F")[0], "campaign": "spring"}, context)  # a schema id the worker never read
            registry.stop()
            producer.produce("outage-in", unseen, b"F-0")
            assert producer.flush(30) == 0
            assert worker.wait(timeout=120) == 1, worker.log_tail()
            assert "the schema registry cannot be reached" in worker.log_path.read_text()
            with TopicReader(broker.bootstrap, config.topics.dlq) as dlq:
                time.sleep(1.0)
                assert not dlq.poll(1000)
        finally:
            worker.stop()
