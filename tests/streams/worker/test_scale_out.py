"""Several worker processes in one group on a 6-partition topic: sharing, crashes, joins, big messages.

Apache Kafka, real ``fairstream worker`` processes. Each test uses its own pipeline (topic
prefix and group), so rebalances of one test never touch another.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from kafka import KafkaProducer

from fairstream.repair import datasets
from fairstream.models.plan import DistributionalRepair
from fairstream.streams.config import adult_config
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.kafka import KAFKA_API_VERSION
from fairstream.streams.ops.supervise import WorkerProcess
from fairstream.streams.topics import ensure_topics

from tests.kafka_admin import allow_messages_of

from .outputs import collect_outputs, send

pytestmark = pytest.mark.integration

PARTITIONS = 6


@pytest.fixture(scope="module")
def adult():
    research, archive = datasets.load("adult").split(10_000, seed=0)
    plans = [DistributionalRepair(n_q=n_q).fit(research.X, research.s, research.u) for n_q in (100, 60)]
    return archive, plans


class Group:
    """Workers of one pipeline (one consumer group) and what they produced."""

    def __init__(self, broker, tmp: Path, prefix: str, plan):
        self.config = adult_config(artifact_dir=str(tmp / "artifacts")).with_topics(prefix=prefix, partitions=PARTITIONS)
        self.bootstrap = broker.bootstrap
        self.tmp = tmp
        ensure_topics(self.bootstrap, self.config.topics)
        self.control = ControlClient(self.bootstrap, self.config.topics, ArtifactStore(self.config.artifact_dir))
        self.plans = {}
        self.publish(plan)
        self.workers: list[WorkerProcess] = []

    def publish(self, plan) -> int:
        version = self.control.publish_sync(plan.to_artifact()).version
        self.plans[version] = plan
        return version

    def start(self, n: int = 1) -> list[WorkerProcess]:
        new = [WorkerProcess(self.config, self.bootstrap, self.tmp, name=f"w{len(self.workers) + i}")
               for i in range(n)]
        for worker in new:
            worker.start()
        self.workers += new
        return new

    def wait_ready(self, workers, timeout: float = 90.0) -> None:
        for worker in workers:
            assert worker.wait_for_log("caught up with", timeout=timeout), worker.log_tail()

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()

    def send(self, messages, rate=None) -> None:
        send(self.bootstrap, self.config, messages, rate)

    def outputs(self, ids: set, timeout: float = 180.0) -> tuple[dict, dict]:
        """Every repaired record and dead letter for ``ids`` (lists keep duplicates), once all came out."""
        return collect_outputs(self.bootstrap, self.config, ids, timeout)


def check_exactly_one_place(ids, repaired, dead, plans, data) -> None:
    """Every id in exactly one topic; copies bit-identical; each equals the batch transform of its version."""
    assert not repaired.keys() & dead.keys()
    assert set(ids) == repaired.keys() | dead.keys()
    for rid in ids:
        copies = repaired.get(rid, [])
        assert len({json.dumps(c, sort_keys=True) for c in copies}) <= 1, f"{rid}: non-identical duplicates"
    index = {rid: i for i, rid in enumerate(ids)}
    for version, plan in plans.items():
        rows = [index[rid] for rid, c in repaired.items() if c[0]["provenance"]["version"] == version]
        if rows:
            expected = plan.transform(data.X[rows], data.s[rows], data.u[rows], keys=[ids[i] for i in rows])
            got = np.array([[repaired[ids[i]][0]["features"][f] for f in ("age", "hours-per-week")] for i in rows])
            assert np.array_equal(got, expected)


@pytest.fixture
def group(broker, adult, tmp_path, request):
    made = Group(broker, tmp_path, request.node.name.replace("test_", "").replace("_", "")[:24], adult[1][0])
    yield made
    made.stop()


def test_three_workers_share_six_partitions_and_every_id_ends_in_one_place(group, adult):
    workers = group.start(3)
    group.wait_ready(workers)
    data = adult[0].subset(slice(0, 6000))
    messages = record_messages(data, group.config, id_prefix="share")
    group.send(messages)
    ids = [k.decode() for k, _ in messages]
    repaired, dead = group.outputs(set(ids))
    check_exactly_one_place(ids, repaired, dead, group.plans, data)
    # Each of the three took a share of the partitions (two each, by aiokafka's round robin).
    for worker in workers:
        log = worker.log_path.read_text()
        last = log[log.rindex("records: partitions assigned"):].splitlines()[0]
        assert last.count("records.in[") == 2, last


def test_a_killed_worker_loses_nothing_and_the_survivors_take_its_partitions(group, adult):
    workers = group.start(3)
    group.wait_ready(workers)
    data = adult[0].subset(slice(6000, 18000))
    messages = record_messages(data, group.config, id_prefix="kill")
    sender = threading.Thread(target=group.send, args=(messages, 2000.0))  # 6 s of records
    sender.start()
    time.sleep(2.0)
    workers[1].kill()  # SIGKILL: no clean shutdown, its uncommitted batch is replayed by a survivor
    sender.join()
    ids = [k.decode() for k, _ in messages]
    repaired, dead = group.outputs(set(ids), timeout=240)
    check_exactly_one_place(ids, repaired, dead, group.plans, data)
    for survivor in (workers[0], workers[2]):
        # Six partitions over two survivors. The killed worker's records can all be out before the last of
        # the rebalance's joins completes (a survivor whose own partitions were drained joins last), so wait.
        assert _last_assignment_settles_on(survivor, 3, timeout=60), survivor.log_path.read_text()[-2000:]


def _last_assignment_settles_on(worker, n_partitions: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = worker.log_path.read_text()
        if "records: partitions assigned" in log:
            last = log[log.rindex("records: partitions assigned"):].splitlines()[0]
            if last.count("records.in[") == n_partitions:
                return True
        time.sleep(0.5)
    return False


def test_a_version_published_while_a_worker_is_down_reaches_survivors_and_the_restarted_worker(group, adult):
    workers = group.start(2)
    group.wait_ready(workers)
    workers[0].kill()
    new_version = group.publish(adult[1][1])
    assert workers[1].wait_for_log(f"now serving plan artifact version {new_version}", timeout=60)
    workers[0].start()
    group.wait_ready([workers[0]])
    assert workers[0].wait_for_log(f"now serving plan artifact version {new_version}", timeout=60)
    data = adult[0].subset(slice(18000, 22000))
    messages = record_messages(data, group.config, id_prefix="down")
    group.send(messages)
    ids = [k.decode() for k, _ in messages]
    repaired, dead = group.outputs(set(ids))
    check_exactly_one_place(ids, repaired, dead, group.plans, data)
    assert {c[0]["provenance"]["version"] for c in repaired.values()} == {new_version}


def test_a_worker_joining_mid_stream_takes_partitions_without_loss(group, adult):
    first = group.start(1)
    group.wait_ready(first)
    data = adult[0].subset(slice(22000, 34000))
    messages = record_messages(data, group.config, id_prefix="join")
    sender = threading.Thread(target=group.send, args=(messages, 2000.0))
    sender.start()
    time.sleep(1.5)
    second = group.start(1)
    sender.join()
    ids = [k.decode() for k, _ in messages]
    repaired, dead = group.outputs(set(ids), timeout=240)
    check_exactly_one_place(ids, repaired, dead, group.plans, data)
    assert second[0].wait_for_log("records: partitions assigned", timeout=60)


SIZES = (500_000, 800_000, 1_500_000, 3_000_000)


def test_huge_messages_are_dead_lettered_and_the_records_around_them_are_repaired(group, adult):
    workers = group.start(1)
    group.wait_ready(workers)
    data = adult[0].subset(slice(34000, 35000))
    good = record_messages(data, group.config, id_prefix="big")
    blobs = {f"huge-{size}": (b'{"id":"huge-%d","pad":"' % size) + b"x" * size + b'"}' for size in SIZES}
    # Kafka refuses records over the topic's max.message.bytes (1 MB by default) at the producer: a team whose
    # producers send bigger ones has raised it, which is the case where the worker meets them.
    allow_messages_of(group.bootstrap, group.config.topics.records_in, 4 * 1024 * 1024)
    producer = KafkaProducer(bootstrap_servers=group.bootstrap, api_version=KAFKA_API_VERSION,
                             max_request_size=4 * 1024 * 1024)
    huge = list(blobs.items())
    for i, (key, value) in enumerate(good):
        producer.send(group.config.topics.records_in, key=key, value=value)
        if i % 200 == 100 and huge:  # between valid records
            rid, blob = huge.pop(0)
            producer.send(group.config.topics.records_in, key=rid.encode(), value=blob)
    producer.flush()
    producer.close()
    ids = {k.decode() for k, _ in good} | set(blobs)
    repaired, dead = group.outputs(ids)
    assert set(dead) == set(blobs) and len(repaired) == len(good)
    for rid, blob in blobs.items():
        (letter,) = dead[rid]
        assert "exceeds the limit" in letter["reason"] and letter["original_size"] == len(blob)
        assert letter["original_sha256"] == hashlib.sha256(blob).hexdigest()
        assert letter["original_truncated"] == (len(blob) > 512 * 1024)
        assert base64.b64decode(letter["original_b64"]) == blob[:512 * 1024]
    assert workers[0].running, workers[0].log_tail()
