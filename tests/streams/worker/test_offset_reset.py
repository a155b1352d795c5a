"""Where a worker resumes on Apache Kafka when its position and the log disagree (issue 29, item 3).

The worker carries handlers for the embedded broker's quirks (a fetch past the log's end that is no
error); on Kafka they must not act, and the worker must do what Kafka's contract says:
``auto.offset.reset`` (earliest) applies only to a real out-of-range, which the broker reports, and
never as a replay from offset 0 of a live log. Each test drives a case that would trigger a handler
with a real ``fairstream worker`` process on the session's Kafka:

- a partition that comes back to the worker after another member advanced it: the worker's cached
  fetch highwater is stale (below the committed offset) until its first fetch there is answered, and
  retention removed the start of the log (on this loopback broker the first answer comes within
  milliseconds, so the worker's fetch wait is raised to a second, as a broker far away or under load
  answers an idle partition);
- a committed offset below the log's start (records removed by ``delete_records``, as retention does);
- the input topic deleted and re-created, shorter, under a running worker.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import textwrap
from collections import Counter

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from fairstream.streams.demo.collect import TopicReader
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.ops.supervise import WorkerProcess
from fairstream.streams.topics import ensure_topics
from tests.polling import wait_for

from .outputs import collect_outputs, send
from .test_liveness import adult, died, pipeline, wait_ready  # noqa: F401 (adult: a fixture)

pytestmark = pytest.mark.integration

OUT_SECONDS = 60.0  # every id of a few hundred records is out within this once the worker consumes
READY_OUT_SECONDS = 90.0  # a worker's start (Faust, the control topic, the group join), then the records out


# The worker's fetch of an idle partition answers after a second (the broker holds it for data that does not come).
SLOW_FETCH = textwrap.dedent('''
    from fairstream.streams.worker import consumer

    consumer.FETCH_MAX_WAIT_MS = 1000
''')


def slow_fetch(tmp_path) -> dict[str, str]:
    """The environment of a worker whose fetches of idle partitions take a second (:data:`SLOW_FETCH`)."""
    (tmp_path / "slow").mkdir()
    (tmp_path / "slow" / "sitecustomize.py").write_text(SLOW_FETCH)
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "slow"), os.environ.get("PYTHONPATH")]))}


def ids_of(messages) -> set[str]:
    return {key.decode() for key, _ in messages}


def records_group(config) -> str:
    """The consumer group of the records input of the pipeline's workers (the default app id)."""
    return f"{config.topics.prefix}-{config.name}.records"


def output_id(topic: str, value: bytes, config) -> str:
    """The record id of an output: a repaired record's ``id``, or the key a dead letter carries."""
    body = json.loads(value)
    return body["id"] if topic == config.topics.records_repaired else base64.b64decode(body["key_b64"]).decode()


def output_ids(bootstrap: str, config, timeout: float = 30.0) -> Counter:
    """How many times each id is in the pipeline's outputs (repaired records and dead letters), read to the end."""
    counts: Counter = Counter()
    for topic in (config.topics.records_repaired, config.topics.dlq):
        with TopicReader(bootstrap, topic) as reader:
            def read_to_end() -> bool:
                counts.update(output_id(topic, m.value, config) for m in reader.poll())
                return reader.at_end()

            wait_for(read_to_end, timeout, f"end of {topic}")
    return counts


def input_log(bootstrap: str, config) -> dict[int, list[tuple[int, str]]]:
    """partition -> (offset, id) of every record the input topic holds, in offset order."""
    log: dict[int, list[tuple[int, str]]] = {}
    with TopicReader(bootstrap, config.topics.records_in) as reader:
        def read_to_end() -> bool:
            for m in reader.poll():
                log.setdefault(m.partition, []).append((m.offset, m.key.decode()))
            return reader.at_end()

        wait_for(read_to_end, 30, "end of the input topic")
    return log


def partition_count(bootstrap: str, topic: str) -> int:
    return len(AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10).topics[topic].partitions)


def delete_below(bootstrap: str, topic: str, offsets: dict[int, int]) -> None:
    """Remove every record below ``offsets[partition]``, as retention does: the log's start moves there."""
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the futures are done: they die with it
    futures = admin.delete_records([TopicPartition(topic, partition, offset) for partition, offset in offsets.items()])
    for tp, future in futures.items():
        assert future.result(timeout=30).low_watermark == tp.offset


def assigned_partitions(worker: WorkerProcess) -> int:
    """How many input partitions the records consumer's last assignment gave the worker."""
    lines = re.findall(r"records: partitions assigned[^\n]*", worker.log_path.read_text())
    return lines[-1].count("records.in[") if lines else 0


def each_once(counts: Counter, ids: set[str]) -> dict[str, int]:
    """The ids of ``ids`` not out exactly once, with how often they are (empty: each is out once)."""
    return {rid: counts[rid] for rid in ids if counts[rid] != 1}


@contextlib.contextmanager
def worker_past_first(broker, adult, tmp_path, prefix: str, count: int, env: dict | None = None):
    """A pipeline of its own and a worker that consumed and delivered ``count`` records: (config, worker, first).

    The worker is stopped on the way out.
    """
    archive, plan = adult
    config = pipeline(tmp_path, prefix, broker.bootstrap, plan)
    worker = WorkerProcess(config, broker.bootstrap, tmp_path, name="w", env=env).start()
    try:
        wait_ready(worker)
        first = record_messages(archive.subset(slice(0, count)), config, "first")
        send(broker.bootstrap, config, first)
        collect_outputs(broker.bootstrap, config, ids_of(first), OUT_SECONDS, alive=died(worker))
        yield config, worker, first
    finally:
        worker.stop()


class GroupMember:
    """A plain consumer in the worker's group: it takes partitions from the worker, reads them and commits."""

    def __init__(self, bootstrap: str, group: str, topic: str):
        self.topic, self.owned = topic, []
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                                  "auto.offset.reset": "earliest", "partition.assignment.strategy": "range",
                                  "session.timeout.ms": 10_000, "heartbeat.interval.ms": 1000})

    def __enter__(self) -> "GroupMember":
        self.consumer.subscribe([self.topic], on_assign=lambda _, partitions: self.owned.extend(partitions))
        wait_for(lambda: self.consumer.consume(100, 0.2) == [] and self.owned, 60, "assignment of the other member")
        return self

    def read_and_commit(self, timeout: float = 60.0) -> tuple[set[str], dict[int, int]]:
        """Read its partitions to their ends and commit: the ids read, and partition -> the offset committed."""
        ids: set[str] = set()

        def at_end() -> bool:
            ids.update(m.key().decode() for m in self.consumer.consume(1000, 0.2) if m.error() is None)
            positions = self.consumer.position(self.owned)
            return all(tp.offset == self.consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in positions)

        wait_for(at_end, timeout, "end of the other member's partitions")
        committed = self.consumer.commit(asynchronous=False)
        return ids, {tp.partition: tp.offset for tp in committed}

    def __exit__(self, *exc) -> None:
        self.consumer.close()  # leaves the group: the worker gets the partitions back


def test_a_partition_back_from_another_member_resumes_at_its_committed_offset_not_at_the_start_of_the_log(
        broker, adult, tmp_path):
    archive = adult[0]
    # The worker alone read every partition: its cached fetch highwaters are the ends of `first`.
    with worker_past_first(broker, adult, tmp_path, "stalehw", 400, env=slow_fetch(tmp_path)) as (config, worker,
                                                                                                  first):
        with GroupMember(broker.bootstrap, records_group(config), config.topics.records_in) as other:
            second = record_messages(archive.subset(slice(400, 1200)), config, "second")
            send(broker.bootstrap, config, second)
            taken, committed = other.read_and_commit()
            # Retention removed the start of the other member's partitions (not what it committed).
            first_of_second = {p: min(o for o, rid in records if rid.startswith("second"))
                               for p, records in input_log(broker.bootstrap, config).items() if p in committed}
            delete_below(broker.bootstrap, config.topics.records_in, first_of_second)
        every = partition_count(broker.bootstrap, config.topics.records_in)
        wait_for(lambda: assigned_partitions(worker) == every, 60, "reassignment to the worker")
        third = record_messages(archive.subset(slice(1200, 1600)), config, "third")
        send(broker.bootstrap, config, third)
        mine = ids_of(first) | (ids_of(second) - taken) | ids_of(third)
        collect_outputs(broker.bootstrap, config, mine, OUT_SECONDS, alive=died(worker))
        counts = output_ids(broker.bootstrap, config)
        # The group committed what the other member read: the worker resumes after it (a seek to 0 on the stale
        # highwater would replay the retained log, `taken` among it), and no id is out twice.
        assert taken and not taken & counts.keys(), f"{len(taken & counts.keys())} ids the group had committed"
        assert each_once(counts, mine) == {}
        log = worker.log_path.read_text()
        assert "out of range" not in log and "offset reset" not in log


def test_a_committed_offset_below_the_log_start_resumes_at_the_log_start(broker, adult, tmp_path):
    with worker_past_first(broker, adult, tmp_path, "retained", 400) as (config, worker, first):
        worker.stop()  # a clean stop: everything of `first` committed
        second = record_messages(adult[0].subset(slice(400, 1200)), config, "second")
        send(broker.bootstrap, config, second)
        # Retention removes `first` and the older half of `second`: the committed offsets are below the log's start.
        log = {p: [(o, rid) for o, rid in records if rid.startswith("second")]
               for p, records in input_log(broker.bootstrap, config).items()}
        cuts = {p: records[len(records) // 2][0] for p, records in log.items()}
        delete_below(broker.bootstrap, config.topics.records_in, cuts)
        kept = {rid for p, records in log.items() for o, rid in records if o >= cuts[p]}
        worker.start()
        collect_outputs(broker.bootstrap, config, kept, READY_OUT_SECONDS, alive=died(worker))
        counts = output_ids(broker.bootstrap, config)
        assert each_once(counts, kept | ids_of(first)) == {}  # from the log's start on, nothing twice
        assert not (ids_of(second) - kept) & counts.keys()  # what retention removed is gone, as Kafka says
        # librdkafka's own line: the fetch was out of range and auto.offset.reset applied.
        assert re.search(r"offset reset \(at offset \d+.*Offset out of range", worker.log_path.read_text())


def test_an_input_topic_deleted_and_re_created_under_a_running_worker_is_read_from_its_start(broker, adult, tmp_path):
    with worker_past_first(broker, adult, tmp_path, "recreated", 1000) as (config, worker, first):
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.delete_topics([config.topics.records_in])[config.topics.records_in].result()
        wait_for(lambda: config.topics.records_in not in admin.list_topics(timeout=10).topics, 30, "topic deletion")
        ensure_topics(broker.bootstrap, config.topics)  # the same name, a new log, shorter than the old one
        second = record_messages(adult[0].subset(slice(1000, 1100)), config, "second")
        send(broker.bootstrap, config, second)
        collect_outputs(broker.bootstrap, config, ids_of(second), OUT_SECONDS, alive=died(worker))
        counts = output_ids(broker.bootstrap, config)
        assert each_once(counts, ids_of(first) | ids_of(second)) == {}
