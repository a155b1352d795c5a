"""Kafka security settings: resolved from the config and the environment, handed to every client, never logged."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from fairstream.streams import kafka
from fairstream.streams.config import ConfigError, KafkaConfig, PipelineConfig, adult_config
from fairstream.streams.kafka import ClientSecurity, KafkaSecurityError

STREAMS = Path(kafka.__file__).resolve().parent
CLIENTS = {"AIOKafkaConsumer": "aiokafka_options", "AIOKafkaProducer": "aiokafka_options",
           "AIOKafkaAdminClient": "aiokafka_options", "KafkaConsumer": "kafka_python_options",
           "KafkaProducer": "kafka_python_options", "KafkaAdminClient": "kafka_python_options",
           # confluent-kafka (librdkafka): one dict of settings, the options spread into it
           "Consumer": "librdkafka_options", "Producer": "librdkafka_options", "AdminClient": "librdkafka_options"}
SECRET = "s3cr3t-do-not-log"


def sasl(**changes) -> dict:
    return {"FAIRSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "FAIRSTREAM_KAFKA_SASL_USERNAME": "fairstream",
            "FAIRSTREAM_KAFKA_SASL_PASSWORD": SECRET, **changes}


def test_plaintext_by_default_and_no_options_to_pass():
    security = ClientSecurity.resolve(env={})
    assert security.protocol == "PLAINTEXT" and security.kafka_python_options() == {} == security.aiokafka_options()
    assert security.librdkafka_options() == {}


def test_the_environment_overrides_the_config_and_the_password_comes_from_a_file(tmp_path):
    secret = tmp_path / "password"
    secret.write_text(SECRET + "\n")
    config = KafkaConfig(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256", sasl_username="cfg",
                         sasl_password_file=str(secret))
    security = ClientSecurity.resolve(config, env={"FAIRSTREAM_KAFKA_SASL_USERNAME": "env-user"})
    assert (security.protocol, security.mechanism, security.username, security.password) == (
        "SASL_PLAINTEXT", "SCRAM-SHA-256", "env-user", SECRET)
    assert security.kafka_python_options() == {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256",
                                               "sasl_plain_username": "env-user", "sasl_plain_password": SECRET}
    assert security.librdkafka_options() == {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
                                             "sasl.username": "env-user", "sasl.password": SECRET}
    # The password variable wins over the file (a secret injected by the platform).
    assert ClientSecurity.resolve(config, env={"FAIRSTREAM_KAFKA_SASL_PASSWORD": "other"}).password == "other"


def test_tls_files_become_an_ssl_context_for_aiokafka_and_paths_for_kafka_python(tmp_path):
    cert = tmp_path / "ca.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(tmp_path / "k.pem"),
                    "-out", str(cert), "-days", "1", "-subj", "/CN=test"], check=True, capture_output=True)
    security = ClientSecurity.resolve(env=sasl(FAIRSTREAM_KAFKA_SSL_CAFILE=str(cert)))
    assert security.kafka_python_options()["ssl_cafile"] == str(cert)
    context = security.aiokafka_options()["ssl_context"]
    assert context.verify_mode.name == "CERT_REQUIRED" and context.cert_store_stats()["x509_ca"] == 1
    files = dict(FAIRSTREAM_KAFKA_SSL_CAFILE=str(cert), FAIRSTREAM_KAFKA_SSL_CERTFILE=str(cert),
                 FAIRSTREAM_KAFKA_SSL_KEYFILE=str(tmp_path / "k.pem"))
    rdkafka = ClientSecurity.resolve(env=sasl(**files)).librdkafka_options()
    assert (rdkafka["security.protocol"], rdkafka["ssl.ca.location"], rdkafka["ssl.certificate.location"],
            rdkafka["ssl.key.location"]) == ("SASL_SSL", str(cert), str(cert), str(tmp_path / "k.pem"))
    from confluent_kafka import Producer

    Producer({"bootstrap.servers": "127.0.0.1:1", **rdkafka})  # librdkafka accepts every key and loads the files


@pytest.mark.parametrize("env, message", [
    ({"FAIRSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL"}, "kafka.security_protocol must be one of"),
    (sasl(FAIRSTREAM_KAFKA_SASL_MECHANISM="GSSAPI"), "kafka.sasl_mechanism must be one of"),
    (sasl(FAIRSTREAM_KAFKA_SASL_PASSWORD=""), "needs the password ($FAIRSTREAM_KAFKA_SASL_PASSWORD"),
    (sasl(FAIRSTREAM_KAFKA_SASL_USERNAME=""), "needs kafka.sasl_username"),
    (sasl(FAIRSTREAM_KAFKA_SSL_CAFILE="/nonexistent/ca.pem"), "kafka.ssl_cafile: no such file"),
])
def test_inconsistent_settings_name_the_key_and_never_the_secret(env, message):
    with pytest.raises(KafkaSecurityError) as info:
        ClientSecurity.resolve(env=env)
    assert message.replace("$", "") in str(info.value).replace("$", "") and SECRET not in str(info.value)


def test_the_password_is_masked_wherever_the_settings_are_shown():
    security = ClientSecurity.resolve(env=sasl())
    assert SECRET not in repr(security) and SECRET not in str(security) and "password='***'" in repr(security)


def test_the_kafka_table_of_a_pipeline_config_reads_back_and_refuses_a_typo():
    config = adult_config(kafka=KafkaConfig(security_protocol="SSL", ssl_cafile="/etc/ca.pem"))
    import tomllib

    assert PipelineConfig.from_dict(tomllib.loads(config.to_toml())) == config
    with pytest.raises(ConfigError, match="kafka.security_protocol must be"):
        KafkaConfig(security_protocol="TLS")
    with pytest.raises(ConfigError, match=r"\[kafka\] has unknown key\(s\) \['sasl_password'\]"):
        PipelineConfig.from_dict({"pipeline": {"name": "p", "features": ["x"], "groups": [0, 1], "strata": [0]},
                                  "kafka": {"sasl_password": SECRET}})


def spread_calls(spreads) -> set[str]:
    """Names of the functions whose results are spread (``**f()``) among these keyword values / dict values."""
    return {value.func.id for value in spreads if isinstance(value, ast.Call) and isinstance(value.func, ast.Name)}


def client_calls() -> list[tuple[str, int, str, set[str]]]:
    """(file, line, client class, names of the ** options passed) of every Kafka client created in streams/.

    Keyword clients (kafka-python, aiokafka) spread the options among their keywords; confluent-kafka's take one
    dict of settings, a literal the options are spread into.
    """
    calls = []
    for path in sorted(STREAMS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in CLIENTS:
                spread = spread_calls(kw.value for kw in node.keywords if kw.arg is None)
                for settings in (a for a in node.args[:1] if isinstance(a, ast.Dict)):
                    spread |= spread_calls(v for k, v in zip(settings.keys, settings.values) if k is None)
                name = getattr(node.func, "id", getattr(node.func, "attr", None))
                calls.append((str(path.relative_to(STREAMS)), node.lineno, name, spread))
    return calls


def test_every_kafka_client_the_product_creates_gets_the_security_options():
    calls = client_calls()
    # worker consumers and producers (librdkafka), notices, control follower, admin and producer, topic admin,
    # replay, topic reader, re-fit source, service and request publisher
    assert len(calls) >= 13, calls
    assert {"Consumer", "Producer"} <= {name for _, _, name, _ in calls}, calls
    missing = [(f, line, name) for f, line, name, spread in calls if CLIENTS[name] not in spread
               and f not in LOCAL_CLUSTER_ONLY]
    assert not missing, f"Kafka clients created without the security options: {missing}"


LOCAL_CLUSTER_ONLY = {"ops/kafka_cluster.py"}
"""Files whose clients talk only to the plaintext Kafka nodes they started themselves (which node leads a
partition), never to the user's cluster: the user's security settings would not fit them."""


def test_a_client_without_the_options_is_caught(tmp_path, monkeypatch):
    """The check above can fail: a new client that forgets the options is reported."""
    extra = STREAMS / "_probe_client.py"
    extra.write_text("from kafka import KafkaConsumer\nfrom confluent_kafka import Producer\n\ndef f():\n"
                     "    return KafkaConsumer(bootstrap_servers='x'), \\\n"
                     "        Producer({'bootstrap.servers': 'x', **other()})\n")
    try:
        assert {c[2] for c in client_calls() if c[0] == "_probe_client.py" and not c[3] - {"other"}} == {
            "KafkaConsumer", "Producer"}
    finally:
        extra.unlink()


def test_the_cli_takes_the_settings_from_the_environment_and_keeps_the_password_out_of_its_output(broker, tmp_path):
    """Against the plaintext broker a SASL client cannot connect: the settings really reach the client,
    and the one-line error says so without the password."""
    env = {**__import__("os").environ, **sasl(FAIRSTREAM_KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT")}
    result = subprocess.run([sys.executable, "-m", "fairstream.streams.cli", "replay", "--broker",
                             f"kafka://{broker.bootstrap}", "--limit", "5", "--quiet", "--run-dir", str(tmp_path)],
                            env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "over SASL_PLAINTEXT (check the [kafka] settings and credentials)" in result.stderr, result.stderr
    assert SECRET not in result.stdout + result.stderr
    plain = subprocess.run([sys.executable, "-m", "fairstream.streams.cli", "replay", "--broker",
                            f"kafka://{broker.bootstrap}", "--limit", "5", "--quiet", "--run-dir", str(tmp_path),
                            "--id-prefix", "plain"], capture_output=True, text=True, timeout=180)
    assert plain.returncode == 0, plain.stderr
