"""An underscore name stays in its module: no product module imports another's private name.

What two modules share is public where it belongs (``fairstream.repair.validation``, ``metrics.auc``,
...); a private module (``_validation``) or a private name (``_auc``) imported elsewhere is a helper
that has become shared without anyone deciding where it lives.
"""

from __future__ import annotations

import ast

import pytest

from .test_layers import ROOMS, PACKAGE, room_files


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def absolute(node: ast.ImportFrom, package: str) -> str:
    """The module an ``from ... import`` names, relative imports resolved against ``package``."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


def private_uses(source: str, package: str) -> list[tuple[int, str]]:
    """(line, what) for each private fairstream module or name used from outside its module."""
    found, fairstream_aliases = [], set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            module = absolute(node, package)
            if not module.startswith("fairstream"):
                continue
            if any(is_private(part) for part in module.split(".")):
                found.append((node.lineno, module))
            for alias in node.names:
                if is_private(alias.name):
                    found.append((node.lineno, f"{module}.{alias.name}"))
                fairstream_aliases.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("fairstream"):
                    if any(is_private(part) for part in alias.name.split(".")):
                        found.append((node.lineno, alias.name))
                    fairstream_aliases.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and is_private(node.attr) and isinstance(node.value, ast.Name)
                and node.value.id in fairstream_aliases):
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return sorted(found)


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_no_module_imports_another_modules_private_name(room):
    crossing = [
        f"{path.relative_to(PACKAGE)}:{line} uses {what}"
        for path, package in room_files(room)
        for line, what in private_uses(path.read_text(), package)
    ]
    assert not crossing, "make these public where they belong:\n" + "\n".join(crossing)


def test_the_checker_sees_every_way_of_reaching_a_private_name():
    source = (
        "import os\n"
        "from . import _validation\n"
        "from .._validation import RepairInputError\n"
        "from fairstream.repair.posterior import _auc, missing_mask\n"
        "from ..measure import verification\n"
        "import fairstream.repair._validation as checks\n"
        "blocks = verification._group_pair_blocks\n"
        "os._exit(0)\n"  # another library's private name is not ours to police
    )
    assert private_uses(source, "fairstream.models.sub") == [
        (2, "fairstream.models.sub._validation"),
        (3, "fairstream.models._validation"),
        (4, "fairstream.repair.posterior._auc"),
        (6, "fairstream.repair._validation"),
        (7, "verification._group_pair_blocks"),
    ]
