"""Broker failures on a three-node Apache Kafka cluster, under a steady stream, a worker running (issue 29, item 4).

One KRaft cluster of three combined controller+broker nodes for the module (replication factor 3,
``min.insync.replicas=2``, the worker's producer with ``acks=all`` and idempotence); each test has
its own pipeline (topic prefix, consumer group) and its own ``fairstream worker`` process, and feeds
it a steady stream (:class:`~tests.streams.worker.cluster_stream.Stream`: ``acks=all``, idempotent,
:data:`RATE` records a second) while one failure happens:

1. kill -9 of the node that leads the input and the output partitions, then its restart;
2. a rolling restart of the three nodes (each back, and every partition fully in sync, before the next);
3. kill -9 of the active KRaft controller, then its restart;
4. the node leading the input and the output paused (SIGSTOP) for :data:`PAUSE_SECONDS`, longer than
   the worker's session timeout (10 s), the brokers' (9 s), the worker's delivery timeout (30 s) and
   the control follower's request timeout (aiokafka, 40 s), then resumed.

While a node is down or frozen the other two serve (``min.insync.replicas=2``), so the worker must
deliver again within :data:`DELIVERY_RESUMES_SECONDS` of the failure, before the node is back.
Once the cluster is whole again each test proves, with a bound for each wait: every id the stream
sent (all acknowledged by the cluster) came out, duplicates are byte-identical to the first copy,
the worker answers 200 on ``/readyz`` within :data:`READY_SECONDS` of the recovery (and was never
unready longer than that), the consumer lag is back to 0 (committed offsets equal the end offsets,
and the ``/metrics`` gauge says 0), and the worker's log kept repeated client warnings to a few
lines per cause and interval. Each test prints its figures (records sent, delivered, duplicates,
seconds until delivery resumed, longest unready stretch, time to ready, time to catch up, warning
lines shown and held back); ``-s`` shows them, and the module prints a table of all four at its end.
"""

from __future__ import annotations

import time

import pytest

from fairstream.repair import datasets
from fairstream.models.plan import DistributionalRepair
from fairstream.streams.ops.kafka_cluster import KafkaCluster
from tests.polling import wait_for

from .cluster_stream import FailureRun, wait_in_sync

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]  # each test's own bound

PARTITIONS = 2
RATE = 150.0  # records a second: a steady stream the worker keeps up with on a busy 2-core machine
LEAD_SECONDS = 3.0  # of stream before the failure
TAIL_SECONDS = 3.0  # of stream after the cluster is whole again
PAUSE_SECONDS = 45.0  # > sessions (worker 10 s, brokers 9 s), delivery timeout (30 s), aiokafka's requests (40 s)
READY_SECONDS = 30.0  # /readyz answers 200 within this of the cluster's recovery (and is never unready longer)
DELIVERY_RESUMES_SECONDS = 40.0  # one node of three failed: the worker delivers again within this of the failure
# (the cluster fences a silent node in 9 s; the worker gives up what a dead or frozen node holds within its delivery
# timeout, 30 s, and rejoins its group if the node was the coordinator)
CATCH_UP_SECONDS = 90.0  # after the stream ends: every id out, committed offsets at the end, lag gauge 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with KafkaCluster(tmp_path_factory.mktemp("kafka-3"), nodes=3) as running:
        yield running


@pytest.fixture(scope="module")
def adult():
    research, archive = datasets.load("adult").split(3_000, seed=0)
    return archive, DistributionalRepair(n_q=50).fit(research.X, research.s, research.u)


FIGURES: dict[str, dict] = {}


@pytest.fixture(scope="module", autouse=True)
def figures_table():
    """At the module's end, the figures of every failure in one table (shown with -s)."""
    started = time.monotonic()
    yield
    columns = ("sent", "delivered", "duplicates", "resumed_s", "longest_unready_s", "ready_s", "caught_up_s",
               "log_warnings", "log_held", "test_s")
    print("\n" + " ".join([f"{'failure':<20}", *(f"{c:>{len(c)}}" for c in columns)]))
    for name, figures in FIGURES.items():
        print(" ".join([f"{name:<20}", *(f"{figures[c]!s:>{len(c)}}" for c in columns)]))
    print(f"module wall time (with the cluster's start and stop) {time.monotonic() - started:.0f} s")


def not_the_controller(cluster: KafkaCluster):
    """A node that is not the active controller (that failure has a test of its own)."""
    controller = cluster.active_controller()
    return next(node for node in cluster.nodes if node is not controller)


def test_the_leader_of_the_input_and_output_killed_and_restarted_loses_nothing(cluster, adult, tmp_path):
    victim = not_the_controller(cluster)
    with FailureRun(cluster, tmp_path, "killed", adult, partitions=PARTITIONS, leader=victim.node_id) as run:
        assert run.leaders() == {victim.node_id}, run.leaders()  # every input and output partition
        run.start_stream(RATE, LEAD_SECONDS)
        victim.kill()
        run.failed()
        run.wait_delivery_resumes(DELIVERY_RESUMES_SECONDS)  # on two nodes of three
        assert victim.node_id not in run.leaders()
        victim.start().wait_ready()
        cluster.wait_for_brokers()
        run.recovered()
        FIGURES["leader kill -9"] = run.finish(TAIL_SECONDS, READY_SECONDS, CATCH_UP_SECONDS)


def test_a_rolling_restart_of_the_three_nodes_loses_nothing(cluster, adult, tmp_path):
    with FailureRun(cluster, tmp_path, "rolling", adult, partitions=PARTITIONS) as run:
        run.start_stream(RATE, LEAD_SECONDS)
        run.failed()
        for node in cluster.nodes:
            node.restart()  # controlled shutdown: its leaderships move first; back on the same ports and storage
            cluster.wait_for_brokers()
            wait_in_sync(cluster, timeout=60)  # as an operator does: no partition under-replicated before the next
        run.recovered()
        FIGURES["rolling restart"] = run.finish(TAIL_SECONDS, READY_SECONDS, CATCH_UP_SECONDS)


def test_the_active_controller_killed_and_restarted_loses_nothing(cluster, adult, tmp_path):
    with FailureRun(cluster, tmp_path, "controller", adult, partitions=PARTITIONS) as run:
        run.start_stream(RATE, LEAD_SECONDS)
        controller = cluster.active_controller()
        controller.kill()
        run.failed()
        run.wait_delivery_resumes(DELIVERY_RESUMES_SECONDS)
        wait_for(lambda: cluster.active_controller() is not controller, 30, "another active controller elected")
        controller.start().wait_ready()
        cluster.wait_for_brokers()
        run.recovered()
        FIGURES["controller kill -9"] = run.finish(TAIL_SECONDS, READY_SECONDS, CATCH_UP_SECONDS)


def test_the_leader_paused_longer_than_the_session_and_request_timeouts_loses_nothing(cluster, adult, tmp_path):
    victim = not_the_controller(cluster)
    with FailureRun(cluster, tmp_path, "paused", adult, partitions=PARTITIONS, leader=victim.node_id) as run:
        assert run.leaders() == {victim.node_id}, run.leaders()
        run.start_stream(RATE, LEAD_SECONDS)
        victim.pause()
        run.failed()
        try:
            run.wait_delivery_resumes(DELIVERY_RESUMES_SECONDS)  # the others fence it and take its leaderships
            run.hold(PAUSE_SECONDS)
        finally:
            victim.resume()
        cluster.wait_for_brokers()
        run.recovered()
        FIGURES["leader SIGSTOP"] = run.finish(TAIL_SECONDS, READY_SECONDS, CATCH_UP_SECONDS)
