"""Throughput, latency, scale-out and soak of the repair worker against raw Kafka passthroughs.

One run, one broker (the embedded Tansu broker, or with ``--broker kafka`` a single-node Apache Kafka
started for the run), the same JSON records (Adult archive rows exactly as
``fairstream replay`` sends them, ~120 bytes, repeated with distinct ids), 6 partitions. The
contestants, each timed **alone** on its own pre-loaded input (nothing else reads or writes
meanwhile):

(a) raw aiokafka passthrough: a bare consumer (group-less) and producer copying input to output in
    a process of its own, a delivered batch at a time (the worker's delivery rule), 10 ms fetch wait;
(b) raw confluent-kafka (librdkafka) passthrough, the same loop with the other Python client: where
    the physical ceiling of this machine and broker lies;
(c) the repair worker: real ``fairstream worker`` processes in one group, 1, 2 and 3 of them,
    applying a ``plan``; then one worker on the chains ``plan`` + ``scorer`` and ``flow`` + ``scorer``
    (the paper's flow architecture: 10 blocks of (20, 20) couplings, numpy in the worker);
(d) the shadow cost: one plan worker with a candidate plan in shadow (``promotion = "approve"``, so
    it stays a candidate for the whole run): the worker applies and monitors both plans on every
    batch, and delivers the serving plan's outputs only. ``--shadow-only`` runs (c)'s one plan worker
    and (d) alone;
(e) with ``--exactly-once`` (on ``--broker kafka``) alone: one plan worker at least once and exactly once
    (one Kafka transaction per batch, outputs read back read_committed), per ``--transaction-sizes``;
(f) with ``--loan`` alone (issue 31): one worker serving the same plan on a team's own topic, the loan records of
    ``benchmarks/loan_records.py`` with 40 pass-through fields (~1.9 KB a record, read by a ``[mapping]``,
    ``[output] repaired = --loan-mode``), against one worker on the same applications in fairstream's envelope
    (~120 bytes), alternated twice on topics of their own: records/s as a ratio (target >= 0.5 x).

Throughput: outputs are read back only after the contestant has finished (its progress is polled:
a counter file for the passthroughs, ``/metrics`` for workers), and the rate is taken from the
outputs' CreateTime (first to last), so neither the reader nor the ~5 s group join count.
CPU cores: the contestant's processes over the same span (Linux /proc). The monitor's share of a
worker's CPU is measured in the same run: ``fairstream_monitor_cpu_seconds_total`` over
``process_cpu_seconds_total`` between the worker's first and last output.

Latency: --rate records/s are offered for --seconds with ``ts = time.time()`` in each record, to
a contestant that is already running; latency is the output's CreateTime minus ``ts``.

Soak (--soak-minutes N, alone): three workers on six partitions and the raw librdkafka passthrough
under --rate records/s for N minutes or until the embedded broker stops serving (about 250,000
records on a topic); each worker's RSS, the broker's, lag and p99 latency per minute.

    .venv/bin/python benchmarks/stream_throughput.py [--records 200000] [--rate 2000] [--seconds 15]
    .venv/bin/python benchmarks/stream_throughput.py --broker kafka
    .venv/bin/python benchmarks/stream_throughput.py --broker kafka --exactly-once [--transaction-sizes 100 1000]
    .venv/bin/python benchmarks/stream_throughput.py --soak-minutes 10 --rate 1000
    .venv/bin/python benchmarks/stream_throughput.py --loan [--records 50000] [--loan-mode under|in_place] [--broker kafka]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import signal
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from fairstream.models.flow_training import refit_flow
from fairstream.models.scorer import LogisticScorer
from fairstream.repair import datasets
from fairstream.models.plan import DistributionalRepair
from fairstream.repair.group_maps import GroupTransportMap
from fairstream.streams.config import adult_config
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.ops.broker import free_port
from fairstream.streams.ops.kafka_cluster import LOCAL_BROKERS, local_broker
from fairstream.streams.ops.processes import ManagedProcess
from fairstream.streams.ops.supervise import WorkerProcess
from fairstream.streams.topics import TopicConfig, ensure_topics_async

PARTITIONS = 6
FETCH_BYTES = 4 * 1024 * 1024


# --------------------------------------------------------------------------- records


def build_records(archive, config, count: int, prefix: str) -> list[tuple[bytes, bytes]]:
    """``count`` (key, value) pairs: the archive as replay sends it, repeated with distinct ids."""
    messages: list[tuple[bytes, bytes]] = []
    rep = 0
    while len(messages) < count:
        messages += record_messages(archive, config, id_prefix=f"{prefix}{rep}")
        rep += 1
    return messages[:count]


async def produce(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> float:
    """Send every message with aiokafka's batching producer; returns records/s."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=512 * 1024, acks="all")
    await producer.start()
    start = time.perf_counter()
    try:
        for i in range(0, len(messages), 20_000):  # bounded number of pending futures
            await asyncio.gather(*[await producer.send(topic, v, key=k) for k, v in messages[i:i + 20_000]])
    finally:
        await producer.stop()
    return len(messages) / (time.perf_counter() - start)


async def offered_load(bootstrap: str, topic: str, records: list[tuple[bytes, dict]], rate: float) -> None:
    """Send ``records`` at ``rate``/s, each stamped with its send time as ``ts``.

    With a 5 ms linger, as a real producer at this rate would batch: the embedded broker's in-memory
    storage slows down as a partition accumulates one-record batches (reading 120k such records
    from the start took minutes), which would measure the broker, not the worker.
    """
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        loop = asyncio.get_running_loop()
        start, sent = loop.time(), 0
        while sent < len(records):
            due = min(len(records), int((loop.time() - start) * rate) + 1)
            for key, record in records[sent:due]:
                record["ts"] = time.time()
                await producer.send(topic, json.dumps(record).encode(), key=key)
            sent = due
            await asyncio.sleep(0.002)
        await producer.flush()
    finally:
        await producer.stop()


@dataclass
class Output:
    create_time: float  # seconds
    key: bytes
    value: bytes


async def read_outputs(bootstrap: str, topics: list[str], count: int, timeout: float,
                       committed: bool = False) -> list[Output]:
    """The first ``count`` messages of ``topics`` (all partitions), read from the beginning (with ``committed``,
    as a downstream reader of an exactly-once pipeline reads: isolation.level=read_committed)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                fetch_max_wait_ms=10, max_partition_fetch_bytes=FETCH_BYTES,
                                isolation_level="read_committed" if committed else "read_uncommitted")
    await consumer.start()
    try:
        consumer.assign([TopicPartition(t, p) for t in topics for p in range(PARTITIONS)])
        await consumer.seek_to_beginning()
        out: list[Output] = []
        deadline = time.monotonic() + timeout
        while len(out) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(out)} of {count} outputs on {topics} after {timeout:.0f} s")
            batches = await consumer.getmany(timeout_ms=200, max_records=50_000)
            out += [Output(m.timestamp / 1000.0, m.key, m.value) for ms in batches.values() for m in ms]
        return out
    finally:
        await consumer.stop()


def rate_of(outputs: list[Output]) -> float:
    stamps = np.array([o.create_time for o in outputs])
    return (len(stamps) - 1) / max(stamps.max() - stamps.min(), 1e-3)


def sent_ts(value: bytes) -> float:
    """``ts`` of a timed record from its output (repaired, passed through or dead-lettered)."""
    record = json.loads(value)
    if "original_b64" in record:  # a dead letter: the original record is inside, byte for byte
        record = json.loads(base64.b64decode(record["original_b64"]))
    return record["ts"]


def latencies_of(outputs: list[Output]) -> np.ndarray:
    reasons = {}
    for o in outputs:
        letter = json.loads(o.value)
        if "reason" in letter:
            reasons[letter["reason"][:60]] = reasons.get(letter["reason"][:60], 0) + 1
    if reasons:
        print(f"  dead letters among the timed records: {reasons}", flush=True)
    return np.array([o.create_time - sent_ts(o.value) for o in outputs])


# --------------------------------------------------------------------------- raw passthroughs


async def aiokafka_passthrough(bootstrap: str, src: str, dst: str, batch: int, progress: Path) -> None:
    """Copy ``src`` to ``dst`` from the beginning until SIGTERM, a delivered batch at a time."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                fetch_max_wait_ms=10, max_partition_fetch_bytes=FETCH_BYTES)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=512 * 1024, acks="all")
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await consumer.start()
    await producer.start()
    done, reported = 0, time.monotonic()
    try:
        consumer.assign([TopicPartition(src, p) for p in range(PARTITIONS)])
        await consumer.seek_to_beginning()
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=100, max_records=batch)
            futures = [await producer.send(dst, m.value, key=m.key) for ms in batches.values() for m in ms]
            await asyncio.gather(*futures)  # delivered before the next fetch, as the worker does
            done += len(futures)
            reported = _report(progress, done, reported)
    finally:
        _report(progress, done, 0.0)
        await producer.stop()
        await consumer.stop()


def confluent_passthrough(bootstrap: str, src: str, dst: str, batch: int, progress: Path) -> None:
    """The same loop with confluent-kafka (librdkafka): the other client's ceiling on this machine."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
    from confluent_kafka import TopicPartition as Partition

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False,
                         "fetch.wait.max.ms": 10, "log_level": 3})
    consumer.assign([Partition(src, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", "log_level": 3})
    done, reported = 0, time.monotonic()
    try:
        while not stop:
            messages = [m for m in consumer.consume(batch, 0.1) if m.error() is None]
            for m in messages:
                producer.produce(dst, m.value(), m.key())
            producer.flush()  # delivered before the next fetch
            done += len(messages)
            reported = _report(progress, done, reported)
    finally:
        _report(progress, done, 0.0)
        consumer.close()


def _report(progress: Path, done: int, last: float) -> float:
    if time.monotonic() - last < 0.5:
        return last
    tmp = progress.with_suffix(".tmp")
    tmp.write_text(str(done))
    os.replace(tmp, progress)
    return time.monotonic()


def create_topic(bootstrap: str, name: str) -> None:
    """A passthrough's output topic, created as the pipeline's are (a production Kafka creates none on demand)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the answer: a dropped client cancels it
    admin.create_topics([NewTopic(name, PARTITIONS)])[name].result(timeout=60)


class Passthrough(ManagedProcess):
    """This script run as ``_passthrough CLIENT ...`` in its own process group."""

    def __init__(self, client: str, bootstrap: str, src: str, dst: str, batch: int, run_dir: Path):
        super().__init__(run_dir / f"passthrough-{client}-{dst}.log")
        self.progress = run_dir / f"progress-{client}-{dst}"
        self.args = [client, bootstrap, src, dst, str(batch), str(self.progress)]

    def _command(self) -> list[str]:
        return [sys.executable, __file__, "_passthrough", *self.args]

    def start(self) -> "Passthrough":
        """Start it (it reads its input from the beginning at once)."""
        self._spawn()
        return self

    def done(self) -> int:
        """Messages copied so far."""
        try:
            return int(self.progress.read_text())
        except (OSError, ValueError):
            return 0


# --------------------------------------------------------------------------- workers


def scrape(port: int) -> dict[str, float]:
    """A worker's Prometheus samples, ``name{labels}`` -> value (without the one pipeline's ``pipeline`` label)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = re.sub(r'\{pipeline="[^"]*"\}|pipeline="[^"]*",|,pipeline="[^"]*"', "", response.read().decode())
    return {name: float(value) for name, value in re.findall(r"^(\S+) (\S+)$", text, re.MULTILINE)}


def worker_done(samples: dict) -> float:
    return sum(samples.get(f'fairstream_records_{what}_total{{agent="records"}}', 0.0)
               for what in ("repaired", "dead_lettered"))


class Workers:
    """``n`` worker processes in one group for one pipeline."""

    def __init__(self, config, bootstrap: str, run_dir: Path, n: int, env: dict | None = None):
        self.workers = []
        for i in range(n):
            worker_config = config.with_monitor(metrics_port=free_port())
            self.workers.append(WorkerProcess(worker_config, bootstrap, run_dir, name=f"{config.topics.prefix}-{i}",
                                              env=env))

    def start(self) -> "Workers":
        """Start them together, so they join the group in one rebalance."""
        for worker in self.workers:
            worker.start()
        return self

    def stop(self) -> None:
        """Stop them (gracefully)."""
        for worker in self.workers:
            worker.stop()

    @property
    def running(self) -> bool:
        return all(w.running for w in self.workers)

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    def samples(self) -> list[dict]:
        out = []
        for worker in self.workers:
            try:
                out.append(scrape(worker.config.monitor.metrics_port))
            except OSError:
                out.append({})
        return out

    def done(self) -> int:
        """Records repaired or dead-lettered so far, over all workers."""
        return int(sum(worker_done(s) for s in self.samples()))


# --------------------------------------------------------------------------- measuring


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process so far (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, TypeError):
        return float("nan")


def rss_mib(pid: int) -> float:
    try:
        return int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1)) / 1024
    except (OSError, AttributeError):
        return float("nan")


@dataclass
class Result:
    name: str
    rate: float = float("nan")
    cores: float = float("nan")
    monitor_share: float = float("nan")
    latencies: np.ndarray = field(default_factory=lambda: np.array([]))

    def p(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) if len(self.latencies) else float("nan")


async def wait_done(contestant, count: int, timeout: float, on_first=None) -> None:
    """Poll the contestant's progress until ``count`` are done; ``on_first`` runs at the first output."""
    deadline, first = time.monotonic() + timeout, False
    while (done := contestant.done()) < count:
        if time.monotonic() > deadline or not contestant.running:
            raise RuntimeError(f"{done} of {count} done after {timeout:.0f} s (running: {contestant.running})")
        if done and not first and on_first:
            on_first()
            first = True
        await asyncio.sleep(0.25)


@dataclass
class Bench:
    args: argparse.Namespace
    run_dir: Path
    bootstrap: str
    archive: object
    modules: dict  # kind -> the fitted module published for it
    broker_pid: int | None = None  # the embedded broker's process (its RSS in the soak)

    def config(self, prefix: str, chain: tuple = ("plan",), promotion: str = "auto", guarantee: str = "at_least_once",
               batch_size: int | None = None):
        config = adult_config(artifact_dir=str(self.run_dir / "artifacts")).with_topics(prefix=prefix,
                                                                                        partitions=PARTITIONS)
        artifact = chain if len(chain) > 1 else chain[0]
        return replace(config, promotion=promotion,
                       records=replace(config.records, batch_size=batch_size or self.args.batch_size,
                                       artifact=artifact)).with_delivery(guarantee=guarantee)

    async def pipeline(self, prefix: str, preload: int, chain: tuple = ("plan",), shadow: bool = False, **options):
        """A pipeline's topics, the chain's modules published (and, with ``shadow``, a candidate of its first kind
        that waits for an approval for the whole run), and ``preload`` records on its input; ``options`` go to
        :meth:`config` (the delivery guarantee, the batch size)."""
        config = self.config(prefix, chain, promotion="approve" if shadow else "auto", **options)
        await ensure_topics_async(self.bootstrap, config.topics)
        control = ControlClient(self.bootstrap, config.topics, ArtifactStore(config.artifact_dir))
        for kind in chain:  # with a scorer the monitor also tracks the decisions' DP, EOpp (and MDP after a plan)
            await control.publish(self.modules[kind].to_artifact())
        if shadow:
            await control.publish(self.modules[f"{chain[0]} candidate"].to_artifact(), candidate=True)
        if preload:
            await produce(self.bootstrap, config.topics.records_in, build_records(self.archive, config, preload, "rec"))
        return config

    async def raw_topics(self, prefix: str, preload: int) -> TopicConfig:
        topics = TopicConfig(prefix=prefix, partitions=PARTITIONS)
        await ensure_topics_async(self.bootstrap, topics)
        if preload:
            await produce(self.bootstrap, topics.records_in,
                          build_records(self.archive, self.config(prefix), preload, "rec"))
        return topics

    # ------------------------------------------------------------------ throughput

    async def throughput_raw(self, client: str, topics: TopicConfig) -> Result:
        n, dst = self.args.records, f"{topics.prefix}.out-{client}"
        create_topic(self.bootstrap, dst)
        proc = Passthrough(client, self.bootstrap, topics.records_in, dst, self.args.batch_size, self.run_dir).start()
        try:
            cpu0 = [float("nan")]
            await wait_done(proc, n, self.args.timeout, on_first=lambda: cpu0.__setitem__(0, cpu_seconds(proc.pid)))
            cores_cpu = cpu_seconds(proc.pid) - cpu0[0]
        finally:
            proc.stop()
        outputs = await read_outputs(self.bootstrap, [dst], n, self.args.timeout)
        rate = rate_of(outputs)
        return Result(f"raw {client} passthrough", rate, cores_cpu / ((n - 1) / rate))

    async def throughput_workers(self, n_workers: int, event_loop: str = "asyncio", chain: tuple = ("plan",),
                                 shadow: bool = False, tag: str = "", **options) -> Result:
        n = self.args.records
        prefix = f"bench{n_workers}{event_loop}{''.join(k[0] for k in chain)}{'-shadow' * shadow}{tag}"
        config = await self.pipeline(prefix, n, chain, shadow, **options)
        workers = Workers(config, self.bootstrap, self.run_dir, n_workers,
                          env={"FAIRSTREAM_EVENT_LOOP": event_loop}).start()
        try:
            first: dict = {}

            def at_first_output() -> None:
                first["cpu"] = sum(cpu_seconds(p) for p in workers.pids)
                first["samples"] = workers.samples()

            await wait_done(workers, n, self.args.timeout + 60, on_first=at_first_output)
            cpu = sum(cpu_seconds(p) for p in workers.pids) - first.get("cpu", float("nan"))
            last = workers.samples()
            share = monitor_share(first.get("samples", []), last)
            if shadow and not all(f'fairstream_candidate_version{{kind="{chain[0]}"}}' in s for s in last):
                raise RuntimeError("a worker did not shadow the candidate: the run would not measure its cost")
        finally:
            workers.stop()
        outputs = await read_outputs(self.bootstrap, [config.topics.records_repaired, config.topics.dlq], n,
                                     self.args.timeout, committed=config.delivery.guarantee == "exactly_once")
        rate = rate_of(outputs)
        name = f"{' + '.join(chain)} worker x{n_workers}" + ("" if event_loop == "asyncio" else f" ({event_loop})") + \
            (" + candidate in shadow" if shadow else "")
        return Result(name, rate, cpu / ((n - 1) / rate), share)

    async def throughput_of(self, config, module, pairs: list[tuple[bytes, bytes]], name: str, tag: str = "") -> Result:
        """One worker on ``config`` serving ``module``, on ``pairs`` pre-loaded on its input (any record format)."""
        n = len(pairs)
        await ensure_topics_async(self.bootstrap, config.topics)
        await ControlClient(self.bootstrap, config.topics, ArtifactStore(config.artifact_dir)).publish(
            module.to_artifact())
        await produce(self.bootstrap, config.topics.records_in, pairs)
        workers = Workers(config, self.bootstrap, self.run_dir, 1).start()
        try:
            first: dict = {}
            await wait_done(workers, n, self.args.timeout + 60,
                            on_first=lambda: first.__setitem__("cpu", sum(cpu_seconds(p) for p in workers.pids)))
            cpu = sum(cpu_seconds(p) for p in workers.pids) - first.get("cpu", float("nan"))
        finally:
            workers.stop()
        outputs = await read_outputs(self.bootstrap, [config.topics.records_repaired, config.topics.dlq], n,
                                     self.args.timeout)
        dead = sum(1 for o in outputs if b'"reason"' in o.value[:4096] and b'"original_b64"' in o.value)
        if dead:
            raise RuntimeError(f"{dead} of {n} records were dead-lettered: the run would not measure the repair")
        rate = rate_of(outputs)
        return Result(name, rate, cpu / ((n - 1) / rate))

    async def passthrough_of(self, src: str, n: int) -> Result:
        """The raw librdkafka passthrough copying ``src`` (pre-loaded with ``n`` records) to a topic of its own."""
        dst = f"{src}.out-raw"
        create_topic(self.bootstrap, dst)
        proc = Passthrough("confluent-kafka", self.bootstrap, src, dst, self.args.batch_size, self.run_dir).start()
        try:
            await wait_done(proc, n, self.args.timeout)
        finally:
            proc.stop()
        return Result("raw confluent-kafka passthrough", rate_of(await read_outputs(self.bootstrap, [dst], n,
                                                                                     self.args.timeout)))

    # ------------------------------------------------------------------ latency

    async def latency_raw(self, client: str) -> np.ndarray:
        topics = await self.raw_topics(f"lat{client.replace('-', '')}", 0)
        dst = f"{topics.prefix}.out-{client}"
        create_topic(self.bootstrap, dst)
        proc = Passthrough(client, self.bootstrap, topics.records_in, dst, self.args.batch_size, self.run_dir).start()
        try:
            await asyncio.sleep(3.0)  # connected and assigned before the load starts
            return await self._offer_and_measure(topics.records_in, proc, [dst])
        finally:
            proc.stop()

    async def latency_worker(self, tag: str = "", **options) -> np.ndarray:
        config = await self.pipeline(f"latw{tag}", 0, **options)
        workers = Workers(config, self.bootstrap, self.run_dir, 1).start()
        try:
            if not workers.workers[0].wait_for_log("caught up with", timeout=90):
                raise RuntimeError(f"the worker did not join its group:\n{workers.workers[0].log_tail()}")
            return await self._offer_and_measure(config.topics.records_in, workers,
                                                 [config.topics.records_repaired, config.topics.dlq],
                                                 committed=config.delivery.guarantee == "exactly_once")
        finally:
            workers.stop()

    async def _offer_and_measure(self, src: str, contestant, outputs: list[str], committed: bool = False) -> np.ndarray:
        count = int(self.args.rate * self.args.seconds)
        records = [(k, json.loads(v)) for k, v in build_records(self.archive, self.config("x"), count, "lat")]
        await offered_load(self.bootstrap, src, records, self.args.rate)
        await wait_done(contestant, count, self.args.timeout)
        return latencies_of(await read_outputs(self.bootstrap, outputs, count, self.args.timeout, committed))

    # ------------------------------------------------------------------ soak

    async def soak(self) -> None:
        """Three workers on six partitions and the librdkafka passthrough on the same input under a fixed rate.

        It runs for ``--soak-minutes`` or until the embedded broker stops serving (its memory-only storage stops
        answering every client, the bare passthrough included, after about 250,000 records on a topic): a minute
        in which records were offered and neither the workers nor the passthrough moved ends the soak there.
        """
        minutes, rate = self.args.soak_minutes, self.args.rate
        config = await self.pipeline("soak", 0)
        workers = Workers(config, self.bootstrap, self.run_dir, 3).start()
        raw = Passthrough("confluent-kafka", self.bootstrap, config.topics.records_in, "soak.raw-out",
                          self.args.batch_size, self.run_dir)
        try:
            for worker in workers.workers:
                if not worker.wait_for_log("caught up with", timeout=90):
                    raise RuntimeError(f"a worker did not join its group:\n{worker.log_tail()}")
            raw.start()
            rows, sent = [], 0
            rss0, buckets = self._rss(workers), self._latency_buckets(workers)
            for minute in range(minutes):
                records = [(k, json.loads(v)) for k, v in build_records(self.archive, config, int(rate * 60),
                                                                          f"m{minute}-")]
                try:
                    await asyncio.wait_for(offered_load(self.bootstrap, config.topics.records_in, records, rate), 120)
                except asyncio.TimeoutError:
                    print(f"  minute {minute + 1}: the broker no longer accepts records: the soak ends here", flush=True)
                    break
                sent += len(records)
                await asyncio.sleep(2.0)  # the last second's records reach the outputs
                now = self._latency_buckets(workers)
                lag = sum(s.get('fairstream_consumer_lag_records{agent="records"}', 0.0) for s in workers.samples())
                rows.append((minute + 1, *self._rss(workers), rss_mib(self.broker_pid), sent, workers.done(),
                             raw.done(), lag, p99_between(buckets, now)))
                buckets = now
                print("  minute %d: worker RSS %.0f / %.0f / %.0f MiB, broker RSS %.0f MiB, sent %d, workers %d, "
                      "passthrough %d, lag %.0f, p99 %.2f s" % rows[-1], flush=True)
                if len(rows) > 1 and rows[-1][6:8] == rows[-2][6:8]:
                    print(f"  minute {minute + 1}: neither the workers nor the passthrough moved: the broker stopped "
                          "serving; the soak ends here", flush=True)
                    break
        finally:
            raw.stop()
            workers.stop()
        print(f"\nsoak: {rate:,.0f} records/s offered; three workers on {PARTITIONS} partitions and the raw "
              "librdkafka passthrough read the same input")
        print(f"{'minute':>6}{'worker RSS MiB':>20}{'broker MiB':>11}{'sent':>10}{'workers':>10}{'passthrough':>12}"
              f"{'lag':>8}{'p99 (s)':>9}")
        for minute, r1, r2, r3, broker, total, done, raw_done, lag, p99 in rows:
            print(f"{minute:6d}{r1:8.0f}{r2:6.0f}{r3:6.0f}{broker:11.0f}{total:10,d}{done:10,d}{raw_done:12,d}"
                  f"{lag:8,.0f}{p99:9.2f}")
        if rows:
            print(f"worker RSS at start {' / '.join(f'{x:.0f}' for x in rss0)} MiB, at the end "
                  f"{' / '.join(f'{x:.0f}' for x in rows[-1][1:4])} MiB; lag at the end {rows[-1][8]:,.0f} records "
                  "(p99 is the upper bound of the latency histogram bucket)")

    @staticmethod
    def _rss(workers: "Workers") -> tuple:
        return tuple(rss_mib(pid) for pid in workers.pids)

    @staticmethod
    def _latency_buckets(workers: "Workers") -> dict[float, float]:
        """The workers' record-latency histograms, summed."""
        total: dict[float, float] = {}
        for samples in workers.samples():
            for bound, count in latency_buckets(samples).items():
                total[bound] = total.get(bound, 0.0) + count
        return total


def latency_buckets(samples: dict) -> dict[float, float]:
    """The worker's cumulative record-latency histogram: upper bound -> count."""
    out = {}
    for name, value in samples.items():
        match = re.match(r'fairstream_record_latency_seconds_bucket\{agent="records",le="([^"]+)"\}', name)
        if match:
            out[float(match.group(1))] = value
    return out


def p99_between(before: dict, after: dict) -> float:
    """The 99th percentile (bucket upper bound) of the latencies observed between two scrapes."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return float("nan")
    return next(b for b, c in zip(bounds, counts) if c >= 0.99 * counts[-1])


def monitor_share(before: list[dict], after: list[dict]) -> float:
    """The monitor's CPU over the worker processes' CPU between two scrapes (measured, never a constant)."""
    def total(samples, name):
        return sum(s.get(name, 0.0) for s in samples)

    monitor = total(after, "fairstream_monitor_cpu_seconds_total") - total(before, "fairstream_monitor_cpu_seconds_total")
    process = total(after, "process_cpu_seconds_total") - total(before, "process_cpu_seconds_total")
    return monitor / process if process > 0 else float("nan")


# --------------------------------------------------------------------------- the run


async def run(args, run_dir: Path, bootstrap: str, broker_pid: int | None = None) -> None:
    research, archive = datasets.load("adult").split(10_000, seed=0)
    plan = DistributionalRepair(n_q=250, out_of_range="reject").fit(research.X, research.s, research.u)
    # A scorer as `fairstream refit --kind scorer` publishes it: carrying its frozen group map, so the monitor
    # also measures MDP (fitted on the repaired research data: what the scorer reads behind the plan).
    repaired = plan.transform(research.X, research.s, research.u, keys=[str(i) for i in range(len(research))])
    scorer = LogisticScorer().fit(research.X, research.y, columns=["age", "hours-per-week"]).attach_group_map(
        GroupTransportMap(seed=0).fit(repaired, research.s, columns=["age", "hours-per-week"]))
    # The paper's flow architecture (10 blocks of (20, 20) couplings): applying it costs the same
    # whatever the training, so a short fit will do for a throughput run.
    flow = refit_flow(research.X, research.s, research.y, scorer, columns=["age", "hours-per-week"], n_steps=20)
    # The candidate in shadow: a plan re-fitted on another research sample, as a re-fit would publish it.
    other, _ = datasets.load("adult").split(10_000, seed=1)
    candidate = DistributionalRepair(n_q=250, out_of_range="reject").fit(other.X, other.s, other.u)
    bench = Bench(args, run_dir, bootstrap, archive, {"plan": plan, "scorer": scorer, "flow": flow,
                                                      "plan candidate": candidate}, broker_pid)
    if args.soak_minutes:
        await bench.soak()
        return
    if args.shadow_only:
        await shadow_cost(bench)
        return
    if args.exactly_once:
        await exactly_once_cost(bench)
        return
    if args.loan:
        await loan_cost(bench)
        return
    raw_topics = await bench.raw_topics("benchraw", args.records)
    print(f"pre-loaded {args.records:,} records on {PARTITIONS} partitions", flush=True)
    results = []
    for client in ("aiokafka", "confluent-kafka"):
        results.append(await bench.throughput_raw(client, raw_topics))
        print(f"  {results[-1].name}: {results[-1].rate:,.0f} records/s", flush=True)
    for n in args.workers:
        results.append(await bench.throughput_workers(n))
        print(f"  {results[-1].name}: {results[-1].rate:,.0f} records/s", flush=True)
    for chain in (("plan", "scorer"), ("flow", "scorer")):
        results.append(await bench.throughput_workers(1, chain=chain))
        print(f"  {results[-1].name}: {results[-1].rate:,.0f} records/s", flush=True)
    if args.uvloop:
        results.append(await bench.throughput_workers(1, "uvloop"))
        print(f"  {results[-1].name}: {results[-1].rate:,.0f} records/s", flush=True)
    results.append(await bench.throughput_workers(1, shadow=True))
    print(f"  {results[-1].name}: {results[-1].rate:,.0f} records/s", flush=True)
    results[0].latencies = await bench.latency_raw("aiokafka")
    results[1].latencies = await bench.latency_raw("confluent-kafka")
    single = next((r for r in results if r.name == "plan worker x1"), None)
    if single is not None:
        single.latencies = await bench.latency_worker()
    report(args, results)


def report(args, results: list[Result]) -> None:
    """The table: every contestant's records/s and p99 as ratios to the librdkafka passthrough of the same run."""
    aio, ceiling = results[0], results[1]  # the raw passthroughs: aiokafka, then confluent-kafka (librdkafka)
    print(f"\n{args.records:,} records, {PARTITIONS} partitions, batch {args.batch_size}, {os.cpu_count()} CPUs; "
          f"latency at {args.rate:,.0f} records/s offered for {args.seconds:.0f} s")
    print(f"{'':34}{'records/s':>10}{'x librdkafka':>13}{'x aiokafka':>11}{'CPU cores':>10}{'p50 (s)':>9}"
          f"{'p99 (s)':>9}{'p99 x':>7}{'monitor':>9}")
    for r in results:
        share = f"{r.monitor_share:8.1%}" if np.isfinite(r.monitor_share) else ""
        print(f"{r.name:34}{r.rate:10,.0f}{r.rate / ceiling.rate:13.2f}{r.rate / aio.rate:11.2f}{r.cores:10.2f}"
              f"{r.p(50):9.3f}{r.p(99):9.3f}{r.p(99) / ceiling.p(99):7.1f} {share}")
    plan = next((r for r in results if r.name == "plan worker x1"), None)
    if plan is not None:
        for r in results:
            if r.name.endswith("scorer worker x1") or r.name.endswith("in shadow"):
                print(f"{r.name}: {r.rate / plan.rate:.2f} x the plan alone")
    print("targets: one plan worker >= 0.25 x the librdkafka passthrough (and >= 1.2 x aiokafka); plan + scorer >= "
          "0.8 x and flow + scorer >= 0.5 x the plan alone; with a candidate in shadow >= 0.6 x the plan alone; p99 at "
          "the offered rate <= 1.5 x the librdkafka passthrough's; monitor <= 10% of a worker's CPU with a scorer")


async def shadow_cost(bench: Bench) -> None:
    """(c)'s one plan worker and (d), alternated twice (the machine's load drifts over a run): records/s as a ratio."""
    rates = {False: [], True: []}
    for run, shadow in enumerate((False, True, True, False)):
        result = await bench.throughput_workers(1, shadow=shadow, tag=f"-{run}")  # each run on topics of its own
        rates[shadow].append(result.rate)
        print(f"  {result.name}: {result.rate:,.0f} records/s", flush=True)
    without, with_candidate = np.mean(rates[False]), np.mean(rates[True])
    print(f"\n{bench.args.records:,} records, {PARTITIONS} partitions, batch {bench.args.batch_size}: one plan worker "
          f"{without:,.0f} records/s, with a candidate plan in shadow {with_candidate:,.0f} records/s: "
          f"{with_candidate / without:.2f} x (target >= 0.6 x)")


async def exactly_once_cost(bench: Bench) -> None:
    """One plan worker at least once and exactly once (a Kafka transaction a batch), per batch size: records/s
    (alternated twice, the machine's load drifts over a run) and the p99 latency at ``--rate``, as ratios."""
    args, rows = bench.args, []
    for batch in args.transaction_sizes:
        rates: dict[str, list[float]] = {"at_least_once": [], "exactly_once": []}
        for run, guarantee in enumerate(("at_least_once", "exactly_once", "exactly_once", "at_least_once")):
            result = await bench.throughput_workers(1, tag=f"-b{batch}-{run}", guarantee=guarantee, batch_size=batch)
            rates[guarantee].append(result.rate)
            print(f"  batch {batch}, {guarantee}: {result.rate:,.0f} records/s", flush=True)
        p99 = {}
        for guarantee in rates:
            latencies = await bench.latency_worker(tag=f"b{batch}{guarantee[0]}", guarantee=guarantee, batch_size=batch)
            p99[guarantee] = float(np.percentile(latencies, 99))
            print(f"  batch {batch}, {guarantee}: p99 {p99[guarantee]:.3f} s at {args.rate:,.0f} records/s", flush=True)
        rows.append((batch, np.mean(rates["at_least_once"]), np.mean(rates["exactly_once"]), p99["at_least_once"],
                     p99["exactly_once"]))
    print(f"\n{args.records:,} records, {PARTITIONS} partitions, one plan worker; p99 at {args.rate:,.0f} records/s "
          f"offered for {args.seconds:.0f} s; exactly once = one transaction per batch (read_committed readers)")
    print(f"{'batch':>6}{'ALO rec/s':>11}{'EOS rec/s':>11}{'EOS/ALO':>9}{'ALO p99 s':>11}{'EOS p99 s':>11}{'p99 x':>7}")
    for batch, alo, eos, alo_p99, eos_p99 in rows:
        print(f"{batch:6d}{alo:11,.0f}{eos:11,.0f}{eos / alo:9.2f}{alo_p99:11.3f}{eos_p99:11.3f}{eos_p99 / alo_p99:7.2f}")


async def loan_cost(bench: Bench) -> None:
    """(f): one worker on envelope records and one on ~1.9 KB loan records through a mapping, the same plan, the same
    broker, alternated twice (the machine's load drifts over a run): records/s as a ratio."""
    from loan_records import loan_config, loan_plan, messages

    args, plan = bench.args, loan_plan()
    rates: dict[str, list[float]] = {"envelope": [], "loan2k": []}
    raw: dict[str, list[float]] = {"envelope": [], "loan2k": []}
    for run, kind in enumerate(("envelope", "loan2k", "loan2k", "envelope")):
        prefix = f"benchloan{run}"
        topics = {"prefix": prefix, "partitions": PARTITIONS}
        if kind != "envelope":  # the team's own topic names
            topics.update(input=f"{prefix}.loan-applications", output=f"{prefix}.loan-applications.fair")
        config = loan_config(mapped=kind != "envelope", repaired=args.loan_mode, topics=topics,
                             artifact_dir=str(bench.run_dir / "artifacts"))
        config = replace(config, records=replace(config.records, batch_size=args.batch_size))
        pairs = messages(args.records, kind, prefix=f"r{run}")
        result = await bench.throughput_of(config, plan, pairs, f"plan worker x1, {kind}", tag=str(run))
        rates[kind].append(result.rate)
        size = sum(len(v) for _, v in pairs) / len(pairs)
        print(f"  {result.name} ({size:,.0f} bytes a record): {result.rate:,.0f} records/s, "
              f"{result.cores:.2f} CPU cores", flush=True)
        passthrough = await bench.passthrough_of(config.topics.records_in, len(pairs))  # the same input, the ceiling
        raw[kind].append(passthrough.rate)
        print(f"  raw confluent-kafka passthrough of the same input: {passthrough.rate:,.0f} records/s", flush=True)
    envelope, loan = np.mean(rates["envelope"]), np.mean(rates["loan2k"])
    raw_ratio = np.mean(raw["loan2k"]) / np.mean(raw["envelope"])
    print(f"\nthe raw librdkafka passthrough on the same inputs: envelope {np.mean(raw['envelope']):,.0f}, loan "
          f"{np.mean(raw['loan2k']):,.0f} records/s: {raw_ratio:.2f} x (what the broker and the bytes allow); the worker "
          f"at {envelope / np.mean(raw['envelope']):.2f} x the passthrough on the envelope, "
          f"{loan / np.mean(raw['loan2k']):.2f} x on the loan records")
    ratio = loan / envelope
    print(f"\n{args.records:,} records, {PARTITIONS} partitions, batch {args.batch_size}, one plan worker: envelope "
          f"{envelope:,.0f} records/s, loan records with 40 pass-through fields ({args.loan_mode}) {loan:,.0f} "
          f"records/s: {ratio:.2f} x (target >= 0.5 x: {'met' if ratio >= 0.5 else 'MISSED'})")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fairstream-bench-") as tmp, local_broker(args.broker, Path(tmp)) as broker:
        print(f"broker: {broker.description}", flush=True)
        asyncio.run(run(args, Path(tmp), broker.bootstrap, broker.pid))
    # Other processes on the machine skew a run: compare the load average with the ~1.5-2 this
    # benchmark makes by itself on 2 cores.
    print(f"\ntotal {time.monotonic() - started:.0f} s; load average (1, 5 min) at the end: "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()[:2]))
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", choices=LOCAL_BROKERS, default="embedded",
                        help="the embedded Tansu broker (default) or a local Apache Kafka started for the run")
    parser.add_argument("--records", type=int, default=200_000, help="records per throughput run (default 200000)")
    parser.add_argument("--rate", type=float, default=2000.0, help="offered load for latency and soak, records/s")
    parser.add_argument("--seconds", type=float, default=15.0, help="duration of each latency run (default 15)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 3], help="worker counts to run (default 1 2 3)")
    parser.add_argument("--batch-size", type=int, default=1000, help="worker batch (and passthrough fetch) size")
    parser.add_argument("--soak-minutes", type=int, default=0, help="run only the soak, this many minutes")
    parser.add_argument("--uvloop", action="store_true", help="also time one worker on uvloop")
    parser.add_argument("--shadow-only", action="store_true",
                        help="only the shadow cost: one plan worker without and with a candidate in shadow")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for a phase")
    parser.add_argument("--exactly-once", action="store_true",
                        help="only the exactly-once cost: one plan worker at least once and exactly once (needs "
                             "--broker kafka), per --transaction-sizes")
    parser.add_argument("--transaction-sizes", type=int, nargs="+", default=[100, 1000],
                        help="with --exactly-once: the batch sizes (records per transaction) to compare (default 100 1000)")
    parser.add_argument("--loan", action="store_true",
                        help="only a team's own topic (issue 31): one worker on ~1.9 KB loan records read by a mapping "
                             "against one on the envelope, records/s as a ratio")
    parser.add_argument("--loan-mode", choices=("under", "in_place"), default="under",
                        help="with --loan: [output] repaired (default under)")
    args = parser.parse_args(argv)
    if args.exactly_once and args.broker != "kafka":
        parser.error("--exactly-once needs --broker kafka: the embedded broker has no transactions it keeps")
    return args


if __name__ == "__main__":
    if sys.argv[1:2] == ["_passthrough"]:
        client, bootstrap, src, dst, batch, progress = sys.argv[2:8]
        if client == "aiokafka":
            asyncio.run(aiokafka_passthrough(bootstrap, src, dst, int(batch), Path(progress)))
        else:
            confluent_passthrough(bootstrap, src, dst, int(batch), Path(progress))
        sys.exit(0)
    sys.exit(main())
