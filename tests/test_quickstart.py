"""The README's quick start runs as written: its ``sh`` blocks, pasted one by one into one bash, against the embedded broker.

docs/getting-started.md walks the same commands with explanations: each line of the README's blocks is one of its
lines (comments aside), so the page cannot drift from what runs here.

The blocks are read from README.md (never copied here) and fed to a single bash process in order, as
a person pasting them would: background jobs, shell variables and the broker it starts carry from
one block to the next. Each block must succeed in every command (an ERR trap reports any that
fails); the repaired records must carry a score and a decision, and ``/metrics`` must count them.
The one change to the text: the worker's metrics port 9464 becomes a free one, so the test can run
beside a worker on the default port.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fairstream.streams.ops.broker import stop_running_broker
from fairstream.streams.ops.processes import free_port

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
GETTING_STARTED = REPO / "docs" / "getting-started.md"
README_METRICS_PORT = "9464"
DONE = "__quickstart_done__"
FAILED = "__quickstart_failed__"
DEADLINE_SECONDS = 240.0  # the whole run; about 60 s on an idle 2-core machine


def quickstart_blocks(readme: str) -> list[str]:
    """The ``sh`` code blocks of the "## Quick start" section of a page (the README's, or the docs'), in order."""
    _, found, rest = readme.partition("\n## Quick start\n")
    assert found, "no '## Quick start' section"
    section = rest.split("\n## ", 1)[0]
    return re.findall(r"^```sh\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)


class PastingShell:
    """One bash reading blocks from a pipe; each block's output and exit status come back through a marker line."""

    def __init__(self, cwd: Path, env: dict[str, str]):
        self.process = subprocess.Popen(["bash"], cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._send(f"trap 'echo \"{FAILED} $BASH_COMMAND (exit $?)\"' ERR\n")

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _send(self, text: str) -> None:
        self.process.stdin.write(text)
        self.process.stdin.flush()

    def paste(self, block: str, deadline: float) -> tuple[int, str]:
        """Run ``block``; its exit status and everything printed meanwhile (background jobs included)."""
        self._send(f"{block}\necho \"{DONE} $?\"\n")
        output = []
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                pytest.fail(f"bash exited while running:\n{block}\noutput:\n{''.join(output)}")
            if line.startswith(DONE):
                return int(line.split()[1]), "".join(output)
            output.append(line)
        pytest.fail(f"still running at the deadline:\n{block}\noutput so far:\n{''.join(output)}")

    def kill(self) -> None:
        """Stop bash and every job it started (they share its process group)."""
        for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            time.sleep(0.5)  # background jobs of a dead shell may outlive it by a moment


def test_the_getting_started_page_walks_the_same_quick_start():
    def lines(page: Path) -> list[str]:
        return [line.split(" #", 1)[0].strip() for block in quickstart_blocks(page.read_text())
                for line in block.splitlines() if line.strip()]

    explained = lines(GETTING_STARTED)
    missing = [line for line in lines(README) if line not in explained]
    assert not missing, f"docs/getting-started.md's quick start lacks the README's lines {missing}"


def test_the_readme_quick_start_is_ten_lines_at_most():
    lines = [line for block in quickstart_blocks(README.read_text()) for line in block.splitlines() if line.strip()]
    assert 0 < len(lines) <= 10, f"the README's quick start has {len(lines)} lines; the walk belongs in {GETTING_STARTED}"


@pytest.mark.integration
def test_the_quick_start_runs_as_written(tmp_path, monkeypatch):
    blocks = quickstart_blocks(README.read_text())
    assert blocks and any(README_METRICS_PORT in block for block in blocks)
    port = str(free_port())
    blocks = [block.replace(README_METRICS_PORT, port) for block in blocks]
    runtime = tmp_path / "runtime"
    monkeypatch.setenv("FAIRSTREAM_RUNTIME_DIR", str(runtime))  # this process's cleanup finds the same broker
    workdir = tmp_path / "checkout"
    workdir.mkdir()
    (workdir / "deploy").symlink_to(REPO / "deploy")  # the pipeline config; runs/ lands in the tmp dir
    env = {key: value for key, value in os.environ.items() if not key.startswith("FAIRSTREAM_")}
    env.update(FAIRSTREAM_RUNTIME_DIR=str(runtime), PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}")
    shell = PastingShell(workdir, env)
    outputs = []
    deadline = time.monotonic() + DEADLINE_SECONDS
    try:
        for block in blocks:
            status, output = shell.paste(block, deadline)
            assert status == 0 and FAILED not in output, f"block failed (exit {status}):\n{block}\noutput:\n{output}"
            outputs.append(output)
        assert not runtime.joinpath("broker.json").exists(), "the last block stops the broker"
    finally:
        shell.kill()
        stop_running_broker()
    everything = "".join(outputs)
    # The commands print their results; their clients' INFO lines and version warnings stay off (--debug shows them).
    noise = [line for line in everything.splitlines() if re.search(r" (INFO|WARNING) (kafka|aiokafka|fairstream)", line)]
    assert not noise, "\n".join(noise)
    repaired = [json.loads(line) for line in everything.splitlines() if line.startswith('{"id"')]
    assert len(repaired) >= 3, everything
    for record in repaired:
        assert 0.0 <= record["score"] <= 1.0 and record["decision"] in (0, 1)
        assert [module["kind"] for module in record["provenance"]["chain"]] == ["plan", "scorer"]
    assert "rolled plan back to version 1" in everything
    counted = re.search(r"^fairstream_records_repaired_total\{[^}]*\} (\S+)$", everything, flags=re.MULTILINE)
    assert counted and float(counted.group(1)) > 0, everything
