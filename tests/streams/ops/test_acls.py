"""Kafka's own authorisation, proven on a real cluster: SASL/SCRAM over TLS, the StandardAuthorizer, the
pipeline's ACLs as ``fairstream acls`` prints and applies them, and the product's one line when Kafka says no."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import time

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import TopicAuthorizationFailedError
from confluent_kafka import Consumer, KafkaError, TopicPartition

from fairstream.repair import artifacts
from fairstream.streams import kafka
from fairstream.streams.cli import main
from fairstream.streams.config import adult_config
from fairstream.streams.demo.collect import TopicReader, last_messages
from fairstream.streams.ops.acls import apply_acls, pipeline_acls
from fairstream.streams.ops.broker import is_kafka_ready
from fairstream.streams.ops.kafka_cluster import KafkaCluster
from fairstream.streams.ops.supervise import WorkerProcess
from tests.streams.test_cli import tiny_plan

PREFIX = "acl"


def pipeline(tmp_path, **topics):
    """The Adult pipeline under PREFIX (topics changed by ``topics``), as a config and its TOML file."""
    config = adult_config(artifact_dir=str(tmp_path / "artifacts")).with_topics(prefix=PREFIX, **topics)
    path = tmp_path / "pipeline.toml"
    path.write_text(config.to_toml())
    return config, path


def printed(capsys, *args) -> dict[tuple[str, str, str], set[str]]:
    """``fairstream acls`` ARGS: {(principal, resource, name[ (prefix)]): operations} of its kafka-acls.sh lines."""
    assert main(["acls", *args]) == 0
    out = capsys.readouterr().out
    rules: dict[tuple[str, str, str], set[str]] = {}
    for line in out.splitlines():
        if line.startswith("#"):
            continue
        words = line.split()
        assert words[:2] == ["kafka-acls.sh", "--bootstrap-server"] and "--add" in words, line
        flags = [(words[i], words[i + 1]) for i in range(2, len(words) - 1) if words[i].startswith("--")
                 and not words[i + 1].startswith("--")]
        principal = dict(flags)["--allow-principal"]
        resources = [(flag[2:], name) for flag, name in flags if flag in ("--topic", "--group", "--transactional-id",
                                                                          "--cluster")]
        assert len(resources) == 1, line
        kind, name = resources[0]
        pattern = dict(flags).get("--resource-pattern-type", "literal")
        key = (principal, kind, name + (" (prefix)" if pattern == "prefixed" else ""))
        assert key not in rules, f"two lines for {key}"
        rules[key] = {value for flag, value in flags if flag == "--operation"}
    return rules


# --------------------------------------------------------------------------- the printed lines (no broker)


def test_the_printed_lines_give_each_role_exactly_its_topics_and_groups(tmp_path, capsys):
    config, path = pipeline(tmp_path, input="loan-applications", output="loan-decisions")
    rules = printed(capsys, "--config", str(path), "--broker", "kafka://kafka.example:9093")
    topics = {"in": "loan-applications", "out": "loan-decisions", "emb_in": "acl.embeddings.in",
              "emb_out": "acl.embeddings.repaired", "dlq": "acl.dlq", "control": "acl.control", "stats": "acl.stats",
              "requests": "acl.refit.requests", "research": "acl.research"}
    assert {spec.name for spec in config.topics.specs()} == set(topics.values())  # every topic of the config

    def role(name: str, **granted: set[str]) -> dict:
        """A role's rules: the granted operations per topic, Describe on every other topic of the pipeline."""
        describe = {"Describe"} if name in ("worker", "monitor", "refit") else None
        table = {}
        for key, topic in topics.items():
            operations = granted.get(key) or describe
            if operations:
                table[(f"User:acl-adult-{name}", "topic", topic)] = set(operations)
        return table

    checked = {"DescribeConfigs"}
    expected = {
        **role("worker", **{"in": {"Read"}, "emb_in": {"Read"}, "out": {"Write"}, "emb_out": {"Write"},
                            "dlq": {"Write"}, "control": {"Read", "Write"} | checked, "stats": {"Write"} | checked}),
        ("User:acl-adult-worker", "group", "acl-adult.records"): {"Read"},
        ("User:acl-adult-worker", "group", "acl-adult.embeddings"): {"Read"},
        **role("monitor", stats={"Read"} | checked, control={"Read", "Write"} | checked, requests={"Write"}),
        ("User:acl-adult-monitor", "group", "acl-adult.monitor"): {"Read"},
        **role("refit", requests={"Read", "Write"}, research={"Read"}, control={"Read", "Write"} | checked,
               stats={"Describe"} | checked),
        ("User:acl-adult-refit", "group", "acl.refit. (prefix)"): {"Read"},
        **role("approver", control={"Read", "Write"}),
        **role("webhook", requests={"Write"}),
    }
    assert rules == expected


def test_nothing_gets_all_a_wildcard_create_or_a_cluster_right(tmp_path, capsys):
    config, path = pipeline(tmp_path)
    exactly_once = tmp_path / "eos.toml"
    exactly_once.write_text(config.with_delivery(guarantee="exactly_once").to_toml())
    for toml in (path, exactly_once):
        assert main(["acls", "--config", str(toml), "--broker", "kafka://127.0.0.1:9093"]) == 0
        out = capsys.readouterr().out
        lines = [line for line in out.splitlines() if not line.startswith("#")]
        assert lines and all(line.startswith("kafka-acls.sh --bootstrap-server 127.0.0.1:9093 --command-config "
                                             "admin.properties --add --allow-principal User:acl-adult-")
                             for line in lines)
        assert "*" not in out and "--cluster" not in out and "--deny-principal" not in out
        operations = {word for line in lines for before, word in zip(line.split(), line.split()[1:])
                      if before == "--operation"}
        assert operations <= {"Read", "Write", "Describe", "DescribeConfigs"}, operations
        prefixed = [line.split("--resource-pattern-type")[0].split()[-2:] for line in lines if "prefixed" in line]
        assert sorted(prefixed) == sorted([["--group", "acl.refit."]] + (
            [["--transactional-id", "acl-adult.records."], ["--transactional-id", "acl-adult.embeddings."]]
            if toml == exactly_once else []))
    header = out.splitlines()[:2]
    assert header[0].startswith(f"# Kafka ACLs of {exactly_once}: run as a super user")
    assert header[1].startswith("# worker User:acl-adult-worker: workers: read the inputs")


def test_principals_app_id_and_roles_can_be_chosen_and_a_bad_principal_is_one_line(tmp_path, capsys):
    _, path = pipeline(tmp_path)
    rules = printed(capsys, "--config", str(path), "--app-id", "loans", "--role", "worker", "--role", "approver",
                    "--principal", "worker=User:alice", "--principal", "approver=bob")
    assert {principal for principal, _, _ in rules} == {"User:alice", "User:bob"}
    assert ("User:alice", "group", "loans.records") in rules and rules[("User:bob", "topic", "acl.control")] == {
        "Read", "Write"}
    for bad in ("boss=User:x", "worker=", "worker=User:*"):
        assert main(["acls", "--config", str(path), "--principal", bad]) == 1
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 1 and err.startswith(f"fairstream acls: error: --principal "
                                                                            f"{bad!r}: ")


# --------------------------------------------------------------------------- on a secure cluster


@dataclasses.dataclass
class Secure:
    cluster: KafkaCluster
    passwords: dict[str, str]
    config: object
    toml: object

    def env(self, user: str) -> dict[str, str]:
        password = self.cluster.admin_password if user == "admin" else self.passwords[user]
        return self.cluster.client_env(user, password)

    def security(self, user: str) -> kafka.ClientSecurity:
        return self.cluster.security(user, self.passwords.get(user))


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """One secure Kafka node; users worker, noinput, approver, stranger; the pipeline's ACLs applied by the
    product as the admin (``fairstream acls --apply``), worker and approver as their roles' principals."""
    tmp = tmp_path_factory.mktemp("secure")
    config, toml = pipeline(tmp)
    with KafkaCluster(tmp / "kafka", secure=True) as cluster:
        passwords = {user: cluster.add_user(user) for user in ("worker", "noinput", "approver", "stranger")}
        yield Secure(cluster, passwords, config, toml)


@pytest.fixture
def as_user(secure, monkeypatch):
    """Make this process's fairstream clients (and commands run in-process) connect as a user."""
    def switch(user: str) -> None:
        for key, value in secure.env(user).items():
            monkeypatch.setenv(key, value)
        kafka.use(kafka.ClientSecurity.resolve())

    yield switch
    kafka.use(kafka.ClientSecurity())


@pytest.fixture(scope="module")
def applied(secure):
    """The ACLs applied with ``fairstream acls --apply`` as the admin; noinput gets the worker's but reading the
    input (its Describe kept), through the product's own apply function."""
    env = secure.env("admin")
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        code = main(["acls", "--apply", "--config", str(secure.toml), "--broker", secure.cluster.url,
                     "--principal", "worker=User:worker", "--principal", "approver=User:approver"])
        noinput = [acl if acl.name != secure.config.topics.records_in else dataclasses.replace(acl, operations=(
                   "Describe",)) for acl in pipeline_acls(secure.config, principals={"worker": "User:noinput"},
                                                          roles=["worker"])]
        apply_acls(secure.cluster.admin_client(), noinput)
    kafka.use(kafka.ClientSecurity())
    assert code == 0
    return noinput


def test_apply_creates_the_topics_and_every_binding_as_the_admin(secure, applied):
    wanted = {(acl.principal, acl.resource.replace("-", "_"), acl.name, "prefixed" if acl.prefixed else "literal",
               operation.upper().replace("DESCRIBECONFIGS", "DESCRIBE_CONFIGS"))
              for acl in pipeline_acls(secure.config, principals={"worker": "User:worker", "approver": "User:approver"})
              + applied for operation in acl.operations}
    admin = secure.cluster.admin_client()  # kept: a client collected before its answer cancels it
    deadline = time.monotonic() + 10
    while True:  # the broker serves new ACLs a moment after the controller committed them
        described = admin.describe_acls(_any_binding(), request_timeout=10).result(10)
        granted = {(b.principal, b.restype.name.lower(), b.name, b.resource_pattern_type.name.lower(),
                    b.operation.name) for b in described}
        if granted == wanted or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert granted == wanted
    assert {b.permission_type.name for b in described} == {"ALLOW"} and {b.host for b in described} == {"*"}
    topics = set(admin.list_topics(timeout=10).topics)
    assert {spec.name for spec in secure.config.topics.specs()} <= topics


def _any_binding():
    from confluent_kafka.admin import AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType, \
        ResourceType

    return AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                            AclPermissionType.ANY)


def test_a_wrong_password_and_a_plaintext_client_are_refused(secure):
    config = {"bootstrap.servers": secure.cluster.bootstrap, "group.id": "nobody", "socket.timeout.ms": 3000}
    wrong = dataclasses.replace(secure.security("approver"), password="not-it").librdkafka_options()
    errors: list[KafkaError] = []
    consumer = Consumer({**config, **wrong, "error_cb": errors.append})
    try:
        deadline = time.monotonic() + 15
        while not any(e.code() == KafkaError._AUTHENTICATION for e in errors) and time.monotonic() < deadline:
            consumer.poll(0.2)
    finally:
        consumer.close()
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    host, port = secure.cluster.address.hosts[0]
    assert not is_kafka_ready(host, port, timeout=2.0)  # a plaintext Kafka request gets no answer


@pytest.fixture(scope="module")
def published(secure, applied, tmp_path_factory):
    """A plan published by the approver through ``fairstream artifacts publish``: (exit status, stdout, stderr)."""
    saved = artifacts.save(tiny_plan(secure.config.features).to_artifact(),
                           tmp_path_factory.mktemp("plan") / "plan.json")
    with pytest.MonkeyPatch.context() as patch:
        for key, value in secure.env("approver").items():
            patch.setenv(key, value)
        with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
            code = main(["artifacts", "publish", str(saved), "--config", str(secure.toml), "--broker",
                         secure.cluster.url, "--by", "alice"])
    kafka.use(kafka.ClientSecurity())
    return code, out.getvalue(), err.getvalue()


def test_the_approver_writes_control_and_a_worker_repairs_as_its_own_principal(secure, published, as_user, capsys,
                                                                                tmp_path):
    code, out, err = published
    assert code == 0 and out.startswith("published plan version 1 ") and "to acl.control" in out, err
    common = ["--config", str(secure.toml), "--broker", secure.cluster.url]
    as_user("admin")
    assert main(["replay", "--limit", "40", "--bad", "2", "--quiet", *common]) == 0
    capsys.readouterr()
    worker = WorkerProcess(secure.config, secure.cluster.bootstrap, tmp_path / "worker", env=secure.env("worker"))
    with worker:  # started
        with TopicReader(secure.cluster.bootstrap, secure.config.topics.records_repaired) as reader:
            repaired = last_messages(reader, 38, 90)
        with TopicReader(secure.cluster.bootstrap, secure.config.topics.dlq) as reader:
            dead = last_messages(reader, 2, 30)
        assert worker.wait_for_log("announced on acl.control", timeout=30), worker.log_tail()
    log = worker.log_path.read_text(errors="replace")
    assert (len(repaired), len(dead)) == (38, 2), log[-3000:]
    assert "AUTHORIZATION" not in log.upper().replace("NOT AUTHORISED", ""), log[-3000:]


def test_a_stranger_may_not_write_control_the_broker_refuses_and_the_product_says_so_in_one_line(
        secure, applied, as_user, capsys):
    as_user("stranger")

    async def write() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=secure.cluster.bootstrap, **kafka.aiokafka_options())
        await producer.start()
        try:
            await producer.send_and_wait(secure.config.topics.control, b"{}", key=b"plan", partition=0)
        finally:
            await producer.stop()

    with pytest.raises(TopicAuthorizationFailedError):
        asyncio.run(write())
    code = main(["artifacts", "approve", "plan", "1", "--reason", "looks fine", "--config", str(secure.toml),
                 "--broker", secure.cluster.url])
    out, err = capsys.readouterr()
    assert (code, out, err) == (1, "", "fairstream artifacts: not authorised: User:stranger may not write topic "
                                       f"acl.control (Kafka refused it; see 'fairstream acls --config {secure.toml}')\n")


def test_a_stranger_may_not_read_the_input_the_broker_refuses_and_the_product_says_so(secure, applied, as_user,
                                                                                       capsys, tmp_path):
    as_user("stranger")
    assert _refused_read(secure, "stranger") == KafkaError.TOPIC_AUTHORIZATION_FAILED
    code = main(["worker", "--config", str(secure.toml), "--broker", secure.cluster.url, "--run-dir",
                 str(tmp_path), "--metrics-port", "off"])
    out, err = capsys.readouterr()
    assert (code, out, err) == (1, "", "fairstream worker: not authorised: User:stranger may not read topic "
                                       f"acl.records.in (Kafka refused it; see 'fairstream acls --config {secure.toml}')\n")


def test_a_worker_that_may_not_read_its_input_exits_non_zero_with_one_critical_line(secure, published, tmp_path):
    # With a plan to apply, the worker fetches (without one it holds its input and reads nothing).
    worker = WorkerProcess(secure.config, secure.cluster.bootstrap, tmp_path / "worker", env=secure.env("noinput"))
    with worker:  # started
        deadline = time.monotonic() + 60
        while worker.running and time.monotonic() < deadline:
            time.sleep(0.2)
        code = worker._process.poll()
    log = worker.log_path.read_text(errors="replace")
    refusal = ("records: not authorised: User:noinput may not read topic acl.records.in (Kafka refused it; see "
               "'fairstream acls --config PIPELINE')")
    critical = [line for line in log.splitlines() if "CRITICAL" in line and "not authorised" in line]
    assert code not in (None, 0) and len(critical) == 1 and critical[0].rstrip().endswith(refusal), (code, log[-3000:])


def test_the_approver_may_not_read_the_input(secure, applied, as_user, capsys, tmp_path):
    assert _refused_read(secure, "approver") == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert _refused_read(secure, "worker") is None  # the same request, allowed to the worker
    as_user("approver")
    code = main(["worker", "--config", str(secure.toml), "--broker", secure.cluster.url, "--run-dir",
                 str(tmp_path), "--metrics-port", "off"])
    out, err = capsys.readouterr()
    assert (code, out, err) == (1, "", "fairstream worker: not authorised: User:approver may not read topic "
                                       f"acl.records.in (Kafka refused it; see 'fairstream acls --config {secure.toml}')\n")


def _refused_read(secure, user: str) -> int | None:
    """The broker's answer to ``user`` asking for the input topic's metadata (what a read starts with): the error
    code, or None when it is allowed."""
    consumer = Consumer({"bootstrap.servers": secure.cluster.bootstrap, **secure.security(user).librdkafka_options(),
                         "group.id": "unused"})
    try:
        topic = consumer.list_topics(secure.config.topics.records_in, timeout=20).topics[secure.config.topics.records_in]
        return None if topic.error is None else topic.error.code()
    finally:
        consumer.close()
