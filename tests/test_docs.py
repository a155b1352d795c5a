"""The documentation site builds with ``mkdocs build --strict``, and its commands are real command lines.

--strict turns every warning into a failure: a broken link or anchor, a page missing from the nav, a
mkdocstrings reference that does not resolve, a generated part (docs/hooks.py) that fails. The build
goes to a temporary directory, never to build/site.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from fairstream.streams.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
_SH_BLOCK = re.compile(r"^```(?:sh|bash)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def test_the_site_builds_strictly(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                            str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    output = built.stdout + built.stderr
    assert built.returncode == 0, output
    warnings = [line for line in output.splitlines() if re.match(r"(WARNING|ERROR)\b", line)]
    assert not warnings, "\n".join(warnings)
    for page in ("index.html", "reference/configuration/index.html", "reference/cli/index.html",
                 "api/repair/index.html", "runbook/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    # The generated parts are in the pages, not their markers.
    configuration = (tmp_path / "site" / "reference/configuration/index.html").read_text()
    cli = (tmp_path / "site" / "reference/cli/index.html").read_text()
    assert "max_event_time_skew" in configuration and "<!-- generated" not in configuration
    assert "fairstream artifacts approve" in cli and "--webhook-port" in cli


def command_lines() -> list[tuple[str, list[str]]]:
    """(page, argv) of every ``fairstream`` command in the ``sh``/``bash`` blocks of README.md and docs/."""
    found = []
    for page in (ROOT / "README.md", *sorted(DOCS.rglob("*.md"))):
        for block in _SH_BLOCK.findall(page.read_text()):
            for line in block.splitlines():
                line = re.split(r"\s(?:#|\d?>|\||;|&)", line, maxsplit=1)[0].strip()  # the command, not the shell's part
                if line.startswith("fairstream "):
                    found.append((str(page.relative_to(ROOT)), shlex.split(line)[1:]))
    return found


def test_every_command_in_the_pages_parses():
    lines = command_lines()
    assert len(lines) > 10
    parser = build_parser()
    for page, argv in lines:
        try:
            parser.parse_args(argv)
        except SystemExit as exit:
            if exit.code == 0:  # --version, --help
                continue
            raise AssertionError(f"{page}: `fairstream {shlex.join(argv)}` is not a valid command line") from None
