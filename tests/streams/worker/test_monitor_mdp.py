"""The monitor's MDP against repair.measure's batch function on the same records: every record (``sample_share`` 1),
and the records the keys put in the sample, with ties broken by the keys (the rule, replayed in one call)."""

import numpy as np
import pytest

from fairstream.models.scorer import LogisticScorer
from fairstream.repair.group_maps import GroupTransportMap
from fairstream.repair.measure.mdp import matched_dp
from fairstream.streams.codec.repaired import RepairedBatch
from fairstream.streams.config import AgentConfig, adult_config
from fairstream.streams.control.registry import Active
from fairstream.streams.worker.monitor import FairnessMonitor, key_draws, sampled_rows


def fitted_scorer(rng, grid: bool):
    """A scorer with a group map fitted on unequal groups (so records split their mass over counterparts); on a grid
    of half-integers (records of the integer grid then tie between its points) or on continuous features."""
    X, s = rng.normal(size=(650, 2)), np.repeat([0, 1], [400, 250])
    X[s == 1] += [0.8, -0.3]
    if grid:
        X = np.round(X * 1.5) + 0.5
    y = (X.sum(axis=1) + rng.normal(size=650) > 0).astype(int)
    return LogisticScorer().fit(X, y).attach_group_map(GroupTransportMap(seed=0).fit(X, s))


def monitored_mdp(scorer, records, groups, share: float, size: int) -> float:
    """The monitor's MDP of every record, fed in batches of ``size``."""
    config = adult_config(records=AgentConfig(artifact="scorer")).with_monitor(
        window_records=5000, buckets=5, min_records=100, statistic="mdp", sample_share=share)
    monitor = FairnessMonitor(config)
    keys = np.array([f"r{i}" for i in range(len(records))], dtype=object)
    for a in range(0, len(records), size):
        n = min(size, len(records) - a)
        rows = slice(a, a + n)
        monitor.observe_batch(RepairedBatch(records[rows], records[rows], groups[rows], np.zeros(n, dtype=np.int64),
                                            None, keys[rows], np.full(n, 1000.0)),
                              Active("scorer", 1, "m" * 64, None, scorer))
    assert monitor.windows["count"].n_records == len(records)
    return {r[:5]: r[5] for r in monitor.rows("count")}[("mdp", "after", "all", "all", "all")]


def batch_mdp(scorer, records, groups, draws=None) -> float:
    """repair.measure's batch MDP of ``records`` with the same map, in one call."""
    pairs = scorer.matched_counterparts(records, groups, draws=draws)
    return matched_dp(scorer.predict_proba(records)[pairs.rows], scorer.predict_proba(pairs.X), groups[pairs.rows],
                      pairs.s, weights=pairs.weights).overall


def test_the_monitors_mdp_of_every_record_is_the_batch_mdp_of_the_windows_records():
    rng = np.random.default_rng(5)
    # The map is applied to other records than its own (a record's partners come from the nearest fitted point,
    # and the weights matter).
    scorer = fitted_scorer(rng, grid=False)
    records, groups = rng.normal(size=(1200, 2)) * 1.3, rng.integers(0, 2, 1200)
    value = monitored_mdp(scorer, records, groups, share=1.0, size=100)  # every record, standing for itself
    truth = batch_mdp(scorer, records, groups)
    assert truth > 0.01 and value == pytest.approx(truth, rel=1e-9)  # the same sums, added in another order


def test_the_monitors_mdp_is_the_batch_mdp_of_the_sampled_records_with_their_keys_tie_breaks():
    rng = np.random.default_rng(6)
    scorer = fitted_scorer(rng, grid=True)
    records, groups = np.round(rng.normal(size=(4000, 2)) * 1.3), rng.integers(0, 2, 4000)
    draws = key_draws(np.array([f"r{i}" for i in range(len(records))], dtype=object))
    sampled, weight = sampled_rows(draws, 0.125)
    # The sampled records in one call, their ties broken by their own draws: what the monitor measures in any batches
    # (each sampled record standing for 1 / share: the MDP, a ratio, is the sampled records' own).
    truth = batch_mdp(scorer, records[sampled], groups[sampled], draws[sampled, 2])
    for size in (137, 1000, 4000):
        assert monitored_mdp(scorer, records, groups, share=0.125, size=size) == pytest.approx(truth, rel=1e-9)
    assert weight == 8.0 and truth > 0.01
    # The records tie (the grid): broken round-robin over the call's tied rows they would give another MDP.
    assert abs(batch_mdp(scorer, records[sampled], groups[sampled]) - truth) > 1e-6
