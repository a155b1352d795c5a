"""The monitor's MDP against repair.measure's batch function on the same records (no replay of its sampling)."""

import numpy as np
import pytest

from fairstream.models.scorer import LogisticScorer
from fairstream.repair.group_maps import GroupTransportMap
from fairstream.repair.measure.mdp import matched_dp
from fairstream.streams.codec.repaired import RepairedBatch
from fairstream.streams.config import AgentConfig, adult_config
from fairstream.streams.control.registry import Active
from fairstream.streams.worker.monitor import MDP_ROWS, FairnessMonitor


def test_the_monitors_mdp_is_the_batch_mdp_of_the_windows_records():
    rng = np.random.default_rng(5)
    # The map is fitted on unequal groups (so records split their mass over counterparts) and applied to other
    # records (so a record's own partners come from the nearest fitted point, and the weights matter).
    X, s = rng.normal(size=(650, 2)), np.repeat([0, 1], [400, 250])
    X[s == 1] += [0.8, -0.3]
    y = (X.sum(axis=1) + rng.normal(size=650) > 0).astype(int)
    scorer = LogisticScorer().fit(X, y).attach_group_map(GroupTransportMap(seed=0).fit(X, s))
    config = adult_config(records=AgentConfig(artifact="scorer")).with_monitor(
        window_records=5000, buckets=5, min_records=100, statistic="mdp")
    monitor = FairnessMonitor(config)
    records, groups = rng.normal(size=(1200, 2)) * 1.3, rng.integers(0, 2, 1200)
    size = MDP_ROWS - 28  # batches within MDP_ROWS: every record is measured, standing for itself
    for a in range(0, len(records), size):
        n = min(size, len(records) - a)
        rows = slice(a, a + n)
        monitor.observe_batch(RepairedBatch(records[rows], records[rows], groups[rows], np.zeros(n, dtype=np.int64),
                                            None, np.arange(a, a + n).astype(str), np.full(n, 1000.0)),
                              Active("scorer", 1, "m" * 64, None, scorer))
    assert monitor.windows["count"].n_records == len(records)
    # The batch function on the same records with the same map, in one call.
    pairs = scorer.matched_counterparts(records, groups)
    truth = matched_dp(scorer.predict_proba(records)[pairs.rows], scorer.predict_proba(pairs.X), groups[pairs.rows],
                       pairs.s, weights=pairs.weights).overall
    value = {r[:5]: r[5] for r in monitor.rows("count")}[("mdp", "after", "all", "all", "all")]
    assert truth > 0.01 and value == pytest.approx(truth, rel=1e-9)  # the same sums, added in another order
