"""The API reference documents what it shows: every object a page of docs/api/ renders has numpydoc sections.

The pages are read as mkdocstrings reads them: each ``::: name`` line renders an object (a module renders its
``__all__``, or its public classes and functions), and a class renders the members its ``members:`` option lists.
Each function or method with parameters (besides self and cls) documents exactly those parameters in a
``Parameters`` section, and one that returns a value has a ``Returns`` section; a class documents its constructor's
parameters in its own docstring (or its ``__init__``'s).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
import typing
from pathlib import Path

import pytest

PAGES = sorted((Path(__file__).resolve().parents[1] / "docs" / "api").glob("*.md"))
DIRECTIVE = re.compile(r"^::: *(?P<name>[\w.]+) *$")
MEMBERS = re.compile(r"^ +members: *(?P<value>.+?) *$")
HEADER = re.compile(r"^(?P<title>[A-Z][A-Za-z ]+)\n-{3,}$", re.M)
ITEM = re.compile(r"^(?P<names>\*{0,2}\w+(?: *, *\*{0,2}\w+)*)(?: *:.*)?$")


def directives() -> list[tuple[str, str, list[str] | None]]:
    """(page, name, listed members or None) of every ``:::`` line of the API pages."""
    found = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            match = DIRECTIVE.match(line)
            if not match:
                continue
            members = None
            for option in lines[i + 1:]:
                if not option.startswith(" "):
                    break
                listed = MEMBERS.match(option)
                if listed:
                    value = listed["value"]
                    members = [] if value == "false" else [m.strip() for m in value.strip("[]").split(",") if m.strip()]
            found.append((page.name, match["name"], members))
    return found


def resolve(name: str):
    """The object a dotted name renders: the longest importable module prefix, then attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


def documented_objects() -> dict[str, object]:
    """Every class, function and method the pages render, by qualified name."""
    objects = {}
    for _, name, members in directives():
        obj = resolve(name)
        if inspect.ismodule(obj):
            names = getattr(obj, "__all__", None) or [
                n for n, v in vars(obj).items()
                if not n.startswith("_") and (inspect.isclass(v) or inspect.isfunction(v))
                and getattr(v, "__module__", None) == obj.__name__]
            for n in names:
                objects[f"{name}.{n}"] = getattr(obj, n)
            continue
        objects[name] = obj
        if inspect.isclass(obj):
            listed = members if members is not None else [
                n for n, v in vars(obj).items() if not n.startswith("_") and callable(v) and inspect.getdoc(v)]
            for member in listed:
                objects[f"{name}.{member}"] = getattr(obj, member)
    return {name: obj for name, obj in objects.items() if inspect.isclass(obj) or callable(obj)}


def sections(doc: str) -> dict[str, str]:
    """A numpydoc docstring's sections by title (``Parameters``, ``Returns``, ...), each section's text."""
    doc = inspect.cleandoc(doc)
    headers = list(HEADER.finditer(doc))
    return {h["title"]: doc[h.end():headers[i + 1].start() if i + 1 < len(headers) else len(doc)]
            for i, h in enumerate(headers)}


def documented_names(section: str) -> list[str]:
    """Names a Parameters section documents: its unindented ``name : type`` lines (stars stripped)."""
    names = []
    for line in textwrap.dedent(section).splitlines():
        if line and not line[0].isspace():
            match = ITEM.match(line)
            if match:
                names += [n.strip().lstrip("*") for n in match["names"].split(",")]
    return names


def constructor(cls: type):
    """The ``__init__`` a class's constructor parameters come from, or None (object's, a builtin's or a Protocol's)."""
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            init = vars(klass)["__init__"]
            if klass is object or not inspect.isfunction(init) or "typing" in (klass.__module__, init.__module__):
                return None
            return init
    return None


def parameter_names(func) -> list[str]:
    func = inspect.unwrap(func.__func__ if isinstance(func, (classmethod, staticmethod)) else func)
    names = list(inspect.signature(func).parameters)
    if names and names[0] in ("self", "cls") and (inspect.isfunction(func) and "." in func.__qualname__):
        names = names[1:]
    return names


def returns_value(func) -> bool:
    """Whether ``func`` returns something: its return annotation, else a ``return <value>`` or ``yield`` in its body."""
    func = inspect.unwrap(func)
    try:
        hint = typing.get_type_hints(func).get("return", inspect.Signature.empty)
    except Exception:  # an unresolvable forward reference: the annotation as written
        hint = func.__annotations__.get("return", inspect.Signature.empty)
    if hint is type(None) or hint in (None, "None"):
        return False
    if hint is not inspect.Signature.empty:
        return True
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    body = tree.body[0]
    for node in ast.walk(body):
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return True
        if isinstance(node, ast.Return) and node.value is not None and not (
                isinstance(node.value, ast.Constant) and node.value.value is None):
            return True
    return False


def test_the_pages_reference_objects():
    found = directives()
    assert {page for page, _, _ in found} >= {"repair.md", "models.md", "streams.md"}
    assert len(documented_objects()) >= 60


@pytest.mark.parametrize("name", sorted(documented_objects()))
def test_numpydoc_sections(name):
    obj = documented_objects()[name]
    problems = []
    if inspect.isclass(obj):
        init = constructor(obj)
        expected = parameter_names(init) if init is not None else []
        doc = inspect.getdoc(obj) or ""
        if expected and "Parameters" not in sections(doc) and init is not None:
            doc = inspect.getdoc(init) or doc
        returns = False
    else:
        expected = parameter_names(obj)
        doc = inspect.getdoc(obj) or ""
        returns = returns_value(obj)
    assert doc, f"{name} has no docstring"
    found = sections(doc)
    if expected:
        if "Parameters" not in found:
            problems.append(f"no 'Parameters\\n----------' section for {expected}")
        else:
            documented = documented_names(found["Parameters"])
            if documented != expected:
                problems.append(f"Parameters documents {documented}, the signature has {expected}")
    if returns and "Returns" not in found and "Yields" not in found:
        problems.append("returns a value but has no 'Returns\\n-------' section")
    assert not problems, f"{name}: " + "; ".join(problems)
