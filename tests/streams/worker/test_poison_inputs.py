"""Inputs that stopped a partition for good, through a real worker on Apache Kafka.

Each of these killed the consumer, and every restart met the same message again: a dead letter
over the producer's limit (a 460 KB Kafka key with an invalid value), a valid record whose output
could not carry its key, and batches compressed with a codec the client could not decode. Now each
comes out (repaired or dead-lettered), the records behind it too, and the worker goes on consuming.
Outputs are matched to inputs by ``input_digest``: a cut key no longer names its record.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import pytest
from confluent_kafka import Producer
from kafka import KafkaProducer

from fairstream.repair import datasets
from fairstream.models.plan import DistributionalRepair
from fairstream.streams.codec.dead_letters import MAX_DEAD_LETTER_KEY, MAX_OUTPUT_BYTES, output_bytes
from fairstream.streams.codec.records import input_digest
from fairstream.streams.config import adult_config
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.demo.collect import TopicReader
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.kafka import KAFKA_API_VERSION
from fairstream.streams.ops.supervise import WorkerProcess
from fairstream.streams.topics import ensure_topics

pytestmark = pytest.mark.integration

CODECS = ("gzip", "snappy", "lz4", "zstd")  # every compression codec Kafka defines


@dataclass
class Output:
    key: bytes | None
    record: dict
    size: int  # key, value and record overhead, as the producer counts it


@dataclass
class LivePipeline:
    config: object
    bootstrap: str
    worker: WorkerProcess
    archive: object

    def messages(self, start: int, n: int, prefix: str) -> list[tuple[bytes, bytes]]:
        return record_messages(self.archive.subset(slice(start, start + n)), self.config, id_prefix=prefix)

    def send(self, messages, partition: int = 0) -> None:
        """Keyed messages, in order, to one partition: the records behind a poison message wait on it."""
        producer = KafkaProducer(bootstrap_servers=self.bootstrap, api_version=KAFKA_API_VERSION,
                                 max_request_size=4 * 1024 * 1024)
        for key, value in messages:
            producer.send(self.config.topics.records_in, key=key, value=value, partition=partition)
        producer.flush()
        producer.close()

    def outputs(self, values, timeout: float = 120.0) -> tuple[dict, dict]:
        """The repaired record and the dead letter of each value, by input digest, once every one came out."""
        wanted, repaired, dead = {input_digest(v) for v in values}, {}, {}
        topics, bootstrap = self.config.topics, self.bootstrap
        with TopicReader(bootstrap, topics.records_repaired) as rep, TopicReader(bootstrap, topics.dlq) as dlq:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and not wanted <= repaired.keys() | dead.keys():
                for reader, found in ((rep, repaired), (dlq, dead)):
                    for m in reader.poll():
                        record = json.loads(m.value)
                        if record["input_digest"] in wanted:
                            found[record["input_digest"]] = Output(m.key, record, output_bytes(m.key, m.value))
                assert self.worker.running, self.worker.log_tail()
        missing = wanted - repaired.keys() - dead.keys()
        assert not missing, f"{len(missing)} of {len(wanted)} inputs never came out:\n{self.worker.log_tail()}"
        return repaired, dead


@pytest.fixture(scope="module")
def pipeline(broker, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("poison")
    config = adult_config(artifact_dir=str(run_dir / "artifacts"), max_message_bytes=524_288).with_topics(
        prefix="poison", partitions=2)
    research, archive = datasets.load("adult").split(3_000, seed=0)
    ensure_topics(broker.bootstrap, config.topics)
    plan = DistributionalRepair(n_q=50, out_of_range="clamp").fit(research.X, research.s, research.u)
    ControlClient(broker.bootstrap, config.topics, ArtifactStore(config.artifact_dir)).publish_sync(plan.to_artifact())
    worker = WorkerProcess(config, broker.bootstrap, run_dir).start()
    try:
        assert worker.wait_for_log("caught up with", timeout=90), worker.log_tail()
        yield LivePipeline(config, broker.bootstrap, worker, archive)
    finally:
        worker.stop()


def test_a_460_kb_key_and_a_key_no_output_can_carry_are_dead_lettered_between_valid_records(pipeline):
    before, after = pipeline.messages(0, 100, "before"), pipeline.messages(100, 100, "after")
    (_, valid), = pipeline.messages(200, 1, "keyed")
    poison = (bytes(range(256)) * 1800, b'{"id": "poison", "features": {"age": "old"}, "s": 0, "u": 1}')
    carried = (bytes(460_000), valid)  # valid, with a 460 KB key: its output carries the key
    unfit = (b"k" * (MAX_OUTPUT_BYTES - 500), valid.replace(b"keyed-0", b"unfit-0"))  # no output can carry it
    pipeline.send(before + [poison, carried, unfit] + after)
    repaired, dead = pipeline.outputs([v for _, v in before + [poison, carried, unfit] + after])
    assert all(o.size <= MAX_OUTPUT_BYTES for o in [*repaired.values(), *dead.values()])
    letter = dead[input_digest(poison[1])]
    assert letter.key == poison[0][:MAX_DEAD_LETTER_KEY] and letter.record["key_truncated"]
    assert letter.record["key_size"] == len(poison[0]) and "missing feature(s)" in letter.record["reason"]
    assert repaired[input_digest(carried[1])].key == carried[0]
    assert "over the producer's limit" in dead[input_digest(unfit[1])].record["reason"]
    assert {input_digest(v) for _, v in before + after} <= repaired.keys()
    # Still consuming: the partition the poison sat on goes on.
    later = pipeline.messages(300, 50, "later")
    pipeline.send(later)
    repaired, _ = pipeline.outputs([v for _, v in later])
    assert {input_digest(v) for _, v in later} <= repaired.keys()


def test_a_batch_in_every_compression_codec_kafka_defines_is_repaired(pipeline):
    sent = []
    for i, codec in enumerate(CODECS):
        messages = pipeline.messages(1000 + 100 * i, 100, codec)
        # One producer per codec, lingering so that its records travel as one compressed batch.
        producer = Producer({"bootstrap.servers": pipeline.bootstrap, "compression.type": codec, "linger.ms": 100})
        for key, value in messages:
            producer.produce(pipeline.config.topics.records_in, key=key, value=value, partition=i % 2)
        assert producer.flush(30) == 0, f"{codec}: not all sent"
        sent += messages
    repaired, dead = pipeline.outputs([v for _, v in sent])
    assert not dead and len(repaired) == len(sent) == 400
