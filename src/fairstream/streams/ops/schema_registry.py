"""A Schema Registry on this machine: Apicurio Registry, fetched through Maven, serving the Confluent API.

Avro topics (``[topics] format = "avro"``) need a registry that speaks the Confluent Schema Registry
REST API; the tests, the benchmark and a user's trial run a real one here. Apicurio Registry serves
that API under ``/apis/ccompat/v7``. :func:`fetch_registry` resolves its distribution
(``io.apicurio:apicurio-registry-app:<version>:tar.gz:all``: the Quarkus runner jar and its ``lib/``,
augmented at build time, so nothing is built here) through Maven, checksums enforced, into the cache
Kafka uses (:func:`~fairstream.streams.ops.kafka_cluster.cache_dir`), once. :class:`SchemaRegistry`
runs it with in-memory storage on a loopback port, a JVM in its own process group that dies with its
owner; :attr:`SchemaRegistry.url` is what ``[schema_registry] url`` takes.

>>> with SchemaRegistry("runs/schema-registry") as registry:  # doctest: +SKIP
...     print(registry.url)
http://127.0.0.1:40321/apis/ccompat/v7
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from .kafka_cluster import cache_dir
from .processes import LOOPBACK, ManagedProcess, dies_with_owner, free_port, port_is_free

REGISTRY_VERSION = "2.6.13.Final"
"""The Apicurio Registry release run here. The 3.x releases are built for Java 21, which this machine's
Debian (12) does not package; 2.6 runs on Java 17 and serves the same Confluent-compatible API."""
CCOMPAT_PATH = "/apis/ccompat/v7"
"""Where Apicurio serves the Confluent Schema Registry API."""
FETCH_TIMEOUT_SECONDS = 900.0
_ARTIFACT = "io.apicurio:apicurio-registry-app:{version}:tar.gz:all"
# An explicit plugin version: Maven 3.8's default (2.8) has no `copy -Dartifact`.
_COPY_GOAL = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy"


class SchemaRegistryError(RuntimeError):
    """The schema registry could not be fetched, started or stopped."""


# --------------------------------------------------------------------------- the release


def runner_jar(home: Path, version: str = REGISTRY_VERSION) -> Path:
    """The Quarkus runner jar of an unpacked distribution in ``home``."""
    return home / f"apicurio-registry-app-{version}-runner.jar"


def fetch_registry(version: str = REGISTRY_VERSION, cache: Path | None = None) -> Path:
    """The runner jar of Apicurio Registry ``version``, fetched through Maven the first time (checksums enforced).

    Parameters
    ----------
    version : str
        The ``io.apicurio:apicurio-registry-app`` release.
    cache : Path, optional
        The cache directory; default :func:`~fairstream.streams.ops.kafka_cluster.cache_dir`.

    Returns
    -------
    Path
        The runner jar; its ``lib/`` is beside it. Several processes may ask at once: one fetches under a
        lock, the others wait and find it. A failed fetch leaves nothing behind.
    """
    home = (cache or cache_dir()) / f"apicurio-registry-{version}"
    if runner_jar(home, version).is_file():
        return runner_jar(home, version)
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f".apicurio-registry-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not runner_jar(home, version).is_file():
            _fetch_distribution(version, home)
    return runner_jar(home, version)


def _fetch_distribution(version: str, home: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise SchemaRegistryError("Apicurio Registry is fetched with Maven, which is not installed: apt-get install "
                                  "maven openjdk-17-jre-headless (make setup installs both)")
    with tempfile.TemporaryDirectory(dir=home.parent) as scratch:
        # -C: a checksum that does not match fails the fetch (Maven only warns by default).
        command = [mvn, "-B", "-q", "-C", _COPY_GOAL, f"-Dartifact={_ARTIFACT.format(version=version)}",
                   f"-DoutputDirectory={scratch}"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            raise SchemaRegistryError(f"fetching Apicurio Registry {version} through Maven took over "
                                      f"{FETCH_TIMEOUT_SECONDS:g} s") from None
        if done.returncode != 0:
            lines = [line for line in (done.stdout + done.stderr).splitlines() if "ERROR" in line] or \
                (done.stdout + done.stderr).splitlines()[-5:]
            raise SchemaRegistryError(f"fetching Apicurio Registry {version} through Maven failed: "
                                      f"{' | '.join(lines[:3])}")
        staged = Path(scratch) / "unpacked"
        with tarfile.open(next(Path(scratch).glob("*.tar.gz"))) as archive:
            archive.extractall(staged, filter="data")  # "data": no absolute paths, links or devices
        if not runner_jar(staged, version).is_file():
            raise SchemaRegistryError(f"the Apicurio Registry {version} distribution has no "
                                      f"{runner_jar(staged, version).name}")
        shutil.rmtree(home, ignore_errors=True)
        staged.rename(home)  # whole or not at all: a reader sees the runner and every jar, or nothing


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise SchemaRegistryError("Apicurio Registry needs a Java runtime (17 or later): apt-get install "
                                  "openjdk-17-jre-headless")
    return java


# --------------------------------------------------------------------------- the server


class SchemaRegistry(ManagedProcess):
    """Apicurio Registry with in-memory storage on a loopback port: the Confluent Schema Registry API at :attr:`url`.

    Parameters
    ----------
    run_dir : path
        Where its log (``registry.log``) goes.
    port : int, optional
        The HTTP port; default a free one.
    host : str
        The loopback address it listens on.
    version : str
        The Apicurio Registry release, fetched on first use (:func:`fetch_registry`).
    heap : str
        The JVM's heap (``-Xmx``).

    Notes
    -----
    In-memory storage: schemas live as long as the process, which is what a test session or a trial
    wants; a restart starts empty, so producers re-register (the serializers do) and ids may change.
    """

    error = SchemaRegistryError
    start_timeout = 120.0  # a cold JVM and Quarkus start on a busy 2-core machine
    stop_timeout = 20.0

    def __init__(self, run_dir: str | os.PathLike, port: int | None = None, host: str = LOOPBACK,
                 version: str = REGISTRY_VERSION, heap: str = "256m"):
        self.run_dir, self.host, self.version, self.heap = Path(run_dir), host, version, heap
        self.port = port if port is not None else free_port(host)
        super().__init__(self.run_dir / "registry.log")

    @property
    def url(self) -> str:
        """The base URL of its Confluent-compatible API (what ``[schema_registry] url`` takes)."""
        return f"http://{self.host}:{self.port}{CCOMPAT_PATH}"

    def _command(self) -> list[str]:
        jar = fetch_registry(self.version)
        # C1 only: the JIT's second tier buys nothing in a registry that answers a few hundred requests, and
        # costs start time on two cores. Quarkus reads its settings from system properties.
        return dies_with_owner([_java(), f"-Xmx{self.heap}", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
                                "-Djava.awt.headless=true", f"-Dquarkus.http.host={self.host}",
                                f"-Dquarkus.http.port={self.port}", "-jar", str(jar)])

    def start(self) -> "SchemaRegistry":
        """Start the JVM (fetching the release first if needed) and return once the API answers."""
        if not self.running:
            if not port_is_free(self.host, self.port):
                raise SchemaRegistryError(f"port {self.host}:{self.port} is taken")
            fetch_registry(self.version)  # before the clock of wait_ready starts
            self._spawn(f"starting Apicurio Registry {self.version} on {self.host}:{self.port}")
        return self.wait_ready()

    def wait_ready(self) -> "SchemaRegistry":
        """Return once ``GET <url>/subjects`` answers 200."""
        self._wait_until(self.answers, f"Apicurio Registry on {self.host}:{self.port}")
        return self

    def answers(self) -> bool:
        """True if the Confluent-compatible API answers ``GET /subjects`` with 200 now."""
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=2.0) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def __repr__(self) -> str:
        return f"<SchemaRegistry {'running' if self.running else 'stopped'} at {self.url}>"
