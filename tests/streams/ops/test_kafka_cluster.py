"""Apache Kafka run by the project: the release fetched through Maven once, KRaft nodes started, announced, stopped."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from fairstream.streams.ops import kafka_cluster
from fairstream.streams.ops.broker import is_alive, kafka_metadata, running_broker, state_path
from fairstream.streams.ops.kafka_cluster import KAFKA_VERSION, KafkaCluster, KafkaError, fetch_kafka
from tests.polling import wait_for
from tests.streams.test_cli import background, fairstream, own_runtime_dir  # noqa: F401 (a fixture)


def test_the_release_is_fetched_once_into_the_cache_outside_the_checkout(monkeypatch):
    libs = fetch_kafka()  # the session's cluster fetched it already, or this does
    assert (libs / f"kafka_2.13-{KAFKA_VERSION}.jar").is_file() and not str(libs).startswith(os.getcwd())
    monkeypatch.setattr(kafka_cluster, "_maven_copy_dependencies",
                        lambda *args: pytest.fail("fetched again although the jars are in the cache"))
    assert fetch_kafka() == libs


def test_maven_fetches_with_checksums_enforced_and_a_failure_is_one_line_naming_the_release(monkeypatch, tmp_path):
    seen = []

    def maven(command, **kwargs):
        seen.append(command)
        return subprocess.CompletedProcess(command, 1, "[ERROR] Failed to collect dependencies at x\n", "")

    monkeypatch.setattr(kafka_cluster.subprocess, "run", maven)
    with pytest.raises(KafkaError, match=r"^fetching Apache Kafka 9\.9\.9 through Maven failed: \[ERROR\] Failed"):
        fetch_kafka("9.9.9", cache=tmp_path)
    assert "-C" in seen[0] and "dependency:copy-dependencies" in seen[0]  # -C: a wrong checksum fails the fetch
    assert not (tmp_path / "kafka-9.9.9" / "libs").exists()  # nothing half-fetched is left to be taken for a release


def test_a_cluster_has_one_or_three_nodes(tmp_path):
    with pytest.raises(KafkaError, match="1 or 3 nodes, not 2"):
        KafkaCluster(tmp_path, nodes=2)


def test_the_session_cluster_is_apache_kafka_in_kraft_mode_and_serves_clients(kafka_cluster):
    node = kafka_cluster.nodes[0]
    assert kafka_metadata(node.host, node.port) == [(node.host, node.port)]
    assert "process.roles=broker,controller" in node.properties.read_text()
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    assert admin.list_topics(timeout=10).cluster_id != "tansu_cluster"
    admin.create_topics([NewTopic("cluster-smoke", 1, 1)])["cluster-smoke"].result(timeout=30)
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap, "acks": "all", "enable.idempotence": True})
    producer.produce("cluster-smoke", b"v", b"k")
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": "smoke",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe(["cluster-smoke"])
    message = wait_for(lambda: consumer.poll(1.0), 60, "the record back")
    consumer.close()
    assert (message.key(), message.value()) == (b"k", b"v")


def test_a_topic_nobody_created_is_not_created_by_asking_for_it(kafka_cluster):
    # Production clusters disable auto-creation; the product creates its topics explicitly (topics.py).
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap, "message.timeout.ms": 2000})
    producer.produce("never-created", b"v")
    producer.flush(10)
    assert "never-created" not in AdminClient({"bootstrap.servers": kafka_cluster.bootstrap}).list_topics(
        timeout=10).topics


@pytest.mark.integration
def test_a_second_start_in_the_same_run_directory_keeps_the_cluster_and_its_topics(tmp_path):
    with KafkaCluster(tmp_path) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.create_topics([NewTopic("kept", 2, 1)])["kept"].result(timeout=30)
    with KafkaCluster(tmp_path) as again:  # new ports, the same storage and cluster id
        assert "kept" in AdminClient({"bootstrap.servers": again.bootstrap}).list_topics(timeout=10).topics
    with pytest.raises(KafkaError, match="holds the storage of a 1-node Kafka cluster, not of 3: remove it"):
        KafkaCluster(tmp_path, nodes=3).start()


@pytest.mark.integration
def test_kafka_start_announces_a_three_node_cluster_that_every_command_finds_and_stop_ends(own_runtime_dir, tmp_path):
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    with background("kafka", "start", "--brokers", "3", cwd=here) as started:
        state = wait_for(running_broker, 120, "state file of 'fairstream kafka start'")
        assert state.kind == "kafka" and len(state.peers) == 2 and state.url.count("kafka://") == 3
        assert state.log == str(here / "runs" / "kafka" / "node-1" / "server.log")
        hosts = [part.removeprefix("kafka://").split(":") for part in state.url.split(";")]
        assert len(kafka_metadata(hosts[0][0], int(hosts[0][1]))) == 3  # one cluster of three brokers
        assert fairstream("broker", "status", cwd=elsewhere).stdout == f"{state.url}\n"
        second = fairstream("broker", "start", cwd=elsewhere, check=False)
        assert second.returncode == 1 and "the local Apache Kafka already runs at" in second.stderr
        stop = fairstream("kafka", "stop", cwd=elsewhere)
        assert stop.stdout.startswith(f"stopped the local Apache Kafka at {state.url} (pid {state.pid}, ")
        assert started.wait(timeout=60) == 0
    assert not state_path().exists() and not any(is_alive(pid) for pid in (state.pid, *state.peers))


@pytest.mark.integration
def test_ctrl_c_stops_every_node_and_removes_the_announcement(own_runtime_dir, tmp_path):
    with background("kafka", "start", cwd=tmp_path / "here") as started:
        state = wait_for(running_broker, 120, "state file of 'fairstream kafka start'")
        started.send_signal(signal.SIGINT)
        assert started.wait(timeout=60) == 0
    assert not state_path().exists() and not is_alive(state.pid)
