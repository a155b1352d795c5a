"""Exactly-once delivery on Apache Kafka (issue 29, item 6): one transaction per batch, zombies fenced.

Real ``fairstream worker`` processes with ``[delivery] guarantee = "exactly_once"`` on the session's
Kafka. A reader with ``isolation.level=read_committed`` must see every id exactly once and nothing
of an aborted transaction, after a worker killed with kill -9 in the middle of a batch and
restarted, and after a worker paused longer than its session (a zombie: its partitions moved to the
other worker) resumed. A ``read_uncommitted`` reader sees the aborted copies too: the tests assert
there were some, so the case really happened.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from fairstream.streams.demo.replay import record_messages
from fairstream.streams.ops.supervise import WorkerProcess
from tests.polling import wait_for

from .outputs import send
from .test_liveness import adult, metric_samples, pipeline, wait_ready  # noqa: F401 (adult: a fixture)
from .test_offset_reset import assigned_partitions, each_once, ids_of, output_id, partition_count

pytestmark = pytest.mark.integration

OUT_SECONDS = 90.0  # every id out to a read_committed reader (a restart's group join included)


def read_outputs(bootstrap: str, config, isolation: str, expected: set[str], timeout: float = OUT_SECONDS) -> Counter:
    """How many times each id is in the pipeline's outputs to a reader with ``isolation.level=isolation``.

    Read until every id of ``expected`` is there and every partition is read to its end (for read_committed:
    to its last stable offset).
    """
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{isolation}", "enable.auto.commit": False,
                         "isolation.level": isolation, "enable.partition.eof": True})
    topics = (config.topics.records_repaired, config.topics.dlq)
    partitions = [TopicPartition(topic, p, OFFSET_BEGINNING) for topic in topics
                  for p in consumer.list_topics(topic, timeout=10).topics[topic].partitions]
    consumer.assign(partitions)
    counts, at_end = Counter(), set()

    def read() -> bool:
        for m in consumer.consume(1000, 0.2):
            where = (m.topic(), m.partition())
            if m.error() is None:
                counts[output_id(m.topic(), m.value(), config)] += 1
                at_end.discard(where)
            elif m.error().code() == KafkaError._PARTITION_EOF:
                at_end.add(where)
        return expected <= counts.keys() and len(at_end) == len(partitions)

    try:
        wait_for(read, timeout, f"all {len(expected)} ids in the outputs to a {isolation} reader")
    finally:
        consumer.close()
    return counts


def committed_once_and_aborted(bootstrap: str, config, ids: set[str]) -> int:
    """Check that read_committed sees each id once and no other; the count of aborted copies read_uncommitted sees."""
    committed = read_outputs(bootstrap, config, "read_committed", ids)
    assert each_once(committed, ids) == {} and committed.keys() == ids
    everything = read_outputs(bootstrap, config, "read_uncommitted", ids)
    return sum(everything.values()) - sum(committed.values())


def taken(worker: WorkerProcess) -> float:
    """Records the worker's records input has taken (its /metrics)."""
    return sum(s.value for s in metric_samples(worker)
               if s.name == "fairstream_records_in_total" and s.labels.get("agent") == "records")


def counted(worker: WorkerProcess) -> float:
    """Records the worker's monitor counted: repaired or dead-lettered in a committed batch."""
    names = ("fairstream_records_repaired_total", "fairstream_records_dead_lettered_total")
    return sum(s.value for s in metric_samples(worker) if s.name in names and s.labels.get("agent") == "records")


CLAIM = "import sys, time; from fairstream.streams.worker.app import worker_instance; " \
        "print(worker_instance(*sys.argv[1:]), flush=True); time.sleep(120)"


def test_a_worker_takes_the_lowest_slot_no_live_worker_holds_so_a_restart_gets_its_predecessors_id(tmp_path):
    processes: list[subprocess.Popen] = []
    app_id = tmp_path.name  # the slots of this test alone

    def claim(bootstrap: str = "127.0.0.1:9092") -> str:
        processes.append(subprocess.Popen([sys.executable, "-c", CLAIM, app_id, bootstrap], stdout=subprocess.PIPE,
                                          text=True))
        return processes[-1].stdout.readline().strip()

    try:
        first, second = claim(), claim()
        assert first.endswith("-0") and second.endswith("-1") and first[:-2] == second[:-2]
        assert claim("127.0.0.1:9093") == first  # another cluster: slots of its own
        processes[0].kill()  # a crash: the kernel releases its claim
        processes[0].wait()
        assert claim() == first
    finally:
        for process in processes:
            process.kill()
            process.wait()


KILL_RATE = 2000.0  # records a second: a transaction is open most of the time


def open_transaction_in_the_outputs(bootstrap: str, config) -> bool:
    """Records of a transaction neither committed nor aborted lie in an output partition: its end is past its
    last stable offset (what a read_committed consumer is told is the end)."""
    ends = {}
    for isolation in ("read_uncommitted", "read_committed"):
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks", "isolation.level": isolation})
        try:
            topic = config.topics.records_repaired
            ends[isolation] = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                               for p in range(partition_count(bootstrap, topic))]
        finally:
            consumer.close()
    return ends["read_uncommitted"] != ends["read_committed"]


def freeze_in_an_open_transaction(worker: WorkerProcess, bootstrap: str, config, tries: int = 40) -> None:
    """SIGSTOP the worker at a moment its outputs hold records of its open transaction (seen twice, 0.5 s apart:
    not a commit whose markers were still on their way), so that a kill then leaves that transaction open."""
    for _ in range(tries):
        os.kill(worker.pid, signal.SIGSTOP)
        if open_transaction_in_the_outputs(bootstrap, config):
            time.sleep(0.5)
            if open_transaction_in_the_outputs(bootstrap, config):
                return
        os.kill(worker.pid, signal.SIGCONT)
        time.sleep(0.1)
    raise AssertionError(f"the worker was never caught with an open transaction in {tries} tries")


def test_a_worker_killed_mid_batch_then_restarted_delivers_every_id_once_to_read_committed_readers(
        broker, adult, tmp_path):
    archive, plan = adult
    config = pipeline(tmp_path, "eoskill", broker.bootstrap, plan).with_delivery(guarantee="exactly_once")
    worker = WorkerProcess(config, broker.bootstrap, tmp_path, name="w").start()
    try:
        wait_ready(worker)
        messages = record_messages(archive.subset(slice(0, 8000)), config, "kill")  # 4 s of records
        sender = threading.Thread(target=send, args=(broker.bootstrap, config, messages, KILL_RATE))
        sender.start()
        wait_for(lambda: taken(worker) >= 2000, 30, "2000 records taken before the kill")
        freeze_in_an_open_transaction(worker, broker.bootstrap, config)
        worker.kill()  # SIGKILL in the middle of a transaction: its records in the log are left open
        worker.start()  # its slot again, so its transactional.id: init_transactions aborts what was left open
        sender.join()
        aborted = committed_once_and_aborted(broker.bootstrap, config, ids_of(messages))
        assert aborted > 0, "no aborted output: the kill did not land in an open transaction"
        first, again = re.findall(r"records: exactly-once delivery: .*transactional.id (\S+)", worker.log_path.read_text())
        assert first == again  # the restart fenced its predecessor and aborted its open transaction at once
        print(f"\n{aborted} outputs of the killed worker's open transaction aborted; none reached read_committed")
    finally:
        worker.stop()


ZOMBIE_RATE = 400.0  # records a second, as in the liveness tests


def test_a_zombie_worker_whose_partitions_moved_cannot_commit_and_every_id_is_delivered_once(broker, adult, tmp_path):
    archive, plan = adult
    config = pipeline(tmp_path, "eoszombie", broker.bootstrap, plan).with_delivery(guarantee="exactly_once")
    zombie, survivor = workers = [WorkerProcess(config, broker.bootstrap, tmp_path, name=f"w{i}").start()
                                  for i in range(2)]
    try:
        for worker in workers:
            wait_ready(worker)
        messages = record_messages(archive.subset(slice(0, 8000)), config, "zombie")  # 20 s of records
        sender = threading.Thread(target=send, args=(broker.bootstrap, config, messages, ZOMBIE_RATE))
        sender.start()
        wait_for(lambda: taken(zombie) >= 100, 30, "records taken by the worker to pause")
        os.kill(zombie.pid, signal.SIGSTOP)  # longer than its session: the group gives its partitions away
        try:
            every = partition_count(broker.bootstrap, config.topics.records_in)
            wait_for(lambda: assigned_partitions(survivor) == every, 40, "the paused worker's partitions moved")
        finally:
            os.kill(zombie.pid, signal.SIGCONT)
        sender.join()
        ids = ids_of(messages)
        aborted = committed_once_and_aborted(broker.bootstrap, config, ids)
        # The zombie's transaction could not commit: its offsets were refused (its generation is gone) and it aborted.
        assert "was aborted" in zombie.log_path.read_text()
        assert aborted > 0
        # It consumes again, and the monitors counted each record once: a batch counts only once committed.
        wait_ready(zombie)
        assert sum(counted(worker) for worker in workers) == len(ids)
        print(f"\n{aborted} outputs of the zombie's transaction aborted; none reached read_committed")
    finally:
        for worker in workers:
            worker.stop()
