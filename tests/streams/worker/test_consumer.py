"""The batch consumer's delivery rule, with a scripted consumer and producer (no broker).

Outputs are delivered before the batch's offsets are committed; a delivery that keeps failing
commits nothing and stops the loop loudly; a revocation waits for the batch in flight. A commit the
group refuses after a rebalance is recovered in place (the batch is replayed); errors the client
does not retry end the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import (
    CommitFailedError,
    KafkaConnectionError,
    KafkaTimeoutError,
    TopicAuthorizationFailedError,
)

from fairstream.streams.config import AgentConfig
from fairstream.streams.worker import consumer as consumer_module
from fairstream.streams.worker.consumer import BatchConsumer, DeliveryError, InputSpec, _SettleOnRevoke
from fairstream.streams.worker.processing import BatchOutcome

TP = TopicPartition("in", 0)


@dataclass
class Message:
    key: bytes
    value: bytes
    offset: int
    topic: str = "in"
    partition: int = 0


class ScriptedConsumer:
    """Serves ``batches`` in order; ``refusals`` commits fail as after a rebalance; ``fetch_errors`` come first."""

    def __init__(self, batches, refusals=0, fetch_errors=(), owned=(TP,)):
        self.batches, self.commits, self.log, self.seeks = list(batches), [], [], []
        self.refusals, self.fetch_errors, self.owned = refusals, list(fetch_errors), set(owned)
        self.served: list = []  # every batch handed out, so that a seek can serve it again
        self.polled_ms, self.end, self.at = time.time() * 1000, 10, 10

    async def getmany(self, timeout_ms, max_records):
        if self.fetch_errors:
            raise self.fetch_errors.pop(0)
        if not self.batches:
            return {}
        self.served.append(self.batches.pop(0))
        return {TP: self.served[-1]}

    async def commit(self, offsets):
        if self.refusals:
            self.refusals -= 1
            self.log.append("refused")
            raise CommitFailedError("the group has already rebalanced")
        self.log.append("commit")
        self.commits.append(dict(offsets))

    def seek(self, tp, offset):
        self.seeks.append((tp, offset))
        self.at = offset
        self.batches[:0] = [b for b in self.served if b[0].offset == offset][:1]  # a batch served again

    def assignment(self):
        return set(self.owned)

    def highwater(self, tp):
        return self.end

    def last_poll_timestamp(self, tp):
        return self.polled_ms

    async def position(self, tp):
        return self.at


class ScriptedProducer:
    def __init__(self, failures: int, log: list):
        self.failures, self.sent, self.log = failures, [], log

    async def send(self, topic, value, key=None):
        future = asyncio.get_running_loop().create_future()
        if self.failures:
            self.failures -= 1
            future.set_exception(KafkaTimeoutError())
        else:
            self.sent.append((topic, key, value))
            self.log.append("sent")
            future.set_result(None)
        return future


class Output:
    def __init__(self, producer):
        self.producer = producer


def spec(seen):
    async def active():
        return "plan"

    async def delivered(outcome, active):
        seen.append(len(outcome.repaired))

    def process(messages, active):
        return BatchOutcome(repaired=[(m.key, m.value.upper()) for m in messages], version=1)

    return InputSpec(agent="records", topic="in", output_topic="out", batching=AgentConfig(artifact="plan"),
                     process=process, active=active, delivered=delivered)


def make(batches, failures=0, seen=None, **script):
    scripted = ScriptedConsumer(batches, **script)
    producer = ScriptedProducer(failures, scripted.log)
    worker = BatchConsumer(spec(seen if seen is not None else []), "unused:9092", "g", Output(producer), "dlq")
    worker._consumer = scripted
    return worker, scripted, producer


def batch(start, n):
    return [Message(str(i).encode(), b"v%d" % i, i) for i in range(start, start + n)]


def test_outputs_are_acknowledged_before_the_offsets_are_committed(monkeypatch):
    async def run():
        seen = []
        worker, scripted, producer = make([batch(0, 3), batch(3, 2)], seen=seen)
        await worker._one_batch()
        await worker._one_batch()
        return scripted, producer, seen

    scripted, producer, seen = asyncio.run(run())
    assert scripted.log == ["sent"] * 3 + ["commit"] + ["sent"] * 2 + ["commit"]
    assert scripted.commits == [{TP: 3}, {TP: 5}]  # the next offset to read, after the batch's last
    assert [value for _, _, value in producer.sent] == [b"V0", b"V1", b"V2", b"V3", b"V4"]
    assert seen == [3, 2]  # the monitor gets each batch after its commit


def test_a_transient_send_failure_is_retried_and_the_batch_committed_once(monkeypatch):
    monkeypatch.setattr(consumer_module.asyncio, "sleep", _no_sleep)

    async def run():
        worker, scripted, producer = make([batch(0, 2)], failures=1)
        await worker._one_batch()
        return scripted, producer

    scripted, producer = asyncio.run(run())
    assert scripted.commits == [{TP: 2}] and len(producer.sent) >= 2


def test_a_delivery_that_keeps_failing_commits_nothing_and_raises(monkeypatch):
    monkeypatch.setattr(consumer_module.asyncio, "sleep", _no_sleep)

    async def run():
        worker, scripted, _ = make([batch(0, 2)], failures=10_000)
        with pytest.raises(DeliveryError, match="2 outputs could not be delivered"):
            await worker._one_batch()
        return scripted

    assert asyncio.run(run()).commits == []


def test_a_revocation_waits_for_the_batch_in_flight():
    async def run():
        lock, order = asyncio.Lock(), []
        listener = _SettleOnRevoke(lock, "records")

        async def batch_in_flight():
            async with lock:
                order.append("batch started")
                await asyncio.sleep(0.05)
                order.append("batch committed")

        async def revoke():
            await asyncio.sleep(0.01)
            await listener.on_partitions_revoked({TP})
            order.append("revoked")

        await asyncio.gather(batch_in_flight(), revoke())
        return order

    assert asyncio.run(run()) == ["batch started", "batch committed", "revoked"]


_real_sleep = asyncio.sleep


async def _no_sleep(seconds):
    await _real_sleep(0)


def test_a_commit_refused_after_a_rebalance_is_replayed_in_place_from_the_batchs_first_offset(caplog):
    async def run():
        seen = []
        worker, scripted, producer = make([batch(4, 3)], seen=seen, refusals=1)
        await worker._one_batch()  # delivered, refused: no exception, nothing committed, rewound
        await worker._one_batch()  # the same batch again
        return scripted, producer, seen

    with caplog.at_level(logging.WARNING):
        scripted, producer, seen = asyncio.run(run())
    assert scripted.log == ["sent"] * 3 + ["refused"] + ["sent"] * 3 + ["commit"]
    assert scripted.seeks == [(TP, 4)] and scripted.commits == [{TP: 7}]
    assert [value for _, _, value in producer.sent] == [b"V4", b"V5", b"V6"] * 2  # at-least-once: identical copies
    assert seen == [3]  # the monitor sees the batch once, after the commit that counted
    assert "rebalanced without this worker" in caplog.text and "replayed" in caplog.text


def test_a_partition_lost_in_the_rebalance_is_left_to_its_new_owner():
    async def run():
        worker, scripted, _ = make([batch(0, 2)], refusals=1, owned=())
        await worker._one_batch()
        return scripted

    scripted = asyncio.run(run())
    assert scripted.seeks == [] and scripted.commits == []  # the new owner replays from the committed offset


def test_commits_refused_again_and_again_end_the_loop(monkeypatch):
    refusals = consumer_module.FAILED_COMMITS_IN_A_ROW

    async def run():
        worker, scripted, _ = make([batch(0, 2)], refusals=refusals)
        for _ in range(refusals - 1):
            await worker._one_batch()
        with pytest.raises(CommitFailedError):
            await worker._one_batch()
        return scripted

    assert asyncio.run(run()).commits == []


def test_a_fetch_error_the_client_retries_is_waited_out_and_any_other_ends_the_loop(monkeypatch):
    monkeypatch.setattr(consumer_module, "RETRY_PAUSE_SECONDS", 0.01)

    async def run():
        worker, scripted, _ = make([batch(0, 2)], fetch_errors=[KafkaConnectionError("broker away")])
        await worker._one_batch()  # the retriable error: nothing fetched, no exception
        await worker._one_batch()
        fatal, _, _ = make([batch(0, 2)], fetch_errors=[TopicAuthorizationFailedError()])
        with pytest.raises(TopicAuthorizationFailedError):
            await fatal._one_batch()
        return worker, scripted

    worker, scripted = asyncio.run(run())
    assert scripted.commits == [{TP: 2}] and "KafkaConnectionError" in worker.progress().last_error


def test_a_crash_of_the_loop_is_logged_critical_and_raised_for_mode_to_end_the_worker(monkeypatch, caplog):
    monkeypatch.setattr(consumer_module.asyncio, "sleep", _no_sleep)

    async def run():
        worker, scripted, _ = make([batch(0, 2)], failures=10_000)
        with pytest.raises(DeliveryError):
            await BatchConsumer._consume(worker)  # the service task, run once by hand
        return worker, scripted

    with caplog.at_level(logging.CRITICAL):
        worker, scripted = asyncio.run(run())
    assert worker._finished.is_set() and scripted.commits == []  # a stop waiting for the batch is released
    assert "non-zero exit status" in caplog.text


def test_progress_is_a_commit_or_an_empty_fetch_at_the_end_of_every_partition_the_broker_just_answered():
    async def run():
        worker, scripted, _ = make([batch(0, 2)])
        before = worker.progress()
        await worker._one_batch()  # a commit
        after_commit = worker.progress()
        worker._progress_at = None
        scripted.at = 9  # an empty fetch one record behind the highwater: not caught up
        await worker._one_batch()
        behind = worker.progress()
        scripted.at, scripted.polled_ms = 10, time.time() * 1000 - 60_000  # at the end, but the broker went quiet
        await worker._one_batch()
        quiet = worker.progress()
        scripted.polled_ms = time.time() * 1000
        await worker._one_batch()
        return before, after_commit, behind, quiet, worker.progress()

    before, after_commit, behind, quiet, caught_up = asyncio.run(run())
    assert before.seconds_since is None and before.partitions == 1
    assert after_commit.seconds_since < 5
    assert behind.seconds_since is None and quiet.seconds_since is None
    assert caught_up.seconds_since < 5


def test_a_position_past_the_end_of_a_shorter_log_is_reset_to_the_beginning_as_out_of_range(caplog):
    async def run():
        worker, scripted, _ = make([])
        scripted.at, scripted.end = 500, 75  # the committed offset of a log the broker lost; the new one is short
        await worker._one_batch()  # the fetch past the end returns nothing, and no error
        reset = (list(scripted.seeks), worker.progress())
        await worker._one_batch()  # now at 0 < 75: nothing more to reset
        return scripted, reset, worker.progress()

    with caplog.at_level(logging.WARNING):
        scripted, (seeks, progress), later = asyncio.run(run())
    assert seeks == [(TP, 0)] and scripted.seeks == [(TP, 0)]
    assert progress.seconds_since is None  # not "caught up": 75 records below the position were never read
    assert progress.last_error == "offset out of range: in[0] at 500, log ends at 75"
    assert "in[0] is at offset 500 but its log ends at 75" in caplog.text


def test_a_batch_past_the_end_of_a_shorter_log_is_delivered_but_its_offset_not_committed(caplog):
    async def run():
        worker, scripted, producer = make([batch(498, 2)])
        scripted.end = 75  # the broker lost the log while the batch was in flight; the sends reached the new one
        await worker._one_batch()
        return worker, scripted, producer

    with caplog.at_level(logging.WARNING):
        worker, scripted, producer = asyncio.run(run())
    assert [value for _, _, value in producer.sent] == [b"V498", b"V499"] and scripted.commits == []
    assert "the delivered batch ends at offset 500 but the partition's log now ends at 75" in caplog.text
