"""A team's own topic end to end on Apache Kafka: loan applications read by a mapping, written back whole.

A real worker reads ``loan-applications`` (a topic the team created, with 3 partitions), repairs the mapped
features in place with a published plan, and writes ``loan-applications.fair``: every output carries every field
its input had, its input's key, partition and headers; a bad record is dead-lettered with its path.
"""

from __future__ import annotations

import base64
import json
import time

import numpy as np
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from fairstream.models.plan import DistributionalRepair
from fairstream.streams.config import PipelineConfig
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.demo.collect import TopicReader
from fairstream.streams.ops.supervise import WorkerProcess
from fairstream.streams.topics import ensure_topics

pytestmark = pytest.mark.integration

INPUT, OUTPUT, TEAM_PARTITIONS = "loan-applications", "loan-applications.fair", 3


def loans_config(artifact_dir: str) -> PipelineConfig:
    return PipelineConfig.from_dict({
        "pipeline": {"name": "loans", "features": ["age", "income", "amount"], "groups": ["female", "male"],
                     "strata": ["north", "south"], "label": True, "artifact_dir": artifact_dir},
        "topics": {"prefix": "itest-loans", "input": INPUT, "output": OUTPUT},
        "mapping": {"id": "application_id", "time": {"path": "submitted_at", "format": "iso8601"},
                    "s": {"path": "applicant.sex", "values": {"F": "female", "M": "male"}},
                    "u": {"path": "branch", "default": "north"},
                    "features": {"age": "applicant.age", "income": "applicant.income", "amount": "amount"}},
        "output": {"repaired": "in_place", "field": "fairstream", "provenance": "field"},
    })


def loan_records(n: int, seed: int, prefix: str) -> list[dict]:
    """Loan applications whose income and amount depend on the applicant's sex (what the plan repairs)."""
    rng = np.random.default_rng(seed)
    female = rng.random(n) < 0.5
    records = []
    for i in range(n):
        record = {"application_id": f"{prefix}-{i}", "submitted_at": "2026-11-28T10:00:00Z",
                  "applicant": {"age": int(rng.integers(20, 70)), "income": int(rng.normal(45000 if female[i] else
                                                                                           55000, 8000)),
                                "sex": "F" if female[i] else "M"},
                  "amount": int(rng.normal(11000 if female[i] else 13000, 2000)), "channel": "web"}
        if i % 3:  # some records carry their branch, the others take the default
            record["branch"] = "south" if i % 2 else "north"
        records.append(record)
    return records


def as_arrays(records: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    X = np.array([[r["applicant"]["age"], r["applicant"]["income"], r["amount"]] for r in records], dtype=float)
    s = np.array(["female" if r["applicant"]["sex"] == "F" else "male" for r in records], dtype=object)
    u = np.array([r.get("branch", "north") for r in records], dtype=object)
    return X, s, u


@pytest.fixture(scope="module")
def loans(broker, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("loans")
    config = loans_config(str(run_dir / "artifacts"))
    # The team's topic exists before fairstream, with its own partition count.
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # held: the future needs its handle
    admin.create_topics([NewTopic(INPUT, TEAM_PARTITIONS, 1)])[INPUT].result(30)
    counts = ensure_topics(broker.bootstrap, config.topics)
    assert counts[INPUT] == TEAM_PARTITIONS and counts[OUTPUT] >= TEAM_PARTITIONS
    plan = DistributionalRepair(n_q=50).fit(*as_arrays(loan_records(4000, seed=0, prefix="research")))
    version = ControlClient(broker.bootstrap, config.topics, ArtifactStore(config.artifact_dir)).publish_sync(
        plan.to_artifact()).version
    worker = WorkerProcess(config, broker.bootstrap, run_dir).start()
    try:
        yield config, broker.bootstrap, worker, plan, version
    finally:
        worker.stop()


def send(bootstrap: str, messages: list[tuple[bytes, bytes, int, list]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value, partition, headers in messages:
        producer.produce(INPUT, value, key, partition=partition, headers=headers)
    assert producer.flush(30) == 0


def collect(bootstrap: str, config, ids: set, worker, timeout: float = 180.0) -> tuple[dict, dict]:
    """Outputs (message by id) and dead letters (letter by id) of ``ids``, once all came out."""
    outputs, dead = {}, {}
    with TopicReader(bootstrap, OUTPUT) as out, TopicReader(bootstrap, config.topics.dlq) as dlq:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not ids <= outputs.keys() | dead.keys():
            for m in out.poll():
                outputs[json.loads(m.value)["application_id"]] = m
            for m in dlq.poll():
                letter = json.loads(m.value)
                dead[base64.b64decode(letter["key_b64"]).decode()] = letter
            assert worker.running, worker.log_tail()
    assert ids <= outputs.keys() | dead.keys(), sorted(ids - outputs.keys() - dead.keys())[:5]
    return outputs, dead


def test_loan_records_come_out_whole_with_their_key_partition_and_headers(loans):
    config, bootstrap, worker, plan, version = loans
    records = loan_records(300, seed=1, prefix="live")
    records[7]["risk_band"] = "B"  # a producer adds a field mid-stream
    records[8]["applicant"]["age"] = "old"  # and a bad value
    messages = [(r["application_id"].encode(), json.dumps(r).encode(), i % TEAM_PARTITIONS,
                 [("trace", f"t-{i}".encode())]) for i, r in enumerate(records)]
    send(bootstrap, messages)
    outputs, dead = collect(bootstrap, config, {r["application_id"] for r in records}, worker)
    assert set(dead) == {"live-8"}
    assert dead["live-8"]["reason"] == 'mapping: applicant.age: expected a number, found "old"'
    assert base64.b64decode(dead["live-8"]["original_b64"]) == messages[8][1] and dead["live-8"]["topic"] == INPUT
    good = [i for i in range(len(records)) if i != 8]
    X, s, u = as_arrays([records[i] for i in good])
    expected = plan.transform(X, s, u, keys=[records[i]["application_id"] for i in good])
    for row, i in enumerate(good):
        record, message = records[i], outputs[records[i]["application_id"]]
        out = json.loads(message.value)
        assert message.key == messages[i][0] and message.partition == messages[i][2]
        assert ("trace", messages[i][3][0][1]) in list(message.headers or [])
        assert list(out) == [*record, "fairstream"]  # every field, in its order, and the added one last
        moved = {"applicant": {**record["applicant"], "age": expected[row, 0], "income": expected[row, 1]},
                 "amount": expected[row, 2]}
        assert {**record, **moved} == {k: v for k, v in out.items() if k != "fairstream"}
        added = out["fairstream"]
        assert added["original"] == {"age": record["applicant"]["age"], "income": record["applicant"]["income"],
                                     "amount": record["amount"]}
        assert added["provenance"]["version"] == version and added["provenance"]["kind"] == "plan"
    assert json.loads(outputs["live-7"].value)["risk_band"] == "B"
