"""One install, pinned: the Dockerfile runs the Makefile's install steps, and everything installs from constraints.txt.

``make -n`` prints the commands a target would run without running them, so the test compares the
commands the image build runs with the ones ``make setup`` runs, line by line.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from importlib import metadata

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from fairstream.streams.ops.prometheus import REPO

from .conftest import DOCKERFILE

CONSTRAINTS = REPO / "constraints.txt"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    logical, current = [], ""
    for line in dockerfile.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            logical.append(current.strip())
            current = ""
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1] if " " in text else "") for text in logical]


def make_dry_run(*args: str) -> list[str]:
    """The commands ``make -n ARGS`` would run in the repository (nothing is run)."""
    result = subprocess.run(["make", "--no-print-directory", "-n", *args], cwd=REPO, check=False, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    joined = re.sub(r"\\\n\s*", " ", result.stdout)  # a recipe line continued with a backslash is one command
    return [line for line in joined.splitlines() if line.strip()]


def pins() -> dict[str, Version]:
    """constraints.txt as {canonical name: pinned version}."""
    pinned = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not a name==version pin"
            pinned[canonicalize_name(name)] = Version(version)
    return pinned


def dockerfile_install_run() -> str:
    """The one RUN of the Dockerfile that installs the Python packages."""
    runs = [args for op, args in instructions(DOCKERFILE.read_text()) if op == "RUN" and "install" in args
            and "apt-get" not in args]
    assert len(runs) == 1, runs
    return runs[0]


def test_the_image_installs_with_the_makefiles_own_steps():
    run = shlex.split(dockerfile_install_run())
    assert run[:2] == ["make", "install"], run
    image = make_dry_run(*run[1:])
    setup = make_dry_run("-W", "pyproject.toml", "setup")
    assert setup[0] == "make --no-print-directory install VENV=.venv" and setup[-1] == "touch .venv/.installed"
    # The same commands in the same order; only the venv, the extras and editability differ.
    expected = [line.replace(".venv", "/opt/venv").replace("-e '.[all,dev]'", " '.[all]'") for line in setup[1:-1]]
    assert image == expected
    pip = [line for line in image if " -m pip install " in line]
    assert len(pip) == 4 and all("-c constraints.txt" in line for line in pip), pip
    assert "torch==2.13.0" in pip[1] and "'.[all]'" in pip[2]  # torch (the CPU build) before the package


def test_the_dockerfile_has_no_second_list_of_dependencies():
    text = DOCKERFILE.read_text()
    runs = [args for op, args in instructions(text) if op == "RUN"]
    assert not [run for run in runs if re.search(r"\bpip3?\b|\buv\b|poetry|requirements", run)], runs
    copied = [args.split()[:-1] for op, args in instructions(text) if op == "COPY" and "--from" not in args]
    sources = {source.rstrip("/") for sources in copied for source in sources}
    # Everything `make install` reads is in the build, and every COPY source exists.
    package_dirs = set(PYPROJECT["tool"]["setuptools"]["packages"]["find"]["where"])
    assert {"Makefile", "pyproject.toml", "constraints.txt", PYPROJECT["project"]["readme"]} | package_dirs <= sources
    assert all((REPO / source).exists() for source in sources), sources


def test_the_image_is_slim_non_root_and_on_the_tested_python():
    steps = instructions(DOCKERFILE.read_text())
    bases = [args.split()[0] for op, args in steps if op == "FROM"]
    assert len(bases) == 2 and len(set(bases)) == 1 and re.fullmatch(r"python:3\.\d+-slim-\w+", bases[0]), bases
    tested = re.search(r"with Python (3\.\d+)\.\d+", CONSTRAINTS.read_text()).group(1)
    assert bases[0].startswith(f"python:{tested}-")
    assert SpecifierSet(PYPROJECT["project"]["requires-python"]).contains(f"{tested}.0")
    final = steps[max(i for i, (op, _) in enumerate(steps) if op == "FROM"):]
    users = [args for op, args in final if op == "USER"]
    assert users == ["10001:10001"]  # numeric, so Kubernetes' runAsNonRoot can verify it
    assert ("ENTRYPOINT", '["fairstream"]') in final


def test_every_requirement_is_pinned_and_the_pins_are_what_is_installed():
    pinned = pins()
    requirements = [Requirement(text) for text in PYPROJECT["project"]["dependencies"]]
    for extra in PYPROJECT["project"]["optional-dependencies"].values():
        requirements += [Requirement(text) for text in extra if not text.startswith("fairstream[")]
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement} has no pin in constraints.txt: run `make lock`"
        assert requirement.specifier.contains(pinned[name], prereleases=True), \
            f"constraints.txt pins {name}=={pinned[name]}, outside pyproject.toml's {requirement}: run `make lock`"
    # `make setup` installed exactly these (a package this environment lacks is not the lock's business).
    for name, version in pinned.items():
        try:
            installed = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            continue
        assert installed == version, f"{name} {installed} is installed, constraints.txt pins {version}"


def test_torch_is_pinned_without_a_local_label_so_a_cpu_build_and_pypis_build_both_satisfy_it():
    torch = pins()["torch"]
    assert torch.public == "2.13.0" and torch.local is None
    assert all(SpecifierSet(f"=={torch}").contains(build) for build in ("2.13.0", "2.13.0+cpu"))
    assert "torch==2.13.0" in (REPO / "Makefile").read_text()
    assert any("sed -E 's/^(torch==[^+]+)[+].*/\\1/'" in line for line in make_dry_run("lock"))


def test_make_lock_refreshes_the_constraints_from_a_fresh_resolution():
    commands = make_dry_run("lock")
    assert commands[0] == "rm -rf build/lock-venv"
    # Every extra is resolved, mutation testing's and reproduction's too: `make mutation` and `make reproduce`
    # install them with these pins.
    assert ("make --no-print-directory install VENV=build/lock-venv CONSTRAINTS= EXTRAS=all,dev,mutation,reproduce"
            in commands)
    install = [line for line in commands if " -m pip install " in line]
    assert install and not [line for line in install if "-c " in line]  # resolved afresh, not from the old pins
    assert any("pip freeze --all --exclude-editable" in line and "constraints.txt.new" in line for line in commands)
    assert commands[-2:] == ["mv constraints.txt.new constraints.txt", "rm -rf build/lock-venv"]


def test_setup_installs_prometheus_alertmanager_chromium_java_and_maven_once():
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^\$\(STAMP\):.*\|\s*\$\(PROMTOOL\) \$\(AMTOOL\) \$\(CHROMIUM\) \$\(JAVA\) \$\(MAVEN\)\s*$",
                     makefile, flags=re.MULTILINE)
    for binary, package in (("/usr/bin/java", "openjdk-17-jre-headless"), ("/usr/bin/mvn", "maven")):
        (recipe,) = make_dry_run("-B", binary)
        assert f"apt-get install -y --no-install-recommends {package})" in recipe
    (recipe,) = make_dry_run("-B", "/usr/bin/amtool")  # -n: printed, not run
    assert recipe.startswith("command -v amtool >/dev/null && command -v prometheus-alertmanager >/dev/null ||")
    assert "apt-get install -y --no-install-recommends prometheus-alertmanager)" in recipe
    (recipe,) = make_dry_run("-B", "/usr/bin/chromium")
    assert recipe.startswith("command -v chromium >/dev/null ||")
    assert "apt-get install -y --no-install-recommends chromium)" in recipe
    for tool in ("amtool", "prometheus-alertmanager", "promtool", "prometheus", "chromium", "java", "mvn"):
        assert subprocess.run(["sh", "-c", f"command -v {tool}"], check=False, capture_output=True).returncode == 0, tool
