"""A worker is consuming or it has exited non-zero (issue 18, item 1).

First the probes and the log filter on their own; then real ``fairstream worker`` processes on
Apache Kafka, under the faults of the issue: a worker frozen longer than its session (SIGSTOP,
SIGCONT) and a bug that crashes processing, with and without ``--supervise``. Two tests exist for the
embedded Tansu broker's behaviour only and run on it: its memory-only storage killed and restarted
under a worker, and the committed offsets beyond the end of the log that such a restart leaves (on
Kafka the broker itself answers those with OFFSET_OUT_OF_RANGE: tests/streams/worker/test_offset_reset.py
and the three-node failures in test_broker_failures.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import textwrap
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fairstream.repair import datasets
from fairstream.models.plan import DistributionalRepair
from fairstream.streams.config import adult_config
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.ops.broker import EmbeddedBroker
from fairstream.streams.ops.processes import is_alive
from fairstream.streams.ops.supervise import WorkerProcess
from fairstream.streams.topics import ensure_topics
from fairstream.streams.worker.consumer import Progress
from fairstream.streams.worker.health import RepeatedLogFilter, WorkerHealth
from fairstream.streams.worker.metrics import serve

from .outputs import collect_outputs, send

# --------------------------------------------------------------------------- the probes, on their own


class Input:
    def __init__(self, agent="records", partitions=2, seconds_since=1.0, last_error=None):
        self.state = Progress(agent, partitions, seconds_since, last_error)

    def progress(self) -> Progress:
        return self.state


def health_of(*inputs, blockers=()) -> WorkerHealth:
    health = WorkerHealth(ready_within=20.0)
    health.watch(inputs, lambda: list(blockers))
    return health


def test_ready_means_partitions_owned_and_progress_on_every_input_that_owns_some():
    assert health_of(Input(), Input("embeddings", partitions=0, seconds_since=None)).reasons() == []
    stalled = health_of(Input(seconds_since=25.0, last_error="CommitFailedError: rebalanced")).reasons()
    assert stalled == ["records: owns 2 partitions but consumed not for 25 s (no batch committed, not caught up); "
                       "last error CommitFailedError: rebalanced"]
    assert health_of(Input(seconds_since=None)).reasons()[0].startswith("records: owns 2 partitions but consumed never")
    (alone,) = health_of(Input(partitions=0), Input("embeddings", partitions=0)).reasons()
    assert alone.startswith("no input partitions assigned")
    assert health_of(Input(), blockers=["no plan artifact loaded (input held)"]).reasons() == [
        "no plan artifact loaded (input held)"]


def get(port: int, path: str) -> tuple[int, dict | str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            status, body = response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read().decode()
    return status, (json.loads(body) if path != "/metrics" else body)


def test_one_server_answers_metrics_healthz_and_readyz_from_the_event_loop():
    health = health_of(Input(seconds_since=None))
    port = serve(0, "127.0.0.1", routes={"/healthz": health.healthz, "/readyz": health.readyz})
    assert get(port, "/readyz") == (503, {"ready": False, "reasons": ["starting"]})
    assert get(port, "/healthz") == (200, {"alive": True, "starting": True})
    health.start_within = 0.0  # a start that never ends is not alive either
    assert get(port, "/healthz")[0] == 503
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        health.attach(loop)
        assert get(port, "/healthz") == (200, {"alive": True})
        status, body = get(port, "/readyz")
        assert status == 503 and "consumed never" in body["reasons"][0]
        health.inputs = [Input()]
        assert get(port, "/readyz") == (200, {"ready": True})
        status, text = get(port, "/metrics")
        assert status == 200 and "fairstream_records_in_total" in text
        health.answer_within = 0.5
        loop.call_soon_threadsafe(time.sleep, 2.0)  # the loop is blocked: not alive
        status, body = get(port, "/healthz")
        assert status == 503 and not body["alive"] and "did not answer within 0.5 s" in body["reason"]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(timeout=10)
        loop.close()


def test_repeated_log_lines_are_one_line_per_cause_every_few_seconds_with_a_count():
    now = [0.0]
    shown: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: shown.append(record.getMessage())
    handler.addFilter(RepeatedLogFilter(every=5.0, clock=lambda: now[0]))
    logger = logging.getLogger("tests.liveness.flood")
    logger.addHandler(handler)
    logger.propagate, level = False, logger.level
    logger.setLevel(logging.INFO)
    try:
        for tick in range(190 * 12):  # 12 s of a broker away: ~190 lines a second, two causes
            now[0] = tick / 190
            logger.error("Unable connect to node with id %s: %s", 111, f"Connect call failed (attempt {tick})")
            if tick % 2:
                logger.error("Unable to update metadata from [%s]", 111)
            if tick % 190 == 0:
                logger.info("an info line, every second: never held")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    connect = [line for line in shown if line.startswith("Unable connect")]
    assert len(connect) == 3  # at 0, 5 and 10 s
    assert connect[0] == "Unable connect to node with id 111: Connect call failed (attempt 0)"
    assert connect[1] == "Unable connect to node with id 111: Connect call failed (attempt 950) [949 more like this " \
                         "in the last 5 s]"
    assert len([line for line in shown if line.startswith("Unable to update")]) == 3
    assert len([line for line in shown if line.startswith("an info line")]) == 12


# --------------------------------------------------------------------------- real workers, real faults

RATE = 400.0  # records a second, as in the issue
SESSION_SECONDS = 10  # BatchConsumer's session timeout
READY_SECONDS = 90.0  # a worker's start: Faust, the control topic, the group join


@pytest.fixture(scope="module")
def adult():
    research, archive = datasets.load("adult").split(3_000, seed=0)
    return archive, DistributionalRepair(n_q=50).fit(research.X, research.s, research.u)


def pipeline(tmp_path, prefix: str, bootstrap: str, plan):
    """A pipeline with its own topics and a published plan; each worker serves its probes on a free port."""
    config = adult_config(artifact_dir=str(tmp_path / "artifacts")).with_topics(prefix=prefix).with_monitor(
        metrics_port=0)
    ensure_topics(bootstrap, config.topics)
    ControlClient(bootstrap, config.topics, ArtifactStore(config.artifact_dir)).publish_sync(plan.to_artifact())
    return config


def probe_port(worker: WorkerProcess) -> int:
    """The port of the newest worker process writing to this log (0 in the config: a free one, logged)."""
    return int(re.findall(r"serving Prometheus /metrics on port (\d+)", worker.log_path.read_text())[-1])


def metric_samples(worker: WorkerProcess) -> list:
    """Every sample of the worker's /metrics, now."""
    status, text = get(probe_port(worker), "/metrics")
    assert status == 200, text[:500]
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def wait_ready(worker: WorkerProcess, timeout: float = READY_SECONDS) -> None:
    """Until /readyz says the worker consumes (it fails at once if the worker died)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and worker.running:
        logged = "serving Prometheus /metrics" in worker.log_path.read_text()
        if logged and get(probe_port(worker), "/readyz")[0] == 200:
            return
        time.sleep(0.5)
    logged = "serving Prometheus /metrics" in worker.log_path.read_text()
    status = "exited" if not worker.running else get(probe_port(worker), "/readyz") if logged else "no port logged"
    raise AssertionError(f"{worker.log_path.name} not ready within {timeout:.0f} s: {status}\n{worker.log_tail()}")


def died(*workers: WorkerProcess):
    """For collect_outputs: the log of a worker that is no longer running, if any."""
    return lambda: next((f"{w.log_path.name} exited:\n{w.log_tail()}" for w in workers if not w.running), None)


def check_one_place(ids: set, repaired: dict, dead: dict) -> None:
    """Every id in exactly one topic; a replay's copies are identical (at-least-once, deterministic)."""
    assert not repaired.keys() & dead.keys() and ids <= repaired.keys() | dead.keys()
    for rid, copies in repaired.items():
        assert len({json.dumps(c, sort_keys=True) for c in copies}) == 1, f"{rid}: copies differ"


# The issue froze a worker for 60 s; any pause longer than the session timeout (10 s) gets the same
# treatment from the group (its partitions given away, its next commit refused with
# CommitFailedError), so 15 s reproduces it with a margin and keeps `make test` fast.
FROZEN_SECONDS = 15.0


@pytest.mark.integration
def test_a_worker_frozen_longer_than_its_session_resumes_and_every_id_comes_out(broker, adult, tmp_path):
    archive, plan = adult
    config = pipeline(tmp_path, "frozen", broker.bootstrap, plan)
    workers = [WorkerProcess(config, broker.bootstrap, tmp_path, name=f"w{i}").start() for i in range(2)]
    frozen = workers[0]
    try:
        for worker in workers:
            wait_ready(worker)
        lead, tail = 3.0, 5.0
        count = int(RATE * (lead + FROZEN_SECONDS + tail))
        messages = record_messages(archive.subset(slice(0, count)), config, "frozen")
        sender = threading.Thread(target=send, args=(broker.bootstrap, config, messages, RATE))
        sender.start()
        time.sleep(lead)
        os.kill(frozen.pid, signal.SIGSTOP)
        time.sleep(FROZEN_SECONDS)
        os.kill(frozen.pid, signal.SIGCONT)
        resumed = time.monotonic()
        sender.join()
        ids = {key.decode() for key, _ in messages}
        repaired, dead = collect_outputs(broker.bootstrap, config, ids, timeout=resumed + 60 - time.monotonic(),
                                         alive=died(*workers))
        check_one_place(ids, repaired, dead)
        # ... with no intervention, and the resumed worker consumes again (partitions back, progress).
        wait_ready(frozen, timeout=max(resumed + 60 - time.monotonic(), 1.0))
        print(f"\nall {len(ids)} ids out {time.monotonic() - resumed:.1f} s after SIGCONT; resumed worker ready")
    finally:
        if frozen.running:
            os.kill(frozen.pid, signal.SIGCONT)
        for worker in workers:
            worker.stop()


# While the broker is away the Kafka clients flood the log (~190 lines a second before the filter);
# 8 s measures that rate, and the worker then still holds the old group and positions.
AWAY_SECONDS = 8.0


@pytest.mark.integration
def test_a_broker_killed_and_restarted_on_its_port_loses_nothing_it_holds_and_the_log_stays_readable(adult, tmp_path):
    """Tansu only: its memory-only storage comes back empty (the Kafka failures are in test_broker_failures.py)."""
    archive, plan = adult
    broker = EmbeddedBroker(tmp_path / "broker").start()
    worker = None
    try:
        config = pipeline(tmp_path, "restart", broker.bootstrap, plan)
        # Supervised: the worker exits when it sees the control topic re-created (its state belongs to the
        # old log) and its restart replays the new one.
        worker = SupervisedWorker(config, broker.bootstrap, tmp_path, name="w").start()
        wait_ready(worker)
        before = record_messages(archive.subset(slice(0, 1000)), config, "before")
        send(broker.bootstrap, config, before)
        collect_outputs(broker.bootstrap, config, {k.decode() for k, _ in before}, timeout=60, alive=died(worker))
        lines = len(worker.log_path.read_text().splitlines())
        broker.kill()
        killed = time.monotonic()
        time.sleep(AWAY_SECONDS)
        per_second = (len(worker.log_path.read_text().splitlines()) - lines) / (time.monotonic() - killed)
        # Tansu creates any topic a client asks about (the control topic with 4 partitions); Kafka in
        # production does not (compose turns it off). The worker is frozen for the second the operator
        # takes to restart the broker and re-create the topics, so that its clients cannot race them.
        frozen = worker_pid(worker)
        os.kill(frozen, signal.SIGSTOP)
        try:
            broker.restart()  # memory storage: topics, offsets and the group are gone
            restarted = time.monotonic()
            ensure_topics(broker.bootstrap, config.topics)
            ControlClient(broker.bootstrap, config.topics, ArtifactStore(config.artifact_dir)).publish_sync(
                plan.to_artifact())
            # More records than before on each partition, so the worker's old positions are valid offsets
            # of the new topics: resuming from them would skip the records below them. It must rejoin
            # and start from the new group's (absent) commits, whether its heartbeat reaches the new
            # broker first or a fetch does (then its commit is refused and the batch replayed), and a
            # commit of its old batch that the new broker accepted (beyond the new logs' ends) must be
            # reset as out of range rather than resumed from.
            after = record_messages(archive.subset(slice(1000, 4000)), config, "after")
            send(broker.bootstrap, config, after)
        finally:
            os.kill(frozen, signal.SIGCONT)
        ids = {key.decode() for key, _ in after}
        repaired, dead = collect_outputs(broker.bootstrap, config, ids, timeout=restarted + 90 - time.monotonic(),
                                         alive=died(worker))
        check_one_place(ids, repaired, dead)
        assert per_second < 5, f"{per_second:.0f} log lines a second while the broker was away"
        wait_ready(worker, timeout=max(restarted + 90 - time.monotonic(), 1.0))
        print(f"\n{per_second:.1f} log lines/s while away; all {len(ids)} ids out "
              f"{time.monotonic() - restarted:.1f} s after the restart")
    finally:
        if worker is not None:
            worker.stop()
        broker.stop()


# A bug in processing: records keyed "poison..." raise, always or (FAULT_ONCE) in the first process only.
FAULT = textwrap.dedent('''
    import os
    from pathlib import Path
    from fairstream.streams.worker import processing

    _process = processing.RecordRepairer.process

    def process(self, messages, active):
        once = os.environ.get("FAULT_ONCE")
        if any((m.key() or b"").startswith(b"poison") for m in messages) and not (once and Path(once).exists()):
            if once:
                Path(once).touch()
            raise ZeroDivisionError("injected: a bug in processing")
        return _process(self, messages, active)

    processing.RecordRepairer.process = process
''')


def faulty(tmp_path, once: bool = False) -> dict[str, str]:
    """The environment of a worker whose processing has :data:`FAULT` (as ``sitecustomize``)."""
    (tmp_path / "fault").mkdir()
    (tmp_path / "fault" / "sitecustomize.py").write_text(FAULT)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "fault"), os.environ.get("PYTHONPATH")]))}
    return env | ({"FAULT_ONCE": str(tmp_path / "fault" / "fired")} if once else {})


def with_poison(archive, config, prefix: str):
    good = record_messages(archive.subset(slice(0, 300)), config, prefix)
    poison = record_messages(archive.subset(slice(300, 301)), config, f"poison-{prefix}")
    return good[:150] + poison + good[150:]


@pytest.mark.integration
def test_an_error_the_worker_cannot_recover_from_ends_the_process_with_a_non_zero_status(broker, adult, tmp_path):
    archive, plan = adult
    config = pipeline(tmp_path, "crash", broker.bootstrap, plan)
    worker = WorkerProcess(config, broker.bootstrap, tmp_path, name="w", env=faulty(tmp_path)).start()
    try:
        wait_ready(worker)
        send(broker.bootstrap, config, with_poison(archive, config, "crash"))
        sent = time.monotonic()
        code = worker.wait(timeout=60)
        assert code not in (None, 0), f"still running 60 s after the fault:\n{worker.log_tail()}"
        log = worker.log_path.read_text()
        assert "stopping the worker with a non-zero exit status" in log and "ZeroDivisionError: injected" in log
        print(f"\nexit status {code} {time.monotonic() - sent:.1f} s after the poison was sent")
    finally:
        worker.stop()


class SupervisedWorker(WorkerProcess):
    """``fairstream worker --supervise``: the supervisor's output and its workers' in one log."""

    def _command(self) -> list[str]:
        return super()._command() + ["--supervise", "--max-restarts", "2"]


def worker_pid(supervisor: SupervisedWorker) -> int:
    """The pid of the worker the supervisor started last."""
    return int(re.findall(r"started the worker \(pid (\d+)\)", supervisor.log_path.read_text())[-1])


@pytest.mark.integration
def test_a_supervised_worker_is_restarted_after_a_crash_replays_the_batch_and_stops_cleanly(broker, adult, tmp_path):
    archive, plan = adult
    config = pipeline(tmp_path, "supervised", broker.bootstrap, plan)
    supervisor = SupervisedWorker(config, broker.bootstrap, tmp_path, name="s", env=faulty(tmp_path, once=True)).start()
    try:
        wait_ready(supervisor)
        messages = with_poison(archive, config, "supervised")
        send(broker.bootstrap, config, messages)
        assert supervisor.wait_for_log("the worker exited with status 1; restarting it in 1 s", timeout=60), \
            supervisor.log_tail()
        # The crashed batch was not committed: the new worker replays it, the poison record included.
        ids = {key.decode() for key, _ in messages}
        repaired, dead = collect_outputs(broker.bootstrap, config, ids, timeout=120, alive=died(supervisor))
        check_one_place(ids, repaired, dead)
        first, second = map(int, re.findall(r"started the worker \(pid (\d+)\)", supervisor.log_path.read_text()))
        assert not is_alive(first) and is_alive(second)
        assert supervisor.stop() == 0  # SIGTERM passed on: the worker stops cleanly, and so does the supervisor
        assert not is_alive(second)
        assert "stopped the worker on SIGTERM: exit status 0" in supervisor.log_path.read_text()
    finally:
        supervisor.stop()


# A monitor that cannot compute its statistics (a bug, or numbers an artifact makes impossible).
BROKEN_MONITOR = textwrap.dedent('''
    from fairstream.streams.worker import monitor

    def observe_batch(self, batch, *actives):
        raise FloatingPointError("injected: the monitor cannot compute its statistics")

    monitor.FairnessMonitor.observe_batch = observe_batch
''')


@pytest.mark.integration
def test_a_monitor_that_fails_on_every_batch_does_not_stop_the_worker(broker, adult, tmp_path):
    """The monitor observes batches already delivered: its failure is counted and logged, the records flow."""
    archive, plan = adult
    config = pipeline(tmp_path, "blind", broker.bootstrap, plan)
    (tmp_path / "fault").mkdir()
    (tmp_path / "fault" / "sitecustomize.py").write_text(BROKEN_MONITOR)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "fault"), os.environ.get("PYTHONPATH")]))}
    worker = WorkerProcess(config, broker.bootstrap, tmp_path, name="w", env=env).start()
    try:
        wait_ready(worker)
        messages = record_messages(archive.subset(slice(0, 600)), config, "blind")
        send(broker.bootstrap, config, messages)
        ids = {key.decode() for key, _ in messages}
        repaired, dead = collect_outputs(broker.bootstrap, config, ids, timeout=60, alive=died(worker))
        check_one_place(ids, repaired, dead)
        status, metrics = get(probe_port(worker), "/metrics")
        errors = [sample.value for family in text_string_to_metric_families(metrics) for sample in family.samples
                  if sample.name == "fairstream_monitor_errors_total"
                  and sample.labels == {"pipeline": config.name, "monitor": "fairness"}]
        assert status == 200 and errors and errors[0] >= 1, metrics[:2000]
        assert worker.running and get(probe_port(worker), "/readyz")[0] == 200
        assert "FloatingPointError: injected" in worker.log_path.read_text()
    finally:
        worker.stop()


def commit_past_the_end(bootstrap: str, topic: str, group: str, offset: int) -> dict:
    """Commit ``offset`` on every partition of ``topic`` for ``group``, as a broker that lost the log leaves it.

    The state a memory-only broker restarted under a worker with a batch in flight ends in: the group's
    committed offsets (the old log's) lie beyond the end of the re-created, shorter topic.
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from fairstream.streams.kafka import aiokafka_options

    async def commit() -> dict:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, **aiokafka_options(), group_id=group,
                                    enable_auto_commit=False)
        await consumer.start()
        try:
            await consumer.topics()  # metadata
            partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
            consumer.assign(partitions)
            await consumer.commit({tp: offset for tp in partitions})
            return {tp.partition: await consumer.committed(tp) for tp in partitions}
        finally:
            await consumer.stop()

    return asyncio.run(commit())


STALE_OFFSET = 500  # per partition, beyond the ~75 records each of the 4 partitions gets below


@pytest.mark.integration
def test_committed_offsets_beyond_the_end_of_a_re_created_log_are_reset_and_every_id_comes_out(embedded_broker, adult,
                                                                                              tmp_path):
    """Tansu only: it answers a fetch past the log's end with nothing rather than OFFSET_OUT_OF_RANGE."""
    archive, plan, broker = *adult, embedded_broker
    config = pipeline(tmp_path, "stale", broker.bootstrap, plan)
    group = f"{config.topics.prefix}-{config.name}.records"  # the worker's records group (default app id)
    committed = commit_past_the_end(broker.bootstrap, config.topics.records_in, group, STALE_OFFSET)
    assert set(committed.values()) == {STALE_OFFSET}, committed  # the broker accepts it: the state is real
    messages = record_messages(archive.subset(slice(0, 300)), config, "stale")
    send(broker.bootstrap, config, messages)
    worker = WorkerProcess(config, broker.bootstrap, tmp_path, name="w").start()
    try:
        started = time.monotonic()
        ids = {key.decode() for key, _ in messages}
        repaired, dead = collect_outputs(broker.bootstrap, config, ids, timeout=READY_SECONDS, alive=died(worker))
        check_one_place(ids, repaired, dead)
        log = worker.log_path.read_text()
        assert "offset out of range" in log and f"is at offset {STALE_OFFSET} but its log ends at" in log
        print(f"\nall {len(ids)} ids out {time.monotonic() - started:.1f} s after the worker started")
    finally:
        worker.stop()
