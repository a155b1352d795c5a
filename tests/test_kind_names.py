"""No product code asks which kind a module is: it asks what the kind can do (its capabilities).

A comparison with a registered kind's name (``kind == "scorer"``, ``"scorer" in chain``, ``kind in ("plan",
"flow")``) outside ``models/kinds.py`` and the kind's own module is a place a new kind would have to be added by
hand; the code reads :class:`~fairstream.repair.protocol.Capabilities` instead (``models/kinds.py``:
``capabilities``, ``kinds_for``, ``chain_problem``, ``chain_writes``).
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from fairstream.models.kinds import MODULE_KINDS

from .test_layers import ROOMS, PACKAGE, room_files

KINDS_TABLE = PACKAGE / "models" / "kinds.py"


def own_modules() -> set[Path]:
    """The files allowed to name kinds: the table, and each registered kind's own module (its class's file)."""
    return {KINDS_TABLE.resolve(), *(Path(inspect.getsourcefile(cls)).resolve() for cls in MODULE_KINDS.values())}


def kind_names_in(node: ast.AST, kinds: set) -> list[str]:
    """The kind names ``node`` spells as a string constant, alone or in a tuple, list or set of them."""
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) and node.value in kinds else []
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [name for item in node.elts for name in kind_names_in(item, kinds)]
    return []


def kind_comparisons(source: str, kinds: set) -> list[tuple[int, str]]:
    """(line, kind) of every comparison (``==``, ``!=``, ``in``, ``is``, ..., a ``match`` case) with a kind name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = (node.left, *node.comparators)
            found += [(node.lineno, name) for operand in operands for name in kind_names_in(operand, kinds)]
        elif isinstance(node, ast.MatchValue):
            found += [(node.lineno, name) for name in kind_names_in(node.value, kinds)]
    return sorted(found)


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_no_code_outside_the_kinds_table_and_the_kinds_own_modules_compares_a_kind_name(room):
    kinds, allowed = set(MODULE_KINDS), own_modules()
    comparisons = [f"{path.relative_to(PACKAGE)}:{line} compares with kind {name!r}"
                   for path, _ in room_files(room) if path.resolve() not in allowed
                   for line, name in kind_comparisons(path.read_text(), kinds)]
    assert not comparisons, "ask the kind's capabilities instead:\n" + "\n".join(comparisons)


def test_the_walk_finds_every_form_of_comparison_and_nothing_else():
    source = ('if kind == "scorer": pass\n'
              'ok = "scorer" in chain[:-1]\n'
              'ok = kind in ("plan", "flow", "other")\n'
              'ok = kind != "embedding" and name == "identity"\n'
              'def f(kind="plan"): return {"plan": 1}.get(kind)\n'
              'match kind:\n    case "flow": pass\n')
    assert kind_comparisons(source, {"plan", "flow", "scorer", "embedding"}) == [
        (1, "scorer"), (2, "scorer"), (3, "flow"), (3, "plan"), (4, "embedding"), (7, "flow")]
    assert (PACKAGE / "models" / "scorer.py").resolve() in own_modules() and KINDS_TABLE.resolve() in own_modules()
