"""What the demo reads from the pipeline, without a broker: the pipeline's figures from the monitoring agent
(``scope="pipeline"``), what serves and what was processed from every worker, and the timeline it makes of them."""

import time

from fairstream.streams.codec.refit_requests import RefitRequest
from fairstream.streams.config import adult_config
from fairstream.streams.demo.loop import LoopReport, MetricsPoller, _add_requests, demo_slices
from fairstream.streams.refit.service import Decision

CONFIG = adult_config().with_monitor(window_records=8000, threshold=0.1)
PIPELINE = CONFIG.name


def sample(name: str, value: float, **labels) -> tuple:
    return (name, tuple(sorted({"pipeline": PIPELINE, **labels}.items()))), value


def worker(version: int, repaired: float, dead: float = 0.0, candidate: int | None = None) -> dict:
    rows = [sample("fairstream_artifact_version", version, kind="plan"),
            sample("fairstream_records_repaired_total", repaired, agent="records"),
            sample("fairstream_records_dead_lettered_total", dead, agent="records"),
            sample("fairstream_records_in_total", repaired + dead, agent="records"),
            # a worker's own statistic (a diagnostic): never the pipeline's
            sample("fairstream_fairness_dependence", 0.9, role="active", statistic="dependence_e", stage="after",
                   stratum="all", feature="all", group_pair="all", window="count", scope="worker")]
    if candidate is not None:
        rows.append(sample("fairstream_candidate_version", candidate, kind="plan"))
    return dict(rows)


def agent(value: float | None, drifts: float = 0.0, slice_end: float = 0.0, candidate: float | None = None) -> dict:
    fairness = dict(statistic="dependence_e", stage="after", stratum="all", feature="all", group_pair="all",
                    window="count", scope="pipeline")
    rows = [sample("fairstream_drift_events_total", drifts, statistic="dependence_e", detector="adwin"),
            sample("fairstream_agent_slice_end_timestamp_seconds", slice_end)]
    if value is not None:
        rows.append(sample("fairstream_fairness_dependence", value, role="active", **fairness))
    if candidate is not None:
        rows.append(sample("fairstream_fairness_dependence", candidate, role="candidate", **fairness))
    return dict(rows)


def poller(workers: int = 3) -> MetricsPoller:
    return MetricsPoller("agent", [f"w{i}" for i in range(workers)], LoopReport(threshold=0.1, workers=workers), 0.0,
                         CONFIG)


def look(p: MetricsPoller, t: float, agent_samples: dict, worker_samples: list) -> None:
    p.agent_samples, p.worker_samples = agent_samples, list(worker_samples)
    p._observe(t)


def events(p: MetricsPoller) -> list[tuple[str, str]]:
    return [(e, d) for _, e, d in p.report.events]


def test_the_pipeline_statistic_and_drift_are_the_agents_the_versions_and_counts_every_workers():
    p = poller()
    look(p, 1.0, agent(None), [worker(1, 100), worker(1, 200, 5), None])  # one worker not scraped yet
    assert p.version is None and p.processed == 305 and p.report.series == []
    look(p, 2.0, agent(0.03, slice_end=1.0), [worker(1, 100), worker(1, 200, 5), worker(1, 50)])
    assert p.version == 1 and p.processed == 355 and p.report.series == [(2.0, 0.03, 1)]
    look(p, 3.0, agent(0.4, drifts=1, slice_end=2.0), [worker(1, 300), worker(1, 400, 5), worker(1, 350)])
    assert events(p) == [("plan version in use", "version 1"),
                         ("drift detected by the monitor", "dependence_e = 0.400 (the pipeline's, 3 workers)")]


def test_a_new_version_is_in_use_once_every_worker_serves_it_and_the_agents_old_figures_are_not_its_own():
    p = poller()
    look(p, 1.0, agent(0.05, slice_end=1.0), [worker(1, 10)] * 3)
    look(p, 2.0, agent(0.7, drifts=1, slice_end=2.0), [worker(2, 20), worker(1, 20), worker(2, 20)])
    assert p.version == 1  # one worker still serves version 1
    look(p, 3.0, agent(0.7, drifts=1, slice_end=3.0), [worker(2, 30)] * 3)
    assert p.version == 2 and events(p)[-1] == ("plan version in use", "version 2")
    swapped = p.swapped_at
    # The agent still shows the replaced chain's last figures (its windows have not counted past the swap): they are
    # neither the new version's series nor its recovery.
    look(p, 4.0, agent(0.05, drifts=1, slice_end=swapped - 0.5), [worker(2, 40)] * 3)
    assert [ver for _, _, ver in p.report.series] == [1, 1]
    look(p, 5.0, agent(0.06, drifts=1, slice_end=swapped + 0.25), [worker(2, 50)] * 3)
    assert p.report.series[-1] == (5.0, 0.06, 2)
    assert events(p)[-1] == ("statistic back below threshold", "0.060 < 0.1")


def test_the_candidate_is_the_workers_and_its_figures_the_agents():
    p = poller(2)
    look(p, 1.0, agent(0.5, candidate=0.08), [worker(1, 10, candidate=2), worker(1, 10)])
    assert (p.candidate, p.candidate_value) == (2, 0.08)
    assert ("candidate in shadow", "plan version 2") in events(p)


def test_the_agents_requests_are_on_the_timeline_at_its_own_time():
    epoch = time.time() - 100.0
    report = LoopReport(threshold=0.1, workers=3, events=[(31.0, "drift detected by the monitor", "(poller)")])
    request = RefitRequest.new("drift", statistic="dependence_e", value=0.44, source="x.monitor@h:1", version=1,
                               ts=epoch + 30.2)
    _add_requests(report, [request], [Decision(request.request_id, "queued", "re-fit starts now")], epoch)
    assert [(round(t, 1), e) for t, e, _ in sorted(report.events)] == [
        (30.2, "drift detected by the monitor"), (30.2, "re-fit requested")]
    assert report.refit_requests == [f"{request.request_id} from x.monitor@h:1: queued: re-fit starts now"]


def test_the_demo_slices_hold_at_most_a_detector_chunk_at_its_rate():
    assert demo_slices(CONFIG, 2000.0).monitor.slice_seconds == 0.25  # 500 records: window_records / 16
    assert demo_slices(CONFIG, 100.0) == CONFIG
