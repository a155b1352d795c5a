"""The batch consumer's delivery rule, with a scripted consumer and producer (no broker).

Outputs are delivered before the batch's offsets are committed; a delivery that keeps failing
commits nothing and stops the loop loudly; a revocation waits for the batch in flight.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError

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
    def __init__(self, batches):
        self.batches, self.commits, self.log = list(batches), [], []

    async def getmany(self, timeout_ms, max_records):
        return {TP: self.batches.pop(0)} if self.batches else {}

    async def commit(self, offsets):
        self.log.append("commit")
        self.commits.append(dict(offsets))

    def assignment(self):
        return {TP}

    def highwater(self, tp):
        return 10


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


def make(batches, failures=0, seen=None):
    scripted = ScriptedConsumer(batches)
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
