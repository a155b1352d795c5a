"""The batch consumer's delivery rule, with a scripted librdkafka consumer and producer (no broker).

Outputs are delivered before the batch's offsets are committed; a delivery that keeps failing
commits nothing and stops the loop loudly; a revocation settles the batch in flight. A commit the
group refuses after a rebalance is recovered in place (the batch is replayed); fatal errors end the
loop. Batch N+1 is decoded and applied while N's delivery reports come back, and produced only once
N is settled. The embedded broker's quirk handlers act only where the metadata names it; under
exactly-once each batch is one transaction, aborted and processed again on an abortable error.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from prometheus_client import REGISTRY

from fairstream.streams.config import AgentConfig
from fairstream.streams.worker import consumer as consumer_module
from fairstream.streams.worker.consumer import NOT_LOADED, BatchConsumer, DeliveryError, InputSpec, NotAuthorised
from fairstream.streams.worker.metrics import PipelineMetrics
from fairstream.streams.worker.processing import BatchOutcome

TP = ("in", 0)
INVALID = -1001  # librdkafka's "no offset"
KAFKA = "5L6g3nShT-eMCtK--X86sw"  # an Apache Kafka cluster id: a base64 uuid
TANSU = consumer_module.EMBEDDED_CLUSTER_ID


class Message:
    """What confluent-kafka's Message offers the loop and the batch logic: methods."""

    def __init__(self, key: bytes, value: bytes, offset: int, partition: int = 0, error=None):
        self._key, self._value, self._offset, self._partition, self._error = key, value, offset, partition, error

    def key(self):
        return self._key

    def value(self):
        return self._value

    def offset(self):
        return self._offset

    def partition(self):
        return self._partition

    def topic(self):
        return "in"

    def error(self):
        return self._error

    def timestamp(self):
        return 0, 0


def stats(rxidle_us: int = 1000, state: str = "UP") -> str:
    """librdkafka's statistics as far as the loop reads them: the brokers' last answers and the partitions' leaders."""
    return json.dumps({"brokers": {"b:9092/111": {"nodeid": 111, "state": state, "rxidle": rxidle_us}},
                       "topics": {"in": {"partitions": {"0": {"leader": 111}}}}})


class ScriptedConsumer:
    """Serves ``batches`` in order (an exception or a callable in the list is raised or called instead).

    ``refusals`` commits fail as after a rebalance; ``owned`` is assigned on the first consume().
    """

    def __init__(self, config, batches, log, refusals=0, refusal=KafkaError.ILLEGAL_GENERATION, owned=(TP,),
                 cluster_id=KAFKA):
        self.config, self.batches, self.log = config, list(batches), log
        self.refusals, self.refusal, self.owned = refusals, refusal, [TopicPartition(*tp) for tp in owned]
        self.cluster_id = cluster_id  # None: the metadata request times out
        self.commits, self.seeks, self.served = [], [], []
        self.position_at, self.end, self.committed_at = {}, 10, {}
        self.stats = stats()
        self.assigned = self.closed = False

    def subscribe(self, topics, on_assign, on_revoke):
        self.on_assign, self.on_revoke = on_assign, on_revoke

    def consume(self, num_messages, timeout):
        if not self.assigned:
            self.assigned = True
            self.on_assign(self, self.owned)
        if self.stats is not None:
            self.config["stats_cb"](self.stats)
        if not self.batches:
            return []
        item = self.batches.pop(0)
        if isinstance(item, BaseException):
            raise item
        if callable(item):
            item = item(self)
        else:
            self.served.append(item)
        for m in item:
            if m.error() is None:
                self.position_at[m.topic(), m.partition()] = m.offset() + 1
        return list(item)

    def position(self, partitions):
        return [TopicPartition(tp.topic, tp.partition, self.position_at.get((tp.topic, tp.partition), INVALID))
                for tp in partitions]

    def commit(self, offsets, asynchronous):
        assert asynchronous is False
        if self.refusals:
            self.refusals -= 1
            self.log.append("refused")
            raise KafkaException(KafkaError(self.refusal))
        self.log.append("commit")
        self.commits.append({(tp.topic, tp.partition): tp.offset for tp in offsets})
        return offsets

    def seek(self, tp):
        self.seeks.append(((tp.topic, tp.partition), tp.offset))
        self.position_at.pop((tp.topic, tp.partition), None)
        again = [b for b in self.served if tp.offset <= b[0].offset() < self.end]  # what the log holds, again
        self.batches[:0] = again

    def get_watermark_offsets(self, tp, cached):
        assert cached, "the embedded broker's ListOffsets are wrong: only the fetch's highwater is used"
        return 0, self.end

    def committed(self, partitions, timeout):
        return [TopicPartition(tp.topic, tp.partition, self.committed_at.get((tp.topic, tp.partition), INVALID))
                for tp in partitions]

    def list_topics(self, topic, timeout):
        if self.cluster_id is None:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "no metadata"))
        return SimpleNamespace(cluster_id=self.cluster_id)

    def consumer_group_metadata(self):
        return "group metadata"

    def close(self):
        self.closed = True
        self.log.append("closed")
        self.on_revoke(self, self.owned)

    def revoke(self):
        """A consume() during which the group takes the partitions away (librdkafka calls back from inside it)."""
        def revoked(consumer):
            consumer.on_revoke(consumer, consumer.owned)
            return [Message(b"late", b"late", 99)]  # fetched before the revocation: not this worker's any more
        return revoked


class ScriptedProducer:
    """Queues produce() calls and reports them on flush(); the first ``failures`` reports are failures."""

    def __init__(self, failures: int, log: list):
        self.failures, self.sent, self.log, self.queued = failures, [], log, []

    def produce(self, topic, value, key, on_delivery):
        self.log.append("produced")
        self.queued.append((topic, key, value, on_delivery))

    def flush(self, timeout):
        queued, self.queued = self.queued, []
        for topic, key, value, report in queued:
            if self.failures:
                self.failures -= 1
                report(KafkaError(KafkaError._MSG_TIMED_OUT), None)
            else:
                self.sent.append((topic, key, value))
                self.log.append("reported")
                report(None, None)
        return 0

    def poll(self, timeout):
        return self.flush(timeout)


class TransactionalProducer(ScriptedProducer):
    """A ScriptedProducer with librdkafka's transactional API; ``commit_errors`` are raised by commit_transaction.

    ``committed`` holds what committed transactions delivered; what an aborted one delivered is not in it.
    """

    def __init__(self, failures: int, log: list, commit_errors=()):
        super().__init__(failures, log)
        self.commit_errors, self.committed, self.offsets, self.open = list(commit_errors), [], [], None

    def init_transactions(self, timeout):
        self.log.append("init transactions")

    def begin_transaction(self):
        assert self.open is None, "a transaction is already open"
        self.open, self.delivered_from = [], len(self.sent)
        self.log.append("begin")

    def send_offsets_to_transaction(self, offsets, group_metadata, timeout):
        assert self.open is not None and group_metadata == "group metadata"
        self.open = {(tp.topic, tp.partition): tp.offset for tp in offsets}

    def commit_transaction(self, timeout):
        if self.commit_errors:
            raise KafkaException(self.commit_errors.pop(0))
        self.committed += [value for _, _, value in self.sent[self.delivered_from:]]
        self.offsets.append(self.open)
        self.open = None
        self.log.append("commit transaction")

    def abort_transaction(self, timeout):
        self.open = None
        self.log.append("abort")


def spec(seen, log, active=lambda: "plan", **counted):
    def delivered(outcome, active):
        seen.append(len(outcome.repaired))

    def process(messages, active):
        log.append(f"processed {messages[0].offset()}")
        return BatchOutcome(repaired=[(m.key(), m.value().upper()) for m in messages], version=1, **counted)

    return InputSpec(agent="records", topic="in", output_topic="out", batching=AgentConfig(artifact="plan"),
                     process=process, active=active, delivered=delivered)


def make(monkeypatch, batches, failures=0, seen=None, active=lambda: "plan", pipeline="consumer-test", counted=None,
         transactional_id=None, commit_errors=(), **script):
    log: list = []
    made = {}

    def consumer(config):
        made["consumer"] = ScriptedConsumer(config, batches, log, **script)
        return made["consumer"]

    def producer(config):
        assert config.get("transactional.id") == transactional_id
        made["producer"] = (ScriptedProducer(failures, log) if transactional_id is None
                            else TransactionalProducer(failures, log, commit_errors))
        return made["producer"]

    monkeypatch.setattr(consumer_module, "Consumer", consumer)
    monkeypatch.setattr(consumer_module, "Producer", producer)
    monkeypatch.setattr(consumer_module, "SEND_BACKOFF_SECONDS", 0.0)
    worker = BatchConsumer(spec(seen if seen is not None else [], log, active, **(counted or {})), "unused:9092", "g",
                           "dlq", metrics=PipelineMetrics(pipeline), transactional_id=transactional_id)
    worker._open()
    return worker, made["consumer"], made["producer"]


def batch(start, n):
    return [Message(str(i).encode(), b"v%d" % i, i) for i in range(start, start + n)]


def run(worker, batches: int) -> None:
    for _ in range(batches):
        worker._one_batch()


def test_outputs_are_acknowledged_before_the_offsets_are_committed(monkeypatch):
    seen = []
    worker, scripted, producer = make(monkeypatch, [batch(0, 3), batch(3, 2)], seen=seen)
    run(worker, 3)  # the third consume() finds nothing: the batch in flight is settled then
    delivery = [e for e in scripted.log if e in ("reported", "commit")]
    assert delivery == ["reported"] * 3 + ["commit"] + ["reported"] * 2 + ["commit"]
    assert scripted.commits == [{TP: 3}, {TP: 5}]  # the next offset to read, after the batch's last
    assert [value for _, _, value in producer.sent] == [b"V0", b"V1", b"V2", b"V3", b"V4"]
    assert seen == [3, 2]  # the monitor gets each batch after its commit


def test_what_a_delivered_batch_counts_is_exported_under_its_pipelines_label(monkeypatch):
    """Two consumers of different pipelines in one process: each counts into its own series."""
    def count(pipeline: str, name: str) -> float | None:
        return REGISTRY.get_sample_value(name, {"pipeline": pipeline, "agent": "records"})

    for pipeline, n in (("count-a", 3), ("count-b", 2)):
        worker, _, _ = make(monkeypatch, [batch(0, n)], pipeline=pipeline, counted={"imputed": 1, "skewed": n - 1})
        run(worker, 2)
    assert [count(p, "fairstream_records_in_total") for p in ("count-a", "count-b")] == [3, 2]
    assert [count(p, "fairstream_records_repaired_total") for p in ("count-a", "count-b")] == [3, 2]
    assert [count(p, "fairstream_records_group_imputed_total") for p in ("count-a", "count-b")] == [1, 1]
    assert [count(p, "fairstream_records_event_time_skewed_total") for p in ("count-a", "count-b")] == [2, 1]
    assert count("count-a", "fairstream_records_s_imputed_total") is None


def test_the_next_batch_is_processed_while_reports_come_back_and_produced_only_after_the_batch_settled(monkeypatch):
    worker, scripted, _ = make(monkeypatch, [batch(0, 3), batch(3, 2), batch(5, 1)])
    run(worker, 4)
    assert scripted.log == [
        "processed 0", "produced", "produced", "produced",  # batch 1 handed to the producer
        "processed 3",  # batch 2 decoded and applied before batch 1's reports are awaited
        "reported", "reported", "reported", "commit",  # batch 1 settled: delivered, then committed
        "produced", "produced",  # only now is batch 2 produced: per-partition order
        "processed 5", "reported", "reported", "commit", "produced",
        "reported", "commit"]  # the empty consume() settles the last one


def test_a_transient_send_failure_is_retried_and_the_batch_committed_once(monkeypatch):
    worker, scripted, producer = make(monkeypatch, [batch(0, 2)], failures=1)
    run(worker, 2)
    assert scripted.commits == [{TP: 2}]
    assert [value for _, _, value in producer.sent] == [b"V1", b"V0", b"V1"]  # re-sent whole: identical copies


def test_a_delivery_that_keeps_failing_commits_nothing_and_raises(monkeypatch):
    worker, scripted, _ = make(monkeypatch, [batch(0, 2)], failures=10_000)
    worker._one_batch()
    with pytest.raises(DeliveryError, match="2 outputs could not be delivered: _MSG_TIMED_OUT"):
        worker._one_batch()
    assert scripted.commits == []


def test_a_revocation_settles_the_batch_in_flight_before_the_partitions_go(monkeypatch):
    seen = []
    worker, scripted, producer = make(monkeypatch, [batch(0, 3)], seen=seen)
    scripted.batches.append(scripted.revoke())
    run(worker, 2)  # the second consume() is revoked inside: batch 1 is settled in the callback
    assert scripted.commits == [{TP: 3}] and seen == [3]
    assert worker.progress().partitions == 0 and worker._pending is None
    assert b"LATE" not in [value for _, _, value in producer.sent]  # fetched before the revocation: dropped


def test_a_commit_refused_after_a_rebalance_is_replayed_in_place_from_the_batchs_first_offset(monkeypatch, caplog):
    seen = []
    worker, scripted, producer = make(monkeypatch, [batch(4, 3)], seen=seen, refusals=1)
    with caplog.at_level(logging.WARNING):
        run(worker, 4)  # taken; settled and refused (rewound); the same batch again; settled
    delivery = [e for e in scripted.log if e in ("reported", "refused", "commit")]
    assert delivery == ["reported"] * 3 + ["refused"] + ["reported"] * 3 + ["commit"]
    assert scripted.seeks == [(TP, 4)] and scripted.commits == [{TP: 7}]
    assert [value for _, _, value in producer.sent] == [b"V4", b"V5", b"V6"] * 2  # at-least-once: identical copies
    assert seen == [3]  # the monitor sees the batch once, after the commit that counted
    assert "rebalanced without this worker (ILLEGAL_GENERATION" in caplog.text and "replayed" in caplog.text


def test_a_refused_commit_replays_the_batch_taken_meanwhile_too_and_never_produces_it_first(monkeypatch):
    worker, scripted, producer = make(monkeypatch, [batch(0, 2), batch(2, 2)], refusals=1,
                                      refusal=KafkaError.REBALANCE_IN_PROGRESS)
    run(worker, 5)
    assert scripted.seeks == [(TP, 0)] and scripted.commits == [{TP: 2}, {TP: 4}]
    assert [value for _, _, value in producer.sent] == [b"V0", b"V1", b"V0", b"V1", b"V2", b"V3"]


def test_a_partition_lost_in_the_rebalance_is_left_to_its_new_owner(monkeypatch):
    worker, scripted, _ = make(monkeypatch, [batch(0, 2)], refusals=1, refusal=KafkaError.UNKNOWN_MEMBER_ID)
    worker._one_batch()
    worker._owned = frozenset()  # the group gave it away
    worker._one_batch()
    assert scripted.seeks == [] and scripted.commits == []  # the new owner replays from the committed offset


def test_commits_refused_again_and_again_end_the_loop(monkeypatch):
    refusals = consumer_module.FAILED_COMMITS_IN_A_ROW
    worker, scripted, _ = make(monkeypatch, [batch(0, 2)], refusals=refusals)
    with pytest.raises(KafkaException, match="ILLEGAL_GENERATION"):
        run(worker, 3 * refusals)
    assert scripted.commits == [] and len(scripted.seeks) == refusals - 1


def test_errors_the_client_retries_are_waited_out_and_fatal_ones_end_the_loop(monkeypatch, caplog):
    away = KafkaError(KafkaError._TRANSPORT, "broker away")
    worker, scripted, _ = make(monkeypatch, [[Message(None, None, -1, error=away)], batch(0, 2)])
    with caplog.at_level(logging.WARNING):
        run(worker, 3)
    assert scripted.commits == [{TP: 2}] and worker.progress().last_error == "_TRANSPORT: broker away"
    assert "Kafka client error _TRANSPORT (the client retries)" in caplog.text

    def fatal_callback(consumer):
        consumer.config["error_cb"](KafkaError(KafkaError._FATAL, "idempotence broken", fatal=True))
        return batch(0, 2)

    fatal, scripted, _ = make(monkeypatch, [fatal_callback])
    with pytest.raises(KafkaException, match="idempotence broken"):
        fatal._one_batch()
    denied, _, _ = make(monkeypatch, [[Message(None, None, -1, error=KafkaError(
        KafkaError.TOPIC_AUTHORIZATION_FAILED))]])
    with pytest.raises(NotAuthorised, match="^not authorised: User:ANONYMOUS may not read topic in "):
        denied._one_batch()  # the broker's refusal, in one line naming the principal, the operation and the topic


def test_a_crash_of_the_loop_is_logged_critical_and_raised_for_mode_to_end_the_worker(monkeypatch, caplog):
    worker, scripted, _ = make(monkeypatch, [batch(0, 2), batch(2, 1)], failures=10_000)
    worker._open = lambda: None  # opened above

    async def crash():
        with pytest.raises(DeliveryError):
            await BatchConsumer._consume(worker)  # the service task, run once by hand: the loop's thread

    with caplog.at_level(logging.CRITICAL):
        asyncio.run(crash())
    assert scripted.commits == [] and "non-zero exit status" in caplog.text
    assert scripted.closed and scripted.log[-1] == "closed"  # left the group, with nothing settled on the way


def test_a_stop_finishes_the_batch_it_holds_and_leaves_the_group(monkeypatch):
    taken = threading.Event()
    worker, scripted, producer = make(monkeypatch, [batch(0, 2)])
    worker._open = lambda: None

    def take_then_wait(consumer):
        taken.set()
        time.sleep(0.2)  # the stop arrives while this batch is being taken
        return batch(2, 3)

    scripted.batches.append(take_then_wait)

    async def stop_midway():
        task = asyncio.ensure_future(BatchConsumer._consume(worker))
        while not taken.is_set():
            await asyncio.sleep(0.01)
        await worker.on_stop()
        await task

    asyncio.run(stop_midway())
    assert scripted.commits == [{TP: 2}, {TP: 5}] and len(producer.sent) == 5  # the batch held: delivered, committed
    assert scripted.log[-1] == "closed"


def test_the_input_is_held_while_no_artifact_is_loaded_and_a_stop_ends_the_wait(monkeypatch):
    monkeypatch.setattr(consumer_module, "HOLD_SECONDS", 0.01)
    loaded = []
    worker, scripted, _ = make(monkeypatch, [batch(0, 2)], active=lambda: loaded[0] if loaded else NOT_LOADED)
    threading.Timer(0.1, lambda: loaded.append("plan")).start()
    worker._one_batch()  # waits until the artifact is loaded; only then fetches
    assert len(scripted.served) == 1 and worker._pending is not None
    held, scripted, _ = make(monkeypatch, [batch(0, 2)], active=lambda: NOT_LOADED)
    held._stop.set()
    held._one_batch()
    assert scripted.served == []  # nothing fetched while held


def test_progress_is_a_commit_or_an_empty_fetch_at_the_end_of_every_partition_its_broker_just_answered(monkeypatch):
    worker, scripted, _ = make(monkeypatch, [batch(0, 2)])
    before = worker.progress()
    run(worker, 2)  # a commit
    after_commit = worker.progress()
    worker._progress_at = None
    scripted.position_at[TP] = 9  # an empty fetch one record behind the highwater: not caught up
    worker._one_batch()
    behind = worker.progress()
    scripted.position_at[TP] = 10
    scripted.stats = stats(rxidle_us=60_000_000)  # at the end, but the broker went quiet a minute ago
    worker._one_batch()
    quiet = worker.progress()
    scripted.stats = stats(state="DOWN")
    worker._one_batch()
    down = worker.progress()
    scripted.stats = stats()
    worker._one_batch()
    assert before.seconds_since is None and before.partitions == 0
    assert after_commit.seconds_since < 5 and after_commit.partitions == 1
    assert behind.seconds_since is None and quiet.seconds_since is None and down.seconds_since is None
    assert worker.progress().seconds_since < 5


def test_an_empty_partition_or_one_read_to_its_committed_end_is_caught_up_before_any_record(monkeypatch):
    worker, scripted, _ = make(monkeypatch, [])
    scripted.end = 0  # a new topic: nothing read, nothing committed, the log empty
    worker._one_batch()
    assert worker.progress().seconds_since < 5
    restarted, scripted, _ = make(monkeypatch, [], owned=(TP,))
    scripted.committed_at[TP] = 10  # everything committed by a previous run
    restarted._one_batch()
    assert restarted.progress().seconds_since < 5


def test_on_tansu_a_position_past_the_end_of_a_shorter_log_is_reset_to_the_beginning_as_out_of_range(monkeypatch,
                                                                                                     caplog):
    worker, scripted, _ = make(monkeypatch, [], cluster_id=TANSU)
    # The committed offset of a log the broker lost; the new log is short.
    scripted.committed_at[TP], scripted.end = 500, 75
    with caplog.at_level(logging.WARNING):
        worker._one_batch()  # the fetch past the end returns nothing, and no error
        reset = (list(scripted.seeks), worker.progress())
        worker._one_batch()  # now at 0 < 75: nothing more to reset
    seeks, progress = reset
    assert seeks == [(TP, 0)] and scripted.seeks == [(TP, 0)]
    assert progress.seconds_since is None  # not "caught up": 75 records below the position were never read
    assert progress.last_error == "offset out of range: in[0] at 500, log ends at 75"
    assert "in[0] is at offset 500 but its log ends at 75" in caplog.text


def test_on_tansu_a_batch_past_the_end_of_a_shorter_log_is_delivered_but_its_offset_not_committed(monkeypatch, caplog):
    worker, scripted, producer = make(monkeypatch, [batch(498, 2)], cluster_id=TANSU)
    scripted.end = 75  # the broker lost the log while the batch was in flight; the sends reached the new one
    with caplog.at_level(logging.WARNING):
        run(worker, 2)
    assert [value for _, _, value in producer.sent] == [b"V498", b"V499"] and scripted.commits == []
    assert "the delivered batch ends at offset 500 but the partition's log now ends at 75" in caplog.text


def test_on_kafka_a_position_past_a_stale_cached_highwater_is_left_where_it_is(monkeypatch):
    """A partition back from another member: its committed offset is past what this consumer's last fetch saw.

    Kafka answers a fetch that is really out of range with OFFSET_OUT_OF_RANGE and librdkafka applies
    auto.offset.reset; the cached highwater is only stale, and a seek to 0 would replay the retained log.
    """
    worker, scripted, producer = make(monkeypatch, [])
    scripted.committed_at[TP], scripted.end = 500, 75
    worker._one_batch()
    scripted.batches.append(batch(500, 2))  # the fetch from the committed offset answers with what follows it
    run(worker, 2)
    assert scripted.seeks == [] and scripted.commits == [{TP: 502}]
    assert [value for _, _, value in producer.sent] == [b"V500", b"V501"]


def test_the_broker_is_told_apart_by_its_cluster_id_and_asked_again_at_assignment_while_unknown(monkeypatch):
    kafka, _, _ = make(monkeypatch, [])
    tansu, _, _ = make(monkeypatch, [], cluster_id=TANSU)
    assert (kafka._embedded, tansu._embedded) == (False, True)
    unknown, scripted, _ = make(monkeypatch, [], cluster_id=None)  # the metadata did not come within the open
    assert unknown._embedded is None
    scripted.cluster_id = TANSU
    unknown._one_batch()  # the first assignment
    assert unknown._embedded is True


def test_a_start_ends_once_the_group_assigned_partitions_and_what_was_read_while_joining_is_processed(monkeypatch):
    worker, scripted, producer = make(monkeypatch, [batch(0, 2)])  # the assignment comes with the first records
    worker._open = lambda: None

    async def start_then_stop():
        await worker.on_start()  # as aiokafka's start did: the worker is up once it is in its group
        owned = worker.progress().partitions
        task = asyncio.ensure_future(BatchConsumer._consume(worker))
        deadline = time.monotonic() + 10
        while not scripted.commits and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await worker.on_stop()
        await task
        return owned

    assert asyncio.run(start_then_stop()) == 1
    assert scripted.commits == [{TP: 2}] and [value for _, _, value in producer.sent] == [b"V0", b"V1"]


@pytest.mark.parametrize("cluster_id", [TANSU, KAFKA])
def test_a_stop_while_the_start_still_waits_for_the_group_join_ends_with_the_thread_not_after_the_timeout(
        monkeypatch, cluster_id):
    # SIGTERM a worker a second after it started: its consumers are still joining, the batch loop's task never ran.
    monkeypatch.setattr(consumer_module, "JOIN_SETTLE_SECONDS", 0.2)
    worker, scripted, _ = make(monkeypatch, [], cluster_id=cluster_id)
    worker._open = lambda: None
    scripted.assigned = True  # the join never ends: no assignment comes

    async def stop_during_start():
        start = asyncio.ensure_future(worker.on_start())
        await asyncio.sleep(0.3)
        began = time.monotonic()
        await worker.on_stop()
        await start
        return time.monotonic() - began

    assert asyncio.run(stop_during_start()) < 5  # was the whole 30 s settle timeout, with an ERROR line
    assert scripted.closed


def test_a_close_waits_for_a_join_in_flight_on_tansu_only(monkeypatch):
    """Tansu keeps a member that leaves mid-join as the group's leader; Kafka rebalances without it."""
    monkeypatch.setattr(consumer_module, "JOIN_SETTLE_SECONDS", 0.3)
    waited = {}
    for cluster_id in (TANSU, KAFKA):
        worker, scripted, _ = make(monkeypatch, [], cluster_id=cluster_id)
        scripted.assigned = True  # the join never ends
        began = time.monotonic()
        worker._close()
        waited[cluster_id] = time.monotonic() - began
    assert waited[TANSU] >= 0.3 > waited[KAFKA]


def test_a_worker_whose_brokers_stay_silent_ends_its_loop_instead_of_staying_up_unconsuming(monkeypatch):
    # The broker was killed: librdkafka retries for ever, /healthz stays 200, nothing is consumed.
    monkeypatch.setattr(consumer_module, "BROKER_LOST_SECONDS", 0.2)
    worker, scripted, _ = make(monkeypatch, [batch(0, 2)])
    run(worker, 1)  # the broker answers: nothing happens
    scripted.stats = stats(state="DOWN")
    worker._answered.clear()
    time.sleep(0.3)
    with pytest.raises(consumer_module.BrokerLost, match="no Kafka broker at unused:9092 has answered for 0.2 s"):
        run(worker, 1)


def test_a_hold_for_a_missing_artifact_does_not_count_as_a_silent_broker(monkeypatch):
    # While held nothing is polled, so no statistics arrive: the silence is ours, not the broker's.
    monkeypatch.setattr(consumer_module, "BROKER_LOST_SECONDS", 0.2)
    monkeypatch.setattr(consumer_module, "HOLD_SECONDS", 0.01)
    loaded = []
    worker, scripted, _ = make(monkeypatch, [batch(0, 2)], active=lambda: loaded[0] if loaded else NOT_LOADED)
    scripted.stats = None  # no statistics until the first poll after the hold
    threading.Timer(0.4, lambda: loaded.append("plan")).start()
    worker._one_batch()
    assert len(scripted.served) == 1


def test_a_batch_is_applied_by_the_version_active_when_it_was_taken_not_when_an_idle_fetch_began(monkeypatch):
    """A swap while the consumer waits in an idle fetch: the records that then arrive are the new version's."""
    current, applied = ["v1"], []

    def swap_then_deliver(consumer):  # the control topic swaps while consume() waits for records
        current[0] = "v2"
        return batch(0, 2)

    worker, _, _ = make(monkeypatch, [swap_then_deliver, batch(2, 1)], active=lambda: current[0])
    worker.spec = dataclasses.replace(worker.spec, process=lambda messages, active: (
        applied.append(active), BatchOutcome(repaired=[(m.key(), m.value()) for m in messages], version=1))[1])
    run(worker, 3)
    assert applied == ["v2", "v2"]


# --------------------------------------------------------------------------- exactly-once


def test_exactly_once_each_batch_is_one_transaction_of_its_outputs_and_offsets_committed_before_the_monitor_sees_it(
        monkeypatch):
    seen = []
    worker, scripted, producer = make(monkeypatch, [batch(0, 3), batch(3, 2)], seen=seen, transactional_id="g.h-0")
    run(worker, 3)
    assert scripted.log == [
        "init transactions",
        "processed 0", "begin", "produced", "produced", "produced",
        "processed 3",  # batch 2 decoded and applied while batch 1's transaction is open: the pipelining stays
        "reported", "reported", "reported", "commit transaction",
        "begin", "produced", "produced", "reported", "reported", "commit transaction"]
    assert producer.offsets == [{TP: 3}, {TP: 5}] and scripted.commits == []  # offsets go through the transaction
    assert producer.committed == [b"V0", b"V1", b"V2", b"V3", b"V4"] and seen == [3, 2]


def test_exactly_once_an_aborted_transaction_counts_nowhere_and_its_batch_is_processed_again(monkeypatch, caplog):
    seen = []
    fenced = KafkaError(KafkaError.ILLEGAL_GENERATION, "the group moved on", txn_requires_abort=True)
    worker, scripted, producer = make(monkeypatch, [batch(4, 3)], seen=seen, transactional_id="g.h-0",
                                      commit_errors=[fenced])
    with caplog.at_level(logging.WARNING):
        run(worker, 4)  # taken; its transaction aborted (rewound); the same batch again; committed
    assert "abort" in scripted.log and scripted.seeks == [(TP, 4)]
    assert producer.committed == [b"V4", b"V5", b"V6"] and producer.offsets == [{TP: 7}]
    assert seen == [3]  # the monitor counts the batch once, after the commit that counted
    assert "transaction of a batch of 3 records was aborted (ILLEGAL_GENERATION" in caplog.text


def test_exactly_once_a_fatal_producer_error_ends_the_loop_with_nothing_committed(monkeypatch):
    fenced = KafkaError(KafkaError._FENCED, "fenced by a newer producer with the same transactional.id", fatal=True)
    worker, scripted, producer = make(monkeypatch, [batch(0, 2)], transactional_id="g.h-0", commit_errors=[fenced])
    worker._one_batch()
    with pytest.raises(KafkaException, match="fenced by a newer producer"):
        worker._one_batch()
    assert producer.committed == [] and "abort" not in scripted.log


def test_exactly_once_transactions_aborted_again_and_again_end_the_loop(monkeypatch):
    again = KafkaError(KafkaError._MSG_TIMED_OUT, "broker away", txn_requires_abort=True)
    aborts = consumer_module.FAILED_COMMITS_IN_A_ROW
    worker, scripted, producer = make(monkeypatch, [batch(0, 2)], transactional_id="g.h-0",
                                      commit_errors=[again] * aborts)
    with pytest.raises(DeliveryError, match=f"{aborts} transactions in a row were aborted, the last: _MSG_TIMED_OUT"):
        run(worker, 3 * aborts)
    assert producer.committed == [] and len(scripted.seeks) == aborts - 1


def test_exactly_once_is_refused_on_the_embedded_broker(monkeypatch):
    with pytest.raises(consumer_module.UnsupportedBroker, match='exactly_once" needs Apache Kafka'):
        make(monkeypatch, [], transactional_id="g.h-0", cluster_id=TANSU)
