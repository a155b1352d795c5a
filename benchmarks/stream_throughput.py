"""Throughput, latency and profile of the record repair agent against a bare aiokafka passthrough.

One run, one embedded Tansu broker, the same JSON records (Adult archive rows exactly as
``fairstream replay`` sends them, ~120 bytes, repeated with distinct ids) pre-loaded on two topics:

(a) raw passthrough: a bare aiokafka consumer (group-less) and producer copying
    ``benchraw.records.in`` to ``benchraw.records.repaired`` in a process of its own, with the agent's
    delivery rule (a batch is delivered before the next one is fetched), producer settings and batch
    size, and a 10 ms fetch wait (--raw-fetch-wait-ms). The ceiling of broker + Kafka client here.
(b) the repair agent: real ``fairstream worker`` processes (WorkerProcess; --workers, default 1) in
    one group, reading ``bench.records.in`` with a published plan, writing ``bench.records.repaired``
    and ``bench.dlq``.

Throughput: outputs / (last - first output timestamp), from the producers' CreateTime on the output
topics, so the ~5 s group join before the first output and the reader's own speed do not count; the
CPU cores column is the process(es) under test over the same span (Linux /proc). A monitor agent
that re-reads ``records.repaired`` is waited for (its Prometheus counters) before latency is timed,
and then the sustained rate, counting its catch-up, is printed too.
Latency: --rate records/s are offered for --seconds with ``ts = time.time()`` in each record; every
output echoes ``ts`` (dead letters keep the original bytes) and a group-less reader (10 ms fetch
wait) records receive time - ts.
Profile: --profile-records more records go through worker 0 while ``py-spy record --gil`` samples
it; time is split into categories (see CATEGORIES) and the top functions by self time. With
``--profiler cprofile`` (or no py-spy in the venv) one more worker is started instead, with a
``sitecustomize`` hook (_CPROFILE_HOOK) on its PYTHONPATH that profiles its main thread from start
to exit when FAIRSTREAM_CPROFILE names the output file.

A patched worker is measured without touching the installed package through an overlay folder
holding ``fairstream/streams`` (the patched copy), ``fairstream/repair`` and ``fairstream/models``,
passed as --worker-pythonpath (put first on the workers' PYTHONPATH).

Phases run one after the other, so another busy process on the machine skews the ratios: the load
average is printed at the end. Takes about 1.5 minutes with the defaults.

    .venv/bin/python benchmarks/stream_throughput.py [--records 200000] [--rate 2000] [--seconds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from fairstream.repair import datasets
from fairstream.repair.distributional import DistributionalRepair
from fairstream.streams.config import adult_config
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.ops.broker import EmbeddedBroker, free_port
from fairstream.streams.ops.supervise import WorkerProcess
from fairstream.streams.topics import TopicConfig, ensure_topics_async

FETCH_BYTES = 4 * 1024 * 1024  # the worker's consumer_max_fetch_size
ROOT = Path(__file__).resolve().parents[1]  # the checkout: profile paths are shown relative to it


# --------------------------------------------------------------------------- records


def build_records(archive, config, count: int, prefix: str) -> list[tuple[bytes, bytes]]:
    """``count`` (key, value) pairs: the archive as replay sends it, repeated with distinct ids."""
    messages: list[tuple[bytes, bytes]] = []
    rep = 0
    while len(messages) < count:
        messages += record_messages(archive, config, id_prefix=f"{prefix}{rep}")
        rep += 1
    return messages[:count]


async def produce(bootstrap: str, topics: list[str], messages: list[tuple[bytes, bytes]]) -> float:
    """Send every message to every topic with aiokafka's batching producer; returns records/s."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=512 * 1024, acks="all")
    await producer.start()
    start = time.perf_counter()
    try:
        for topic in topics:
            # Wait per chunk so that millions of undelivered futures never pile up in memory.
            for i in range(0, len(messages), 20_000):
                await asyncio.gather(*[await producer.send(topic, v, key=k) for k, v in messages[i:i + 20_000]])
    finally:
        await producer.stop()
    return len(topics) * len(messages) / (time.perf_counter() - start)


# --------------------------------------------------------------------------- (a) the raw passthrough


async def passthrough(bootstrap: str, src: str, dst: str, partitions: int, batch: int, fetch_wait_ms: int) -> None:
    """Copy ``src`` to ``dst`` from the beginning until SIGTERM, a delivered batch at a time."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                fetch_max_wait_ms=fetch_wait_ms, max_partition_fetch_bytes=FETCH_BYTES)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=512 * 1024, acks="all")
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await consumer.start()
    await producer.start()
    try:
        consumer.assign([TopicPartition(src, p) for p in range(partitions)])
        await consumer.seek_to_beginning()
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=100, max_records=batch)
            futures = [await producer.send(dst, m.value, key=m.key) for ms in batches.values() for m in ms]
            await asyncio.gather(*futures)  # delivered before the next fetch, as the agent does
    finally:
        await producer.stop()
        await consumer.stop()


class PassthroughProcess:
    """This script run as ``_passthrough`` in its own process group: the same isolation as the worker."""

    def __init__(self, bootstrap: str, src: str, dst: str, partitions: int, batch: int, fetch_wait_ms: int):
        self.args = [bootstrap, src, dst, str(partitions), str(batch), str(fetch_wait_ms)]
        self.process: subprocess.Popen | None = None

    def start(self) -> "PassthroughProcess":
        self.process = subprocess.Popen([sys.executable, __file__, "_passthrough", *self.args],
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.running:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


# --------------------------------------------------------------------------- reading outputs


def partitions_of(topics: list[str], partitions: int) -> list[TopicPartition]:
    return [TopicPartition(t, p) for t in topics for p in range(partitions)]


class Outputs:
    """A group-less reader of output topics that keeps its position from one phase to the next.

    Outputs are told apart by key prefix (outputs keep the input key, the record id), which needs no
    JSON parsing. Counting means reading: Tansu's ListOffsets under-reports the end offset of topics
    written in multi-record batches (14,773 for 20,000 records), so end offsets cannot be trusted.
    """

    def __init__(self, bootstrap: str, tps: list[TopicPartition]):
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                         fetch_max_wait_ms=10, max_partition_fetch_bytes=FETCH_BYTES)
        self.tps = tps

    async def start(self) -> "Outputs":
        await self.consumer.start()
        self.consumer.assign(self.tps)
        await self.consumer.seek_to_beginning()
        return self

    async def stop(self) -> None:
        await self.consumer.stop()

    async def collect(self, prefix: bytes, count: int, timeout: float, alive, on_batch=None) -> np.ndarray:
        """CreateTime (s) of the next ``count`` outputs whose key starts with ``prefix``."""
        stamps: list[int] = []
        deadline = time.monotonic() + timeout
        while len(stamps) < count:
            if time.monotonic() > deadline or not alive():
                raise RuntimeError(f"only {len(stamps)} of {count} {prefix.decode()}* outputs after {timeout:.0f}s")
            batches = await self.consumer.getmany(timeout_ms=200, max_records=20_000)
            ours = [m for ms in batches.values() for m in ms if m.key.startswith(prefix)]
            stamps += [m.timestamp for m in ours]
            if on_batch and ours:
                on_batch(time.time(), ours)
        return np.array(stamps, dtype=np.float64) / 1000.0


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process so far (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, TypeError):
        return float("nan")


async def throughput(outputs: Outputs, prefix: bytes, count: int, timeout: float, alive, pids: list[int] = ()
                     ) -> tuple[float, float]:
    """Records/s from the first to the last of ``count`` outputs (producer timestamps, not read times),
    and the CPU cores the processes ``pids`` used meanwhile (wall clock from the first output read)."""
    first = await outputs.collect(prefix, 1, timeout, alive)
    cpu, wall = sum(map(cpu_seconds, pids)), time.monotonic()
    rest = await outputs.collect(prefix, count - len(first), timeout, alive) if count > len(first) else np.array([])
    cores = (sum(map(cpu_seconds, pids)) - cpu) / max(time.monotonic() - wall, 1e-3)
    stamps = np.concatenate([first, rest])
    return (len(stamps) - 1) / max(stamps.max() - stamps.min(), 1e-3), cores


def scrape(port: int) -> dict[str, float]:
    """The worker's Prometheus samples, ``name{labels}`` -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {name: float(value) for name, value in re.findall(r"^(\S+) (\S+)$", text, re.MULTILINE)}


async def monitor_caught_up(ports: list[int], timeout: float, alive) -> float:
    """Seconds until the workers' monitor agents have taken every repaired record (backlog drained).

    A monitor agent that re-reads records.repaired counts records_in_total{agent="monitor"} from its
    first batch on, which comes long before the repair backlog is done; no such sample once the
    repair is done means the monitor is fed in-process (or absent): nothing to wait for.
    """
    start = time.monotonic()
    while time.monotonic() - start < timeout and alive():
        samples = [scrape(port) for port in ports]
        monitored = [s.get('fairstream_records_in_total{agent="monitor"}') for s in samples]
        if all(m is None for m in monitored):
            return 0.0
        repaired = sum(s.get('fairstream_records_repaired_total{agent="records"}', 0.0) for s in samples)
        if sum(m or 0.0 for m in monitored) >= repaired > 0:
            return time.monotonic() - start
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the monitor agent did not catch up within {timeout:.0f}s")


# --------------------------------------------------------------------------- (c) latency


def sent_ts(value: bytes) -> float:
    """``ts`` of a timed record from its output (repaired, passed through or dead-lettered)."""
    record = json.loads(value)
    if "original_b64" in record:  # a dead letter: the original record is inside, byte for byte
        record = json.loads(base64.b64decode(record["original_b64"]))
    return record["ts"]


async def offered_load(bootstrap: str, src: str, outputs: Outputs, records: list[tuple[bytes, dict]],
                       rate: float, prefix: bytes, alive) -> np.ndarray:
    """Offer ``records`` at ``rate``/s stamped with the send time; returns end-to-end latencies (s)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    latencies: list[float] = []
    on_batch = lambda now, ms: latencies.extend(now - sent_ts(m.value) for m in ms)  # noqa: E731
    try:
        receiving = asyncio.create_task(outputs.collect(prefix, len(records), len(records) / rate + 60, alive, on_batch))
        await paced_send(producer, src, records, rate)
        await receiving
    finally:
        await producer.stop()
    return np.array(latencies)


async def paced_send(producer: AIOKafkaProducer, topic: str, records: list[tuple[bytes, dict]], rate: float) -> None:
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


def timed_records(archive, config, count: int, prefix: str) -> list[tuple[bytes, dict]]:
    return [(k, json.loads(v)) for k, v in build_records(archive, config, count, prefix)]


# --------------------------------------------------------------------------- (d) profile

# Put on a worker's PYTHONPATH as sitecustomize.py: profiles the main thread (the agents' event loop)
# from interpreter start to exit when FAIRSTREAM_CPROFILE is set. Used when py-spy is unavailable.
_CPROFILE_HOOK = '''
import atexit, cProfile, os
_out = os.environ.get("FAIRSTREAM_CPROFILE")
if _out:
    _profile = cProfile.Profile()
    _profile.enable()
    atexit.register(lambda: (_profile.disable(), _profile.dump_stats(_out)))
'''

# Where a sample's time goes. A stack is cut below the frame that runs the event loop's callbacks
# (asyncio's Handle._run; under uvloop, whose loop is C, the Python frame that started the loop);
# the frames below it are tried from the leaf up and the first one that matches a category decides,
# so asyncio.wait under Faust's consumer counts as Faust, json.loads under decode_records as decode,
# and future callbacks under aiokafka's producer as send.
_LOOP_RUNNERS = re.compile(r"^(Handle\._run \(asyncio/|Worker\.execute_from_commandline \(mode/"
                           r"|ServiceThread\._start_thread \(mode/)")
_FAIRSTREAM = r"\((fairstream/)?"
CATEGORIES = [
    ("repair (plan, numpy)", re.compile(_FAIRSTREAM + r"repair/")),
    ("decode + validate", re.compile(r"^(decode_records|_parse|_check_\w+|_number|_key|_label|labels_array)\b.*streams/codec\.py")),
    ("encode", re.compile(r"^(encode_repaired|_scalar|_literal|dead_letter|_dead_letters|provenance)\b")),
    ("send (Faust + aiokafka producer)", re.compile(
        r"aiokafka/(producer|partitioner)|^(Producer|ProducerBuffer)\.\w+ \(faust/|send_all|send_batched")),
    ("fairness monitor", re.compile(r"streams/worker/monitor\.py|monitor_fairness|monitor_delivered|export_fairness")),
    ("agent + batch glue", re.compile(r"streams/worker/(app|processing)\.py")),
    ("Faust/mode event machinery", re.compile(r"\((faust|mode)/")),
]
# Faust runs the aiokafka consumer (fetching, record parsing) in a thread of its own.
_FETCH = "fetch (Faust's aiokafka consumer thread)"
# Left over: the loop itself and bare asyncio tasks (mostly the Event.wait tasks that Faust's
# Service.wait_first spawns for every message).
_LOOP = "event loop + bare asyncio tasks"


def classify(stack: list[str], thread: str = "MainThread") -> str:
    if thread != "MainThread":
        return _FETCH
    runners = [i for i, frame in enumerate(stack) if _LOOP_RUNNERS.match(frame)]
    for frame in reversed(stack[runners[-1] + 1:] if runners else []):
        for name, pattern in CATEGORIES:
            if pattern.search(frame):
                return name
    return _LOOP


def function(frame: str) -> str:
    """``func (file:line)`` -> ``func (file)``: self time by function, not by line."""
    return re.sub(r":\d+\)$", ")", frame)


def parse_pyspy(path: Path) -> tuple[Counter, Counter, Counter, int]:
    """Samples by function (self), by category and by thread, and the total, from py-spy's raw output."""
    leaves, categories, threads, total = Counter(), Counter(), Counter(), 0
    for line in path.read_text().splitlines():
        stack_text, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        thread, *stack = stack_text.split(";")
        if not stack:
            continue
        n = int(count)
        total += n
        thread = thread.rpartition(" ")[2]
        threads[thread] += n
        leaves[function(stack[-1])] += n
        categories[classify(stack, thread)] += n
    return leaves, categories, threads, total


def parse_cprofile(path: Path) -> tuple[Counter, Counter, Counter, int]:
    """The same from a cProfile dump: self time by function, and by the category of its own frame."""
    import pstats

    stats = pstats.Stats(str(path)).stats  # (file, line, func) -> (cc, nc, tottime, cumtime, callers)
    leaves, categories = Counter(), Counter()
    for (filename, line, func), (_, _, tottime, _, _) in stats.items():
        if "select" in func or "poll" in func:  # waiting for the network: idle, not work
            continue
        frame = f"{func} ({shorten(f'({filename}')[1:]})"
        micros = int(tottime * 1e6)
        leaves[frame] += micros
        # Without stacks only a function's own file can say where its self time belongs.
        categories[next((name for name, p in CATEGORIES if p.search(frame)), "asyncio + other")] += micros
    return leaves, categories, Counter({"MainThread": sum(leaves.values())}), sum(leaves.values())


def pyspy_binary() -> Path | None:
    binary = Path(sys.executable).with_name("py-spy")
    return binary if binary.exists() else None


def start_pyspy(pid: int, out: Path) -> subprocess.Popen:
    return subprocess.Popen([str(pyspy_binary()), "record", "--pid", str(pid), "--format", "raw", "--output", str(out),
                             "--rate", "200", "--threads", "--gil"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)


def stop_pyspy(spy: subprocess.Popen) -> None:
    spy.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
    try:
        spy.wait(30)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.wait()


# --------------------------------------------------------------------------- the run


@dataclass
class Result:
    rate: float = float("nan")
    cores: float = float("nan")  # CPU of the process under test during the throughput run
    catch_up: float = float("nan")  # agent only: seconds the monitor needed after the last repaired output
    latencies: np.ndarray = field(default_factory=lambda: np.array([]))

    def p(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) if len(self.latencies) else float("nan")


@dataclass
class Bench:
    args: argparse.Namespace
    run_dir: Path
    bootstrap: str
    config: object
    raw_topics: TopicConfig
    archive: object
    stack: contextlib.AsyncExitStack

    @property
    def partitions(self) -> int:
        return self.config.topics.partitions

    async def outputs(self, topics: list[str]) -> Outputs:
        outputs = await Outputs(self.bootstrap, partitions_of(topics, self.partitions)).start()
        self.stack.push_async_callback(outputs.stop)
        return outputs

    async def run_raw(self) -> Result:
        raw, args = self.raw_topics, self.args
        proc = PassthroughProcess(self.bootstrap, raw.records_in, raw.records_repaired, self.partitions,
                                  self.config.records.batch_size, args.raw_fetch_wait_ms).start()
        self.stack.callback(proc.stop)
        outputs = await self.outputs([raw.records_repaired])
        alive = lambda: proc.running  # noqa: E731
        result = Result(*await throughput(outputs, b"rec", args.records, args.timeout, alive, [proc.process.pid]))
        print(f"(a) raw passthrough: {result.rate:,.0f} records/s", flush=True)
        result.latencies = await self.latency(raw.records_in, outputs, "lat-a", alive)
        proc.stop()
        return result

    def start_worker(self, name: str, env: dict, metrics_port: int | None = None) -> WorkerProcess:
        if self.args.worker_pythonpath:
            env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [env.get("PYTHONPATH"), self.args.worker_pythonpath]))}
        config = self.config.with_monitor(metrics_port=metrics_port or free_port())  # one port per worker
        worker = WorkerProcess(config, self.bootstrap, self.run_dir, name=name, env=env).start()
        self.stack.callback(worker.stop)
        return worker

    async def run_agent(self) -> tuple[Result, dict]:
        topics, args = self.config.topics, self.args
        outputs = await self.outputs([topics.records_repaired, topics.dlq])
        # Started together so that they join the group in one rebalance.
        workers = [self.start_worker(f"worker{i}", {}) for i in range(args.workers)]
        alive = lambda: all(w.running for w in workers)  # noqa: E731
        try:
            # The timeout includes the workers' start and group join (~10 s), which the rate does not.
            result = Result(*await throughput(outputs, b"rec", args.records, args.timeout + 60, alive,
                                              [w._process.pid for w in workers]))  # WorkerProcess has no public pid
            # A monitor agent that re-reads records.repaired must drain its backlog before latency is
            # timed, as in a steady state.
            ports = [w.config.monitor.metrics_port for w in workers]
            result.catch_up = await monitor_caught_up(ports, args.timeout, alive)
            print(f"(b) repair agent: {result.rate:,.0f} records/s; monitor caught up {result.catch_up:.1f} s later",
                  flush=True)
            result.latencies = await self.latency(topics.records_in, outputs, "lat-b", alive)
            profile = await self.profile(workers[0], outputs)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\nworker log:\n{workers[0].log_tail()}") from None
        for worker in workers:
            worker.stop()
        return result, profile

    async def latency(self, src: str, outputs: Outputs, prefix: str, alive) -> np.ndarray:
        records = timed_records(self.archive, self.config, int(self.args.rate * self.args.seconds), prefix)
        return await offered_load(self.bootstrap, src, outputs, records, self.args.rate, prefix.encode(), alive)

    async def profile(self, worker: WorkerProcess, outputs: Outputs) -> dict:
        """Push --profile-records more records through the worker while a profiler samples it."""
        if self.args.profiler == "none":
            return {}
        messages = build_records(self.archive, self.config, self.args.profile_records, "prof")
        if self.args.profiler == "cprofile" or pyspy_binary() is None:
            return await self.profile_cprofile(worker, outputs, messages)
        spy_out = self.run_dir / "agent-profile.txt"
        spy = start_pyspy(worker._process.pid, spy_out)  # the worker's pid: WorkerProcess has no public one
        self.stack.callback(lambda: spy.poll() is None and spy.kill())
        await asyncio.sleep(1.0)  # py-spy attaches before the records arrive
        await produce(self.bootstrap, [self.config.topics.records_in], messages)
        rate, _ = await throughput(outputs, b"prof", len(messages), self.args.timeout, lambda: worker.running)
        stop_pyspy(spy)
        if not spy_out.exists():
            return {"tool": f"py-spy failed: {spy.stderr.read().decode(errors='replace')[-300:]}"}
        if self.args.keep_profile:
            Path(self.args.keep_profile).write_bytes(spy_out.read_bytes())
        return {"tool": "py-spy --gil (samples holding the GIL = Python CPU, 200 Hz)", "rate": rate, "parsed": parse_pyspy(spy_out),
                "saved": self.args.keep_profile}

    async def profile_cprofile(self, worker: WorkerProcess, outputs: Outputs, messages) -> dict:
        """Fallback: a second worker whose main thread runs under cProfile via the sitecustomize hook."""
        worker.stop()
        hook = self.run_dir / "cprofile-hook"
        hook.mkdir(exist_ok=True)
        (hook / "sitecustomize.py").write_text(_CPROFILE_HOOK)
        dump = self.run_dir / "agent.prof"
        await produce(self.bootstrap, [self.config.topics.records_in], messages)
        profiled = self.start_worker("profiled", {"PYTHONPATH": str(hook), "FAIRSTREAM_CPROFILE": str(dump)})
        rate, _ = await throughput(outputs, b"prof", len(messages), self.args.timeout + 60, lambda: profiled.running)
        profiled.stop()
        return {"tool": "cProfile (main thread only, start-up included, idle excluded; self time)", "rate": rate, "parsed": parse_cprofile(dump)}


async def setup(args, run_dir: Path, bootstrap: str, stack: contextlib.AsyncExitStack) -> Bench:
    config = adult_config(artifact_dir=str(run_dir / "artifacts")).with_topics(prefix="bench")
    config = replace(config, records=replace(config.records, batch_size=args.batch_size))
    raw_topics = TopicConfig(prefix="benchraw", partitions=config.topics.partitions)
    await ensure_topics_async(bootstrap, config.topics)
    await ensure_topics_async(bootstrap, raw_topics)
    research, archive = datasets.load("adult").split(10_000, seed=0)
    plan = DistributionalRepair(n_q=250, out_of_range="reject").fit(research.X, research.s, research.u)
    await ControlClient(bootstrap, config.topics, ArtifactStore(config.artifact_dir)).publish(plan.to_artifact())
    messages = build_records(archive, config, args.records, "rec")
    size = np.mean([len(v) for _, v in messages])
    rate = await produce(bootstrap, [config.topics.records_in, raw_topics.records_in], messages)
    print(f"pre-loaded {len(messages):,} records of {size:.0f} B (mean) on 2 topics at {rate:,.0f} records/s "
          f"(aiokafka producer)", flush=True)
    return Bench(args, run_dir, bootstrap, config, raw_topics, archive, stack)


async def run(args, run_dir: Path, bootstrap: str) -> tuple[Bench, Result, Result, dict]:
    async with contextlib.AsyncExitStack() as stack:
        bench = await setup(args, run_dir, bootstrap, stack)
        raw = await bench.run_raw()
        agent, profile = await bench.run_agent()
    return bench, raw, agent, profile


# --------------------------------------------------------------------------- report


def report(args, config, raw: Result, agent: Result, profile: dict) -> None:
    ratio, lat_ratio = agent.rate / raw.rate, agent.p(99) / raw.p(99)
    print(f"\n{args.records:,} records, {config.topics.partitions} partitions, batch {config.records.batch_size}, "
          f"{os.cpu_count()} CPUs; latency at {args.rate:,.0f} records/s offered for {args.seconds:.0f} s")
    print(f"{'':28}{'records/s':>11}{'CPU cores':>11}{'lat p50 (s)':>13}{'lat p99 (s)':>13}")
    print(f"{'(a) raw aiokafka passthrough':28}{raw.rate:11,.0f}{raw.cores:11.2f}{raw.p(50):13.3f}{raw.p(99):13.3f}"
          f"   fetch wait {args.raw_fetch_wait_ms} ms")
    label = f"(b) repair agent, {args.workers} worker" + "s" * (args.workers > 1)
    print(f"{label:28}{agent.rate:11,.0f}{agent.cores:11.2f}{agent.p(50):13.3f}{agent.p(99):13.3f}"
          + (f"   monitor done {agent.catch_up:.1f} s after" if agent.catch_up > 0 else ""))
    if agent.catch_up > 0:  # a monitor that re-reads records.repaired must keep up in a steady state too
        sustained = args.records / (args.records / agent.rate + agent.catch_up)
        print(f"{'(b) sustained, with monitor':28}{sustained:11,.0f}   (records / (repair time + monitor catch-up))")
    print(f"{'b / a':28}{ratio:11.2f}{'':11}{'':13}{lat_ratio:13.1f}   targets: records/s >= 0.50, p99 <= 2.0")
    if profile:
        print_profile(profile, args.top)


def print_profile(profile: dict, top: int) -> None:
    if "parsed" not in profile:
        print(f"\nprofile: {profile['tool']}")
        return
    leaves, categories, threads, total = profile["parsed"]
    print(f"\nagent profile: {profile['tool']}; {profile['rate']:,.0f} records/s while profiled")
    print("threads: " + ", ".join(f"{name} {100 * n / total:.0f}%" for name, n in threads.most_common()))
    print("where the time goes (see CATEGORIES):")
    for name, n in categories.most_common():
        print(f"  {100 * n / total:5.1f}%  {name}")
    print(f"top {top} functions by self time:")
    for frame, n in leaves.most_common(top):
        print(f"  {100 * n / total:5.1f}%  {shorten(frame)}")
    if profile.get("saved"):
        print(f"raw py-spy stacks (collapsed; for speedscope or flamegraph.pl): {profile['saved']}")


def shorten(frame: str) -> str:
    """Paths as py-spy shows them: relative to site-packages, the stdlib or the project."""
    return re.sub(r"\([^)]*(site-packages|lib/python3\.\d+|" + re.escape(str(ROOT)) + r"|/fairstream)/", "(", frame)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fairstream-bench-") as tmp, EmbeddedBroker(Path(tmp) / "broker") as broker:
        bench, raw, agent, profile = asyncio.run(run(args, Path(tmp), broker.bootstrap))
        report(args, bench.config, raw, agent, profile)
    # Other processes on the machine skew a run: a 1-minute load average well above the ~1.5 this
    # benchmark makes by itself on 2 cores means the figures are not comparable.
    print(f"\ntotal {time.monotonic() - started:.0f} s; load average (1, 5 min) at the end: "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()[:2]))
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="records for the throughput runs (default 200000)")
    parser.add_argument("--rate", type=float, default=2000.0, help="offered load for the latency runs, records/s")
    parser.add_argument("--seconds", type=float, default=15.0, help="duration of each latency run (default 15)")
    parser.add_argument("--workers", type=int, default=1, help="repair worker processes in the group (default 1)")
    parser.add_argument("--batch-size", type=int, default=1000, help="agent batch (and passthrough getmany) size")
    parser.add_argument("--raw-fetch-wait-ms", type=int, default=10, help="fetch_max_wait_ms of the raw passthrough")
    parser.add_argument("--profiler", choices=["py-spy", "cprofile", "none"], default="py-spy",
                        help="py-spy falls back to cProfile when it is not installed")
    parser.add_argument("--profile-records", type=int, default=50_000, help="records pushed through while profiling")
    parser.add_argument("--keep-profile", help="copy py-spy's raw stacks to this file")
    parser.add_argument("--top", type=int, default=15, help="functions listed in the profile")
    parser.add_argument("--worker-pythonpath", help="overlay folder put first on the worker's PYTHONPATH (a patched copy)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for a phase's outputs")
    return parser.parse_args(argv)


if __name__ == "__main__":
    if sys.argv[1:2] == ["_passthrough"]:
        bootstrap, src, dst, partitions, batch, wait = sys.argv[2:8]
        asyncio.run(passthrough(bootstrap, src, dst, int(partitions), int(batch), int(wait)))
        sys.exit(0)
    sys.exit(main())
