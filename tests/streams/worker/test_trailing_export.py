"""The monitors' gauges are exported at most once a second after a batch; the batches observed since the last
export reach /metrics within a second even when no batch follows them (the last ones before a lull)."""

import numpy as np

from fairstream.models.scorer import LogisticScorer
from fairstream.repair import datasets
from fairstream.streams.config import AgentConfig, adult_config
from fairstream.streams.control.registry import Active
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.worker.app import WorkerHooks
from fairstream.streams.worker.processing import RecordRepairer, SimpleMessage


def window_records(hooks: WorkerHooks) -> float:
    return hooks.metrics.window_records.labels("count", "worker")._value.get()


def test_a_batch_after_the_throttled_export_reaches_the_gauges_without_another_batch():
    research, archive = datasets.load("adult").split(3000, seed=0)
    config = adult_config(records=AgentConfig(artifact="scorer")).with_monitor(
        statistic="dp_difference", min_records=100, window_records=5000, buckets=1, metrics_port="off")
    chain = (Active("scorer", 1, "s" * 64, None, LogisticScorer().fit(research.X, research.y)),)
    messages = [SimpleMessage(v, k) for k, v in record_messages(archive.subset(slice(0, 800)), config, id_prefix="t")]
    hooks = WorkerHooks(config, "127.0.0.1:1", "trailing-test")
    for part in (slice(0, 400), slice(400, 800)):  # the second within the second: its export is throttled
        hooks.records_delivered(RecordRepairer(config).process(messages[part], chain), chain)
    assert window_records(hooks) == 400 and hooks.unexported == {"fairness"}
    hooks.export_unexported()  # what `export_trailing` does a second later
    assert window_records(hooks) == 800 and not hooks.unexported
    assert np.isfinite(hooks.monitor.statistic("count", "dp_difference"))
