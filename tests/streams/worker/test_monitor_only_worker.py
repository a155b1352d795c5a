"""A monitor-only worker's hooks without a broker: it consumes without waiting for an artifact, has nothing that
blocks its readiness, exports the gauges of the records' own decisions and counts them for the pipeline's agent,
which asks no re-fit when they drift (tests/streams/agent/test_agent.py)."""

from dataclasses import replace

import numpy as np
import pytest
from prometheus_client import REGISTRY

from fairstream.repair.measure.metrics import dp_difference
from fairstream.streams.codec.repaired import NO_MODULE, RepairedBatch
from fairstream.streams.config import AgentConfig, adult_config
from fairstream.streams.worker.app import WorkerHooks
from fairstream.streams.worker.consumer import NOT_LOADED
from fairstream.streams.worker.processing import BatchOutcome

CONFIG = replace(adult_config(records=AgentConfig(artifact=())), name="monitor-only-hooks").with_monitor(
    min_records=100, window_records=5000, buckets=1, metrics_port="off")


@pytest.fixture
def hooks():
    return WorkerHooks(CONFIG, "127.0.0.1:1", "monitor-only-test")


def test_an_empty_chain_is_served_before_the_control_topic_is_replayed_and_nothing_blocks_readiness(hooks):
    assert not hooks.ready.is_set()
    served = hooks.active_chain()  # a consumer's lookup before replay: a chain would hold its input (NOT_LOADED)
    assert served is not NOT_LOADED and served.active == () and served.candidate is None
    hooks.ready.set()
    assert hooks.blockers() == ["config: not checked yet"]  # replayed, its config not yet compared: not ready
    hooks.check_config()  # what follows the replay (an unsigned pipeline with no config published: admitted)
    assert hooks.blockers() == []


def test_the_records_own_decisions_are_exported_and_counted_for_the_pipeline(hooks):
    from fairstream.streams.codec.partials import decode_partial

    rng = np.random.default_rng(5)
    n = 600
    s, u, y = rng.integers(0, 2, n), rng.integers(0, 2, n), rng.integers(0, 2, n)
    decision = (rng.uniform(size=n) < 0.3 + 0.3 * s).astype(np.int64)
    X = rng.uniform(20, 60, (n, 2))
    batch = RepairedBatch(X, X, s, u, y, np.arange(n).astype(str), np.full(n, 1.7e9),
                          out_of_range=np.zeros(n, dtype=bool), decision=decision)
    hooks.records_delivered(BatchOutcome(version=NO_MODULE, monitor_batch=batch), ())
    labels = {"pipeline": CONFIG.name, "role": "active", "statistic": "dp_difference", "stage": "after",
              "stratum": "all", "feature": "all", "group_pair": "all", "window": "count", "scope": "worker"}
    assert REGISTRY.get_sample_value("fairstream_fairness_rate_gap", labels) == pytest.approx(
        dp_difference(decision, s), abs=1e-12)
    assert not hasattr(hooks, "pending_refits")  # no worker asks a re-fit: the pipeline's agent does, once
    (message,) = hooks.partials.take()  # what the worker sends the agent: the records' own decisions, counted
    partial = decode_partial(message, CONFIG.groups, CONFIG.strata)
    assert partial.chain == () and partial.records == n
    (records, accumulators), = partial.slices.values()
    assert accumulators["dp", "after"].value().difference == pytest.approx(dp_difference(decision, s), abs=1e-12)


def test_a_monitor_only_worker_announces_that_it_applies_no_module_rather_than_nothing_yet():
    from fairstream.streams.control.records import WorkerStatus
    from fairstream.streams.control.registry import WorkerIdentity, _describe

    identity = WorkerIdentity.of("monitor-only-test", CONFIG)
    assert identity.kinds == ()
    status = WorkerStatus(identity.name, identity.app_id, identity.host, identity.pid, at=0.0, every=10.0,
                          kinds=identity.kinds, serving=())
    assert _describe(status) == "serves no module (monitors the records as they come)"
    waiting = WorkerStatus(identity.name, identity.app_id, identity.host, identity.pid, at=0.0, every=10.0,
                           kinds=("plan",), serving=())
    assert _describe(waiting) == "serves nothing yet"  # a chain whose artifact is not published: input held


def test_a_worker_without_its_own_statistics_only_counts_for_the_agent():
    from fairstream.streams.codec.partials import decode_partial

    config = replace(CONFIG, name="counts-only").with_monitor(worker_statistics=False)
    hooks = WorkerHooks(config, "127.0.0.1:1", "counts-only-test")
    rng = np.random.default_rng(6)
    n = 600
    s, u = rng.integers(0, 2, n), rng.integers(0, 2, n)
    X = rng.uniform(20, 60, (n, 2))
    batch = RepairedBatch(X, X, s, u, None, np.arange(n).astype(str), np.full(n, 1.7e9),
                          out_of_range=np.zeros(n, dtype=bool), decision=(rng.uniform(size=n) < 0.4).astype(np.int64))
    hooks.records_delivered(BatchOutcome(version=NO_MODULE, monitor_batch=batch), ())
    hooks.export_unexported()
    assert REGISTRY.get_sample_value("fairstream_fairness_rate_gap", {
        "pipeline": "counts-only", "role": "active", "statistic": "dp_difference", "stage": "after", "stratum": "all",
        "feature": "all", "group_pair": "all", "window": "count", "scope": "worker"}) is None
    (message,) = hooks.partials.take()
    assert decode_partial(message, config.groups, config.strata).records == n  # the agent still gets every record
