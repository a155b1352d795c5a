"""docker/compose.yaml: valid Compose, every file it names exists, and its services agree with each other.

The schema is the Compose Specification's JSON schema (compose-spec.json next to this file, the copy
SchemaStore publishes and check-jsonschema vendors). The topic-init job's own command runs here
against Apache Kafka; the other fairstream commands are parsed by the real command line.
"""

from __future__ import annotations

import ast
import asyncio
import base64
import copy
import json
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
import yaml

from fairstream.streams.config import PipelineConfig
from fairstream.streams.ops.kafka_cluster import KAFKA_VERSION
from fairstream.streams.ops.prometheus import binary
from fairstream.streams.topics import ensure_topics
from fairstream.streams.worker.health import HEALTHZ, LOOP_ANSWER_SECONDS, WorkerHealth
from fairstream.streams.worker.metrics import serve

from .conftest import (
    ALERTMANAGER_YML,
    COMPOSE_YAML,
    DASHBOARD_JSON,
    DOCKER,
    FAIRSTREAM_IMAGE_SERVICES,
    K8S,
    PIPELINE_TOML,
    bind_mounts,
    compose,
    parse_cli,
    service,
)

SCHEMA = json.loads((Path(__file__).parent / "compose-spec.json").read_text())
PIPELINE_IN_CONTAINER = "/etc/fairstream/pipeline.toml"


def schema_errors(document: dict) -> list[str]:
    validator = jsonschema.Draft202012Validator(SCHEMA)
    return [f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(document)]


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


# --------------------------------------------------------------------------- the file itself


def test_the_compose_file_follows_the_compose_specification():
    assert schema_errors(compose()) == []


def test_the_schema_check_can_fail():
    broken = copy.deepcopy(compose())
    broken["services"]["worker"]["stop_grace_period"] = {"seconds": 60}  # a duration is a string
    broken["services"]["kafka"]["healthcheck"]["retrys"] = 30
    errors = schema_errors(broken)
    assert any("'retrys' does not match" in error for error in errors), errors
    assert any("stop_grace_period" in error for error in errors), errors


def test_every_file_it_names_exists():
    document = compose()
    for name, spec in document["services"].items():
        build = spec.get("build")
        if build:
            context = (DOCKER / build["context"]).resolve()
            assert (context / build["dockerfile"]).is_file(), name
        for target, source in bind_mounts(name).items():
            assert source.exists(), f"{name}: {source} (mounted at {target}) does not exist"
        for volume in spec.get("volumes", []):
            if not volume.startswith((".", "/")):
                assert volume.split(":")[0] in document["volumes"], f"{name}: undeclared volume {volume}"
        for secret in spec.get("secrets", []):
            assert (secret if isinstance(secret, str) else secret["source"]) in document["secrets"], name
        for dependency in spec.get("depends_on", {}):
            assert dependency in document["services"], f"{name} depends on unknown {dependency}"


def test_fairstream_services_share_one_image_the_pipeline_and_the_artifact_store():
    for name in FAIRSTREAM_IMAGE_SERVICES:
        spec = service(name)
        assert spec["image"] == "fairstream:0.1.0" and spec["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}
        assert bind_mounts(name)[PIPELINE_IN_CONTAINER] == (DOCKER / "pipeline.toml").resolve()
        assert "artifacts:/var/lib/fairstream/artifacts" in spec["volumes"]
        assert spec["environment"]["FAIRSTREAM_BROKER"] == "kafka://kafka:9092"
    assert service("topics")["depends_on"] == {"kafka": {"condition": "service_healthy"}}
    for name in ("worker", "monitor", "refit"):
        assert service(name)["depends_on"] == {"topics": {"condition": "service_completed_successfully"}}


# --------------------------------------------------------------------------- the pipelines


def test_compose_and_kubernetes_run_one_pipeline_on_their_own_paths_and_replication():
    compose_pipeline = PipelineConfig.from_toml(DOCKER / "pipeline.toml")
    k8s_pipeline = PipelineConfig.from_toml(K8S / "base" / "pipeline.toml")
    assert (compose_pipeline.topics.replication, k8s_pipeline.topics.replication) == (1, 3)
    assert compose_pipeline.artifact_dir == k8s_pipeline.artifact_dir == "/var/lib/fairstream/artifacts"
    assert k8s_pipeline == compose_pipeline.with_topics(replication=3)
    assert compose_pipeline.monitor.metrics_port == 9464


@pytest.mark.parametrize("path", [DOCKER / "pipeline.toml", K8S / "base" / "pipeline.toml"])
def test_the_deployed_pipelines_take_the_records_the_adult_pipeline_takes(path):
    """Producers (`fairstream replay --dataset adult`, users' apps) write for deploy/pipeline.adult.toml."""
    deployed, adult = PipelineConfig.from_toml(path), PipelineConfig.from_toml(PIPELINE_TOML)
    contract = ("features", "groups", "strata", "s_name", "u_name", "label", "max_message_bytes", "valid_ranges")
    assert {key: getattr(deployed, key) for key in contract} == {key: getattr(adult, key) for key in contract}
    assert replace(deployed.topics, replication=1) == replace(adult.topics, replication=1)
    assert deployed.records.chain == ("plan",)  # one artifact to publish before the workers take input


# --------------------------------------------------------------------------- Kafka and the topics


def test_kafka_runs_one_kraft_node_that_the_services_reach():
    env = service("kafka")["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node, controller = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split("@")
    assert int(node) == env["KAFKA_NODE_ID"]
    listeners = dict(item.split("://") for item in env["KAFKA_LISTENERS"].split(","))
    advertised = dict(item.split("://") for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    protocols = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(listeners) == set(protocols) and env["KAFKA_CONTROLLER_LISTENER_NAMES"] in listeners
    assert controller == f"kafka{listeners['CONTROLLER']}"  # the controller listener on this host
    assert advertised["PLAINTEXT"] == "kafka:9092" == service("worker")["environment"]["FAIRSTREAM_BROKER"][8:]
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] in advertised and "CONTROLLER" not in advertised
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"  # the topic-init job owns the layout
    assert len(base64.urlsafe_b64decode(env["CLUSTER_ID"] + "==")) == 16  # what `kafka-storage format` accepts
    host_port = advertised["HOST"].rsplit(":", 1)[1]
    assert f"127.0.0.1:{host_port}:{listeners['HOST'].lstrip(':')}" in service("kafka")["ports"]
    assert service("kafka")["image"] == f"apache/kafka:{KAFKA_VERSION}"  # the release the suite runs on


def test_the_topic_init_job_creates_the_pipelines_topics(broker):
    spec = service("topics")
    program, pipeline, bootstrap = spec["command"]
    assert spec["entrypoint"] == ["python", "-c"] and pipeline == PIPELINE_IN_CONTAINER and bootstrap == "kafka:9092"
    host_pipeline = str(bind_mounts("topics")[pipeline])
    for _ in range(2):  # idempotent: a restarted job changes nothing
        result = subprocess.run([sys.executable, "-c", program, host_pipeline, broker.bootstrap], check=False,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
    topics = PipelineConfig.from_toml(host_pipeline).topics
    assert ensure_topics(broker.bootstrap, topics) == {spec.name: spec.partitions for spec in topics.specs()}
    assert ast.literal_eval(result.stdout.strip()) == {spec.name: spec.partitions for spec in topics.specs()}  # what it printed


def test_the_fairstream_commands_are_valid_command_lines():
    worker = parse_cli(service("worker")["command"])
    assert worker.command == "worker" and worker.config == PIPELINE_IN_CONTAINER and worker.metrics_port == 9464
    assert worker.broker == "kafka://kafka:9092"
    refit = parse_cli(service("refit")["command"])
    assert refit.command == "refit" and refit.serve and refit.webhook_port == 9095 and refit.config == PIPELINE_IN_CONTAINER
    assert refit.webhook_host == "0.0.0.0"  # Alertmanager calls from its own container (the default is this one only)
    assert refit.webhook_token_file == "/run/secrets/refit_webhook_token"  # compose mounts secrets there
    assert service("refit")["secrets"] == ["refit_webhook_token"]
    assert compose()["secrets"]["refit_webhook_token"] == {"environment": "FAIRSTREAM_WEBHOOK_TOKEN"}
    monitor = parse_cli(service("monitor")["command"])
    assert monitor.command == "monitor" and monitor.config == PIPELINE_IN_CONTAINER and monitor.metrics_port == 9464
    assert monitor.broker == worker.broker and monitor.app_id is None  # the workers' app id: the pipeline's agent


def test_the_pipeline_has_one_monitoring_agent_and_a_standby():
    """Two replicas in one consumer group: one reads the stats topic, the other takes over if it goes."""
    monitor = service("monitor")
    assert monitor["deploy"]["replicas"] == 2 and "container_name" not in monitor
    assert monitor["restart"] == "unless-stopped" and monitor["stop_signal"] == "SIGTERM"


def test_workers_stop_gracefully_and_scale_out():
    worker = service("worker")
    assert worker["deploy"]["replicas"] >= 2 and "container_name" not in worker  # --scale needs generated names
    assert worker["stop_signal"] == "SIGTERM" and worker["stop_grace_period"] == "60s"


def test_the_worker_health_check_is_the_liveness_probe_and_a_worker_that_exits_is_restarted():
    """The health check's own command against a real /healthz: passes while the loop answers, fails when it does not."""
    worker = service("worker")
    assert worker["restart"] == "unless-stopped"  # an exit non-zero (an error not recovered in place) restarts it
    check = worker["healthcheck"]
    kind, program, flag, command = check["test"]
    metrics_port = option(worker["command"], "--metrics-port")
    assert (kind, program, flag) == ("CMD", "python", "-c") and f"'http://localhost:{metrics_port}{HEALTHZ}'" in command
    assert _seconds(check["timeout"]) > LOOP_ANSWER_SECONDS
    health = WorkerHealth(answer_within=0.5)
    port = serve(0, "127.0.0.1", routes={HEALTHZ: health.healthz})
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    health.attach(loop)

    def run_check() -> int:
        here = command.replace(f"localhost:{metrics_port}", f"127.0.0.1:{port}")
        return subprocess.run([sys.executable, "-c", here], capture_output=True, timeout=60).returncode

    try:
        assert run_check() == 0
        loop.call_soon_threadsafe(time.sleep, 5.0)  # a blocked event loop
        assert run_check() != 0
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(timeout=10)
        loop.close()


def _seconds(duration: str) -> float:
    return float(duration.removesuffix("s"))


# --------------------------------------------------------------------------- Prometheus, Alertmanager, Grafana


def test_prometheus_in_compose_loads_its_config_and_the_alert_rules(tmp_path):
    """The mounted files, laid out as in the container, pass `promtool check config` (which loads the rules)."""
    mounts = bind_mounts("prometheus")
    config_path = next(c for c in service("prometheus")["command"] if c.startswith("--config.file=")).split("=", 1)[1]
    root = tmp_path / "root"
    for target, source in mounts.items():
        (root / target.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, root / target.lstrip("/"))
    container_config = root / config_path.lstrip("/")
    result = subprocess.run([binary("promtool"), "check", "config", container_config.name], cwd=container_config.parent,
                            check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout and "rules found" in result.stdout
    assert mounts["/etc/prometheus/alerts.yml"] == (DOCKER / ".." / "deploy" / "prometheus" / "alerts.yml").resolve()


def test_prometheus_scrapes_the_workers_and_the_agent_and_alerts_to_alertmanager():
    config = yaml.safe_load(bind_mounts("prometheus")["/etc/prometheus/prometheus.yml"].read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "fairstream-worker"]  # the rules' job
    (dns,) = job["dns_sd_configs"]
    worker_port = PipelineConfig.from_toml(DOCKER / "pipeline.toml").monitor.metrics_port
    assert dns["names"] == ["worker"] and dns["type"] == "A" and dns["port"] == worker_port
    assert option(service("worker")["command"], "--metrics-port") == str(worker_port)
    (agent,) = [j for j in config["scrape_configs"] if j["job_name"] == "fairstream-monitor"]
    (dns,) = agent["dns_sd_configs"]  # both replicas, the active agent and the standby
    assert dns["names"] == ["monitor"] and dns["type"] == "A"
    assert dns["port"] == int(option(service("monitor")["command"], "--metrics-port"))
    assert agent["relabel_configs"] == job["relabel_configs"]  # the same pipeline label
    (target,) = config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert target == "alertmanager:9093" and "alertmanager" in compose()["services"]


def test_alertmanager_in_compose_reaches_the_refit_webhook_with_the_shared_token():
    mounts = bind_mounts("alertmanager")
    assert mounts["/etc/alertmanager/alertmanager.yml"] == ALERTMANAGER_YML.resolve()
    result = subprocess.run(["amtool", "check-config", str(ALERTMANAGER_YML)], check=False, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr
    config = yaml.safe_load(ALERTMANAGER_YML.read_text())
    (receiver,) = [r for r in config["receivers"] if r["name"] == "fairstream-refit"]
    (hook,) = receiver["webhook_configs"]
    (secret,) = service("alertmanager")["secrets"]
    assert secret == {"source": "refit_webhook_token", "target": hook["http_config"]["authorization"]["credentials_file"]}
    host_port = hook["url"].removeprefix("http://").split("/")[0]
    host, port = host_port.split(":")
    assert host in service("refit")["networks"]["default"]["aliases"]
    assert port == option(service("refit")["command"], "--webhook-port")
    assert hook["url"].endswith("/alertmanager") and not hook["send_resolved"]


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard():
    mounts = bind_mounts("grafana")
    provisioning = mounts["/etc/grafana/provisioning"]
    (datasource,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "fairstream.yaml").read_text())["providers"]
    dashboards = mounts[provider["options"]["path"]]  # the provider reads the folder compose mounts there
    assert (dashboards / DASHBOARD_JSON.name).resolve() == DASHBOARD_JSON.resolve()
    home = service("grafana")["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD_JSON.name}"
    # the dashboard's data source variable (no fixed uid) selects this one: a Prometheus, the default
    (variable,) = [v for v in json.loads(DASHBOARD_JSON.read_text())["templating"]["list"] if v["type"] == "datasource"]
    assert variable["query"] == datasource["type"] and datasource["isDefault"]


def test_the_documented_commands_name_real_services():
    header = [line for line in COMPOSE_YAML.read_text().splitlines() if line.startswith("#   docker compose")]
    assert header
    for line in header:
        words = line.split()
        if "run" in words:
            name = words[words.index("--rm") + 1]
            assert name in compose()["services"], line
            parse_cli(words[words.index("--rm") + 2:])
