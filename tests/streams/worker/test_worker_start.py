"""A worker's start against hostile inputs: a config that disagrees with the plan, a compacted control
topic with hostile records, a run directory that does not exist, a metrics port that is taken.

Real worker processes on Apache Kafka. None of these workers needs to join its
consumer group, so each test takes seconds; workers left holding input are killed, not stopped.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from fairstream.repair import datasets
from fairstream.models.plan import DistributionalRepair
from fairstream.streams.config import adult_config
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.demo.collect import TopicReader
from fairstream.streams.demo.replay import record_messages, replay
from fairstream.streams.ops.supervise import WorkerProcess
from fairstream.streams.topics import ensure_topics
from tests.streams.control.test_registry import compact, read_log, write_log

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def adult():
    research, archive = datasets.load("adult").split(3_000, seed=0)
    return research, archive


def fit(research, n_q: int, columns=("age", "hours-per-week")) -> DistributionalRepair:
    return DistributionalRepair(n_q=n_q, columns=list(columns)).fit(research.X, research.s, research.u)


def pipeline(tmp_path, prefix: str, **changes):
    return adult_config(artifact_dir=str(tmp_path / "artifacts"), **changes).with_topics(prefix=prefix)


def serving(worker: WorkerProcess) -> list[int]:
    """Every plan version the worker swapped to, in order (from its log)."""
    return [int(v) for v in re.findall(r"now serving plan artifact version (\d+)", worker.log_path.read_text())]


def test_a_config_that_disagrees_with_the_plan_is_refused_at_start_and_input_is_held(broker, adult, tmp_path):
    research, archive = adult
    config = pipeline(tmp_path, "mismatch")
    ensure_topics(broker.bootstrap, config.topics)
    ControlClient(broker.bootstrap, config.topics, ArtifactStore(config.artifact_dir)).publish_sync(
        fit(research, 50).to_artifact())
    typo = pipeline(tmp_path, "mismatch", features=("age", "hours-per-weak"))
    worker = WorkerProcess(typo, broker.bootstrap, tmp_path / "run").start()
    try:
        assert worker.wait_for_log("no usable plan artifact", timeout=90), worker.log_tail()
        log = worker.log_path.read_text()
        assert re.search(r"\[ERROR\] no usable plan artifact: the last one was refused \(publish of plan version 1 .*"
                         r"the plan was fitted on features \['age', 'hours-per-week'\], the pipeline names "
                         r"\['age', 'hours-per-weak'\]\); holding input \(nothing is dead-lettered\)", log), log
        valid = record_messages(archive.subset(slice(0, 50)), config, "held")
        replay(broker.bootstrap, config.topics.records_in, valid, progress=False)
        with TopicReader(broker.bootstrap, config.topics.dlq) as dlq:
            deadline, letters = time.monotonic() + 5.0, []
            while time.monotonic() < deadline:
                letters += dlq.poll()
        assert letters == [] and worker.running  # held, not dead-lettered
    finally:
        worker.kill()


def test_a_fresh_worker_on_a_compacted_control_topic_serves_the_newest_surviving_version(broker, adult, tmp_path):
    research, _ = adult
    config = pipeline(tmp_path, "history")
    client = ControlClient(broker.bootstrap, config.topics, ArtifactStore(config.artifact_dir))
    for n_q in (40, 50):
        client.publish_sync(fit(research, n_q).to_artifact())
    client.rollback_sync("plan")  # back to version 1
    client.publish_sync(fit(research, 60).to_artifact())  # version 3
    log = asyncio.run(read_log(broker.bootstrap, config.topics.control))
    # One garbage record and one tombstone keyed like the kind, one garbage record keyed like version 3.
    log += [(b"plan", b"garbage"), (b"plan", None), (log[-1][0], b"{}")]
    fresh = config.with_topics(prefix="history-compacted")
    ensure_topics(broker.bootstrap, fresh.topics)
    surviving = [(key, value) for _, key, value in compact(log)]  # rewritten without holes
    asyncio.run(write_log(broker.bootstrap, fresh.topics.control, surviving))
    worker = WorkerProcess(fresh, broker.bootstrap, tmp_path / "run").start()
    try:
        assert worker.wait_for_log("caught up with history-compacted.control", timeout=90), worker.log_tail()
        assert serving(worker)[-1] == 1, worker.log_tail()  # version 3 was shadowed; 1 was active before it
    finally:
        worker.kill()


class _WorkerIn(WorkerProcess):
    """A worker started with ``--run-dir`` pointing at a directory that does not exist yet."""

    def __init__(self, *args, run_dir_argument, **kwargs):
        super().__init__(*args, **kwargs)
        self.run_dir_argument = run_dir_argument

    def _command(self) -> list[str]:
        command = super()._command()
        command[command.index("--run-dir") + 1] = str(self.run_dir_argument)
        return command


def test_a_worker_creates_its_run_dir_and_serves_metrics_and_its_probes_on_a_free_port(broker, tmp_path):
    config = pipeline(tmp_path, "ops").with_monitor(metrics_port=0)
    missing = tmp_path / "not" / "yet" / "there"
    worker = _WorkerIn(config, broker.bootstrap, tmp_path / "run", run_dir_argument=missing).start()
    try:
        assert worker.wait_for_log("serving Prometheus /metrics on port", timeout=90), worker.log_tail()
        port = int(re.search(r"serving Prometheus /metrics on port (\d+)", worker.log_path.read_text()).group(1))
        assert port > 0 and (missing / "faust-data").is_dir()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            assert "fairstream_records_in_total" in response.read().decode()
        # The probes on the same port: alive, and not ready (no plan was ever published: input held).
        assert get(port, "/healthz") == (200, {"alive": True})
        deadline, held = time.monotonic() + 60, "no plan artifact loaded (input held)"
        while held not in (answer := get(port, "/readyz"))[1].get("reasons", []) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert answer[0] == 503 and held in answer[1]["reasons"], answer
    finally:
        worker.kill()


def get(port: int, path: str) -> tuple[int, dict]:
    """A probe's status and JSON answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_taken_metrics_port_stops_the_worker_at_once_in_one_line(broker, tmp_path):
    with socket.socket() as taken:  # a second worker on this host, with the same pipeline file
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = tmp_path / "pipeline.toml"
        path.write_text(pipeline(tmp_path, "ops").with_monitor(metrics_port=port).to_toml())
        (tmp_path / "run").mkdir()
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "fairstream.streams.cli", "worker", "--config", str(path),
                                 "--broker", f"kafka://{broker.bootstrap}", "--run-dir", str(tmp_path / "run")],
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and time.monotonic() - started < 60
    assert result.stderr.strip() == (
        f"fairstream worker: error: metrics port {port} is already in use on this host (another worker?): give each "
        "worker its own port with --metrics-port PORT or [monitor] metrics_port, or 0 for any free port")
