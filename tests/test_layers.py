"""The rooms' import rules: repair <- models <- streams, no stream client below streams/, and the rooms inside streams/."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "fairstream"  # the rooms are its folders
ROOMS = {"repair": "fairstream.repair", "models": "fairstream.models", "streams": "fairstream.streams"}
STREAM_CLIENTS = ("faust", "kafka", "aiokafka", "mode", "river", "prometheus_client")
# The estimator-convention tests use scikit-learn and `make reproduce` compares with Fairlearn (which brings
# pandas): the product never imports them.
TEST_ONLY = ("sklearn", "fairlearn", "pandas")
FORBIDDEN = {
    "repair": ("fairstream.models", "fairstream.streams", "torch", *STREAM_CLIENTS, *TEST_ONLY),
    "models": ("fairstream.streams", *STREAM_CLIENTS, *TEST_ONLY),
    "streams": TEST_ONLY,
}


STREAMS_ROOMS = {
    # a room inside streams/ -> the other rooms inside streams/ it may import. Every room may import the shared
    # layer: the modules at the top of streams/ (config, schemas, topics, kafka, parsing) and the packages of
    # SHARED_PACKAGES (the codec: one module per message); only cli.py, the command line at the top, may import any room.
    "shared": (),  # streams/*.py but cli.py, and streams/codec/
    "control": (),
    "worker": ("control",),
    "refit": ("control",),
    "ops": ("worker",),  # alert_rules renders the rules from the worker's metric families
    "demo": ("control", "ops", "refit", "worker"),
}
SHARED_PACKAGES = ("codec",)  # folders of streams/ that belong to the shared layer, not rooms


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
    for path in sorted((PACKAGE / room).rglob("*.py")):
        parts = path.relative_to(PACKAGE / room).with_suffix("").parts[:-1]
        yield path, ".".join([ROOMS[room], *parts])


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_imports_point_down_only(room):
    broken = [
        f"{path.relative_to(PACKAGE)}:{line} imports {name}"
        for path, package in room_files(room)
        for line, name in imports_of(path, package)
        if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN[room])
    ]
    assert not broken, "\n".join(broken)


def streams_room(path: Path) -> str | None:
    """The room inside streams/ a file of it belongs to: its folder, ``shared`` at the top (and in the shared
    packages), None for cli.py."""
    parts = path.relative_to(PACKAGE / "streams").parts
    if len(parts) > 1:
        return "shared" if parts[0] in SHARED_PACKAGES else parts[0]
    return None if parts[0] == "cli.py" else "shared"


def streams_room_violations(path: Path, package: str, room: str) -> list[str]:
    """Imports of a file of ``room`` that reach a room inside streams/ it may not import."""
    broken = []
    for line, name in imports_of(path, package):
        parts = (name or "").split(".")
        if parts[:2] == ["fairstream", "streams"] and len(parts) > 2 and parts[2] in STREAMS_ROOMS \
                and parts[2] != room and parts[2] not in STREAMS_ROOMS[room]:
            broken.append(f"{path.relative_to(PACKAGE) if path.is_relative_to(PACKAGE) else path}:{line} imports {name}")
    return broken


def test_every_folder_of_streams_is_a_room_with_rules():
    folders = {path.name for path in (PACKAGE / "streams").iterdir() if (path / "__init__.py").exists()}
    assert folders - set(SHARED_PACKAGES) == STREAMS_ROOMS.keys() - {"shared"}


@pytest.mark.parametrize("room", sorted(STREAMS_ROOMS))
def test_rooms_inside_streams_import_only_the_rooms_they_may(room):
    broken = [violation for path, package in room_files("streams") if streams_room(path) == room
              for violation in streams_room_violations(path, package, room)]
    assert not broken, "\n".join(broken)


def test_the_streams_rule_checker_sees_a_violation(tmp_path):
    bad = tmp_path / "app.py"
    bad.write_text("from fairstream.streams.ops.broker import parse_broker_url\nfrom ..control import registry\n"
                   "from .monitor import FairnessMonitor\nfrom fairstream.streams import parsing\n")
    assert streams_room_violations(bad, "fairstream.streams.worker", "worker") == [
        f"{bad}:1 imports fairstream.streams.ops.broker"]


def test_the_rule_checker_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from ..streams.worker import app\nimport faust\n")
    assert imports_of(bad, "fairstream.repair") == [(1, "fairstream.streams.worker"), (2, "faust")]


def test_applying_frozen_modules_and_running_a_worker_never_imports_torch():
    code = ("import sys, fairstream.models.kinds, fairstream.streams.worker.app, fairstream.streams.cli; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
