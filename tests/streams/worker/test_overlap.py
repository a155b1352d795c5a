"""The overlapped batch loop on Apache Kafka and a real worker process (issue 19).

Batch N+1 is decoded and applied while N's delivery reports come back (the order of those steps is
pinned in test_consumer.py); here the rules the overlap must keep, end to end: the outputs of one
input partition come out in input order, an offset is committed only once the outputs below it are
out, and a worker killed with SIGKILL mid-stream is replayed identically by its restart.
"""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from fairstream.repair import datasets
from fairstream.models.plan import DistributionalRepair
from fairstream.streams.config import adult_config
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.demo.collect import TopicReader
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.ops.supervise import WorkerProcess
from fairstream.streams.topics import ensure_topics

from .outputs import send

pytestmark = pytest.mark.integration

PARTITIONS = 4


@pytest.fixture(scope="module")
def live(broker, tmp_path_factory):
    """One worker for the module, on a pipeline with its own topics and a published plan."""
    run_dir = tmp_path_factory.mktemp("overlap")
    research, archive = datasets.load("adult").split(5_000, seed=0)
    config = adult_config(artifact_dir=str(run_dir / "artifacts")).with_topics(prefix="overlap", partitions=PARTITIONS)
    ensure_topics(broker.bootstrap, config.topics)
    ControlClient(broker.bootstrap, config.topics, ArtifactStore(config.artifact_dir)).publish_sync(
        DistributionalRepair(n_q=50).fit(research.X, research.s, research.u).to_artifact())
    worker = WorkerProcess(config, broker.bootstrap, run_dir, name="w").start()
    assert worker.wait_for_log("records: partitions assigned", timeout=90), worker.log_tail()
    yield config, archive, worker
    worker.stop()


def read_all(bootstrap: str, topic: str, ids: set, timeout: float, worker) -> list:
    """Every message of ``topic`` whose key is one of ``ids``, once each id has come at least once."""
    found, seen = [], set()
    with TopicReader(bootstrap, topic) as reader:
        deadline = time.monotonic() + timeout
        while not ids <= seen and time.monotonic() < deadline:
            for m in reader.poll():
                if m.key is not None and m.key.decode() in ids:
                    found.append(m)
                    seen.add(m.key.decode())
            assert worker.running, worker.log_tail()
    assert ids <= seen, f"{len(ids - seen)} ids never came out, e.g. {sorted(ids - seen)[:5]}"
    return found


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offset per partition (a client that reads them, never joins)."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        answer = reader.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
        return {tp.partition: tp.offset for tp in answer if tp.offset >= 0}
    finally:
        reader.close()


def test_outputs_of_a_partition_keep_input_order_and_offsets_are_committed_only_after_their_outputs(broker, live):
    config, archive, worker = live
    group = f"{config.topics.prefix}-{config.name}.records"
    messages = record_messages(archive.subset(slice(0, 8000)), config, "order")
    samples: list[tuple[float, dict]] = []  # (wall time in ms after the answer, committed offsets) while it streams
    sending = threading.Thread(target=send, args=(broker.bootstrap, config, messages, 4000.0))
    sending.start()
    while sending.is_alive() or len(samples) < 3:
        committed = committed_offsets(broker.bootstrap, group, config.topics.records_in)
        samples.append((time.time() * 1000, committed))
        time.sleep(0.2)
    sending.join()
    ids = {key.decode() for key, _ in messages}
    inputs = {m.key.decode(): (m.partition, m.offset) for m in read_all(
        broker.bootstrap, config.topics.records_in, ids, 60, worker)}
    outputs = read_all(broker.bootstrap, config.topics.records_repaired, ids, 90, worker)
    # Order: within each output partition, the outputs of any one input partition follow its input offsets.
    for out_partition in {m.partition for m in outputs}:
        last: dict[int, int] = {}
        for m in sorted((m for m in outputs if m.partition == out_partition), key=lambda m: m.offset):
            in_partition, in_offset = inputs[m.key.decode()]
            assert in_offset > last.get(in_partition, -1), f"out of order: {m.key} after input offset {last}"
            last[in_partition] = in_offset
    # Commit after delivery: every output below a committed offset was produced before the commit was read.
    produced = {}
    for m in outputs:
        produced[m.key.decode()] = min(m.timestamp, produced.get(m.key.decode(), m.timestamp))
    by_input = {position: produced[rid] for rid, position in inputs.items()}
    checked = 0
    for answered_ms, committed in samples:
        for partition, offset in committed.items():
            late = [pos for pos, ms in by_input.items() if pos[0] == partition and pos[1] < offset and ms > answered_ms]
            assert not late, f"offset {offset} of partition {partition} committed before outputs of {late[:3]}"
            checked += sum(1 for pos in by_input if pos[0] == partition and pos[1] < offset)
    assert checked and max(map(len, (c for _, c in samples))) == PARTITIONS  # commits were seen while it streamed


def test_a_worker_killed_mid_stream_is_replayed_identically_by_its_restart(broker, live):
    config, archive, worker = live
    messages = record_messages(archive.subset(slice(8000, 16000)), config, "killed")
    ids = {key.decode() for key, _ in messages}
    sending = threading.Thread(target=send, args=(broker.bootstrap, config, messages, 2000.0))
    sending.start()
    out_before = 0
    with TopicReader(broker.bootstrap, config.topics.records_repaired) as reader:
        deadline = time.monotonic() + 60
        while out_before < 1000 and time.monotonic() < deadline:  # well into the stream
            out_before += sum(1 for m in reader.poll() if m.key.decode() in ids)
    worker.kill()  # SIGKILL between (or inside) batches: outputs produced whose offsets are not committed
    sending.join()
    assert 1000 <= out_before < len(ids), out_before
    worker.start()
    outputs = read_all(broker.bootstrap, config.topics.records_repaired, ids, 180, worker)
    copies: dict[str, set] = {}
    for m in outputs:
        copies.setdefault(m.key.decode(), set()).add(m.value)
    differing = [rid for rid, values in copies.items() if len(values) > 1]
    assert not differing, f"replayed outputs differ from the first copies: {differing[:5]}"
    print(f"\nkilled after {out_before} outputs; {len(outputs) - len(ids)} duplicates of {len(ids)} ids, all "
          f"byte-identical")
