"""Re-fit jobs against Apache Kafka: publish, refuse with reasons, follow a shift, answer requests."""

from __future__ import annotations

import argparse
import dataclasses
import doctest
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest
from kafka import KafkaProducer

from fairstream.repair import datasets
from fairstream.streams import cli
from fairstream.streams.codec.records import decode_records
from fairstream.streams.codec.refit_requests import RefitRequest, RefitRequestError, parse_request
from fairstream.streams.config import adult_config
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.demo.replay import bad_messages, interleave, record_messages, replay
from fairstream.streams.kafka import KAFKA_API_VERSION
from fairstream.streams.refit import job, requests, schedule, service, sources
from fairstream.streams.refit.command import add_refit_parser
from fairstream.streams.refit.job import RefitJob, stratified_split
from fairstream.streams.refit.requests import request_refit
from fairstream.streams.refit.schedule import run_every
from fairstream.streams.refit.service import RefitService
from fairstream.streams.refit.sources import (
    FileSource,
    ResearchWindow,
    TopicSource,
    read_research_file,
    read_research_topic,
)
from fairstream.streams.refit.trainers import format_value
from fairstream.streams.topics import ensure_topics

pytestmark = pytest.mark.integration


# --------------------------------------------------------------------------- fixtures and helpers


@pytest.fixture(scope="module")
def adult():
    return datasets.load("adult")


@pytest.fixture(scope="module")
def windows(adult):
    """Two disjoint research windows from the same distribution, and the second one shifted."""
    first, rest = adult.split(8000, seed=1)
    second, _ = rest.split(8000, seed=2)
    X = second.X.copy()
    # Women with a college education now report 10 more hours a week: one (u, s) cell drifts.
    X[(second.s == 1) & (second.u == 1), 1] += 10
    return {"first": first, "second": second, "shifted": dataclasses.replace(second, X=X)}


@pytest.fixture
def config(broker, tmp_path):
    # A fresh topic prefix per test: no test sees another's research data, requests or plans.
    config = adult_config(artifact_dir=str(tmp_path / "artifacts")).with_topics(prefix=f"refit-{uuid.uuid4().hex[:10]}")
    ensure_topics(broker.bootstrap, config.topics)
    return config


def as_window(data) -> ResearchWindow:
    return ResearchWindow.of(data.X, data.s, data.u)


def control_history(broker, config):
    return ControlClient(broker.bootstrap, config.topics, ArtifactStore(config.artifact_dir)).history_sync()


def to_research_topic(broker, config, data, id_prefix: str) -> None:
    messages = record_messages(data, config, id_prefix=id_prefix)
    assert replay(broker.bootstrap, config.topics.research, messages, progress=False) == len(messages)


def holdout_size(data, fraction: float = 0.2) -> int:
    """Rows the stratified split holds out: the fraction of every (u, s) cell, rounded per cell."""
    return sum(round(fraction * count) for count in data.group_counts().values())


def publish_first_plan(broker, config, data):
    outcome = RefitJob(config, broker.bootstrap).run_once(as_window(data))
    assert outcome.published and outcome.version == 1, outcome.reason
    return outcome


# --------------------------------------------------------------------------- the job


def test_first_refit_publishes_v1_when_no_plan_is_active(broker, config, windows):
    to_research_topic(broker, config, windows["first"], "research")
    job = RefitJob(config, broker.bootstrap)

    outcome = job.run_once(TopicSource(broker.bootstrap, config, last_n=None))

    assert outcome.published and outcome.version == 1 and outcome.current_version is None and not outcome.candidate
    assert outcome.current_value is None and "no plan was active: published plan v1 (" in outcome.reason
    assert outcome.n_research == 8000 and outcome.n_invalid == 0
    assert outcome.n_holdout == holdout_size(windows["first"])
    (record,) = control_history(broker, config)
    assert record.kind == "plan" and record.version == 1 and record.sha256 == outcome.sha256
    artifact = ArtifactStore(config.artifact_dir).get(record.sha256)
    metrics = artifact.metrics
    assert metrics["E_holdout_after"] == pytest.approx(outcome.candidate_value)
    assert metrics["E_holdout_floor"] == pytest.approx(outcome.floor)
    assert metrics["n_research"] == 8000 and metrics["replaces_version"] is None
    assert metrics["E_holdout_after"] < metrics["E_holdout_before"]  # the plan removes dependence
    assert len(artifact.manifest.data_fingerprint) == 64
    assert job.current().version == 1

    again = job.run_once(TopicSource(broker.bootstrap, config, last_n=None))  # nothing new on the topic

    assert not again.published and again.current_version == 1
    assert again.reason.startswith("the candidate is identical to the active plan v1")
    assert len(control_history(broker, config)) == 1


def test_under_approval_a_refit_publishes_a_candidate_that_serves_only_once_approved(broker, config, windows):
    config = dataclasses.replace(config, promotion="approve")
    refit = RefitJob(config, broker.bootstrap)

    outcome = refit.run_once(as_window(windows["first"]), trigger="drift alert")

    assert outcome.published and outcome.candidate and outcome.version == 1
    assert "no plan was active: published candidate plan version 1 (" in outcome.reason
    assert job.format_outcome(outcome).startswith(
        "re-fit of plan: published candidate plan version 1 (it serves once promoted or approved)\n")
    (record,) = control_history(broker, config)
    assert record.candidate and record.reason == "drift alert" and record.sha256 == outcome.sha256
    assert refit.current() is None  # a candidate does not serve
    control = ControlClient(broker.bootstrap, config.topics, ArtifactStore(config.artifact_dir))
    control.decide_sync("plan", 1, "approve", actor="alice", reason="closes the gap")
    assert refit.current().version == 1


def test_under_shadow_the_first_refit_serves_at_once_as_nothing_served_to_compare_with(broker, config, windows):
    config = dataclasses.replace(config, promotion="shadow")
    refit = RefitJob(config, broker.bootstrap)

    outcome = refit.run_once(as_window(windows["first"]), trigger="schedule")

    assert outcome.published and not outcome.candidate and outcome.version == 1
    assert outcome.reason.endswith("; promotion is 'shadow', but no plan version served yet (there is no active chain "
                                   "to compare it with): it serves at once, as under 'auto'"), outcome.reason
    (record,) = control_history(broker, config)
    assert not record.candidate and refit.current().version == 1


def test_the_job_serves_what_the_workers_serve_after_a_version_skipped_over_other_messages(broker, config, windows):
    """A version may skip as many numbers as messages were written since its kind's last claim (what
    compaction can remove); the job's view of what is served must apply that rule at the real offsets."""
    import asyncio

    from fairstream.models.plan import DistributionalRepair
    from tests.streams.control.test_registry import message, send_raw

    publish_first_plan(broker, config, windows["first"])
    for _ in range(2):  # two messages no reader takes (garbage under a key of its own)
        asyncio.run(send_raw(broker.bootstrap, config.topics.control, b"garbage", key=b"garbage"))
    second = windows["second"]
    plan = DistributionalRepair(n_q=40).fit(second.X, second.s, second.u)
    asyncio.run(send_raw(broker.bootstrap, config.topics.control, message(plan.to_artifact(), version=3)))

    assert RefitJob(config, broker.bootstrap).current().version == 3


def test_worse_candidate_is_refused_with_both_numbers(broker, config, windows):
    publish_first_plan(broker, config, windows["first"])
    # A partial repair (30 % of the way to the barycentre) on data from the same distribution:
    # measurably worse than the full repair that is active. (A coarse grid such as n_q=3 is not:
    # it collapses values onto 3 nodes, which drives E below its noise floor.)
    worse = RefitJob(config, broker.bootstrap, repair_amount=0.3)

    outcome = worse.run_once(as_window(windows["second"]))

    assert not outcome.published and outcome.version is None and outcome.current_version == 1
    assert outcome.candidate_value > outcome.current_value * 1.1
    expected = (f"candidate E {format_value(outcome.candidate_value)} > current E {format_value(outcome.current_value)} x 1.10 "
                f"on {holdout_size(windows['second'])} holdout rows")
    assert outcome.reason.startswith(expected) and outcome.reason.endswith("against the active plan v1); not publishing")
    assert outcome.statistic == "E" and outcome.kind == "plan"
    assert [r.version for r in control_history(broker, config)] == [1]


def test_too_small_window_is_refused_with_the_cell_that_is_short(broker, config, windows):
    tiny = windows["first"].subset(slice(0, 150))

    outcome = RefitJob(config, broker.bootstrap).run_once(as_window(tiny))

    assert not outcome.published and outcome.candidate_value is None
    assert outcome.reason.startswith("research window too small: cell (u=")
    assert "at least 20 of each are needed" in outcome.reason and "window of 150 valid rows" in outcome.reason
    assert control_history(broker, config) == []


def test_distribution_shift_makes_the_candidate_win_and_publishes_v2(broker, config, windows):
    publish_first_plan(broker, config, windows["first"])
    to_research_topic(broker, config, windows["shifted"], "shifted")
    job = RefitJob(config, broker.bootstrap)

    outcome = job.run_once(TopicSource(broker.bootstrap, config, last_n=10_000))

    assert outcome.published and outcome.version == 2 and outcome.current_version == 1, outcome.reason
    assert outcome.candidate_value < outcome.current_value
    assert f"against current E {format_value(outcome.current_value)}" in outcome.reason and "replaces v1" in outcome.reason
    assert [r.version for r in control_history(broker, config)] == [1, 2]
    assert job.current().artifact.metrics["replaces_version"] == 1


def test_same_window_gives_the_same_split_and_every_cell_is_held_out(windows):
    data = windows["first"]
    fit, held = stratified_split(data.s, data.u, 0.2, seed=3)
    again, _ = stratified_split(data.s, data.u, 0.2, seed=3)
    assert np.array_equal(fit, again) and not np.intersect1d(fit, held).size and len(fit) + len(held) == len(data)
    for (u, s), count in data.group_counts().items():
        in_holdout = np.sum((data.u[held] == u) & (data.s[held] == s))
        assert in_holdout == round(0.2 * count)


# --------------------------------------------------------------------------- research sources


def test_research_topic_skips_invalid_records_and_keeps_the_latest(broker, config, windows):
    early = record_messages(windows["first"].subset(slice(0, 300)), config, id_prefix="early")
    bad = bad_messages(config, 20, id_prefix="bad")
    assert replay(broker.bootstrap, config.topics.research, interleave(early, bad, seed=1), progress=False) == 320
    time.sleep(0.05)  # later Kafka timestamps for the late records
    late = record_messages(windows["first"].subset(slice(300, 400)), config, id_prefix="late")
    assert replay(broker.bootstrap, config.topics.research, late, progress=False) == 100

    # Some "bad" messages only fail at repair time (e.g. a value far out of range): the codec keeps them.
    invalid = len(decode_records([value for _, value in bad], config).errors)

    everything = read_research_topic(broker.bootstrap, config)
    latest = read_research_topic(broker.bootstrap, config, last_n=100)

    assert invalid >= 15 and len(everything) == 420 - invalid and everything.n_invalid == invalid
    assert everything.invalid_examples
    X, s, u = latest
    assert X.shape == (100, 2) and sorted(latest.keys) == sorted(k.decode() for k, _ in late)
    assert latest.n_invalid == invalid


def test_read_research_file_reads_json_lines_and_csv_alike(tmp_path, windows):
    config = adult_config()
    part = windows["first"].subset(slice(0, 50))
    lines = [value.decode() for _, value in record_messages(part, config, id_prefix="f")]
    jsonl = tmp_path / "research.jsonl"
    jsonl.write_text("\n".join(lines[:25] + ["{broken", "", '{"id": "x", "features": {}, "s": 0, "u": 0}'] + lines[25:]) + "\n")
    rows = [f"f-{i},{a},{h},{s},{u},1" for i, ((a, h), s, u) in enumerate(zip(part.X.tolist(), part.s, part.u))]
    csv_path = tmp_path / "research.csv"
    csv_path.write_text("\n".join(["id,age,hours-per-week,s,u,y", *rows, "bad-1,abc,40,0,1,0", "bad-2,30,40,7,1,0"]) + "\n")

    from_jsonl, from_csv = read_research_file(jsonl, config), read_research_file(csv_path, config)

    assert len(from_jsonl) == 50 and from_jsonl.n_invalid == 2
    assert len(from_csv) == 50 and from_csv.n_invalid == 2
    assert any("non-numeric" in reason for reason in from_csv.invalid_examples)
    assert any("not a configured group" in reason for reason in from_csv.invalid_examples)
    for a, b in zip(from_jsonl, from_csv):
        assert np.array_equal(a, b)
    assert list(from_csv.keys) == list(from_jsonl.keys)
    assert FileSource(csv_path, config)().X.shape == (50, 2)


def test_read_research_file_accepts_the_named_label_columns_and_names_missing_ones(tmp_path):
    config = adult_config()
    named = tmp_path / "named.csv"
    named.write_text("age,hours-per-week,sex,education-num > 9\n30,40,1,0\n")
    window = read_research_file(named, config)
    assert window.X.tolist() == [[30.0, 40.0]] and window.s.tolist() == [1] and window.u.tolist() == [0]
    missing = tmp_path / "missing.csv"
    missing.write_text("age,s,u\n30,1,0\n")
    with pytest.raises(ValueError, match="hours-per-week"):
        read_research_file(missing, config)


# --------------------------------------------------------------------------- scheduling


def test_the_refit_modules_examples_hold():
    for module in (job, requests, schedule, service, sources):
        assert doctest.testmod(module).failed == 0


def test_run_every_keeps_its_schedule_through_failures_until_stopped(tmp_path, windows):
    config = adult_config(artifact_dir=str(tmp_path / "artifacts"))
    # A window too small to fit is refused before the broker is contacted: nothing here needs one.
    job = RefitJob(config, "127.0.0.1:1")
    tiny = as_window(windows["first"].subset(slice(0, 40)))
    calls = []

    def source():
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise OSError("research file not there yet")
        return tiny

    outcomes, stop = [], threading.Event()
    threading.Timer(1.0, stop.set).start()
    runs = run_every(job, source, 0.2, stop, on_outcome=outcomes.append)

    assert runs == len(calls) >= 4 and len(outcomes) == runs - 1
    assert all(not o.published and "too small" in o.reason for o in outcomes)
    assert np.diff(calls).min() > 0.15  # on the schedule, not back to back
    assert run_every(job, tiny, 60.0, threading.Event(), max_runs=1) == 1


# --------------------------------------------------------------------------- requests and the service


def test_refit_requests_round_trip_and_bad_ones_are_refused():
    request = RefitRequest.new("drift of dependence_e", statistic="dependence_e", value=0.12, source="monitor")
    assert parse_request(request.to_json()) == request and len(request.request_id) == 32
    extra = json.loads(request.to_json()) | {"window": 5000}
    assert parse_request(json.dumps(extra).encode()) == request  # unknown fields are ignored
    for bad in (b"", b"[1]", b"{not json", json.dumps({"kind": "plan", "reason": "r", "ts": 1.0}).encode(),
                json.dumps({"request_id": "a", "kind": "plan", "reason": "r", "ts": "yesterday"}).encode(),
                json.dumps({"request_id": "a", "kind": "", "reason": "r", "ts": 1.0}).encode(),
                json.dumps({"request_id": "a" * 201, "kind": "plan", "reason": "r", "ts": 1.0}).encode()):
        with pytest.raises(RefitRequestError):
            parse_request(bad)
    with pytest.raises(RefitRequestError):
        RefitRequest.new("drift", value=float("nan"))


def send_raw_request(broker, config, value: bytes) -> None:
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, api_version=KAFKA_API_VERSION)
    try:
        producer.send(config.topics.refit_requests, key=b"plan", value=value).get(30)
    finally:
        producer.close()


def decisions_by_action(service) -> dict[str, list]:
    grouped: dict[str, list] = {}
    for decision in service.decisions:
        grouped.setdefault(decision.action, []).append(decision)
    return grouped


def test_requests_are_deduplicated_coalesced_and_rate_limited(broker, config, windows):
    min_interval = 5.0
    job = RefitJob(config, broker.bootstrap)
    service = RefitService(job, as_window(windows["first"].subset(slice(0, 4000))), min_interval_seconds=min_interval)
    burst = [request_refit(broker.bootstrap, config, f"drift #{i}", statistic="dependence_e", value=0.1 + i)
             for i in range(5)]
    request_refit(broker.bootstrap, config, "the monitor retried", request_id=burst[0].request_id)
    request_refit(broker.bootstrap, config, "another kind", kind="flow")
    send_raw_request(broker, config, b"{not json")

    with service:
        outcomes = service.process_pending(timeout=120)
        first = decisions_by_action(service)
        assert 1 <= len(outcomes) <= 2 and outcomes[0].published and outcomes[0].version == 1
        answered = [d.request_id for d in first["queued"] + first.get("coalesced", [])]
        assert sorted(answered) == sorted(r.request_id for r in burst)  # each exactly once
        assert [d.request_id for d in first["duplicate"]] == [burst[0].request_id]
        assert len(first["ignored"]) == 1 and len(first["invalid"]) == 1
        assert all(b - a >= min_interval for a, b in zip(service.refit_started, list(service.refit_started)[1:]))
        # the audit trail: the service publishes under its own name, for the reasons of the requests it answered
        published = control_history(broker, config)[0]
        assert published.actor.startswith("refit@") and published.reason.startswith("drift #")

        late = [request_refit(broker.bootstrap, config, f"late drift #{i}") for i in range(2)]
        more = service.process_pending(timeout=120)

    assert len(more) == 1 and len(service.refit_started) == len(outcomes) + 1
    assert service.refit_started[-1] - service.refit_started[-2] >= min_interval
    latest = [d for d in service.decisions if d.request_id in {r.request_id for r in late}]
    assert [d.action for d in latest] == ["queued", "coalesced"] and "rate-limited" in latest[0].reason
    assert [d.action for d in service.decisions].count("refit") == len(service.refit_started)


# --------------------------------------------------------------------------- command line


def refit_cli() -> argparse.ArgumentParser:
    """The parser as the lead wires it into ``fairstream``: one call with the CLI's own hooks."""
    parser = argparse.ArgumentParser(prog="fairstream")
    sub = parser.add_subparsers(dest="command", required=True)
    add_refit_parser(sub, broker_context=cli._broker, add_common=cli._add_common, load_config=cli._config)
    return parser


def test_refit_command_publishes_from_a_file(broker, config, windows, tmp_path, capsys):
    toml = tmp_path / "pipeline.toml"
    toml.write_text(config.to_toml())
    research = tmp_path / "research.jsonl"
    research.write_text("\n".join(v.decode() for _, v in record_messages(windows["first"], config, "cli")) + "\n")
    args = refit_cli().parse_args(["refit", "--kind", "plan", "--config", str(toml), "--broker",
                                   f"kafka://{broker.bootstrap}", "--source", str(research), "--holdout", "0.25"])

    assert args.func(args) == 0

    printed = capsys.readouterr().out
    assert "re-fit of plan: published plan v1" in printed and f"{holdout_size(windows['first'], 0.25)} held out" in printed
    (record,) = control_history(broker, config)
    assert record.version == 1 and record.actor.startswith("refit@") and record.reason == "command"


def test_a_refit_that_could_not_train_a_candidate_exits_non_zero_with_its_reason(broker, config, tmp_path, capsys):
    # The quick start's `refit` before the research split reached the topic: a script must not carry on.
    toml = tmp_path / "pipeline.toml"
    toml.write_text(config.to_toml())
    args = refit_cli().parse_args(["refit", "--kind", "plan", "--config", str(toml), "--broker",
                                   f"kafka://{broker.bootstrap}"])

    assert args.func(args) == 1

    assert "re-fit of plan: not published" in capsys.readouterr().out and control_history(broker, config) == []


def test_refit_command_line_checks_its_options(capsys):
    parser = refit_cli()
    args = parser.parse_args(["refit", "--serve", "--min-interval", "10m", "--tolerance", "0.2"])
    assert args.serve and args.min_interval == 600.0 and args.tolerance == 0.2 and args.kind is None
    assert parser.parse_args(["refit", "--every", "6h"]).every == 21600.0
    assert parser.parse_args(["refit", "--kind", "flow", "--lam", "0.3"]).lam == 0.3
    for bad in (["refit", "--every", "soon"], ["refit", "--every", "1h", "--serve"], ["refit", "--holdout", "1.5"],
                ["refit", "--kind", "scorecard"], ["refit", "--kind", "flow", "--lam", "2"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
    assert "not a duration: 'soon'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["refit", "--help"])
    assert "--min-interval" in capsys.readouterr().out


CLI_SCRIPT = """
import argparse, sys
from fairstream.streams import cli
from fairstream.streams.refit.command import add_refit_parser
parser = argparse.ArgumentParser(prog="fairstream")
sub = parser.add_subparsers(dest="command", required=True)
add_refit_parser(sub, broker_context=cli._broker, add_common=cli._add_common, load_config=cli._config)
args = parser.parse_args(sys.argv[1:])
sys.exit(args.func(args))
"""


def test_refit_service_command_answers_a_request_and_stops_on_sigterm(broker, config, windows, tmp_path):
    toml = tmp_path / "pipeline.toml"
    toml.write_text(config.to_toml())
    research = tmp_path / "research.jsonl"
    research.write_text("\n".join(v.decode() for _, v in record_messages(windows["first"].subset(slice(0, 3000)), config, "svc")))
    script = tmp_path / "fairstream_cli.py"
    script.write_text(CLI_SCRIPT)
    log_path = tmp_path / "service.log"
    command = [sys.executable, str(script), "refit", "--serve", "--config", str(toml), "--broker", broker.bootstrap,
               "--source", str(research), "--min-interval", "1s"]
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        request_refit(broker.bootstrap, config, "drift of dependence_e", statistic="dependence_e", value=0.3)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not control_history(broker, config):
            assert process.poll() is None, log_path.read_text()
            time.sleep(0.5)
        assert [r.version for r in control_history(broker, config)] == [1], log_path.read_text()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, log_path.read_text()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    log_text = log_path.read_text()
    assert "queued: (drift of dependence_e) re-fit starts now" in log_text
    assert "no plan was active: published plan v1" in log_text


def test_a_plan_re_fit_fits_the_posterior_of_s_only_for_a_pipeline_that_imputes_s(windows, tmp_path):
    from fairstream.streams.refit.trainers.plan import PlanTrainer

    config = adult_config(artifact_dir=str(tmp_path))
    imputing = dataclasses.replace(config, records=dataclasses.replace(config.records, missing_s="impute"))
    window = as_window(windows["first"])
    assert PlanTrainer(config).fit(window, {}).posterior_ is None  # most of a fit's time, for nothing
    plan = PlanTrainer(imputing).fit(window, {})
    assert plan.posterior_ is not None
    plan.check_compatible(imputing.schema())  # the imputing pipeline loads it


def test_a_window_read_in_another_order_refits_the_same_plan(broker, config, windows):
    # Two reads of one research topic interleave its partitions differently: the re-fit must not care.
    data = windows["first"]
    keys = np.array([f"research-{i}" for i in range(len(data))])
    window = ResearchWindow.of(data.X, data.s, data.u, keys=keys)
    job = RefitJob(config, broker.bootstrap)
    first = job.run_once(window)
    shuffled = window.subset(np.random.default_rng(7).permutation(len(window)))

    again = job.run_once(shuffled)

    assert first.published and not again.published, again.reason
    assert again.reason.startswith("the candidate is identical to the active plan v1")
