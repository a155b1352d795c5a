"""No product code asks which kind a module is: it asks what the kind can do (its capabilities).

A registered kind's name spelled in code outside ``models/kinds.py``, the kind's own module and its trainer's
module is a place a new kind would have to be added by hand: a comparison (``kind == "scorer"``, ``"scorer" in
chain``, ``kind in ("plan", "flow")``), a lookup (``actives["scorer"]``, ``actives.get("scorer")``) or a default
(``def f(kind="plan")``, a dataclass field ``artifact: str = "plan"``, a keyword ``AgentConfig(artifact="plan")``).
The code reads :class:`~fairstream.repair.protocol.Capabilities` instead (``models/kinds.py``: ``capabilities``,
``kinds_for``, ``chain_problem``, ``chain_writes``, ``active_at``) and takes its defaults from the table
(``DEFAULT_KIND``) or from a module class (``FlowPreprocessor.kind``).
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from fairstream.models.kinds import MODULE_KINDS
from fairstream.streams.refit.trainers import TRAINERS

from .test_layers import ROOMS, PACKAGE, room_files

KINDS_TABLE = PACKAGE / "models" / "kinds.py"


def own_modules() -> set[Path]:
    """The files allowed to name kinds: the table, each registered kind's own module (its class's file) and its
    trainer's module (it trains that kind)."""
    owners = (*MODULE_KINDS.values(), *TRAINERS.values())
    return {KINDS_TABLE.resolve(), *(Path(inspect.getsourcefile(cls)).resolve() for cls in owners)}


def kind_names_in(node: ast.AST, kinds: set) -> list[str]:
    """The kind names ``node`` spells as a string constant, alone or in a tuple, list or set of them."""
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) and node.value in kinds else []
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [name for item in node.elts for name in kind_names_in(item, kinds)]
    return []


LOOKUP_METHODS = ("get", "pop", "setdefault", "index", "count", "remove")
"""Methods that look an entry up by the value they are given: ``actives.get("scorer")``, ``chain.index("plan")``."""


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


def kind_lookups(source: str, kinds: set) -> list[tuple[int, str]]:
    """(line, kind) of every lookup by a kind name: ``x["scorer"]`` and ``x.get("scorer")`` (or ``pop``, ...)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript):
            found += [(node.lineno, name) for name in kind_names_in(node.slice, kinds)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in LOOKUP_METHODS:
            found += [(node.lineno, name) for arg in node.args[:1] for name in kind_names_in(arg, kinds)]
    return sorted(found)


def kind_defaults(source: str, kinds: set) -> list[tuple[int, str]]:
    """(line, kind) of every default that is a kind name: a parameter's (``def f(kind="plan")``), a dataclass
    field's (``artifact: str = "plan"``), a keyword argument's (``kind="plan"``, ``field(default=("plan",))``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            defaults = [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
            found += [(d.lineno, name) for d in defaults for name in kind_names_in(d, kinds)]
        elif isinstance(node, ast.ClassDef):  # annotated: a dataclass field (a plain class attribute is a constant)
            values = [item.value for item in node.body if isinstance(item, ast.AnnAssign) and item.value]
            found += [(value.lineno, name) for value in values for name in kind_names_in(value, kinds)]
        elif isinstance(node, ast.keyword):
            found += [(node.value.lineno, name) for name in kind_names_in(node.value, kinds)]
    return sorted(found)


def kind_names_used(source: str, kinds: set) -> list[tuple[int, str, str]]:
    """(line, kind, how) of every comparison, lookup and default naming a kind in ``source``."""
    return sorted([(line, name, how) for how, finder in (("compares with", kind_comparisons),
                                                         ("looks up", kind_lookups), ("defaults to", kind_defaults))
                   for line, name in finder(source, kinds)])


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_no_code_outside_the_kinds_table_and_the_kinds_own_modules_names_a_kind(room):
    kinds, allowed = set(MODULE_KINDS), own_modules()
    named = [f"{path.relative_to(PACKAGE)}:{line} {how} kind {name!r}"
             for path, _ in room_files(room) if path.resolve() not in allowed
             for line, name, how in kind_names_used(path.read_text(), kinds)]
    assert not named, "ask the kind's capabilities, or take the default from models/kinds.py:\n" + "\n".join(named)


KINDS = {"plan", "flow", "scorer", "embedding"}


def test_the_walk_finds_every_form_of_comparison_and_nothing_else():
    source = ('if kind == "scorer": pass\n'
              'ok = "scorer" in chain[:-1]\n'
              'ok = kind in ("plan", "flow", "other")\n'
              'ok = kind != "embedding" and name == "identity"\n'
              'def f(kind): return {"plan": 1}.get(kind)\n'
              'match kind:\n    case "flow": pass\n')
    assert kind_comparisons(source, KINDS) == [
        (1, "scorer"), (2, "scorer"), (3, "flow"), (3, "plan"), (4, "embedding"), (7, "flow")]


def test_the_walk_finds_every_form_of_lookup_and_nothing_else():
    source = ('scorer = actives.get("scorer")\n'
              'flow = actives["flow"]\n'
              'chain.index("plan"); table.pop("embedding", None)\n'
              'value = actives.get(kind); other = names["identity"]\n'
              'print("plan"); log.info("flow")\n')
    assert kind_lookups(source, KINDS) == [(1, "scorer"), (2, "flow"), (3, "embedding"), (3, "plan")]


def test_the_walk_finds_every_form_of_default_and_nothing_else():
    source = ('def f(reason, kind="plan", *, chain=("flow", "scorer")): pass\n'
              'run = lambda kind="embedding": kind\n'
              '@dataclass\nclass Options:\n    act: str = "plan"\n    name: str = "identity"\n'
              '    PARAMETERS = ("scorer", "warm_start")\n'
              'config = AgentConfig(artifact="flow"); parser.add_argument("--kind", default="scorer")\n'
              'records: tuple = field(default=("plan",))\n'
              'def g(kind=DEFAULT_KIND, name="identity"): pass\n')
    assert kind_defaults(source, KINDS) == [(1, "flow"), (1, "plan"), (1, "scorer"), (2, "embedding"), (5, "plan"),
                                            (8, "flow"), (8, "scorer"), (9, "plan")]


def test_only_the_table_the_kinds_modules_and_their_trainers_modules_may_name_kinds():
    allowed = {path.relative_to(PACKAGE.resolve()).as_posix() for path in own_modules()}
    assert {"models/kinds.py", "models/scorer.py", "streams/refit/trainers/scorer.py"} <= allowed
    assert "streams/refit/trainers/base.py" not in allowed and "streams/refit/trainers/__init__.py" not in allowed
