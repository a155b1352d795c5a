"""The command line as a user runs it: real subprocesses, Apache Kafka (the embedded broker where a command starts one)."""

import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fairstream.repair import artifacts
from fairstream.models.plan import DistributionalRepair
from fairstream.streams import cli
from fairstream.streams.cli import build_parser, main
from fairstream.streams.config import adult_config
from fairstream.streams.control.client import ControlClient, default_actor
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.ops.broker import (
    BrokerState,
    EmbeddedBroker,
    is_alive,
    running_broker,
    state_path,
    write_state,
)
from fairstream.streams.ops.supervise import WorkerProcess
from fairstream.streams.topics import ensure_topics
from tests.polling import wait_for

COMMANDS = ["repair", "broker", "kafka", "schema-registry", "worker", "monitor", "replay", "tail", "init", "artifacts", "keys", "config", "refit",
            "demo", "alerts", "acls"]


def fairstream(*args, cwd, check=True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "fairstream.streams.cli", *args], cwd=cwd, capture_output=True,
                            text=True, timeout=300)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_explains_itself(command, tmp_path):
    out = fairstream(command, "--help", cwd=tmp_path).stdout
    assert out.startswith("usage: fairstream " + command)
    assert len(out.splitlines()) > 4


def test_the_parser_knows_exactly_the_documented_commands():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert sorted(sub.choices) == sorted(COMMANDS)


def test_version_names_fairstream_its_kafka_client_and_python():
    from importlib.metadata import version

    result = subprocess.run([sys.executable, "-m", "fairstream.streams.cli", "--version"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(rf"fairstream {re.escape(version('fairstream'))} \(librdkafka [\d.]+, Python [\d.]+\)\n",
                        result.stdout), result.stdout


def test_batch_repair_job_writes_report_artifact_and_plot(tmp_path):
    out = fairstream("repair", "--dataset", "simulation", "--n-research", "500", "--n-q", "50", "--out", "run",
                     "--quiet", cwd=tmp_path).stdout
    assert "archive E reduced" in out
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["evaluations"]["archive"]["E_after_total"] < report["evaluations"]["archive"]["E_before_total"] / 3
    assert (tmp_path / "run" / "plan-v1.json").exists() and (tmp_path / "run" / "distributions.png").stat().st_size > 10_000


def test_a_data_sets_default_research_split_fits_the_data_set(tmp_path):
    # COMPAS has 6,167 rows: the default research split (10,000 elsewhere) is half of them, leaving an archive.
    fairstream("repair", "--dataset", "compas", "--n-q", "30", "--out", "run", "--quiet", cwd=tmp_path)
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert (report["n_research"], report["n_archive"]) == (3083, 6167 - 3083)


def test_artifacts_publish_list_and_rollback(broker, tmp_path):
    fairstream("repair", "--dataset", "adult", "--n-research", "500", "--n-q", "30", "--out", "run", "--quiet",
               cwd=tmp_path)
    toml, _ = pipeline_toml(tmp_path, "rollback")
    url = ["--broker", broker.url, "--config", str(toml)]
    assert "version 1" in fairstream("artifacts", "publish", "run/plan-v1.json", *url, cwd=tmp_path).stdout
    assert "version 2" in fairstream("artifacts", "publish", "run/plan-v1.json", *url, cwd=tmp_path).stdout
    assert "back to version 1" in fairstream("artifacts", "rollback", "plan", *url, cwd=tmp_path).stdout
    rows = fairstream("artifacts", "list", *url, cwd=tmp_path).stdout.splitlines()[1:]
    assert [(r.split()[1], r.split()[3], r.split()[7]) for r in rows] == [  # kind version sha action via date time
        ("1", "publish", "-"), ("2", "publish", "-"), ("1", "rollback", "*")]
    failed = fairstream("artifacts", "rollback", "plan", *url, cwd=tmp_path, check=False)
    assert failed.returncode != 0 and "nothing to roll back to: no plan version was active before version 1" in failed.stderr
    failed = fairstream("artifacts", "rollback", "plan", "--to", "99", *url, cwd=tmp_path, check=False)
    assert failed.returncode == 1 and failed.stderr == (
        "fairstream artifacts: error: plan version 99 was never published on rollback.control (published: 1, 2); "
        "a rollback names a version in the history\n")
    assert "back to version 2" in fairstream("artifacts", "rollback", "plan", "--to", "2", *url, cwd=tmp_path).stdout
    failed = fairstream("artifacts", "rollback", "nosuchkind", *url, cwd=tmp_path, check=False)
    assert failed.returncode != 0 and "nosuchkind" in failed.stderr


# --------------------------------------------------------------------------- user errors: one line, no traceback

ADULT_TOML = Path(__file__).resolve().parents[2] / "deploy" / "pipeline.adult.toml"
BAD_CONFIGS = {
    # name: (change to the shipped TOML, the message after "<path>: ")
    "TOML syntax": (lambda text: "[pipeline\n" + text,
                    "not valid TOML: Expected ']' at the end of a table declaration (at line 1, column 10)"),
    "partitions a string": (lambda text: text.replace("partitions = 4", 'partitions = "4"'),
                            "topics.partitions must be an integer >= 1 and <= 10000, got '4'"),
    "metrics_port a string": (lambda text: text.replace("metrics_port = 9464", 'metrics_port = "9464"'),
                              "monitor.metrics_port must be an integer >= 0 and <= 65535 or 'off', got '9464'"),
    "feature typo": (lambda text: text.replace('"hours-per-week"]', '"hours-per-weak"]'),
                     "pipeline.valid_ranges names 'hours-per-week', which is not a configured feature "
                     "['age', 'hours-per-weak']"),
    "absurd batch_within": (lambda text: text.replace("batch_within = 0.05", "batch_within = 1e308"),
                            "agents.records.batch_within must be a number > 0 and <= 60, got 1e+308"),
    "unknown statistic": (lambda text: text.replace('statistic = ["dependence_e"', 'statistic = ["dependence_E"'),
                          "monitor.statistic must be a statistic ('dependence_e', 'w1', 'dp_difference', 'dp_ratio', "
                          "'conditional_dp', 'eopp', 'mdp', 'otf') or a non-empty list of distinct ones, got "
                          "['dependence_E', 'dp_difference', 'mdp']"),
}
CONFIG_COMMANDS = [["worker"], ["replay"], ["artifacts", "list"], ["artifacts", "rollback", "plan"], ["refit"],
                   ["demo"]]
UNREACHABLE = "kafka://127.0.0.1:1"


def run_main(args, capsys) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", list(BAD_CONFIGS))
def test_a_config_error_is_one_line_naming_the_file_key_expected_and_found(name, tmp_path, capsys):
    change, message = BAD_CONFIGS[name]
    path = tmp_path / "pipeline.toml"
    path.write_text(change(ADULT_TOML.read_text()))
    code, out, err = run_main(["replay", "--config", str(path), "--broker", UNREACHABLE], capsys)
    assert (code, out, err) == (1, "", f"fairstream replay: error: {path}: {message}\n")


@pytest.mark.parametrize("command", CONFIG_COMMANDS, ids=" ".join)
def test_every_command_refuses_a_bad_config_before_it_starts_anything(command, tmp_path, capsys):
    path = tmp_path / "nope.toml"  # no such file; no --broker: nothing may be started before the config is read
    code, out, err = run_main([*command, "--config", str(path), "--run-dir", str(tmp_path / "run")], capsys)
    assert (code, err) == (1, f"fairstream {command[0]}: error: {path}: no such pipeline config file\n"), out + err
    assert not (tmp_path / "run").exists()


def test_a_genuine_bug_keeps_its_traceback(monkeypatch):
    def broken(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(cli, "_cmd_repair", broken)
    with pytest.raises(ZeroDivisionError):
        main(["repair"])


@pytest.mark.parametrize("value", ["-1", "65536", "any", "80.5"])
def test_metrics_port_option_is_checked(value, capsys):
    with pytest.raises(SystemExit):
        main(["worker", "--metrics-port", value])
    assert "expected a port 0-65535 (0 = any free port) or 'off'" in capsys.readouterr().err


def test_user_errors_are_one_line_and_debug_shows_the_traceback(tmp_path):
    result = fairstream("repair", "--dataset", "nope", cwd=tmp_path, check=False)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == ("fairstream repair: error: unknown dataset 'nope'; valid names: adult, compas, german, "
                             "crime, law, health, simulation\n")
    debug = fairstream("repair", "--dataset", "nope", "--debug", cwd=tmp_path, check=False)
    assert debug.returncode == 1 and debug.stderr.startswith("Traceback") and "unknown dataset 'nope'" in debug.stderr


def test_an_unreachable_broker_is_one_line(tmp_path):
    result = fairstream("artifacts", "list", "--broker", UNREACHABLE, "--config", str(ADULT_TOML), cwd=tmp_path,
                        check=False)
    assert result.returncode == 1 and result.stdout == "", result.stderr
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("fairstream artifacts: error: ")
    assert "127.0.0.1" in result.stderr and "Traceback" not in result.stderr


# --------------------------------------------------------------------------- artifacts: fit check, who serves what


def tiny_plan(columns, seed: int = 0):
    """A small real plan fitted on synthetic data with the given feature names (groups and strata 0/1)."""
    rng = np.random.default_rng(seed)
    s, u = rng.integers(0, 2, 400), rng.integers(0, 2, 400)
    X = rng.normal(40.0, 10.0, size=(400, len(columns))) + 5.0 * s[:, None]
    return DistributionalRepair(n_q=30, columns=list(columns)).fit(X, s, u)


def pipeline_toml(tmp_path, prefix: str, **changes) -> tuple[Path, object]:
    config = dataclasses.replace(adult_config(artifact_dir=str(tmp_path / "artifacts")).with_topics(prefix=prefix),
                                 **changes)
    path = tmp_path / f"{prefix}.toml"
    path.write_text(config.to_toml())
    return path, config


def listing_rows(url: str, toml: Path, capsys) -> tuple[list[dict], str]:
    """``artifacts list``: its rows (the columns by name, "served" for what is beside them), and the whole output."""
    code, out, err = run_main(["artifacts", "list", "--broker", url, "--config", str(toml)], capsys)
    assert code == 0, err
    rows = []
    for line in out.split("\n\n")[0].splitlines()[1:]:
        if line.startswith("("):  # (no artifacts published on ...)
            continue
        kind, version, _sha, action, via, _date, _time, mark, state, actor, *served = line.split()
        rows.append({"kind": kind, "version": int(version), "action": action, "via": via, "mark": mark,
                     "state": state, "actor": actor, "served": " ".join(served)})
    return rows, out


def listing(url: str, toml: Path, capsys) -> tuple[dict, str]:
    """``artifacts list``: {version: (mark, served by)} of the plan rows, and the whole output."""
    rows, out = listing_rows(url, toml, capsys)
    return {row["version"]: (row["mark"], row["served"]) for row in rows}, out


@pytest.mark.integration
def test_publish_refuses_an_artifact_that_does_not_fit_the_pipeline_unless_forced(broker, tmp_path, capsys):
    toml, _ = pipeline_toml(tmp_path, "cli-fit")
    compas = artifacts.save(tiny_plan(["priors_count", "age"]).to_artifact(), tmp_path / "compas-plan.json")
    adult = artifacts.save(tiny_plan(["age", "hours-per-week"]).to_artifact(), tmp_path / "adult-plan.json")
    publish = ["artifacts", "publish", "--broker", broker.url, "--config", str(toml)]
    code, out, err = run_main([*publish, str(compas)], capsys)
    assert (code, out) == (1, "") and err == (
        f"fairstream artifacts: error: the plan does not fit the pipeline 'adult' ({toml}): the plan was fitted on "
        "features ['priors_count', 'age'], the pipeline names ['age', 'hours-per-week']; every worker would refuse "
        "it at load (--force publishes it anyway)\n")
    assert "(no artifacts published on cli-fit.control)" in listing(broker.url, toml, capsys)[1]
    assert run_main([*publish, str(adult)], capsys)[:2] == (0, f"published plan version 1 (sha256 "
                                                              f"{artifacts.load(adult).sha256[:12]}, inline) to "
                                                              "cli-fit.control\n")
    code, out, _ = run_main([*publish, str(compas), "--force"], capsys)
    assert code == 0 and out.startswith("published plan version 2")
    rows, _ = listing(broker.url, toml, capsys)  # what every worker does: refuse it, keep serving version 1
    assert rows[1] == ("*", "") and rows[2][0] == "refused" and rows[2][1].startswith(
        "refused at load: the pipeline config and the artifact disagree: the plan was fitted on features "
        "['priors_count', 'age']")


@pytest.mark.integration
def test_artifacts_list_shows_which_workers_serve_each_version(broker, tmp_path, capsys):
    toml, config = pipeline_toml(tmp_path, "cli-served")
    ensure_topics(broker.bootstrap, config.topics)
    publish = ["artifacts", "publish", "--broker", broker.url, "--config", str(toml)]
    for seed in (1, 2):
        artifacts.save(tiny_plan(["age", "hours-per-week"], seed).to_artifact(), tmp_path / f"plan-{seed}.json")
    assert run_main([*publish, str(tmp_path / "plan-1.json")], capsys)[0] == 0
    worker = WorkerProcess(config, broker.bootstrap, tmp_path / "run").start()
    try:
        assert worker.wait_for_log("serves plan v1", timeout=90), worker.log_tail()
        name = re.search(r"announced on cli-served\.control: (\S+) serves plan v1", worker.log_path.read_text())[1]
        assert name.startswith(f"cli-served-adult@{socket.gethostname()}:")
        rows, _ = listing(broker.url, toml, capsys)
        assert rows[1][0] == "*" and rows[1][1].startswith(f"{name} (") and rows[1][1].endswith(" ago)")
        assert run_main([*publish, str(tmp_path / "plan-2.json")], capsys)[0] == 0
        assert worker.wait_for_log("serves plan v2", timeout=60), worker.log_tail()
        rows, out = listing(broker.url, toml, capsys)
        assert rows[1] == ("-", "") and rows[2][0] == "*" and rows[2][1].startswith(f"{name} (")
        assert f"  {name}  serves plan v2  (announced " in out
        compas = artifacts.save(tiny_plan(["priors_count", "age"]).to_artifact(), tmp_path / "compas-plan.json")
        assert run_main([*publish, str(compas), "--force"], capsys)[0] == 0
        assert worker.wait_for_log("refused publish of plan version 3", timeout=60), worker.log_tail()
        rows, _ = listing(broker.url, toml, capsys)  # the listing says what the worker did, and the worker agrees
        assert rows[3][0] == "refused" and rows[3][1].startswith("refused at load: the pipeline config and")
        assert rows[2][0] == "*" and rows[2][1].startswith(f"{name} (")
    finally:
        worker.stop()
    rows, out = listing(broker.url, toml, capsys)
    assert rows[2] == ("*", "") and f"  {name}  stopped  (announced " in out  # a clean stop says it left


@pytest.mark.integration
def test_artifacts_history_shows_who_published_and_rolled_back_and_why(broker, tmp_path, capsys):
    toml, config = pipeline_toml(tmp_path, "cli-history")
    common = ["--broker", broker.url, "--config", str(toml)]
    plans = [artifacts.save(tiny_plan(["age", "hours-per-week"], seed).to_artifact(), tmp_path / f"plan-{seed}.json")
             for seed in (1, 2, 3)]
    assert run_main(["artifacts", "history", *common], capsys)[:2] == (0, "(no artifact records on "
                                                                          "cli-history.control)\n")
    publish = ["artifacts", "publish", *common, "--by", "alice", "--reason", "first plan for the Adult pipeline"]
    assert run_main([*publish, str(plans[0])], capsys)[0] == 0
    assert run_main(["artifacts", "publish", *common, str(plans[1])], capsys)[0] == 0  # nobody named: user@host
    rollback = ["artifacts", "rollback", "plan", *common, "--by", "bob", "--reason", "v2 widened the gap"]
    assert run_main(rollback, capsys)[0] == 0
    figures = {"E": 0.0123456, "current E": 0.2}  # a service's publish, with the figures that decided it
    ControlClient(broker.bootstrap, config.topics, ArtifactStore(config.artifact_dir)).publish_sync(
        artifacts.load(plans[2]), actor="refit@host", reason="schedule", statistics=figures)
    code, out, err = run_main(["artifacts", "history", *common], capsys)
    assert code == 0 and err == "" and len(out.splitlines()) == 4
    fields = [re.split(r"\s{2,}", line) for line in out.splitlines()]
    assert [row[1:] for row in fields] == [["plan", "v1", "publish", "alice", "first plan for the Adult pipeline"],
                                           ["plan", "v2", "publish", default_actor(), "-"],
                                           ["plan", "v1", "rollback", "bob", "v2 widened the gap"],
                                           ["plan", "v3", "publish", "refit@host", "schedule",
                                            "E=0.01235, current E=0.2"]]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", row[0]) for row in fields)
    code, out, _ = run_main(["artifacts", "history", *common, "--kind", "plan", "--json"], capsys)
    entries = [json.loads(line) for line in out.splitlines()]
    assert [(e["version"], e["action"], e["actor"], e["reason"]) for e in entries] == [
        (1, "publish", "alice", "first plan for the Adult pipeline"), (2, "publish", default_actor(), None),
        (1, "rollback", "bob", "v2 widened the gap"), (3, "publish", "refit@host", "schedule")]
    assert [e["statistics"] for e in entries] == [{}, {}, {}, figures]
    assert run_main(["artifacts", "history", *common, "--kind", "flow", "--json"], capsys)[:2] == (0, "")


@pytest.mark.integration
def test_under_approval_a_publish_is_a_candidate_a_person_approves_or_rejects(broker, tmp_path, capsys):
    toml, _ = pipeline_toml(tmp_path, "cli-approve", promotion="approve")
    common = ["--broker", broker.url, "--config", str(toml)]
    plans = [artifacts.save(tiny_plan(["age", "hours-per-week"], seed).to_artifact(), tmp_path / f"plan-{seed}.json")
             for seed in (1, 2)]
    sha = [artifacts.load(plan).sha256[:12] for plan in plans]
    code, out, err = run_main(["artifacts", "publish", *common, "--by", "refit@host", str(plans[0])], capsys)
    assert (code, out) == (0, f"published plan version 1 as a candidate (sha256 {sha[0]}, inline) to "
                              "cli-approve.control: promotion is 'approve', so the workers shadow it until "
                              "'fairstream artifacts approve plan 1' or 'reject'\n"), err
    code, out, err = run_main(["artifacts", "approve", "plan", "2", *common, "--by", "alice", "--reason", "ok"],
                              capsys)
    assert (code, out, err) == (1, "", "fairstream artifacts: error: refusing to approve: plan version 2 is not a "
                                       "pending candidate (pending: version 1)\n")
    assert run_main(["artifacts", "rollback", "plan", *common], capsys)[2] == (
        "fairstream artifacts: error: no plan version ever served on cli-approve.control (only candidates that were "
        "never promoted or approved): nothing to roll back to\n")
    approve = ["artifacts", "approve", "plan", "1", *common, "--by", "alice", "--reason", "closes the gap for women"]
    assert run_main(approve, capsys)[:2] == (0, f"approved plan version 1 (sha256 {sha[0]}) as alice: the workers "
                                                "serve it once they read this\n")
    assert run_main(["artifacts", "publish", *common, "--by", "refit@host", str(plans[1])], capsys)[0] == 0
    reject = ["artifacts", "reject", "plan", "2", *common, "--by", "bob", "--reason", "accuracy dropped"]
    assert run_main(reject, capsys)[:2] == (0, f"rejected plan version 2 (sha256 {sha[1]}) as bob: it will not serve\n")
    assert run_main(reject, capsys)[2] == ("fairstream artifacts: error: refusing to reject: plan version 2 was "
                                           "already rejected by bob at offset 3 (no candidate of plan is pending)\n")
    rows, _ = listing_rows(broker.url, toml, capsys)
    assert [(r["version"], r["action"], r["via"], r["mark"], r["state"], r["actor"]) for r in rows] == [
        (1, "publish", "inline", "-", "active", "refit@host"), (1, "approve", "-", "*", "active", "alice"),
        (2, "publish", "inline", "-", "rejected", "refit@host"), (2, "reject", "-", "-", "rejected", "bob")]
    code, out, _ = run_main(["artifacts", "history", *common], capsys)
    assert [re.split(r"\s{2,}", line)[1:] for line in out.splitlines()] == [
        ["plan", "v1", "candidate", "refit@host", "-"], ["plan", "v1", "approve", "alice", "closes the gap for women"],
        ["plan", "v2", "candidate", "refit@host", "-"], ["plan", "v2", "reject", "bob", "accuracy dropped"]]
    code, out, _ = run_main(["artifacts", "history", *common, "--json"], capsys)
    assert [(e["action"], e["candidate"]) for e in map(json.loads, out.splitlines())] == [
        ("publish", True), ("approve", False), ("publish", True), ("reject", False)]


@pytest.mark.integration
def test_under_shadow_the_first_publish_serves_at_once_and_says_why(broker, tmp_path, capsys):
    toml, _ = pipeline_toml(tmp_path, "cli-shadow", promotion="shadow")
    common = ["--broker", broker.url, "--config", str(toml), "--by", "refit@host"]
    plans = [artifacts.save(tiny_plan(["age", "hours-per-week"], seed).to_artifact(), tmp_path / f"plan-{seed}.json")
             for seed in (1, 2)]
    sha = [artifacts.load(plan).sha256[:12] for plan in plans]
    code, out, err = run_main(["artifacts", "publish", *common, str(plans[0])], capsys)
    assert (code, out) == (0, f"published plan version 1 (sha256 {sha[0]}, inline) to cli-shadow.control: promotion "
                              "is 'shadow', but no plan version served yet (there is no active chain to compare it "
                              "with): it serves at once, as under 'auto'\n"), err
    code, out, err = run_main(["artifacts", "publish", *common, str(plans[1])], capsys)
    assert (code, out) == (0, f"published plan version 2 as a candidate (sha256 {sha[1]}, inline) to "
                              "cli-shadow.control: promotion is 'shadow', so the workers shadow it until the shadow "
                              "policy's promotion or retirement\n"), err


def test_a_statistic_name_cannot_forge_a_line_of_the_audit_trail():
    forged = "x\n2026-11-24T15:00:00Z  plan  v1  approve  Ada Lovelace  looked at it"
    line = cli._history_line({"at": 0.0, "kind": "plan", "version": 1, "action": "publish", "actor": "refit@h",
                              "reason": "drift\nagain", "statistics": {"E": 0.01, forged: 1.0}, "candidate": False,
                              "signer": "refit\nforged", "refused": "no\n2026-11-24T15:00:00Z  plan  v2  approve"})
    assert line == ("1970-01-01T00:00:00Z  plan          v1      publish    refit@h  drift again  E=0.01, x "
                    "2026-11-24T15:00:00Z plan v1 approve Ada Lovelace looked at it=1  [claims refit forged]  "
                    "REFUSED: no 2026-11-24T15:00:00Z plan v2 approve")


@pytest.mark.parametrize("action", ["approve", "reject"])
def test_a_decision_without_a_reason_is_refused_before_anything_starts(action, tmp_path, capsys):
    toml, _ = pipeline_toml(tmp_path, "cli-reason")
    with pytest.raises(SystemExit) as exited:
        main(["artifacts", action, "plan", "1", "--broker", UNREACHABLE, "--config", str(toml)])
    assert exited.value.code == 2 and "the following arguments are required: --reason" in capsys.readouterr().err


def test_artifacts_report_writes_the_report_of_a_version_and_prints_its_path(broker, tmp_path, capsys, monkeypatch):
    from fairstream.streams.refit import report

    toml, config = pipeline_toml(tmp_path, "cli-report")
    calls = []

    def write_report(config, bootstrap, kind, version, out=None, sample=2000):
        calls.append((config.topics.prefix, bootstrap, kind, version, out, sample))
        return Path(out)

    monkeypatch.setattr(report, "write_report", write_report)
    command = ["artifacts", "report", "plan", "3", "--broker", broker.url, "--config", str(toml),
               "--out", str(tmp_path / "plan-3.html"), "--sample", "500"]
    assert run_main(command, capsys)[:2] == (0, f"{tmp_path / 'plan-3.html'}\n")
    assert calls == [("cli-report", broker.bootstrap, "plan", 3, tmp_path / "plan-3.html", 500)]


@pytest.mark.parametrize("option, value, message", [("--by", "", "--by must not be empty"),
                                                    ("--by", "x" * 201, "--by must be at most 200 characters, got 201"),
                                                    ("--reason", " ", "--reason must not be empty"),
                                                    ("--reason", "r" * 1001,
                                                     "--reason must be at most 1000 characters, got 1001")])
def test_who_and_why_are_refused_in_one_line_before_anything_starts(option, value, message, tmp_path, capsys):
    toml, _ = pipeline_toml(tmp_path, "cli-audit")
    command = ["artifacts", "rollback", "plan", "--broker", UNREACHABLE, "--config", str(toml), option, value]
    assert run_main(command, capsys) == (1, "", f"fairstream artifacts: error: {message}\n")


def test_replay_sends_at_most_limit_records_bad_ones_included(broker, tmp_path, capsys):
    run = ["--broker", broker.url, "--config", str(ADULT_TOML), "--quiet"]
    code, out, err = run_main(["replay", *run, "--limit", "300", "--bad", "20"], capsys)
    assert (code, out) == (0, "sent 300 of 300 records to fairstream.records.in\n"), err
    code, out, err = run_main(["replay", "--broker", UNREACHABLE, "--config", str(ADULT_TOML), "--limit", "5",
                               "--bad", "6"], capsys)  # refused before any connection
    assert (code, out, err) == (1, "", "fairstream replay: error: --bad 6 exceeds --limit 5 (the records sent at most, "
                                       "the bad ones included)\n")


@pytest.mark.parametrize("extra, message", [
    (["--source", "{csv}"], "{csv}: CSV header ['age', 's', 'u'] lacks feature column(s) ['hours-per-week']"),
    (["--kind", "embedding", "--source", "{missing}"], "--source {missing}: no such file"),
    (["--kind", "embedding"], "an embedding re-fit reads labelled embeddings from a file: --source PATH"),
    (["--source", "{garbled}"], "--source {garbled}: not a UTF-8 text file"),
    (["--source", "{invalid}"], "--source {invalid}: no valid research record (1 invalid, e.g. "),
    (["--source", "{folder}"], "--source {folder}: a directory"),
], ids=["csv without a feature", "no such file", "embeddings from the topic", "garbled bytes", "no valid row",
        "a directory"])
def test_refit_refuses_its_source_in_one_line_before_connecting(extra, message, tmp_path, capsys):
    csv, missing = tmp_path / "research.csv", tmp_path / "faces.npz"
    csv.write_text("age,s,u\n30,0,1\n")
    (tmp_path / "garbled.csv").write_bytes(b"age,s\n\xff\xfe\x00\x81")
    (tmp_path / "invalid.csv").write_text("age,hours-per-week,s,u,y\n30,-5,0,1,1\n")  # hours below their range
    fill = {"csv": str(csv), "missing": str(missing), "garbled": str(tmp_path / "garbled.csv"),
            "invalid": str(tmp_path / "invalid.csv"), "folder": str(tmp_path)}
    code, out, err = run_main(["refit", "--config", str(ADULT_TOML), "--broker", UNREACHABLE,
                               *[arg.format(**fill) for arg in extra]], capsys)
    assert code == 1 and err.count("\n") == 1 and message.format(**fill) in err, err  # not the broker's error


def test_the_kafka_clients_info_lines_are_kept_off_a_command_unless_debugging(tmp_path, capsys):
    import logging

    root = logging.getLogger()
    level, root.level = root.level, logging.INFO  # as `refit` and `worker` configure it
    try:
        run_main(["replay", "--config", str(tmp_path / "nope.toml")], capsys)
        assert not any(logging.getLogger(name).isEnabledFor(logging.INFO) for name in ("aiokafka", "kafka"))
    finally:
        root.level = level


# --------------------------------------------------------------------------- finding the broker from anywhere

NO_BROKER = ("fairstream {command}: error: no broker: start one with 'fairstream broker start' (or pass --broker URL / "
             "set FAIRSTREAM_BROKER)\n")


@contextlib.contextmanager
def background(*args, cwd: Path):
    """``fairstream ARGS`` running in the background (output in cwd/out.log), stopped for good afterwards."""
    with open(cwd / "out.log", "w") as out:
        process = subprocess.Popen([sys.executable, "-m", "fairstream.streams.cli", *args], cwd=cwd, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def refuse_to_start(self):
    raise AssertionError("a command that must not start a broker started one")


@pytest.fixture
def own_runtime_dir(monkeypatch, tmp_path) -> Path:
    """A runtime directory of this test's own (commands run as subprocesses inherit it)."""
    monkeypatch.setenv("FAIRSTREAM_RUNTIME_DIR", str(tmp_path / "runtime"))
    for folder in ("here", "elsewhere"):
        (tmp_path / folder).mkdir()
    return tmp_path / "runtime"


@pytest.mark.integration
def test_a_started_broker_is_found_and_stopped_from_any_directory(own_runtime_dir, tmp_path):
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    with background("broker", "start", cwd=here) as started:
        state = wait_for(running_broker, 60, "state file of 'fairstream broker start'")
        assert state.log == str(here / "runs" / "broker" / "broker.log")
        assert fairstream("broker", "status", cwd=elsewhere).stdout == f"{state.url}\n"
        second = fairstream("broker", "start", cwd=elsewhere, check=False)
        assert (second.returncode, second.stdout, second.stderr) == (
            1, "", f"fairstream broker: error: the embedded broker already runs at {state.url} (pid {state.pid}) and "
                   "every command uses it; 'fairstream broker stop' stops it\n")
        stop = fairstream("broker", "stop", cwd=elsewhere)
        assert stop.stdout == f"stopped the embedded broker at {state.url} (pid {state.pid})\n"
        assert started.wait(timeout=30) == 0
    assert not state_path().exists() and not is_alive(state.pid)
    status = fairstream("broker", "status", cwd=elsewhere, check=False)
    assert (status.returncode, status.stdout) == (1, "no running local broker\n")


def test_a_command_without_a_broker_says_how_to_get_one_and_starts_none(own_runtime_dir, tmp_path):
    own_runtime_dir.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    write_state(BrokerState("kafka://127.0.0.1:1", gone.pid, "broker.log"))  # stale: its broker died unannounced
    result = fairstream("artifacts", "list", "--config", str(ADULT_TOML), "--run-dir", "run", cwd=tmp_path,
                        check=False)
    assert (result.returncode, result.stdout, result.stderr) == (1, "", NO_BROKER.format(command="artifacts"))
    assert not (tmp_path / "run").exists() and not state_path().exists()


@pytest.mark.parametrize("command", [["artifacts", "publish", "{plan}"], ["artifacts", "rollback", "plan"],
                                     ["replay", "--limit", "5", "--quiet"], ["refit", "--kind", "plan"]], ids=" ".join)
def test_only_worker_demo_and_broker_start_may_start_a_broker(command, own_runtime_dir, tmp_path, monkeypatch,
                                                              capsys):
    monkeypatch.setattr(EmbeddedBroker, "start", refuse_to_start)
    plan = artifacts.save(tiny_plan(["age", "hours-per-week"]).to_artifact(), tmp_path / "plan.json")
    argv = [arg.format(plan=plan) for arg in command]
    code, out, err = run_main([*argv, "--config", str(ADULT_TOML), "--run-dir", str(tmp_path / "run")], capsys)
    assert (code, out, err) == (1, "", NO_BROKER.format(command=command[0]))
    assert not (tmp_path / "run").exists()


@pytest.mark.integration
def test_a_worker_that_started_its_own_broker_is_found_by_status_and_replay(own_runtime_dir, tmp_path):
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    with background("worker", "--config", str(ADULT_TOML), "--metrics-port", "off", cwd=here) as worker:
        state = wait_for(running_broker, 90, "state file of the worker's broker")
        assert fairstream("broker", "status", cwd=elsewhere).stdout == f"{state.url}\n"
        replay = fairstream("replay", "--config", str(ADULT_TOML), "--limit", "20", "--quiet", cwd=elsewhere)
        assert replay.stdout == "sent 20 of 20 records to fairstream.records.in\n"
        log = here / "out.log"  # stopped once up: a stop while its consumers still join waits 30 s for them
        wait_for(lambda: all(f"{agent}: partitions assigned" in log.read_text() for agent in ("records", "embeddings")),
                 90, "worker's consumers")
        worker.terminate()
        assert worker.wait(timeout=90) == 0, log.read_text()[-3000:]
    assert not state_path().exists() and not is_alive(state.pid)  # the worker's broker went with it


@pytest.mark.integration
def test_the_broker_option_beats_the_environment_which_beats_the_state_file(broker, own_runtime_dir, tmp_path,
                                                                           monkeypatch, capsys):
    toml, _ = pipeline_toml(tmp_path, "cli-found")
    plan = artifacts.save(tiny_plan(["age", "hours-per-week"]).to_artifact(), tmp_path / "plan.json")
    assert run_main(["artifacts", "publish", str(plan), "--broker", broker.url, "--config", str(toml)], capsys)[0] == 0
    node = broker.nodes[0]
    write_state(BrokerState(broker.url, node.pid, str(node.log_path), kind="kafka"))  # as if 'kafka start' had run
    monkeypatch.setattr(EmbeddedBroker, "start", refuse_to_start)
    listing = ["artifacts", "list", "--config", str(toml)]
    code, out, err = run_main(listing, capsys)
    assert code == 0 and out.splitlines()[1].split()[:2] == ["plan", "1"], out + err  # found through the state file
    monkeypatch.setenv("FAIRSTREAM_BROKER", "nowhere")
    assert run_main(listing, capsys) == (1, "", "fairstream artifacts: error: FAIRSTREAM_BROKER: broker address "
                                                "'nowhere' in 'nowhere' is not host:port\n")
    code, out, err = run_main([*listing, "--broker", broker.url], capsys)
    assert code == 0 and out.splitlines()[1].split()[:2] == ["plan", "1"], out + err
    assert run_main([*listing, "--broker", "nowhere"], capsys)[2].startswith("fairstream artifacts: error: --broker: ")


def test_broker_status_waits_for_a_broker_that_is_still_starting_and_gives_up_at_its_deadline(own_runtime_dir, capsys,
                                                                                                monkeypatch):
    from fairstream.streams.ops import broker as broker_module

    announced = broker_module.BrokerState(url="kafka://127.0.0.1:1", pid=os.getpid(), log="broker.log")
    polls = iter([None, None, announced])  # `broker start &` announces itself on the third look
    monkeypatch.setattr(broker_module, "running_broker", lambda: next(polls))
    assert run_main(["broker", "status", "--wait", "5"], capsys)[:2] == (0, "kafka://127.0.0.1:1\n")
    monkeypatch.setattr(broker_module, "running_broker", lambda: None)
    began = time.monotonic()
    code, out, _ = run_main(["broker", "status", "--wait", "0.5"], capsys)
    assert (code, out) == (1, "no running local broker after waiting 0.5 s\n") and time.monotonic() - began >= 0.5


def test_fairstream_config_names_every_commands_default_pipeline(monkeypatch, tmp_path, capsys):
    # A container sets it once (docker/compose.yaml) so that `run --rm cli refit ...` uses the stack's pipeline.
    missing = tmp_path / "pipeline.toml"
    monkeypatch.setenv("FAIRSTREAM_CONFIG", str(missing))
    code, _, err = run_main(["replay", "--broker", UNREACHABLE], capsys)
    assert code == 1 and str(missing) in err and err.count("\n") == 1, err


@pytest.mark.parametrize("argv, message", [
    (["replay", "--bad", "-1", "--limit", "5"], "argument --bad: expected a whole number >= 0, got '-1'"),
    (["replay", "--limit", "-5"], "argument --limit: expected a whole number >= 0, got '-5'"),
    (["replay", "--rate", "0"], "argument --rate: expected a number > 0, got '0'"),
    (["tail", "dlq", "--timeout", "-1"], "argument --timeout: expected a number >= 0, got '-1'"),
    (["broker", "status", "--wait", "nan"], "argument --wait: expected a number >= 0, got 'nan'"),
], ids=["negative bad", "negative limit", "zero rate", "negative timeout", "nan wait"])
def test_counts_rates_and_waits_out_of_their_range_are_refused_by_the_parser(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_output_cut_short_by_its_reader_ends_quietly():
    # `fairstream alerts | head -1`: the reader is gone before the command writes.
    command = subprocess.Popen([sys.executable, "-m", "fairstream.streams.cli", "alerts", "--config", str(ADULT_TOML)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    command.stdout.close()
    assert command.wait(timeout=60) == 141 and command.stderr.read() == b""
    command.stderr.close()
