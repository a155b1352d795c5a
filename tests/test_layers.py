"""The rooms' import rules: repair <- models <- streams, no stream client below streams/, and the rooms inside streams/.

An import hidden in a string counts as one: a string that names a module (``"fairstream.streams.refit.trainers"``,
``"package.module:Class"``), as ``importlib.import_module`` or an entry-point-style path would use it, obeys the
same rules. Docstrings (the first statement of a module, class or function) are documentation, not imports.
"""

from __future__ import annotations

import ast
import re
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
    "agent": ("control", "worker"),  # the pipeline's monitor: the workers' windows, detectors and metric families
    "demo": ("agent", "control", "ops", "refit", "worker"),
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


MODULE_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(:[A-Za-z_][\w.]*)?|[A-Za-z_]\w*:[A-Za-z_][\w.]*")
"""A string that names a module: dotted (``a.b``), or with an attribute (``a:Name``, ``a.b:Name``). A single word
is not taken for a module: it is far more often an ordinary word (``"mode"``, ``"river"``)."""


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string nodes that are docstrings: the first statement of a module, class or function."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
                    isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def modules_named_in_strings(path: Path) -> list[tuple[int, str]]:
    """(line, module name) of every string constant, docstrings aside, that names a module (``"a.b:Name"`` -> a.b)."""
    tree = ast.parse(path.read_text())
    skip = docstrings(tree)
    return [(node.lineno, node.value.partition(":")[0]) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
            and MODULE_PATH.fullmatch(node.value)]


def room_files(room: str):
    for path in sorted((PACKAGE / room).rglob("*.py")):
        parts = path.relative_to(PACKAGE / room).with_suffix("").parts[:-1]
        yield path, ".".join([ROOMS[room], *parts])


def forbidden_in(path: Path, package: str, room: str) -> list[str]:
    """The imports of a file of ``room``, and the modules its strings name, that reach a forbidden module."""
    def forbidden(name: str) -> bool:
        return any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN[room])

    where = path.relative_to(PACKAGE) if path.is_relative_to(PACKAGE) else path
    return [*(f"{where}:{line} imports {name}" for line, name in imports_of(path, package) if forbidden(name)),
            *(f"{where}:{line} names {name} in a string" for line, name in modules_named_in_strings(path)
              if forbidden(name))]


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_imports_point_down_only(room):
    broken = [violation for path, package in room_files(room) for violation in forbidden_in(path, package, room)]
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
    named = [(line, name, "imports") for line, name in imports_of(path, package)]
    named += [(line, name, "names") for line, name in modules_named_in_strings(path)]
    for line, name, how in named:
        parts = (name or "").split(".")
        if parts[:2] == ["fairstream", "streams"] and len(parts) > 2 and parts[2] in STREAMS_ROOMS \
                and parts[2] != room and parts[2] not in STREAMS_ROOMS[room]:
            where = path.relative_to(PACKAGE) if path.is_relative_to(PACKAGE) else path
            broken.append(f"{where}:{line} {how} {name}" + (" in a string" if how == "names" else ""))
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


def test_the_rule_checker_sees_an_import_hidden_in_a_string_but_not_in_a_docstring(tmp_path):
    bad = tmp_path / "kind.py"
    bad.write_text('"""Trained by "fairstream.streams.refit.trainers:PlanTrainer" (documentation)."""\n'
                   'import importlib\n'
                   'TRAINER = "fairstream.streams.refit.trainers:PlanTrainer"\n'
                   'def load():\n'
                   '    """fairstream.streams.refit.job"""\n'
                   '    return importlib.import_module("fairstream.models.kinds"), "a sentence. not one", "mode"\n')
    assert modules_named_in_strings(bad) == [(3, "fairstream.streams.refit.trainers"), (6, "fairstream.models.kinds")]
    assert forbidden_in(bad, "fairstream.models", "models") == [
        f"{bad}:3 names fairstream.streams.refit.trainers in a string"]
    assert forbidden_in(bad, "fairstream.repair", "repair") == [
        f"{bad}:3 names fairstream.streams.refit.trainers in a string",
        f"{bad}:6 names fairstream.models.kinds in a string"]
    assert streams_room_violations(bad, "fairstream.streams.worker", "worker") == [
        f"{bad}:3 names fairstream.streams.refit.trainers in a string"]


def test_applying_frozen_modules_and_running_a_worker_never_imports_torch():
    code = ("import sys, fairstream.models.kinds, fairstream.streams.worker.app, fairstream.streams.cli; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
