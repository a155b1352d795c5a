"""The README and the documentation pages: their Python examples run as written, and the README stays a README.

Every ``>>>`` example in README.md and in docs/**/*.md runs as a doctest. README.md stays under 12 KB (the
manual lives in docs/) and every relative link in it resolves to a file, so its links work on GitHub.
"""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_LIMIT_BYTES = 12 * 1024
PAGES = sorted(DOCS.rglob("*.md"))
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def with_examples() -> list[Path]:
    """The Markdown files that hold at least one ``>>>`` example."""
    return [path for path in (README, *PAGES) if ">>> " in path.read_text()]


def test_the_pages_have_examples():
    assert README in with_examples() or any(path.is_relative_to(DOCS) for path in with_examples())


@pytest.mark.parametrize("path", with_examples(), ids=lambda path: str(path.relative_to(ROOT)))
def test_examples_run(path):
    result = doctest.testfile(str(path), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_the_readme_is_short():
    size = len(README.read_bytes())
    assert size < README_LIMIT_BYTES, f"README.md is {size:,} bytes; the manual belongs in docs/"


def test_every_relative_link_of_the_readme_resolves_to_a_file():
    targets = [target for target in _LINK.findall(README.read_text())
               if not re.match(r"[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")]
    assert targets, "README.md links to the documentation"
    missing = [target for target in targets if not (ROOT / target.split("#", 1)[0]).is_file()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
