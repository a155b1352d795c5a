"""One config per pipeline (issue 33): a worker whose config differs from the pipeline's active one takes no
partitions.

The rolling-upgrade case of the issue, on Apache Kafka: workers ran ``plan -> scorer`` when one with another chain
(``plan`` only) and another valid range joined their group; on its partitions 297 of 500 records went out with no
score and 203 were dead-lettered, with no warning, no metric and ``/readyz`` 200 on both. Here the pipeline's config
is published as version 1; the second worker holds (not ready, naming the keys, one line, the gauges) and every
record comes out of the first, scored; once its config is published as version 2 the first worker leaves and the
second serves. Nothing is lost, nothing is mixed.

The hold on its own: a held consumer never subscribes, and one that is held while it consumes leaves its group.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace

import pytest

from fairstream.models.plan import DistributionalRepair
from fairstream.models.scorer import LogisticScorer
from fairstream.repair import datasets
from fairstream.streams.cli import main
from fairstream.streams.config import AgentConfig, adult_config
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.ops.supervise import WorkerProcess
from fairstream.streams.topics import ensure_topics
from fairstream.streams.worker.consumer import BatchConsumer, InputSpec
from fairstream.streams.worker.metrics import PipelineMetrics
from fairstream.streams.worker.processing import BatchOutcome
from tests.polling import wait_for

from .outputs import collect_outputs, send
from .test_liveness import check_one_place, died, get, metric_samples, probe_port, wait_ready

pytestmark = pytest.mark.integration

RECORDS = 500  # per phase, as in the issue
B_RANGES = {"age": (30.0, 120.0), "hours-per-week": (0.0, 168.0)}  # worker B dead-letters everyone under 30


def held_by_config(worker: WorkerProcess, version: int) -> dict:
    """Once ``worker`` says its config differs from ``version``: its /readyz answer."""
    line = f"this worker's config differs from the pipeline's active config version {version} in "
    assert worker.wait_for_log(line, timeout=90), worker.log_tail()
    status, body = get(probe_port(worker), "/readyz")
    assert status == 503, body
    return body


def config_gauges(worker: WorkerProcess) -> dict:
    return {(s.name, s.labels.get("key")): s.value for s in metric_samples(worker) if s.name.startswith("fairstream_config")}


def test_a_worker_with_another_config_takes_no_partitions_until_its_config_is_published(broker, tmp_path, capsys):
    research, archive = datasets.load("adult").split(3_000, seed=0)
    config_a = adult_config(artifact_dir=str(tmp_path / "artifacts"), records=AgentConfig(artifact=("plan", "scorer"))
                            ).with_topics(prefix="cfghold", partitions=4).with_monitor(metrics_port=0)
    config_b = replace(config_a, records=AgentConfig(artifact="plan"), valid_ranges=B_RANGES)
    ensure_topics(broker.bootstrap, config_a.topics)
    control = ControlClient(broker.bootstrap, config_a.topics, ArtifactStore(config_a.artifact_dir))
    for module in (DistributionalRepair(n_q=50).fit(research.X, research.s, research.u),
                   LogisticScorer().fit(research.X, research.y)):
        control.publish_sync(module.to_artifact())
    files = {}
    for name, config in (("a", config_a), ("b", config_b)):
        files[name] = tmp_path / f"pipeline-{name}.toml"
        files[name].write_text(config.to_toml())
    cli = ["--broker", f"kafka://{broker.bootstrap}", "--run-dir", str(tmp_path)]
    assert main(["config", "publish", "--config", str(files["a"]), *cli, "--by", "ops", "--reason", "v1"]) == 0
    assert "as the pipeline's config version 1" in capsys.readouterr().out

    data = archive.subset(slice(0, 2 * RECORDS))
    messages = record_messages(data, config_a, "cfg")
    young = {key.decode() for key, age in zip((k for k, _ in messages), data.X[:, 0]) if age < 30}
    assert 100 < len(young) < 2 * RECORDS - 100  # both ranges matter
    worker_a = WorkerProcess(config_a, broker.bootstrap, tmp_path, name="a").start()
    worker_b = WorkerProcess(config_b, broker.bootstrap, tmp_path, name="b")
    try:
        wait_ready(worker_a)
        worker_b.start()
        body = held_by_config(worker_b, 1)
        assert ("config: differs from the pipeline's active config version 1 in records.artifact, valid_ranges.age "
                "(it takes no partitions)") in body["reasons"], body
        assert config_gauges(worker_b) == {("fairstream_config_version", None): 1.0, ("fairstream_config_held", None): 1.0,
                                           ("fairstream_config_differs", "records.artifact"): 1.0,
                                           ("fairstream_config_differs", "valid_ranges.age"): 1.0}
        assert config_gauges(worker_a) == {("fairstream_config_version", None): 1.0, ("fairstream_config_held", None): 0.0}
        assert main(["config", "show", "--config", str(files["b"]), *cli]) == 1
        shown = capsys.readouterr().out
        assert "active config: version 1" in shown and "by ops (v1)" in shown
        assert '  records.artifact: this file ["plan"], active ["plan", "scorer"]' in shown

        # Worker B holds: every record comes out of worker A, scored (none under B's chain or range).
        first = {key.decode() for key, _ in messages[:RECORDS]}
        send(broker.bootstrap, config_a, messages[:RECORDS])
        repaired, dead = collect_outputs(broker.bootstrap, config_a, first, 120.0, alive=died(worker_a, worker_b))
        check_one_place(first, repaired, dead)
        assert not dead, sorted(dead)[:5]
        assert all(copies[0].get("score") is not None for copies in repaired.values())
        assert "partitions assigned" not in worker_b.log_path.read_text()
        assert get(probe_port(worker_b), "/readyz")[0] == 503

        # B's config published as version 2: A finishes its batch and leaves, B joins and serves.
        assert main(["config", "publish", "--config", str(files["b"]), *cli, "--by", "ops", "--reason", "v2"]) == 0
        assert "as the pipeline's config version 2" in capsys.readouterr().out
        body = held_by_config(worker_a, 2)
        assert any("records.artifact, valid_ranges.age" in reason for reason in body["reasons"]), body
        wait_ready(worker_b)
        assert config_gauges(worker_b) == {("fairstream_config_version", None): 2.0, ("fairstream_config_held", None): 0.0}
        assert main(["config", "show", "--config", str(files["b"]), *cli]) == 0
        assert "the same settings" in capsys.readouterr().out
        second = {key.decode() for key, _ in messages[RECORDS:]}
        send(broker.bootstrap, config_a, messages[RECORDS:])
        repaired2, dead2 = collect_outputs(broker.bootstrap, config_a, second, 120.0, alive=died(worker_a, worker_b))
        check_one_place(second, repaired2, dead2)
        assert set(dead2) == second & young  # B's range
        assert all(copies[0].get("score") is None for copies in repaired2.values())  # B's chain
    finally:
        worker_b.stop()
        worker_a.stop()
    # In = out + dead letters over the whole run, each record once.
    assert len(repaired) + len(dead) + len(repaired2) + len(dead2) == 2 * RECORDS
    assert "left group" in worker_a.log_path.read_text()


# --------------------------------------------------------------------------- the hold, in one consumer


def test_a_held_consumer_never_subscribes_and_leaves_when_held_while_consuming(broker):
    config = adult_config().with_topics(prefix="cfgunit", partitions=2)
    ensure_topics(broker.bootstrap, config.topics)
    admitted = threading.Event()
    spec = InputSpec(agent="records", topic=config.topics.records_in, output_topic=config.topics.records_repaired,
                     batching=config.records, process=lambda messages, active: BatchOutcome([], []),
                     active=lambda: "identity", delivered=lambda outcome, active: None, admitted=admitted.is_set)
    consumer = BatchConsumer(spec, broker.bootstrap, "cfgunit.records", config.topics.dlq,
                             PipelineMetrics("cfgunit"))
    loop = asyncio.new_event_loop()
    try:
        started = time.monotonic()
        loop.run_until_complete(asyncio.wait_for(consumer.on_start(), 30))
        assert time.monotonic() - started < 10  # a held start is over at once
        time.sleep(1.0)
        assert consumer._consumer is None and consumer.assignment() == set()  # no client, no subscription
        admitted.set()
        wait_for(lambda: len(consumer.assignment()) == 2, 60, "the assignment once admitted")
        admitted.clear()
        wait_for(lambda: consumer._consumer is None, 30, "leaving the group once held")
        assert consumer.assignment() == set()
    finally:
        loop.run_until_complete(asyncio.wait_for(consumer.on_stop(), 60))
        loop.close()
