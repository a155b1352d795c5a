"""A module placed after the scorer (reads the score, writes the decision) runs through the worker's batch logic
and the monitor with no code that knows its kind: what the records carry, and what the monitor measures, is its
decision."""

import json
import logging
from dataclasses import replace

import numpy as np
import pytest

from fairstream.models.kinds import MODULE_KINDS
from fairstream.models.scorer import LogisticScorer
from fairstream.repair import datasets
from fairstream.streams.codec.repaired import decode_repaired
from fairstream.streams.config import AgentConfig, adult_config
from fairstream.streams.control.registry import Active
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.worker.monitor import FairnessMonitor
from fairstream.streams.worker.processing import RecordRepairer, SimpleMessage

from .post_module import CUTOFFS, GroupCutoffs

CUT = {0: 0.3, 1: 0.7}  # far from 0.5 and from each other: the post module's decisions are not the scorer's


@pytest.fixture
def scored_chain(monkeypatch):
    monkeypatch.setitem(MODULE_KINDS, CUTOFFS, GroupCutoffs)
    research, archive = datasets.load("adult").split(3000, seed=0)
    config = adult_config(records=AgentConfig(artifact=("scorer", CUTOFFS))).with_monitor(
        statistic="dp_difference", min_records=500, window_records=2000, buckets=2)
    chain = (Active("scorer", 1, "s" * 64, None, LogisticScorer().fit(research.X, research.y)),
             Active(CUTOFFS, 1, "c" * 64, None, GroupCutoffs(CUT)))
    messages = [SimpleMessage(v, k) for k, v in record_messages(archive.subset(slice(0, 2000)), config, id_prefix="p")]
    outcomes = [RecordRepairer(config).process(messages[i:i + 1000], chain) for i in (0, 1000)]
    return config, chain, outcomes


def dp_after(monitor):
    return monitor.windows["count"].windows["dp", "after"].value().rates


def test_records_carry_the_post_modules_decision_and_the_monitor_measures_it(scored_chain):
    config, chain, outcomes = scored_chain
    records = decode_repaired([v for outcome in outcomes for _, v in outcome.repaired], config)
    assert len(records) == 2000 and records.score is not None
    expected = GroupCutoffs(CUT).decide(records.score, records.s)
    assert np.array_equal(records.decision, expected)
    assert not np.array_equal(records.decision, (records.score >= 0.5).astype(np.int64))  # not the scorer's
    chain_kinds = [stage["kind"] for stage in json.loads(outcomes[0].repaired[0][1])["provenance"]["chain"]]
    assert chain_kinds == ["scorer", CUTOFFS]
    # The worker hands the monitor the chain's decisions; a reader of the topic reads them from the records.
    handed, reader = FairnessMonitor(config), FairnessMonitor(config)
    for outcome in outcomes:
        assert np.array_equal(outcome.monitor_batch.decision,
                              GroupCutoffs(CUT).decide(outcome.monitor_batch.score, outcome.monitor_batch.s))
        handed.observe_batch(outcome.monitor_batch, *chain)
        reader.observe([v for _, v in outcome.repaired], *chain)
    exact = np.array([expected[records.s == g].mean() for g in (0, 1)])
    assert np.allclose(dp_after(handed), exact, rtol=1e-12) and np.allclose(dp_after(reader), exact, rtol=1e-12)
    assert handed.statistic("count", "dp_difference") == pytest.approx(abs(exact[1] - exact[0]), rel=1e-12)
    assert handed.refused is None and reader.refused is None


def test_records_without_the_post_modules_decision_are_not_given_the_scorers(scored_chain, caplog):
    config, chain, outcomes = scored_chain
    monitor = FairnessMonitor(config)
    with caplog.at_level(logging.ERROR, logger="fairstream.streams.worker.monitor"):
        assert monitor.observe_batch(replace(outcomes[0].monitor_batch, decision=None), *chain) == []
    assert monitor.refused == (("scorer", 1), (CUTOFFS, 1)) and monitor.unmeasured == 1000
    assert any("carry no decision" in r.getMessage() and CUTOFFS in r.getMessage() for r in caplog.records)
