"""The command line as a user runs it: real subprocesses, the real embedded broker."""

import json
import subprocess
import sys

import pytest

from fairstream.streams.cli import build_parser
from fairstream.streams.ops.broker import EmbeddedBroker

COMMANDS = ["repair", "broker", "worker", "replay", "artifacts", "refit", "demo"]


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
