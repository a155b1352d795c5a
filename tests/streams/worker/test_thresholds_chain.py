"""A real worker on Apache Kafka serving the record chain ``scorer -> thresholds``, end to end.

A scorer v1 and then group thresholds v1 (fitted for DP on the scorer's research-split scores) are
published through the control client; a worker process replays Adult records. Every output carries the
scorer's score and the thresholds' decision (bit-exact with ``GroupThresholds.decide`` keyed by the
record ids), the provenance lists both modules, and the monitor's exported ``dp_difference`` is the gap
of those decisions, not of the scorer's own decisions at 0.5. Thresholds v2 published mid-stream are
served from then on. A worker that ignored the thresholds would emit ``score >= 0.5``: every assertion
on the decisions, the provenance and the gauge then fails.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from fairstream.models.thresholds import GroupThresholds
from fairstream.repair import datasets
from fairstream.repair.measure.metrics import dp_difference
from fairstream.streams.config import AgentConfig, adult_config
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.ops.supervise import WorkerProcess
from fairstream.streams.topics import ensure_topics
from tests.streams.refit.test_flow_refit import balanced_scorer  # its decisions at 0.5 differ by sex

from .outputs import collect_outputs, send
from .test_liveness import died, metric_samples, wait_ready

pytestmark = pytest.mark.integration

WINDOW = 2000  # records the monitor's count window holds: more than this module sends under thresholds v1


class Chain:
    """A worker serving ``scorer -> thresholds``, the modules it was given by version, and its input."""

    def __init__(self, broker, tmp_path, research, archive):
        self.bootstrap, self.archive = broker.bootstrap, archive
        self.config = adult_config(artifact_dir=str(tmp_path / "artifacts"),
                                   records=AgentConfig(artifact=("scorer", "thresholds")),
                                   ).with_topics(prefix="thrchain").with_monitor(
            statistic="dp_difference", min_records=100, window_records=WINDOW, buckets=1, metrics_port=0)
        ensure_topics(self.bootstrap, self.config.topics)
        self.control = ControlClient(self.bootstrap, self.config.topics, ArtifactStore(self.config.artifact_dir))
        self.scorer = balanced_scorer(research)
        self.research_scores = self.scorer.predict_proba(research.X)
        self.research = research
        self.thresholds: dict[int, GroupThresholds] = {}
        self.worker = WorkerProcess(self.config, self.bootstrap, tmp_path, name="thr")

    def publish_thresholds(self, **params) -> int:
        r = self.research
        fitted = GroupThresholds(**params).fit(self.research_scores, r.s, r.y, r.u)
        version = self.control.publish_sync(fitted.to_artifact()).version
        self.thresholds[version] = fitted
        return version

    def replay(self, rows: slice, prefix: str, rate=None):
        """Send ``rows`` of the archive; returns (their ids in order, the rows)."""
        part = self.archive.subset(rows)
        messages = record_messages(part, self.config, id_prefix=prefix)
        send(self.bootstrap, self.config, messages, rate)
        return [key.decode() for key, _ in messages], part

    def outputs(self, ids: list[str]) -> list[dict]:
        """The one repaired record of each id, in the order of ``ids`` (none may be dead-lettered)."""
        repaired, dead = collect_outputs(self.bootstrap, self.config, set(ids), timeout=60, alive=died(self.worker))
        assert not dead, f"dead-lettered: {[d[0]['reason'] for d in dead.values()][:3]}"
        return [repaired[rid][0] for rid in ids]


@pytest.fixture(scope="module")
def chain(broker, tmp_path_factory):
    research, archive = datasets.load("adult").split(4000, seed=3)
    live = Chain(broker, tmp_path_factory.mktemp("thresholds-chain"), research, archive)
    assert live.control.publish_sync(live.scorer.to_artifact()).version == 1
    assert live.publish_thresholds(constraint="dp") == 1
    live.worker.start()
    try:
        wait_ready(live.worker)
        yield live
    finally:
        live.worker.stop()


def check_decided_by(chain: Chain, records: list[dict], ids: list[str], part) -> np.ndarray:
    """Each record's score is the scorer's, its decision that of the thresholds version it is stamped with."""
    stages = [[(stage["kind"], stage["version"]) for stage in r["provenance"]["chain"]] for r in records]
    assert all(len(kinds) == 2 and kinds[0] == ("scorer", 1) and kinds[1][0] == "thresholds" for kinds in stages)
    versions = np.array([kinds[1][1] for kinds in stages])
    score = np.array([r["score"] for r in records])
    np.testing.assert_allclose(score, chain.scorer.predict_proba(part.X), rtol=1e-9, atol=1e-12)
    decision = np.array([r["decision"] for r in records])
    for version in np.unique(versions):
        rows = np.flatnonzero(versions == version)
        expected = chain.thresholds[version].decide(score[rows], part.s[rows], part.u[rows],
                                                    keys=np.array(ids, dtype=object)[rows])
        assert np.array_equal(decision[rows], expected), f"thresholds v{version}"
    return versions


def rate_gap_gauge(worker: WorkerProcess) -> tuple[float | None, float | None]:
    """(dp_difference after the chain over the count window, records in that window) from the worker's /metrics."""
    samples = metric_samples(worker)
    gaps = [sample.value for sample in samples
            if sample.name == "fairstream_fairness_rate_gap" and sample.labels.get("statistic") == "dp_difference"
            and sample.labels.get("stage") == "after" and sample.labels.get("window") == "count"
            and sample.labels.get("stratum", "all") == "all" and sample.labels.get("group_pair", "all") == "all"]
    held = [sample.value for sample in samples
            if sample.name == "fairstream_monitor_window_records" and sample.labels.get("window") == "count"]
    assert len(gaps) <= 1 and len(held) <= 1, (gaps, held)
    return (gaps or [None])[0], (held or [None])[0]


def test_records_carry_the_thresholds_decision_and_the_monitor_measures_it(chain):
    ids, part = chain.replay(slice(0, 600), "v1")
    records = chain.outputs(ids)
    assert set(check_decided_by(chain, records, ids, part)) == {1}
    decision = np.array([r["decision"] for r in records])
    own = (np.array([r["score"] for r in records]) >= 0.5).astype(np.int64)  # what the scorer alone decides
    assert not np.array_equal(decision, own)
    gap, gap_own = dp_difference(decision, part.s), dp_difference(own, part.s)
    assert abs(gap - gap_own) > 0.05, (gap, gap_own)
    # The gauge is exported after each batch: poll until the window holds every record, then it is their gap.
    deadline, exported = time.monotonic() + 20, (None, None)
    while time.monotonic() < deadline and exported[1] != len(ids):
        exported = rate_gap_gauge(chain.worker)
        time.sleep(0.2)
    assert exported[1] == len(ids) and exported[0] is not None, exported
    assert exported[0] == pytest.approx(gap, abs=1e-9)


def test_thresholds_published_mid_stream_decide_the_records_after_the_swap(chain):
    halfway, sent = threading.Event(), {}

    def stream() -> None:  # 400 records at 200 a second; v2 is published once the first 100 are acknowledged
        first = chain.replay(slice(600, 700), "swap-a", rate=200.0)
        halfway.set()
        rest = chain.replay(slice(700, 1000), "swap-b", rate=200.0)
        sent["ids"], sent["part"] = first[0] + rest[0], chain.archive.subset(slice(600, 1000))

    sender = threading.Thread(target=stream)
    sender.start()
    assert halfway.wait(timeout=30)
    assert chain.publish_thresholds(constraint="eo", random_state=7) == 2
    sender.join()
    assert chain.worker.wait_for_log("now serving thresholds artifact version 2", timeout=30)
    mid = chain.outputs(sent["ids"])
    assert set(check_decided_by(chain, mid, sent["ids"], sent["part"])) <= {1, 2}
    ids, part = chain.replay(slice(1000, 1300), "after-swap")
    records = chain.outputs(ids)
    assert set(check_decided_by(chain, records, ids, part)) == {2}
    decision = np.array([r["decision"] for r in records])
    score = np.array([r["score"] for r in records])
    v1 = chain.thresholds[1].decide(score, part.s, part.u, keys=np.array(ids, dtype=object))
    assert not np.array_equal(decision, v1)  # v2 decides otherwise: the stamp is not all that changed
