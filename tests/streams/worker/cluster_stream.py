"""A worker under a steady stream while a Kafka cluster fails: the harness of test_broker_failures.

:class:`Stream` feeds the input as a production producer does (``acks=all``, idempotent, at a bounded
rate, a bounded count) and records which ids the cluster acknowledged. :class:`FailureRun` is one
failure test's pipeline: its topics (optionally every input and output partition led by one node),
a published plan, a real ``fairstream worker`` process, a thread sampling its ``/readyz``, and the
checks and figures once the cluster is whole again (:meth:`FailureRun.finish`).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from fairstream.streams.config import adult_config
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.demo.collect import TopicReader
from fairstream.streams.demo.replay import paced, record_messages
from fairstream.streams.ops.kafka_cluster import KafkaCluster
from fairstream.streams.ops.supervise import WorkerProcess
from fairstream.streams.topics import ensure_topics
from fairstream.streams.worker.health import LOG_REPEAT_SECONDS
from tests.polling import wait_for

from .test_liveness import get, metric_samples, probe_port, wait_ready

STREAM_SECONDS = 150.0  # the stream's bound: RATE times this many records at most (a test stops it sooner)
FLUSH_SECONDS = 120.0  # the stream's last records acknowledged within this once it stops
PRODUCER_TIMEOUT_MS = 120_000  # a record not acknowledged within this is a failed send (none is, on 2 nodes of 3)
REQUEST_TIMEOUT_MS = 10_000  # a request a frozen broker holds is given up (and sent to the new leader) after this
SAMPLE_SECONDS = 0.5  # /readyz is asked this often
LINES_PER_CAUSE = 2  # repeated warnings: at most this many lines per cause in any LOG_REPEAT_SECONDS window


def admin(cluster: KafkaCluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap})


def wait_in_sync(cluster: KafkaCluster, timeout: float) -> None:
    """Until every partition of every topic has all its replicas in sync (no partition under-replicated)."""
    def in_sync() -> bool:
        topics = admin(cluster).list_topics(timeout=10).topics.values()
        return all(len(p.isrs) == len(p.replicas) for t in topics for p in t.partitions.values())

    wait_for(in_sync, timeout, "partition with a replica out of sync", interval=0.5)


class Stream(threading.Thread):
    """A producer thread: ``messages`` at ``rate`` a second until :meth:`stop` (or they run out), ``acks=all``.

    Its requests time out after REQUEST_TIMEOUT_MS (librdkafka's default is 60 s), so that the input keeps
    flowing to the new leaders while a node is frozen: the worker is judged on its own recovery, not the feed's.
    """

    def __init__(self, bootstrap: str, topic: str, messages: list, rate: float):
        super().__init__(name="stream", daemon=True)
        self.topic, self.messages, self.rate = topic, messages, rate
        self.sent: list[str] = []
        self.acked: set[str] = set()
        self.failed: list[str] = []
        self._stop_sending = threading.Event()
        self._producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                   "linger.ms": 5, "message.timeout.ms": PRODUCER_TIMEOUT_MS,
                                   "socket.timeout.ms": REQUEST_TIMEOUT_MS,
                                   "logger": logging.getLogger(f"{__name__}.stream")})

    def run(self) -> None:
        for key, value in paced(self.messages, self.rate):
            if self._stop_sending.is_set():
                break
            self._producer.produce(self.topic, value, key, on_delivery=self._report)
            self.sent.append(key.decode())
            self._producer.poll(0)
        self._producer.flush(FLUSH_SECONDS)

    def _report(self, error, message) -> None:
        if error is None:
            self.acked.add(message.key().decode())
        else:
            self.failed.append(f"{message.key().decode()}: {error}")

    @property
    def exhausted(self) -> bool:
        return len(self.sent) == len(self.messages)

    def stop(self, wait: bool = True) -> None:
        """Stop sending; with ``wait``, return once every record sent is acknowledged (or failed)."""
        self._stop_sending.set()
        if not wait:
            return
        self.join(FLUSH_SECONDS + 10)
        assert not self.is_alive(), f"the stream's last records were not acknowledged within {FLUSH_SECONDS:g} s"


class Readiness(threading.Thread):
    """The worker's ``/readyz`` status every SAMPLE_SECONDS, as (monotonic time, status or None)."""

    def __init__(self, port: int):
        super().__init__(name="readyz", daemon=True)
        self.port, self.samples = port, []
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(SAMPLE_SECONDS):
            try:
                status = get(self.port, "/readyz")[0]
            except OSError:
                status = None
            self.samples.append((time.monotonic(), status))

    def stop(self) -> None:
        self._done.set()
        self.join(15)

    def longest_unready(self) -> float:
        """The longest stretch of answers other than 200, in seconds."""
        longest, since = 0.0, None
        for at, status in self.samples:
            if status != 200 and since is None:
                since = at
            elif status == 200 and since is not None:
                longest, since = max(longest, at - since), None
        if since is not None:
            longest = max(longest, self.samples[-1][0] - since)
        return longest


class FailureRun:
    """One failure test: a pipeline on ``cluster`` with its worker, a stream into it, the checks once recovered."""

    def __init__(self, cluster: KafkaCluster, tmp_path: Path, prefix: str, adult, partitions: int,
                 leader: int | None = None):
        archive, plan = adult
        self.cluster, self.prefix, self.archive = cluster, prefix, archive
        self.started = time.monotonic()
        cluster.wait_for_brokers()  # whole again after the test before, whatever it did
        wait_in_sync(cluster, timeout=60)
        self.config = adult_config(artifact_dir=str(tmp_path / "artifacts")).with_topics(
            prefix=prefix, partitions=partitions, replication=cluster.replication).with_monitor(metrics_port=0)
        self.topics = self.config.topics
        if leader is not None:
            self._create_led_by(leader)
        ensure_topics(cluster.bootstrap, self.topics)
        ControlClient(cluster.bootstrap, self.topics, ArtifactStore(self.config.artifact_dir)).publish_sync(
            plan.to_artifact())
        self.group = f"{self.topics.prefix}-{self.config.name}.records"  # the worker's records group (default id)
        self.worker = WorkerProcess(self.config, cluster.bootstrap, tmp_path, name="w")
        self.feed: Stream | None = None
        self.readiness: Readiness | None = None
        self.failed_at = self.recovered_at = self.resumed_s = None
        self.log_from = 0

    def _create_led_by(self, leader: int) -> None:
        """The input, output and dead-letter topics with ``leader`` the preferred (so the elected) leader of each
        partition; the other nodes follow."""
        replicas = [leader] + [n.node_id for n in self.cluster.nodes if n.node_id != leader]
        count = self.topics.partitions  # confluent-kafka wants the count with an assignment (-1 is refused)
        topics = [NewTopic(name, num_partitions=count, replica_assignment=[replicas] * count)
                  for name in (self.topics.records_in, self.topics.records_repaired, self.topics.dlq)]
        client = admin(self.cluster)  # held until the futures are done (a client destroyed fails them)
        for future in client.create_topics(topics, operation_timeout=30).values():
            future.result()

    def leaders(self) -> set[int]:
        """The nodes leading the input's and the output's partitions now."""
        return {self.cluster.leader_of(topic, p).node_id for topic in (self.topics.records_in,
                                                                       self.topics.records_repaired)
                for p in range(self.topics.partitions)}

    # ------------------------------------------------------------------ the run

    def __enter__(self) -> "FailureRun":
        self.worker.start()
        wait_ready(self.worker)
        self.readiness = Readiness(probe_port(self.worker))
        self.readiness.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.feed is not None:
            self.feed.stop(wait=False)
        if self.readiness is not None:
            self.readiness.stop()
        self.worker.stop()

    def repaired(self) -> int:
        """The worker's count of records repaired (delivered and committed)."""
        return int(sum(s.value for s in metric_samples(self.worker)
                       if s.name == "fairstream_records_repaired_total" and s.labels.get("agent") == "records"))

    def start_stream(self, rate: float, lead: float) -> None:
        """Start the stream; return once the worker has repaired ``lead`` seconds of it (the pipeline flows)."""
        messages = record_messages(self.archive.subset(slice(0, int(rate * STREAM_SECONDS))), self.config, self.prefix)
        self.rate = rate
        self.feed = Stream(self.cluster.bootstrap, self.topics.records_in, messages, rate)
        self.feed.start()
        wait_for(lambda: self.repaired() >= rate * lead, lead + 30, f"{rate * lead:.0f} records repaired")

    def failed(self) -> None:
        """The failure happened now."""
        self.failed_at = time.monotonic()
        self.repaired_at_failure = self.repaired()
        self.log_from = self.worker.log_path.stat().st_size

    def wait_delivery_resumes(self, timeout: float) -> None:
        """Until the worker has repaired two more seconds of the stream than at the failure (the cluster serves)."""
        wanted = self.repaired_at_failure + 2 * self.rate
        try:
            wait_for(lambda: self.worker.running and self.repaired() >= wanted, timeout,
                     "delivery resuming after the failure", interval=0.25)
        except AssertionError as error:
            stream = self.feed
            raise AssertionError(
                f"{error}: the worker repaired {self.repaired() - self.repaired_at_failure} records since the failure "
                f"while the stream sent {len(stream.sent)} and the cluster acknowledged {len(stream.acked)} in all "
                f"(the worker had repaired {self.repaired_at_failure} before it); worker log:\n"
                f"{self.worker.log_tail()}") from None
        assert self.worker.running, self.worker.log_tail()
        self.resumed_s = time.monotonic() - self.failed_at

    def hold(self, seconds_after_failure: float) -> None:
        """Until ``seconds_after_failure`` have passed since the failure, the worker running all along."""
        until = self.failed_at + seconds_after_failure
        while time.monotonic() < until:
            assert self.worker.running, self.worker.log_tail()
            time.sleep(min(0.5, max(until - time.monotonic(), 0)))

    def recovered(self) -> None:
        """The cluster is whole again now."""
        self.recovered_at = time.monotonic()
        assert not self.feed.exhausted, "the stream ran out before the cluster recovered: raise STREAM_SECONDS"

    def finish(self, tail: float, ready_bound: float, catch_up: float) -> dict:
        """The checks once the cluster is whole again; returns the figures (and prints them)."""
        stream, worker = self.feed, self.worker
        ready_s = self._time_to_ready(ready_bound)
        sent_then = len(stream.sent)
        wait_for(lambda: len(stream.sent) >= sent_then + self.rate * tail, tail + 10, f"{tail:g} s more of the stream")
        stream.stop()
        stopped = time.monotonic()
        assert not stream.failed, f"{len(stream.failed)} records not acknowledged, e.g. {stream.failed[:3]}"
        ids = set(stream.sent)
        assert stream.acked == ids
        outputs, dead = self._collect(ids, catch_up)
        assert not dead, f"{len(dead)} valid records dead-lettered, e.g. {list(dead.items())[:2]}"
        for rid, copies in outputs.items():
            assert all(copy == copies[0] for copy in copies), f"{rid}: a duplicate differs from the first copy"
        self._wait_lag_zero(max(stopped + catch_up - time.monotonic(), 5.0))
        caught_up_s = time.monotonic() - stopped
        assert worker.running, worker.log_tail()
        self.readiness.stop()
        longest = self.readiness.longest_unready()
        assert self.readiness.samples[-1][1] == 200, self.readiness.samples[-5:]
        assert longest <= ready_bound, f"unready for {longest:.0f} s at a stretch (bound {ready_bound:g} s)"
        warnings, held = self._check_log_rate()
        copies = sum(len(c) for c in outputs.values())
        figures = {"sent": len(ids), "delivered": len(outputs), "duplicates": copies - len(outputs),
                   "resumed_s": "-" if self.resumed_s is None else round(self.resumed_s, 1),
                   "longest_unready_s": round(longest, 1), "ready_s": round(ready_s, 1),
                   "caught_up_s": round(caught_up_s, 1), "log_warnings": warnings, "log_held": held,
                   "test_s": round(time.monotonic() - self.started)}
        print(f"\n{self.prefix}: {json.dumps(figures)}")
        return figures

    def _time_to_ready(self, bound: float) -> float:
        """Seconds from the recovery until /readyz answers 200 (asked afresh, not the sampler's)."""
        port = probe_port(self.worker)
        wait_for(lambda: get(port, "/readyz")[0] == 200, bound, f"/readyz 200 within {bound:g} s of the recovery",
                 interval=0.25)
        return time.monotonic() - self.recovered_at

    def _collect(self, ids: set, timeout: float) -> tuple[dict, dict]:
        """The raw bytes of every output copy per id, and the dead letters, once every id came out."""
        outputs, dead = defaultdict(list), defaultdict(list)
        with TopicReader(self.cluster.bootstrap, self.topics.records_repaired) as out, \
                TopicReader(self.cluster.bootstrap, self.topics.dlq) as dlq:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and not ids <= outputs.keys() | dead.keys():
                for m in out.poll():
                    outputs[json.loads(m.value)["id"]].append(m.value)
                for m in dlq.poll():
                    dead[(m.key or b"").decode()].append(m.value)
                assert self.worker.running, self.worker.log_tail()
        missing = ids - outputs.keys() - dead.keys()
        assert not missing, f"{len(missing)} of {len(ids)} ids never came out within {timeout:g} s, " \
                            f"e.g. {sorted(missing)[:5]}\n{self.worker.log_tail()}"
        return outputs, dead

    def _wait_lag_zero(self, timeout: float) -> None:
        """Until the group's committed offsets equal the input's end offsets and the worker's lag gauge says 0."""
        client = admin(self.cluster)
        partitions = [TopicPartition(self.topics.records_in, p) for p in range(self.topics.partitions)]

        def lag() -> dict:
            request = [ConsumerGroupTopicPartitions(self.group, partitions)]
            committed = client.list_consumer_group_offsets(request)[self.group].result().topic_partitions
            ends = client.list_offsets({tp: OffsetSpec.latest() for tp in partitions})
            end = {tp.partition: future.result().offset for tp, future in ends.items()}
            return {tp.partition: end[tp.partition] - tp.offset for tp in committed}

        def gauge() -> float | None:
            return next((s.value for s in metric_samples(self.worker)
                         if s.name == "fairstream_consumer_lag_records" and s.labels.get("agent") == "records"), None)

        last = {}

        def zero() -> bool:
            try:
                last["lag"], last["gauge"] = lag(), gauge()
            except KafkaException as error:  # the coordinator moving: ask again
                last["lag"] = str(error)
                return False
            return all(v == 0 for v in last["lag"].values()) and last["gauge"] == 0

        try:
            wait_for(zero, timeout, "consumer lag 0", interval=0.5)
        except AssertionError as error:
            raise AssertionError(f"{error}: committed lag per partition {last.get('lag')}, gauge {last.get('gauge')}"
                                 ) from None

    def _check_log_rate(self) -> tuple[int, int]:
        """Repeated warnings in the worker's log since the failure: at most LINES_PER_CAUSE per cause per window.

        Returns the warning and error lines shown, and how many more the worker's filter held back (it says so).
        """
        text = self.worker.log_path.read_bytes()[self.log_from:].decode(errors="replace")
        windows: Counter = Counter()
        held = 0
        for line in text.splitlines():
            parsed = _warning(line)
            if parsed is not None:
                at, cause = parsed
                windows[cause, int(at // LOG_REPEAT_SECONDS)] += 1
                held += sum(int(n) for n in _HELD.findall(line))
        flooded = {key: n for key, n in windows.items() if n > LINES_PER_CAUSE}
        assert not flooded, f"warnings repeated over {LINES_PER_CAUSE} times per {LOG_REPEAT_SECONDS:g} s: {flooded}"
        return sum(windows.values()), held


_HELD = re.compile(r"\[(\d+) more like this in the last \d+ s\]")  # what the worker's filter held back
_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\] \[\d+\] \[(WARNING|ERROR)\] (.*)$")


def _warning(line: str):
    """(seconds of the day, cause) of a warning or error line of the worker's log; None for other lines."""
    match = _LINE.match(line)
    if match is None:
        return None
    clock, millis, level, message = match.groups()
    h, m, s = map(int, clock[11:].split(":"))
    cause = re.sub(r"\d+", "N", message)[:80]  # numbers (ids, offsets, counts) vary within one cause
    return h * 3600 + m * 60 + s + int(millis) / 1000, (level, cause)
