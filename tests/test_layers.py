"""The rooms' import rules: repair <- models <- streams, and no stream client below streams/."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROOMS = {"repair": "fairstream.repair", "models": "fairstream.models", "streams": "fairstream.streams"}
STREAM_CLIENTS = ("faust", "kafka", "aiokafka", "mode", "river", "prometheus_client")
TEST_ONLY = ("sklearn",)  # the estimator-convention tests use scikit-learn; the product never imports it
FORBIDDEN = {
    "repair": ("fairstream.models", "fairstream.streams", "torch", *STREAM_CLIENTS, *TEST_ONLY),
    "models": ("fairstream.streams", *STREAM_CLIENTS, *TEST_ONLY),
    "streams": TEST_ONLY,
}


def imports_of(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a file, relative ones resolved."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.append((node.lineno, ".".join(base + ([node.module] if node.module else []))))
            else:
                found.append((node.lineno, node.module))
    return found


def room_files(room: str):
    for path in sorted((ROOT / room).rglob("*.py")):
        parts = path.relative_to(ROOT / room).with_suffix("").parts[:-1]
        yield path, ".".join([ROOMS[room], *parts])


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_imports_point_down_only(room):
    broken = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path, package in room_files(room)
        for line, name in imports_of(path, package)
        if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN[room])
    ]
    assert not broken, "\n".join(broken)


def test_the_rule_checker_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from ..streams.worker import app\nimport faust\n")
    assert imports_of(bad, "fairstream.repair") == [(1, "fairstream.streams.worker"), (2, "faust")]


def test_applying_frozen_modules_and_running_a_worker_never_imports_torch():
    code = ("import sys, fairstream.models.kinds, fairstream.streams.worker.app, fairstream.streams.cli; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
