"""What the deploy tests share: the repository's deploy files, parsed, and the broker (Apache Kafka).

No container engine or cluster runs here, so these tests check what can be checked without one:
the files parse and validate against their schemas, every file they name exists, the real tools
(promtool, amtool, kustomize in kubectl) accept them, the commands they run are the CLI's, and the
pieces agree with each other (ports, names, tokens, metrics).
"""

from __future__ import annotations

import shlex
import subprocess
from functools import cache
from pathlib import Path

import yaml

from fairstream.streams.cli import build_parser
from fairstream.streams.ops.prometheus import REPO
from tests.streams.conftest import broker  # noqa: F401 (the module's Apache Kafka, for these modules too)

DOCKER = REPO / "docker"
COMPOSE_YAML = DOCKER / "compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"
K8S = REPO / "deploy" / "k8s"
ALERTMANAGER_YML = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
DASHBOARD_JSON = REPO / "deploy" / "grafana" / "dashboards" / "fairstream.json"
PIPELINE_TOML = REPO / "deploy" / "pipeline.adult.toml"
FAIRSTREAM_IMAGE_SERVICES = ("topics", "worker", "monitor", "refit", "cli")


class _GoYAMLLoader(yaml.SafeLoader):
    """YAML as Go's parser reads it: a bare ``=`` is the string "=", not YAML 1.1's ``!!value`` (kustomize writes it)."""


_GoYAMLLoader.add_constructor("tag:yaml.org,2002:value", yaml.SafeLoader.construct_scalar)


@cache
def compose() -> dict:
    """docker/compose.yaml with YAML anchors and merge keys resolved (as compose reads it)."""
    return yaml.safe_load(COMPOSE_YAML.read_text())


def service(name: str) -> dict:
    """One service of the compose file."""
    return compose()["services"][name]


def bind_mounts(name: str) -> dict[str, Path]:
    """A compose service's bind mounts: {path in the container: path on the host} (named volumes left out)."""
    mounts = {}
    for volume in service(name).get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts[target] = (DOCKER / source).resolve()
    return mounts


def kustomize(directory: Path) -> list[dict]:
    """The objects ``kubectl kustomize`` renders from ``directory`` (kubectl ships Kustomize)."""
    result = subprocess.run(["kubectl", "kustomize", str(directory)], check=False, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, f"kubectl kustomize {directory} failed:\n{result.stderr}"
    return [doc for doc in yaml.load_all(result.stdout, Loader=_GoYAMLLoader) if doc]


def parse_cli(argv: list[str]):
    """``argv`` (what follows ``fairstream``) parsed by the real command line; fails the test on a usage error."""
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"`fairstream {shlex.join(argv)}` is not a valid command line") from exc
