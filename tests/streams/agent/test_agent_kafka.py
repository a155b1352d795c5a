"""The monitoring agent on Apache Kafka: real workers, a rebalance, partitions correlated with the group.

Three ``fairstream worker`` processes (two, then a third joins half way: a rebalance) repair records whose
partition is chosen by their group and stratum (the case where each worker's own statistics are furthest from the
pipeline's); a ``fairstream monitor`` process merges their partial aggregates. What it exports equals an offline
computation over the output topic, slice by slice.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from kafka import KafkaProducer

from fairstream.models.plan import DistributionalRepair
from fairstream.models.scorer import LogisticScorer
from fairstream.repair import datasets
from fairstream.streams.codec.repaired import decode_repaired
from fairstream.streams.config import AgentConfig, MonitorConfig, adult_config
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.registry import Active
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.demo.collect import TopicReader
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.kafka import KAFKA_API_VERSION
from fairstream.streams.ops.processes import free_port
from fairstream.streams.ops.supervise import AgentProcess, WorkerProcess
from fairstream.streams.topics import ensure_topics
from fairstream.streams.worker.metrics import exported_value
from fairstream.streams.worker.monitor import FairnessMonitor, slice_of

pytestmark = pytest.mark.integration

PARTITIONS = 6
RECORDS = 6000


def agent_rows(port: int) -> dict:
    """The pipeline's fairness gauges the agent exports: {(statistic, stage, stratum, feature, pair): value}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    rows = {}
    for line in text.splitlines():
        if line.startswith("fairstream_") and 'scope="pipeline"' in line and 'role="active"' in line \
                and 'window="count"' in line and "statistic=" in line:
            labels = dict(part.split("=", 1) for part in line[line.index("{") + 1:line.rindex("}")].split('",'))
            labels = {k.strip(): v.strip('"') for k, v in labels.items()}
            key = (labels["statistic"], labels["stage"], labels["stratum"], labels["feature"], labels["group_pair"])
            rows[key] = float(line.rsplit(" ", 1)[1])
    return rows


def offline_rows(config, values: list[bytes], plan, scorer) -> dict:
    """The output topic's records measured slice by slice, in order, as the agent's windows hold them."""
    batch = decode_repaired(values, config)
    monitor = FairnessMonitor(config, detect=False)
    slices = slice_of(batch.ts, config.monitor.slice_seconds)
    for index in np.unique(slices):
        monitor.observe_batch(batch.take(np.flatnonzero(slices == index)), plan, scorer)
    return {row[:5]: exported_value(row[0], row[5]) for row in monitor.rows("count")}


def test_workers_and_a_rebalance_give_the_agent_the_output_topics_statistics(broker, tmp_path: Path):
    research, archive = datasets.load("adult").split(10_000, seed=0)
    monitor = MonitorConfig(window_records=3000, buckets=4, min_records=500, statistic=("dependence_e", "dp_difference"),
                            threshold=0.1, lateness_seconds=1.0, stats_seconds=0.5, metrics_port="off")
    config = adult_config(artifact_dir=str(tmp_path / "artifacts"), records=AgentConfig(artifact=("plan", "scorer")),
                          monitor=monitor).with_topics(prefix="agentk", partitions=PARTITIONS)
    ensure_topics(broker.bootstrap, config.topics)
    plan = DistributionalRepair(n_q=100).fit(research.X, research.s, research.u)
    scorer = LogisticScorer().fit(research.X, research.y)
    control = ControlClient(broker.bootstrap, config.topics, ArtifactStore(config.artifact_dir))
    for module in (plan, scorer):
        control.publish_sync(module.to_artifact())
    port = free_port()
    workers = [WorkerProcess(config, broker.bootstrap, tmp_path, name=f"w{i}") for i in range(3)]
    with AgentProcess(config, broker.bootstrap, tmp_path, metrics_port=port) as agent:
        for worker in workers[:2]:
            worker.start()
        for worker in workers[:2]:
            assert worker.wait_for_log("caught up with", timeout=90), worker.log_tail()
        data = archive.subset(slice(0, RECORDS))
        # Event times spread over 30 s (within the workers' event-time skew), so the count window holds the last
        # slices only; partitions chosen by group and stratum.
        messages = record_messages(data, config, "k", start_ts=time.time() - 30.0, spacing=30.0 / RECORDS)
        partition = (data.s.astype(int) * 2 + data.u.astype(int)) % PARTITIONS
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, api_version=KAFKA_API_VERSION, acks="all")
        try:
            for i, (key, value) in enumerate(messages):
                producer.send(config.topics.records_in, value, key, partition=int(partition[i]))
                if i == RECORDS // 2:
                    producer.flush()
                    workers[2].start()  # joins: the group rebalances with records in flight
            producer.flush()
        finally:
            producer.close()
        values = read_outputs(broker.bootstrap, config.topics.records_repaired, RECORDS)
        expected = offline_rows(config, values, Active("plan", 1, "", None, plan), Active("scorer", 1, "", None, scorer))
        assert ("dp_difference", "after", "all", "all", "all") in expected
        deadline, found = time.monotonic() + 60.0, {}
        while time.monotonic() < deadline:
            found = agent_rows(port)
            if found.keys() == expected.keys() and all(found[k] == pytest.approx(v, abs=1e-12)
                                                       for k, v in expected.items()):
                break
            assert agent.running, agent.log_tail()
            time.sleep(0.5)
        for worker in workers:
            worker.stop()
    assert found.keys() == expected.keys(), (sorted(expected.keys() - found.keys())[:5], agent.log_tail())
    for key, value in expected.items():
        assert found[key] == pytest.approx(value, abs=1e-12), key
    assert "rebalance" in workers[0].log_path.read_text() or "assigned" in workers[2].log_path.read_text()


def read_outputs(bootstrap: str, topic: str, count: int, timeout: float = 180.0) -> list[bytes]:
    """Every repaired record's value (the first copy of each id), once ``count`` ids came out."""
    values: dict[str, bytes] = {}
    with TopicReader(bootstrap, topic) as reader:
        deadline = time.monotonic() + timeout
        while len(values) < count and time.monotonic() < deadline:
            for message in reader.poll():
                values.setdefault(json.loads(message.value)["id"], message.value)
    assert len(values) == count, f"{len(values)} of {count} records came out"
    return list(values.values())


def gauge(port: int, name: str) -> float | None:
    """One unlabelled (but for ``pipeline``) gauge of a process's /metrics, or None."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return None
    found = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")]
    return found[0] if found else None


def test_a_standby_agent_takes_over_and_rebuilds_the_pipelines_windows(broker, tmp_path: Path):
    research, archive = datasets.load("adult").split(10_000, seed=0)
    config = adult_config(artifact_dir=str(tmp_path / "artifacts"), monitor=MonitorConfig(
        window_records=8000, buckets=4, min_records=200, lateness_seconds=1.0, stats_seconds=0.5,
        metrics_port="off")).with_topics(prefix="standby", partitions=2)
    ensure_topics(broker.bootstrap, config.topics)
    ControlClient(broker.bootstrap, config.topics, ArtifactStore(config.artifact_dir)).publish_sync(
        DistributionalRepair(n_q=100).fit(research.X, research.s, research.u).to_artifact())
    ports = [free_port(), free_port()]
    agents = [AgentProcess(config, broker.bootstrap, tmp_path, name=f"monitor-{i}", metrics_port=port)
              for i, port in enumerate(ports)]
    with WorkerProcess(config, broker.bootstrap, tmp_path, name="w") as worker, agents[0], agents[1]:
        assert worker.wait_for_log("caught up with", timeout=90), worker.log_tail()
        messages = record_messages(archive.subset(slice(0, 3000)), config, "s", start_ts=time.time() - 10.0,
                                   spacing=10.0 / 3000)
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, api_version=KAFKA_API_VERSION, acks="all")
        for key, value in messages:
            producer.send(config.topics.records_in, value, key)
        producer.flush()
        producer.close()
        states = wait_until(lambda: [gauge(port, "fairstream_agent_active") for port in ports],
                            lambda found: sorted(found) == [0.0, 1.0], agents)
        active, standby = (0, 1) if states[0] == 1.0 else (1, 0)
        wait_until(lambda: window_records(ports[active], config.name), lambda n: n == 3000, agents)
        assert window_records(ports[standby], config.name) in (None, 0.0)  # a standby exports no pipeline figures
        agents[active].stop()
        wait_until(lambda: gauge(ports[standby], "fairstream_agent_active"), lambda state: state == 1.0, agents)
        # It read the stats topic back: the pipeline's window holds every record again, not only later ones.
        wait_until(lambda: window_records(ports[standby], config.name), lambda n: n == 3000, agents)


def window_records(port: int, pipeline: str) -> float | None:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("fairstream_monitor_window_records{") and 'scope="pipeline"' in line \
                and 'window="count"' in line and f'pipeline="{pipeline}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_until(read, done, agents, timeout: float = 60.0):
    deadline, found = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        found = read()
        if done(found):
            return found
        time.sleep(0.5)
    raise AssertionError(f"still {found!r} after {timeout:g} s; " + " | ".join(a.log_tail() for a in agents))
