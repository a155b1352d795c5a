"""The command line as a user runs it: real subprocesses, the real embedded broker."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fairstream.streams import cli
from fairstream.streams.cli import build_parser, main
from fairstream.streams.ops.broker import EmbeddedBroker

COMMANDS = ["repair", "broker", "worker", "replay", "artifacts", "refit", "demo", "alerts"]


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


def test_batch_repair_job_writes_report_artifact_and_plot(tmp_path):
    out = fairstream("repair", "--dataset", "simulation", "--n-research", "500", "--n-q", "50", "--out", "run",
                     "--quiet", cwd=tmp_path).stdout
    assert "archive E reduced" in out
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["evaluations"]["archive"]["E_after_total"] < report["evaluations"]["archive"]["E_before_total"] / 3
    assert (tmp_path / "run" / "plan-v1.json").exists() and (tmp_path / "run" / "distributions.png").stat().st_size > 10_000


def test_artifacts_publish_list_and_rollback(tmp_path):
    fairstream("repair", "--dataset", "simulation", "--n-research", "500", "--n-q", "30", "--out", "run", "--quiet",
               cwd=tmp_path)
    with EmbeddedBroker(tmp_path / "broker") as broker:
        url = ["--broker", broker.url]
        assert "version 1" in fairstream("artifacts", "publish", "run/plan-v1.json", *url, cwd=tmp_path).stdout
        assert "version 2" in fairstream("artifacts", "publish", "run/plan-v1.json", *url, cwd=tmp_path).stdout
        assert "back to version 1" in fairstream("artifacts", "rollback", "plan", *url, cwd=tmp_path).stdout
        rows = fairstream("artifacts", "list", *url, cwd=tmp_path).stdout.splitlines()[1:]
        assert [(r.split()[1], r.split()[3], r.rstrip().endswith("*")) for r in rows] == [
            ("1", "publish", False), ("2", "publish", False), ("1", "rollback", True)]
        failed = fairstream("artifacts", "rollback", "plan", *url, cwd=tmp_path, check=False)
        assert failed.returncode != 0 and "nothing to roll back to: no plan version was active before version 1" in failed.stderr
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
