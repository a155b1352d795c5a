"""Apache Kafka on this machine: a pinned release fetched through Maven, run as one KRaft node or three.

Production is Apache Kafka; this module runs it locally so the tests, the benchmark and a user's
trial prove the product there. :func:`fetch_kafka` resolves ``org.apache.kafka:kafka_2.13`` at
:data:`KAFKA_VERSION` with its runtime dependencies through Maven, checksums enforced (``mvn -C``),
into a cache outside the checkout (:func:`cache_dir`), once: a second call finds the jars there.
:class:`KafkaCluster` formats KRaft storage for one or three combined controller+broker nodes on
loopback ports and starts them, each a :class:`KafkaNode` (a JVM in its own process group that dies
with its owner, logging to ``<run_dir>/node-N/server.log``). Single-node clusters keep replication
at 1; three-node clusters are what production runs: replication factor 3,
``min.insync.replicas=2`` (the internal topics too).

>>> with KafkaCluster("runs/kafka", nodes=3) as cluster:  # doctest: +SKIP
...     print(cluster.bootstrap)
127.0.0.1:40123,127.0.0.1:40125,127.0.0.1:40127

``KafkaCluster(..., secure=True)`` runs the cluster as production should: clients connect over SASL_SSL
(SCRAM-SHA-512, TLS from a throwaway CA made at start under ``run_dir/tls``) and the StandardAuthorizer
refuses whatever no ACL allows; the super user ``admin`` exists from the format on, and
:meth:`KafkaCluster.add_user` adds further SCRAM users. :meth:`KafkaCluster.security` gives the
:class:`~fairstream.streams.kafka.ClientSecurity` of a user (:func:`secure_broker_properties` lists the
properties; the ACLs are :mod:`fairstream.streams.ops.acls`'s).

The failure tests use the per-node controls: :meth:`KafkaNode.kill` (kill -9),
:meth:`KafkaNode.pause` and :meth:`KafkaNode.resume` (SIGSTOP, SIGCONT), :meth:`KafkaNode.restart`,
and :meth:`KafkaCluster.leader_of` and :meth:`KafkaCluster.active_controller` to choose the victim.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import functools
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from .broker import KAFKA, BrokerError, EmbeddedBroker, BrokerState, Reachable, is_kafka_ready, kafka_metadata, remove_state, write_state
from .processes import LOOPBACK, ManagedProcess, dies_with_owner, free_port, port_is_free
from fairstream.streams.parsing import BrokerAddress

KAFKA_VERSION = "4.1.1"
"""The Apache Kafka release the project runs and tests against (Scala 2.13 build)."""
LOG4J_VERSION = "2.24.3"  # the logging backend Kafka 4.1's own distribution ships
NODE_LOG = "server.log"
FETCH_TIMEOUT_SECONDS = 900.0

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.fairstream</groupId><artifactId>kafka-runtime</artifactId><version>{kafka}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>{log4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>{log4j}</version></dependency>
  </dependencies>
</project>
"""

# One line a record, INFO for the broker's own life (started, elected, shut down), WARN elsewhere:
# a test cluster's log stays readable and small.
_LOG4J = """Configuration:
  Appenders:
    Console: {name: STDOUT, PatternLayout: {pattern: "[%d] %p %m (%c)%n"}}
  Loggers:
    Root: {level: WARN, AppenderRef: [{ref: STDOUT}]}
    Logger:
      - {name: kafka.server, level: INFO}
      - {name: org.apache.kafka.controller, level: INFO}
      - {name: kafka.log.LogCleaner, level: INFO}
"""


class KafkaError(BrokerError):
    """Apache Kafka could not be fetched, formatted, started or stopped."""


# --------------------------------------------------------------------------- the release


def cache_dir() -> Path:
    """Where fetched Kafka releases are kept: ``$FAIRSTREAM_CACHE_DIR``, else ``$XDG_CACHE_HOME/fairstream``,
    else ``~/.cache/fairstream`` (outside the checkout: ``make clean`` keeps it, every checkout shares it)."""
    if os.environ.get("FAIRSTREAM_CACHE_DIR"):
        return Path(os.environ["FAIRSTREAM_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fairstream"


def fetch_kafka(version: str = KAFKA_VERSION, cache: Path | None = None) -> Path:
    """The directory of Kafka ``version``'s jars, fetched through Maven the first time (checksums enforced).

    Several processes may ask at once (two test workers): one fetches under a lock, the others wait
    and find the jars. A fetch that fails leaves nothing behind, so the next call tries again.
    """
    home = (cache or cache_dir()) / f"kafka-{version}"
    libs = home / "libs"
    if (libs / f"kafka_2.13-{version}.jar").is_file():
        return libs
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (libs / f"kafka_2.13-{version}.jar").is_file():
            _maven_copy_dependencies(version, home, libs)
    return libs


def _maven_copy_dependencies(version: str, home: Path, libs: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaError("Apache Kafka is fetched with Maven, which is not installed: apt-get install maven "
                         "openjdk-17-jre-headless (make setup installs both)")
    with tempfile.TemporaryDirectory(dir=home) as scratch:
        pom = Path(scratch) / "pom.xml"
        pom.write_text(_POM.format(kafka=version, log4j=LOG4J_VERSION))
        staged = Path(scratch) / "libs"
        # -C: a checksum that does not match fails the fetch (Maven only warns by default).
        command = [mvn, "-B", "-q", "-C", "-f", str(pom), "dependency:copy-dependencies",
                   f"-DoutputDirectory={staged}", "-DincludeScope=runtime"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            raise KafkaError(f"fetching Apache Kafka {version} through Maven took over {FETCH_TIMEOUT_SECONDS:g} s") from None
        if done.returncode != 0:
            lines = [line for line in (done.stdout + done.stderr).splitlines() if "ERROR" in line] or \
                (done.stdout + done.stderr).splitlines()[-5:]
            raise KafkaError(f"fetching Apache Kafka {version} through Maven failed: {' | '.join(lines[:3])}")
        shutil.rmtree(libs, ignore_errors=True)
        staged.rename(libs)  # whole or not at all: a reader sees every jar or none
    (home / "log4j2.yaml").write_text(_LOG4J)


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise KafkaError("Apache Kafka needs a Java runtime (17 or later): apt-get install openjdk-17-jre-headless")
    return java


def _run_java(libs: Path, *args: str, timeout: float = 120.0) -> str:
    done = subprocess.run([_java(), "-cp", f"{libs}/*", *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise KafkaError(f"{args[0]} {args[1] if len(args) > 1 else ''} failed: "
                         f"{' '.join((done.stderr or done.stdout).split())[-400:]}")
    return done.stdout


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes in URL-safe base64 without padding (what ``random-uuid`` prints).

    Never one that starts with "-": the storage tool would read it as an option (Kafka's own ``Uuid.randomUuid``
    draws again for the same reason), and a test cluster's start would fail one time in 64.
    """
    while (cluster_id := base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")).startswith("-"):
        continue
    return cluster_id


def _each(items, action) -> None:
    """``action`` on every item at once (JVMs start and stop in seconds each); the first error is raised."""
    with ThreadPoolExecutor(max_workers=max(len(items), 1)) as pool:
        for future in [pool.submit(action, item) for item in items]:
            future.result()


def _quorum_state(node: "KafkaNode") -> tuple[int, int]:
    """(election epoch, leader id) as ``node`` last recorded them; (-1, -1) if it has not."""
    path = node.run_dir / "data" / "__cluster_metadata-0" / "quorum-state"
    try:
        state = json.loads(path.read_text())
        return int(state["leaderEpoch"]), int(state["leaderId"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1, -1


# --------------------------------------------------------------------------- security (secure=True)

ADMIN_USER = "admin"
"""The secure cluster's super user (``super.users``), whose SCRAM credential the storage format adds."""
SCRAM_MECHANISM = "SCRAM-SHA-512"
SCRAM_ITERATIONS = 8192
CONTROLLER_USER = "controller"  # the nodes' own principal on the controller listener (SASL/PLAIN, static)
SECURE_LISTENER = "SASL_SSL"
TLS_DIR = "tls"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def make_loopback_tls(directory: str | os.PathLike, host: str = LOOPBACK) -> tuple[Path, Path]:
    """A throwaway CA and a server certificate it signs for ``host`` and ``localhost``, in PEM files.

    Parameters
    ----------
    directory : path
        Where to write ``ca.pem`` (the CA's certificate: the clients' trust) and ``server.pem`` (the
        server's private key, unencrypted PKCS#8, then its certificate and the CA's: a PEM keystore).
        The CA's private key is not kept: nothing else is ever signed with it.
    host : str, default=LOOPBACK
        The address clients connect to (an IP address SAN, or a DNS name).

    Returns
    -------
    tuple of Path
        ``(ca.pem, server.pem)``.
    """
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=30)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fairstream local Kafka CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    try:
        names = [x509.IPAddress(ipaddress.ip_address(host)), x509.DNSName("localhost")]
    except ValueError:
        names = [x509.DNSName(host), x509.DNSName("localhost")]
    server = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
              .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(start).not_valid_after(end)
              .add_extension(x509.SubjectAlternativeName(names), critical=False)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                             critical=False)
              .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    ca_path, server_path = folder / "ca.pem", folder / "server.pem"
    ca_path.write_bytes(ca.public_bytes(pem))
    server_path.touch(mode=0o600)
    server_path.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
                            + server.public_bytes(pem) + ca.public_bytes(pem))
    return ca_path, server_path


def secure_broker_properties(node_listener: str, controller_listener: str, ca: Path, keystore: Path,
                             admin_password: str, controller_password: str) -> dict:
    """The broker properties of a secure node (``KafkaCluster(secure=True)``), beside the common ones.

    Clients and the other brokers use the ``SASL_SSL`` listener (SCRAM-SHA-512 over TLS, the
    server's certificate from ``keystore``, a PEM file); the brokers authenticate to each other as
    :data:`ADMIN_USER`. The controller listener stays on loopback and speaks SASL_PLAINTEXT with the
    static PLAIN user :data:`CONTROLLER_USER` (SCRAM credentials live in the metadata the controller
    serves, so they cannot authenticate it; no TLS there: loopback only, and it carries no client's
    records). Both principals are super users; everyone else gets only what an ACL allows
    (``allow.everyone.if.no.acl.found=false``).

    Parameters
    ----------
    node_listener, controller_listener : str
        ``host:port`` of the client listener and of the controller listener.
    ca, keystore : Path
        The CA certificate (the truststore) and the server's key and certificate chain (PEM).
    admin_password, controller_password : str
        The credentials of the two super users.

    Returns
    -------
    dict
        Property name to value.
    """
    def jaas(module: str, user: str, password: str, *extra: str) -> str:
        return (f'org.apache.kafka.common.security.{module} required username="{user}" password="{password}"'
                + "".join(f" {item}" for item in extra) + ";")

    return {
        "listeners": f"{SECURE_LISTENER}://{node_listener},CONTROLLER://{controller_listener}",
        "advertised.listeners": f"{SECURE_LISTENER}://{node_listener}",
        "listener.security.protocol.map": f"{SECURE_LISTENER}:SASL_SSL,CONTROLLER:SASL_PLAINTEXT",
        "inter.broker.listener.name": SECURE_LISTENER,
        "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
        "listener.name.sasl_ssl.sasl.enabled.mechanisms": SCRAM_MECHANISM,
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
            jaas("scram.ScramLoginModule", ADMIN_USER, admin_password),
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config":
            jaas("plain.PlainLoginModule", CONTROLLER_USER, controller_password,
                 f'user_{CONTROLLER_USER}="{controller_password}"'),
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(keystore),
        "ssl.truststore.type": "PEM", "ssl.truststore.location": str(ca),
        "ssl.client.auth": "none",
        "authorizer.class.name": AUTHORIZER,
        "allow.everyone.if.no.acl.found": "false",
        "super.users": f"User:{ADMIN_USER};User:{CONTROLLER_USER}",
    }


# --------------------------------------------------------------------------- one node


class KafkaNode(ManagedProcess):
    """One combined controller+broker of a :class:`KafkaCluster`: its JVM, ports and storage."""

    error = KafkaError
    start_timeout = 60.0
    stop_timeout = 30.0  # a controlled shutdown moves leadership away first

    def __init__(self, node_id: int, run_dir: Path, libs: Path, host: str, port: int, controller_port: int,
                 heap: str):
        self.node_id, self.run_dir, self.libs, self.host = node_id, run_dir, libs, host
        self.port, self.controller_port, self.heap = port, controller_port, heap
        super().__init__(run_dir / NODE_LOG)
        self.paused = False
        self.ready_check: Callable[[], bool] | None = None  # a secure node's (a plaintext metadata request otherwise)

    @property
    def properties(self) -> Path:
        """The node's ``server.properties``."""
        return self.run_dir / "server.properties"

    def _command(self) -> list[str]:
        log4j = self.libs.parent / "log4j2.yaml"
        return dies_with_owner([_java(), f"-Xmx{self.heap}", f"-Xms{self.heap}", "-XX:+UseG1GC",
                                "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true",
                                f"-Dlog4j2.configurationFile={log4j}", "-cp", f"{self.libs}/*", "kafka.Kafka",
                                str(self.properties)])

    def start(self) -> "KafkaNode":
        """Start the JVM; :meth:`wait_ready` waits for its broker (a node alone cannot elect a controller)."""
        if not self.running:
            if not port_is_free(self.host, self.port) or not port_is_free(self.host, self.controller_port):
                raise KafkaError(f"node {self.node_id}: port {self.port} or {self.controller_port} is taken")
            self._spawn(f"starting Kafka node {self.node_id} on {self.host}:{self.port}")
            self.paused = False
        return self

    def wait_ready(self) -> "KafkaNode":
        """Return once the node's broker answers Kafka metadata requests."""
        check = self.ready_check or (lambda: is_kafka_ready(self.host, self.port, timeout=1.0))
        self._wait_until(check, f"Kafka node {self.node_id}")
        return self

    def restart(self) -> "KafkaNode":
        """A clean stop (controlled shutdown) if it runs, then a start on the same ports and storage."""
        self.stop()
        self._wait_ports_free()
        return self.start().wait_ready()

    def _wait_ports_free(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not (port_is_free(self.host, self.port) and port_is_free(self.host, self.controller_port)):
            if time.monotonic() > deadline:
                raise KafkaError(f"node {self.node_id}: ports still taken {timeout:g} s after it stopped")
            time.sleep(0.1)

    def pause(self) -> None:
        """SIGSTOP: the JVM keeps its sockets but answers nothing (a GC pause, a frozen VM)."""
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        self._signal(signal.SIGCONT)
        self.paused = False

    def _signal(self, signum: int) -> None:
        if self._process is None or self._process.poll() is not None:
            raise KafkaError(f"node {self.node_id} is not running")
        os.killpg(self._process.pid, signum)

    def stop(self) -> int | None:
        if self.paused:  # a stopped JVM cannot act on SIGTERM
            with contextlib.suppress(KafkaError, ProcessLookupError):
                self.resume()
        return super().stop()

    def __repr__(self) -> str:
        state = "paused" if self.paused else "running" if self.running else "stopped"
        return f"<KafkaNode {self.node_id} {state} at {self.host}:{self.port}>"


# --------------------------------------------------------------------------- the cluster


class KafkaCluster(Reachable):
    """One or three Apache Kafka nodes in KRaft mode on loopback ports, with storage under ``run_dir``.

    Parameters
    ----------
    run_dir : path
        Where each node keeps its properties, log and data (``node-1/`` ...).
    nodes : int
        1 (replication 1) or 3 (replication 3, ``min.insync.replicas=2``).
    version : str
        The Apache Kafka release, fetched on first use (:func:`fetch_kafka`).
    heap : str
        Each JVM's heap (``-Xmx``).
    settings : dict
        Extra broker properties for every node (e.g. ``{"log.cleaner.backoff.ms": 500}``).
    secure : bool
        SASL_SSL clients (SCRAM-SHA-512, a throwaway CA's certificate), the StandardAuthorizer and a super
        user :data:`ADMIN_USER` (:func:`secure_broker_properties`); False: PLAINTEXT, no authorisation.
    """

    def __init__(self, run_dir: str | os.PathLike, nodes: int = 1, version: str = KAFKA_VERSION, host: str = LOOPBACK,
                 heap: str = "512m", settings: dict | None = None, announce: bool = False, secure: bool = False):
        if nodes not in (1, 3):
            raise KafkaError(f"a local Kafka cluster has 1 or 3 nodes, not {nodes}")
        self.run_dir, self.size, self.version, self.host = Path(run_dir), nodes, version, host
        self.heap, self.settings = heap, dict(settings or {})
        self.announce = announce  # in broker.json while it runs: every command without --broker then uses it
        self.nodes: list[KafkaNode] = []
        self.secure = secure
        self._secrets: dict[str, str] = {}  # secure: the admin's and the controller listener's passwords

    # --- addresses

    @property
    def address(self) -> BrokerAddress:
        """Every node's client listener."""
        if not self.nodes:
            raise KafkaError("the Kafka cluster is not started")
        return BrokerAddress(tuple((node.host, node.port) for node in self.nodes))

    @property
    def replication(self) -> int:
        """The replication factor topics of this cluster get (and the internal topics have)."""
        return self.size

    @property
    def running(self) -> bool:
        """True while every node's process runs."""
        return bool(self.nodes) and all(node.running for node in self.nodes)

    # --- lifecycle

    def start(self) -> "KafkaCluster":
        """Fetch the release if needed, format every node's storage, start them, and wait until all serve."""
        if self.running:
            return self
        libs = fetch_kafka(self.version)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        ports = self._free_ports(2 * self.size)
        self.nodes = [KafkaNode(i + 1, self.run_dir / f"node-{i + 1}", libs, self.host, ports[2 * i], ports[2 * i + 1],
                                self.heap) for i in range(self.size)]
        cluster_id = self._stored_cluster_id() or _cluster_id()
        scram: list[str] = []
        if self.secure:
            self._prepare_security()
            scram = ["--add-scram", f"{SCRAM_MECHANISM}=[name={ADMIN_USER},password={self.admin_password}]"]
            for node in self.nodes:
                node.ready_check = functools.partial(self._answers_admin, node)
        for node in self.nodes:
            self._write_properties(node)
        _each(self.nodes, lambda node: _run_java(libs, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c",
                                                 str(node.properties), "--ignore-formatted", *scram))
        try:
            for node in self.nodes:
                node.start()
            for node in self.nodes:
                node.wait_ready()
            self.wait_for_brokers()
            if self.announce:
                write_state(BrokerState(self.url, self.nodes[0].pid, str(self.nodes[0].log_path.resolve()), kind=KAFKA,
                                        peers=tuple(node.pid for node in self.nodes[1:])))
        except BaseException:
            self.stop()
            raise
        return self

    def wait(self) -> None:
        """Block until a node exits (``fairstream kafka stop`` from another shell, or a crash)."""
        while all(node.running for node in self.nodes):
            time.sleep(0.5)

    def _stored_cluster_id(self) -> str | None:
        """The id of the cluster whose storage ``run_dir`` already holds (a second ``kafka start`` there keeps its
        topics), or None; storage of a cluster of another size is refused (its quorum has other voters)."""
        stored = sorted(path.parent.parent.name for path in self.run_dir.glob("node-*/data/meta.properties"))
        if not stored:
            return None
        if stored != [node.run_dir.name for node in self.nodes]:
            raise KafkaError(f"{self.run_dir} holds the storage of a {len(stored)}-node Kafka cluster, not of "
                             f"{self.size}: remove it or give another run directory")
        fields = dict(line.split("=", 1) for line in (self.nodes[0].run_dir / "data" / "meta.properties")
                      .read_text().splitlines() if "=" in line and not line.startswith("#"))
        return fields.get("cluster.id")

    def _free_ports(self, count: int) -> list[int]:
        ports: list[int] = []
        while len(ports) < count:
            port = free_port(self.host)
            if port not in ports:
                ports.append(port)
        return ports

    def _write_properties(self, node: KafkaNode) -> None:
        voters = ",".join(f"{n.node_id}@{n.host}:{n.controller_port}" for n in self.nodes)
        replicas = self.size
        min_isr = 2 if self.size == 3 else 1
        props = {
            "process.roles": "broker,controller", "node.id": node.node_id, "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{node.host}:{node.port},CONTROLLER://{node.host}:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{node.host}:{node.port}",
            "controller.listener.names": "CONTROLLER", "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(node.run_dir / "data"),
            "default.replication.factor": replicas, "min.insync.replicas": min_isr,
            "offsets.topic.replication.factor": replicas, "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min_isr,
            # A local cluster serves one user: fewer internal partitions start faster, and a group's first
            # join is not held back (Kafka waits 3 s by default for more members).
            "offsets.topic.num.partitions": 10, "transaction.state.log.num.partitions": 10,
            "group.initial.rebalance.delay.ms": 0,
            "num.partitions": 1, "auto.create.topics.enable": "false",
            **self.settings,
        }
        if self.secure:
            props.update(secure_broker_properties(f"{node.host}:{node.port}", f"{node.host}:{node.controller_port}",
                                                  self.ca_file, self.run_dir / TLS_DIR / "server.pem",
                                                  self.admin_password, self._secrets["controller"]))
        node.run_dir.mkdir(parents=True, exist_ok=True)
        node.properties.touch(mode=0o600)  # a secure node's holds the super users' passwords
        node.properties.write_text("".join(f"{key}={value}\n" for key, value in props.items()))

    def wait_for_brokers(self, timeout: float = 60.0) -> None:
        """Until some node's metadata lists every running, unpaused node (the cluster has formed)."""
        live = {(n.host, n.port) for n in self.nodes if n.running and not n.paused}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self.nodes:
                if (node.host, node.port) in live:
                    with contextlib.suppress(OSError, ValueError):
                        if live <= set(self._metadata(node)):
                            return
            time.sleep(0.2)
        raise KafkaError(f"the Kafka cluster did not list all {len(live)} live nodes within {timeout:g} s; "
                         f"logs under {self.run_dir}")

    def _metadata(self, node: KafkaNode) -> list[tuple[str, int]]:
        """The brokers ``node`` lists (``OSError`` if it does not answer); a secure node is asked as the admin."""
        if not self.secure:
            return kafka_metadata(node.host, node.port)
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        try:
            brokers = AdminClient({**self._admin_options(), "bootstrap.servers": f"{node.host}:{node.port}"}) \
                .list_topics(timeout=2).brokers
        except KafkaException as exc:
            raise OSError(f"node {node.node_id}: {exc}") from None
        return [(broker.host, broker.port) for broker in brokers.values()]

    def _answers_admin(self, node: KafkaNode) -> bool:
        if not port_is_free(node.host, node.port):  # listening: worth a TLS handshake and a SCRAM exchange
            with contextlib.suppress(OSError):
                return bool(self._metadata(node))
        return False

    # --- security (secure=True)

    def _prepare_security(self) -> None:
        """The CA, the server certificate and the super users' passwords, under ``run_dir`` (kept for a restart)."""
        make_loopback_tls(self.run_dir / TLS_DIR, self.host)
        for name in (ADMIN_USER, CONTROLLER_USER):
            path = self.run_dir / TLS_DIR / f"{name}.password"
            if not path.is_file():
                path.touch(mode=0o600)
                path.write_text(secrets.token_hex(16))
            self._secrets[name] = path.read_text().strip()

    def _require_secure(self) -> None:
        if not self.secure:
            raise KafkaError("this Kafka cluster runs without security (KafkaCluster(..., secure=True) has it)")

    @property
    def ca_file(self) -> Path:
        """The CA certificate clients trust (PEM)."""
        self._require_secure()
        return self.run_dir / TLS_DIR / "ca.pem"

    @property
    def admin_password(self) -> str:
        """The super user :data:`ADMIN_USER`'s password (also in ``run_dir/tls/admin.password``, owner-only)."""
        self._require_secure()
        if ADMIN_USER not in self._secrets:
            raise KafkaError("the secure Kafka cluster is not started")
        return self._secrets[ADMIN_USER]

    def security(self, user: str = ADMIN_USER, password: str | None = None):
        """The :class:`~fairstream.streams.kafka.ClientSecurity` of ``user`` (the admin's password by default).

        Parameters
        ----------
        user : str, default=ADMIN_USER
            A SCRAM user of the cluster (:meth:`add_user`).
        password : str or None, default=None
            Its password; None is the admin's.

        Returns
        -------
        ClientSecurity
            SASL_SSL with SCRAM-SHA-512, trusting :attr:`ca_file`.
        """
        from fairstream.streams.kafka import ClientSecurity

        return ClientSecurity(protocol="SASL_SSL", mechanism=SCRAM_MECHANISM, username=user,
                              password=self.admin_password if password is None else password, cafile=str(self.ca_file))

    def client_env(self, user: str, password: str) -> dict[str, str]:
        """The ``FAIRSTREAM_KAFKA_*`` environment that makes a ``fairstream`` process connect as ``user``."""
        return {"FAIRSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "FAIRSTREAM_KAFKA_SASL_MECHANISM": SCRAM_MECHANISM,
                "FAIRSTREAM_KAFKA_SASL_USERNAME": user, "FAIRSTREAM_KAFKA_SASL_PASSWORD": password,
                "FAIRSTREAM_KAFKA_SSL_CAFILE": str(self.ca_file)}

    def _admin_options(self) -> dict:
        return {"bootstrap.servers": self.bootstrap, **self.security().librdkafka_options()}

    def admin_client(self):
        """A confluent-kafka ``AdminClient`` connected as the super user."""
        from confluent_kafka.admin import AdminClient

        self._require_secure()
        return AdminClient(self._admin_options())

    def add_user(self, user: str, password: str | None = None, timeout: float = 30.0) -> str:
        """Create (or re-key) the SCRAM-SHA-512 user ``user``; returns its password once the broker knows it.

        Parameters
        ----------
        user : str
            The user name (its principal is ``User:<user>``).
        password : str or None, default=None
            None: a random one.
        timeout : float, default=30.0
            Seconds to wait for the broker to accept the credential.

        Returns
        -------
        str
            The password.
        """
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

        password = password or secrets.token_hex(16)
        admin = self.admin_client()
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS)
        futures = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(user, info, password.encode())])
        futures[user].result(timeout)
        deadline = time.monotonic() + timeout
        while True:  # the broker serves the credential once its metadata has it
            try:  # one future per user named
                if admin.describe_user_scram_credentials([user])[user].result(timeout).scram_credential_infos:
                    return password
            except KafkaException:  # not known yet (RESOURCE_NOT_FOUND)
                pass
            if time.monotonic() > deadline:
                raise KafkaError(f"the SCRAM user {user!r} was not known to the broker within {timeout:g} s")
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop every node at once (one by one, the last would wait out its controlled shutdown with no quorum)."""
        first = self.nodes[0].pid if self.nodes else None
        _each(self.nodes, KafkaNode.stop)
        if self.announce and first is not None:
            remove_state(first)

    def node(self, node_id: int) -> KafkaNode:
        """The node with ``node_id`` (1-based)."""
        return self.nodes[node_id - 1]

    # --- who does what (for the failure tests)

    def leader_of(self, topic: str, partition: int) -> KafkaNode:
        """The node that leads ``topic[partition]`` now."""
        from confluent_kafka.admin import AdminClient

        metadata = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(topic, timeout=10)
        leader = metadata.topics[topic].partitions[partition].leader
        if leader < 0:
            raise KafkaError(f"{topic}[{partition}] has no leader now")
        return self.node(leader)

    def active_controller(self) -> KafkaNode:
        """The node that is the active KRaft controller now."""
        # Not DescribeCluster: under KRaft it names a random broker. Each voter records the leader it
        # follows, with the election's epoch, in its quorum-state file; the newest epoch is the truth.
        epoch, leader = max(_quorum_state(node) for node in self.nodes)
        if leader < 0:
            raise KafkaError("the KRaft quorum has no leader now")
        return self.node(leader)

    @property
    def pid(self) -> int | None:
        """The first node's JVM (the cluster's process for a single node)."""
        return self.nodes[0].pid if self.nodes else None

    @property
    def description(self) -> str:
        """What the cluster is, in one line (for a benchmark's report)."""
        return (f"Apache Kafka {self.version} (KRaft, {self.size} node{'s' * (self.size > 1)}, {self.heap} heap each) "
                f"at {self.bootstrap}")

    def __enter__(self) -> "KafkaCluster":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<KafkaCluster {self.version} nodes={self.nodes or self.size} run_dir={str(self.run_dir)!r}>"


LOCAL_BROKERS = ("embedded", "kafka")


def local_broker(kind: str, run_dir: str | os.PathLike) -> "EmbeddedBroker | KafkaCluster":
    """A broker for one run of a benchmark or a trial: the embedded Tansu broker, or one Apache Kafka node.

    Either has ``bootstrap``, ``url``, ``pid`` (the process whose memory is the broker's) and ``description``.
    """
    if kind == "kafka":
        return KafkaCluster(Path(run_dir) / "kafka", nodes=1, heap="1g")
    if kind == "embedded":
        return EmbeddedBroker(Path(run_dir) / "broker")
    raise KafkaError(f"a local broker is one of {list(LOCAL_BROKERS)}, not {kind!r}")
