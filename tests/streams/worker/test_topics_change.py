"""Topics that change under running workers, on Apache Kafka (issue 29, item 5).

The input topic expanded by an operator while workers consume it: the workers take the new
partitions at their next metadata refresh (a rebalance), the records sent there come out, and a
worker started after the expansion starts (it used to exit: the input had more partitions than
configured, a restart loop under a supervisor). The output topic deleted, or made unwritable (its
``max.message.bytes`` below any output), under a running worker: nothing is committed that the
broker cannot return, the worker exits non-zero (a batch whose delivery keeps failing, the liveness
contract of ``consumer.py``), and once the topic is back a new worker delivers every record.
"""

from __future__ import annotations

import re
import threading
import time

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, Producer
from confluent_kafka.admin import AdminClient, NewPartitions

from fairstream.streams.demo.collect import TopicReader
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.ops.supervise import WorkerProcess
from fairstream.streams.topics import ensure_topics
from fairstream.streams.worker import consumer
from tests.kafka_admin import allow_messages_of
from tests.polling import wait_for

from .outputs import collect_outputs, send
from .test_liveness import RATE, adult, check_one_place, died, pipeline, wait_ready  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration

GROWN = 6  # the input's partitions after the operator's expansion (configured: 4)
REBALANCE_SECONDS = 10.0  # from the metadata refresh that shows the expansion to the new assignment (one join round)


# --------------------------------------------------------------------------- the operator's acts, the broker's state


def add_partitions(bootstrap: str, topic: str, total: int, timeout: float = 30.0) -> None:
    """``kafka-topics.sh --alter --partitions``: done once the broker's metadata lists them all."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_partitions([NewPartitions(topic, total)]).values():
        future.result(timeout=timeout)
    wait_for(lambda: len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == total, timeout,
             f"{topic} with {total} partitions in the metadata")


def delete_topic(bootstrap: str, topic: str, timeout: float = 30.0) -> None:
    """Delete ``topic``, done once the broker's metadata no longer lists it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics([topic], operation_timeout=timeout).values():
        future.result(timeout=timeout)
    wait_for(lambda: topic not in admin.list_topics(timeout=10).topics, timeout, f"{topic} gone from the metadata")


def send_to(bootstrap: str, topic: str, messages, partitions: list[int]) -> None:
    """Send ``messages`` round robin to the given ``partitions`` (the new ones), every one acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    failed = []
    for i, (key, value) in enumerate(messages):
        producer.produce(topic, value, key, partition=partitions[i % len(partitions)],
                         on_delivery=lambda error, _message: error is None or failed.append(error))
        producer.poll(0)
    assert producer.flush(30) == 0 and not failed, failed[:1]


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offset of each partition of ``topic`` that has one."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group]
    return {tp.partition: tp.offset for tp in future.result(timeout=30).topic_partitions
            if tp.topic == topic and tp.offset >= 0}


def input_offsets(bootstrap: str, topic: str, timeout: float = 30.0) -> dict[str, tuple[int, int]]:
    """Every record id on the input, with the (partition, offset) it was written at."""
    where: dict[str, tuple[int, int]] = {}
    with TopicReader(bootstrap, topic) as reader:
        deadline = time.monotonic() + timeout
        while True:
            for m in reader.poll():
                where[m.key.decode()] = (m.partition, m.offset)
            if reader.at_end():
                return where
            assert time.monotonic() < deadline, f"{topic} not read to its end within {timeout:g} s"


def caught_up(bootstrap: str, group: str, topic: str) -> dict[int, int] | None:
    """The group's committed offsets once they are at the end of every partition of ``topic`` (else None)."""
    ends = {}
    for partition, offset in input_offsets(bootstrap, topic).values():
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    offsets = committed(bootstrap, group, topic)
    return offsets if all(offsets.get(p, 0) >= end for p, end in ends.items()) else None


def assigned(worker: WorkerProcess) -> set[int]:
    """The input partitions the worker owns by its log (its last assignment, none after a revocation)."""
    lines = [line for line in worker.log_path.read_text().splitlines() if "records: partitions " in line]
    if not lines or "records: partitions revoked" in lines[-1]:
        return set()
    return {int(p) for p in re.findall(r"records\.in\[(\d+)\]", lines[-1])}


def record_ids(messages) -> set[str]:
    return {key.decode() for key, _ in messages}


# --------------------------------------------------------------------------- the input expanded


def test_partitions_added_to_the_input_under_running_workers_are_taken_and_their_records_come_out(
        broker, adult, tmp_path):
    # The bound: the consumers' metadata refresh (librdkafka refreshes every 5 min by default), then a rebalance.
    bound = consumer.METADATA_REFRESH_MS / 1000 + REBALANCE_SECONDS
    archive, plan = adult
    config = pipeline(tmp_path, "grown", broker.bootstrap, plan)
    assert config.topics.partitions_for("records.in") == 4
    workers = [WorkerProcess(config, broker.bootstrap, tmp_path, name=f"w{i}").start() for i in range(2)]
    try:
        for worker in workers:
            wait_ready(worker)
        steady = record_messages(archive.subset(slice(0, 4000)), config, "steady")  # 10 s at RATE, across the change
        sender = threading.Thread(target=send, args=(broker.bootstrap, config, steady, RATE))
        sender.start()
        add_partitions(broker.bootstrap, config.topics.records_in, GROWN)
        expanded = time.monotonic()
        fresh = record_messages(archive.subset(slice(4000, 4600)), config, "fresh")
        send_to(broker.bootstrap, config.topics.records_in, fresh, partitions=list(range(4, GROWN)))
        wait_for(lambda: set().union(*map(assigned, workers)) == set(range(GROWN)), bound,
                 f"assignment of all {GROWN} partitions to the running workers")
        taken = time.monotonic() - expanded
        # A worker (re)started after the expansion starts: it used to exit, the input having more than configured.
        late = WorkerProcess(config, broker.bootstrap, tmp_path, name="late").start()
        workers.append(late)
        wait_ready(late)
        sender.join()
        ids = record_ids(steady) | record_ids(fresh)
        repaired, dead = collect_outputs(broker.bootstrap, config, ids, timeout=60, alive=died(*workers))
        check_one_place(ids, repaired, dead)
        assert f"has {GROWN} partitions, more than the 4 configured" in late.log_path.read_text()
        print(f"\nthe running workers took the {GROWN - 4} new partitions {taken:.1f} s after the expansion "
              f"(bound {bound:g} s); all {len(ids)} ids out, a worker started after it ready")
    finally:
        for worker in workers:
            worker.stop()


# --------------------------------------------------------------------------- the output topic gone or unwritable

TOO_SMALL = 64  # bytes: max.message.bytes no repaired record fits in
KAFKA_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588


def delete_output(bootstrap: str, config) -> None:
    delete_topic(bootstrap, config.topics.records_repaired)


def recreate_output(bootstrap: str, config) -> None:
    ensure_topics(bootstrap, config.topics)  # as the operator does, and as a worker's start would


def shrink_output(bootstrap: str, config) -> None:
    allow_messages_of(bootstrap, config.topics.records_repaired, TOO_SMALL)


def restore_output(bootstrap: str, config) -> None:
    allow_messages_of(bootstrap, config.topics.records_repaired, KAFKA_DEFAULT_MAX_MESSAGE_BYTES)


FAULTS = {"deleted": (delete_output, recreate_output), "unwritable": (shrink_output, restore_output)}
STOP_SECONDS = 15.0  # the fetch of the batch that fails, and the worker's shutdown after the crash


def exit_bound() -> float:
    """From the fault to the worker's exit: each of the batch's SEND_ATTEMPTS sends fails (at once for a record
    too large, within TOPIC_GONE_MS for a topic missing from the producer's metadata), with backoff between them,
    then the process stops."""
    attempts = range(1, consumer.SEND_ATTEMPTS)
    backoff = sum(min(consumer.SEND_BACKOFF_SECONDS * 2 ** attempt, 5.0) for attempt in attempts)
    return consumer.SEND_ATTEMPTS * consumer.TOPIC_GONE_MS / 1000 + backoff + STOP_SECONDS


@pytest.mark.parametrize("fault", list(FAULTS))
def test_an_output_topic_deleted_or_unwritable_stops_the_worker_with_nothing_committed_it_cannot_return(
        fault, broker, adult, tmp_path):
    bound = exit_bound()
    archive, plan = adult
    config = pipeline(tmp_path, f"out-{fault}", broker.bootstrap, plan)
    group = f"{config.topics.prefix}-{config.name}.records"  # the worker's records group (default app id)
    topic = config.topics.records_in
    break_output, mend_output = FAULTS[fault]
    worker = WorkerProcess(config, broker.bootstrap, tmp_path, name="w").start()
    workers = [worker]
    try:
        wait_ready(worker)
        before = record_messages(archive.subset(slice(0, 400)), config, "before")
        send(broker.bootstrap, config, before)
        seen = set().union(*collect_outputs(broker.bootstrap, config, record_ids(before), timeout=60,
                                            alive=died(worker)))  # repaired or dead-lettered ids
        held = wait_for(lambda: caught_up(broker.bootstrap, group, topic), 30, "the commit of every record sent")
        break_output(broker.bootstrap, config)
        broken = time.monotonic()
        after = record_messages(archive.subset(slice(400, 1200)), config, "after")
        sender = threading.Thread(target=send, args=(broker.bootstrap, config, after, RATE))  # 2 s of records
        sender.start()
        code = worker.wait(timeout=bound)
        stopped = time.monotonic() - broken
        sender.join()
        assert code not in (None, 0), f"{fault} output: still running {bound:g} s on\n{worker.log_tail()}"
        log = worker.log_path.read_text()
        assert "outputs could not be delivered" in log and "stopping the worker with a non-zero exit status" in log
        # Nothing was committed that the broker cannot return: the group is where it was before the fault.
        assert committed(broker.bootstrap, group, topic) == held
        mend_output(broker.bootstrap, config)
        mended = time.monotonic()
        again = WorkerProcess(config, broker.bootstrap, tmp_path, name="again").start()
        workers.append(again)
        ids = record_ids(after)
        repaired, dead = collect_outputs(broker.bootstrap, config, ids, timeout=90, alive=died(again))
        check_one_place(ids, repaired, dead)
        # Every input the group committed can be read back (the first records before the fault, the rest after it).
        final = wait_for(lambda: caught_up(broker.bootstrap, group, topic), 30, "the commit of every record sent")
        out = seen | set(repaired) | set(dead)
        lost = [rid for rid, (partition, offset) in input_offsets(broker.bootstrap, topic).items()
                if offset < final.get(partition, 0) and rid not in out]
        assert not lost, f"{len(lost)} committed inputs have no output, e.g. {lost[:5]}"
        print(f"\noutput {fault}: the worker exited with status {code} {stopped:.1f} s after the fault (bound "
              f"{bound:g} s), nothing committed meanwhile; all {len(ids)} ids out "
              f"{time.monotonic() - mended:.1f} s after the topic was mended")
    finally:
        for running in workers:
            running.stop()
