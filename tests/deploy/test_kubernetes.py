"""deploy/k8s: Kustomize renders it, the objects validate against the Kubernetes API schemas, and they fit together.

``kubectl kustomize`` (Kustomize inside kubectl, on this machine's image) renders both entry points
without a cluster; ``kubernetes-validate`` checks every built-in object against the API's schema.
The Prometheus Operator's objects have no schema there: their fields are checked against what they
point at (the worker Service, the alert rules, the webhook route of alertmanager.yml).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from functools import cache

import kubernetes_validate
import pytest
import yaml

from fairstream.streams.config import PipelineConfig
from fairstream.streams.ops.prometheus import ALERTS_YML, REPO
from fairstream.streams.worker.consumer import STOP_SETTLE_SECONDS
from fairstream.streams.worker.health import HEALTHZ, LOOP_ANSWER_SECONDS, READYZ

from .conftest import ALERTMANAGER_YML, DOCKERFILE, K8S, kustomize, parse_cli

KUBERNETES_VERSION = "1.30.0"  # the oldest minor version still maintained upstream when this was written
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule", "AlertmanagerConfig"}
WEBHOOK_SECRET = "fairstream-refit-webhook"  # created by hand (a token is no file to commit)


@cache
def rendered(entry: str = "monitoring") -> tuple[dict, ...]:
    return tuple(kustomize(K8S / entry))


def objects(kind: str, entry: str = "monitoring") -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in rendered(entry) if o["kind"] == kind}


def pod_specs() -> dict[str, dict]:
    """The pod template of every workload, by kind/name."""
    specs = {f"Deployment/{name}": o["spec"]["template"]["spec"] for name, o in objects("Deployment").items()}
    specs.update({f"CronJob/{name}": o["spec"]["jobTemplate"]["spec"]["template"]["spec"]
                  for name, o in objects("CronJob").items()})
    return specs


def containers() -> list[dict]:
    return [container for spec in pod_specs().values() for container in spec["containers"]]


def kustomization(entry: str) -> dict:
    return yaml.safe_load((K8S / entry / "kustomization.yaml").read_text())


# --------------------------------------------------------------------------- rendering and schemas


def test_both_entry_points_render_and_every_listed_file_exists():
    base, monitoring = rendered("base"), rendered("monitoring")
    assert {o["kind"] for o in base} == {"ConfigMap", "Service", "PersistentVolumeClaim", "Deployment", "CronJob"}
    assert {o["kind"] for o in monitoring} - {o["kind"] for o in base} == OPERATOR_KINDS
    for entry in ("base", "monitoring"):
        listed = kustomization(entry)["resources"] + [f for g in kustomization(entry).get("configMapGenerator", [])
                                                       for f in g.get("files", [])]
        assert all((K8S / entry / path).exists() for path in listed), listed
    assert {o["metadata"].get("namespace") for o in monitoring} == {kustomization("base")["namespace"]}


@pytest.mark.parametrize("entry", ["base", "monitoring"])
def test_every_built_in_object_validates_against_the_kubernetes_schema(entry):
    for obj in rendered(entry):
        if obj["kind"] in OPERATOR_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message} at {list(exc.path)}") from None


def test_the_schema_check_can_fail():
    (worker,) = [o for o in rendered() if o["kind"] == "Deployment" and o["metadata"]["name"] == "fairstream-worker"]
    broken = yaml.safe_load(yaml.safe_dump(worker))
    broken["spec"]["template"]["spec"]["terminationGracePeriod"] = 60  # a misspelt field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


# --------------------------------------------------------------------------- one image, valid commands


def test_every_container_runs_the_one_image_as_the_images_user():
    (image,) = kustomization("base")["images"]
    assert {c["image"] for c in containers()} == {f"{image['newName']}:{image['newTag']}"}
    uid, gid = re.search(r"^USER (\d+):(\d+)$", DOCKERFILE.read_text(), flags=re.MULTILINE).groups()
    for name, spec in pod_specs().items():
        context = spec["securityContext"]
        assert context["runAsNonRoot"] and (context["runAsUser"], context["runAsGroup"]) == (int(uid), int(gid)), name
        for container in spec["containers"]:
            assert container["securityContext"]["readOnlyRootFilesystem"], name
            assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"]), f"{name}: no writable /tmp"


def test_every_container_runs_a_valid_fairstream_command_with_the_mounted_pipeline():
    (pipeline_map,) = [o for name, o in objects("ConfigMap").items() if name.startswith("fairstream-pipeline-")]
    for container in containers():
        assert container["command"] == ["fairstream"]
        args = parse_cli(container["args"])
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for spec in pod_specs().values() for v in spec["volumes"]}
        (pipeline_volume,) = [n for n, v in volumes.items() if v.get("configMap", {}).get("name") == pipeline_map["metadata"]["name"]]
        directory, _, key = args.config.rpartition("/")
        assert directory == mounts[pipeline_volume] and key in pipeline_map["data"], container["name"]
        assert args.broker is None  # from $FAIRSTREAM_BROKER of the broker ConfigMap
        assert next(e["configMapRef"]["name"] for e in container["envFrom"]).startswith("fairstream-broker-")


def test_the_pipeline_configmap_is_the_pipeline_file(tmp_path):
    (pipeline_map,) = [o for name, o in objects("ConfigMap").items() if name.startswith("fairstream-pipeline-")]
    path = tmp_path / "pipeline.toml"
    path.write_text(pipeline_map["data"]["pipeline.toml"])
    assert PipelineConfig.from_toml(path) == PipelineConfig.from_toml(K8S / "base" / "pipeline.toml")
    broker_url = next(iter(o for n, o in objects("ConfigMap").items() if n.startswith("fairstream-broker-")))
    assert broker_url["data"]["FAIRSTREAM_BROKER"].startswith("kafka://")


def test_everything_a_pod_refers_to_is_defined_but_the_hand_made_secret():
    defined = {(o["kind"], o["metadata"]["name"]) for o in rendered()}
    referred = set()
    for spec in pod_specs().values():
        for volume in spec["volumes"]:
            if "configMap" in volume:
                referred.add(("ConfigMap", volume["configMap"]["name"]))
            if "secret" in volume:
                referred.add(("Secret", volume["secret"]["secretName"]))
            if "persistentVolumeClaim" in volume:
                referred.add(("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]))
        for container in spec["containers"]:
            referred |= {("ConfigMap", e["configMapRef"]["name"]) for e in container.get("envFrom", [])}
            mounted = {m["name"] for m in container["volumeMounts"]}
            assert mounted <= {v["name"] for v in spec["volumes"]}, container["name"]
    assert referred - defined == {("Secret", WEBHOOK_SECRET)}
    # ... which the docs and the kustomization tell how to create
    create = f"create secret generic {WEBHOOK_SECRET} --from-literal=token="
    assert create in (K8S / "base" / "kustomization.yaml").read_text()
    assert create in (REPO / "docs" / "production.md").read_text()


# --------------------------------------------------------------------------- the worker and the re-fit service


def test_the_worker_stops_gracefully_within_its_grace_period():
    (worker,) = objects("Deployment")["fairstream-worker"]["spec"]["template"]["spec"]["containers"]
    spec = objects("Deployment")["fairstream-worker"]["spec"]["template"]["spec"]
    pre_stop = worker["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    # The worker waits this long for the batch in flight before it leaves its group (consumer.py).
    settle = STOP_SETTLE_SECONDS
    assert spec["terminationGracePeriodSeconds"] >= int(pre_stop[1]) + settle + 10
    strategy = objects("Deployment")["fairstream-worker"]["spec"]["strategy"]["rollingUpdate"]
    assert strategy["maxUnavailable"] == 0


@pytest.mark.parametrize("name", ["fairstream-worker", "fairstream-monitor"])
def test_metrics_ports_agree_from_pipeline_to_scrape(name):
    port = PipelineConfig.from_toml(K8S / "base" / "pipeline.toml").monitor.metrics_port
    deployment = objects("Deployment")[name]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert parse_cli(container["args"]).metrics_port == port
    assert {"name": "metrics", "containerPort": port} in container["ports"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] == "/metrics"


def test_the_pipeline_has_one_monitoring_agent_and_a_standby():
    """`fairstream monitor` with the workers' pipeline and app id: two pods in one consumer group, one reads the
    stats topic and the other stands by; a rolling update replaces one at a time, on different nodes if it can."""
    deployment = objects("Deployment")["fairstream-monitor"]
    spec = deployment["spec"]["template"]["spec"]
    (agent,) = spec["containers"]
    args = parse_cli(agent["args"])
    assert args.command == "monitor" and args.app_id is None  # the workers' app id: this pipeline's agent
    (worker,) = objects("Deployment")["fairstream-worker"]["spec"]["template"]["spec"]["containers"]
    assert args.config == parse_cli(worker["args"]).config
    assert {m["mountPath"] for m in agent["volumeMounts"]} == {m["mountPath"] for m in worker["volumeMounts"]}
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    (term,) = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert objects("Service")["fairstream-monitor"]["spec"]["publishNotReadyAddresses"] is True  # the standby too


def test_the_worker_is_probed_for_liveness_at_healthz_and_readiness_at_readyz_on_its_metrics_port():
    (worker,) = objects("Deployment")["fairstream-worker"]["spec"]["template"]["spec"]["containers"]
    live, ready = worker["livenessProbe"], worker["readinessProbe"]
    assert live["httpGet"] == {"path": HEALTHZ, "port": "metrics"}  # the event loop answers
    assert ready["httpGet"] == {"path": READYZ, "port": "metrics"}  # consuming
    for probe in (live, ready):  # the worker answers 503 after LOOP_ANSWER_SECONDS; the kubelet's default is 1 s
        assert probe["timeoutSeconds"] > LOOP_ANSWER_SECONDS
    # A worker that is not ready is still scraped: its lag and held input say why.
    assert objects("Service")["fairstream-worker"]["spec"]["publishNotReadyAddresses"] is True
    # Ready means owning partitions: the pod a rolling update adds must find some to own.
    deployment = objects("Deployment")["fairstream-worker"]["spec"]
    partitions = PipelineConfig.from_toml(K8S / "base" / "pipeline.toml").topics.partitions
    assert deployment["replicas"] + deployment["strategy"]["rollingUpdate"]["maxSurge"] <= partitions


def test_services_select_their_pods_and_name_their_ports():
    for name, svc in objects("Service").items():
        deployment = objects("Deployment")[name]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert svc["spec"]["selector"].items() <= labels.items(), name
        ports = {p["name"] for c in deployment["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= ports, name


def test_the_refit_service_serves_the_webhook_with_the_secret_token():
    deployment = objects("Deployment")["fairstream-refit"]
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    args = parse_cli(container["args"])
    assert args.serve and args.webhook_port == 9095
    (volume,) = [v for v in spec["volumes"] if "secret" in v]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert args.webhook_token_file == f"{mount['mountPath']}/token" and volume["secret"]["secretName"] == WEBHOOK_SECRET
    assert {"name": "webhook", "containerPort": args.webhook_port} in container["ports"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "webhook"}
    assert deployment["spec"]["strategy"]["type"] == "Recreate"


def test_the_cronjob_is_suspended_while_the_service_answers_drift():
    cronjob = objects("CronJob")["fairstream-refit"]["spec"]
    assert cronjob["suspend"] is True and cronjob["concurrencyPolicy"] == "Forbid"


# --------------------------------------------------------------------------- Prometheus Operator objects


@pytest.mark.parametrize("name", ["fairstream-worker", "fairstream-monitor"])
def test_the_servicemonitors_scrape_the_workers_and_the_agents_as_their_jobs(name):
    monitor = objects("ServiceMonitor")[name]
    service = objects("Service")[name]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (other,) = set(objects("Service")) & {"fairstream-worker", "fairstream-monitor"} - {name}
    other_labels = objects("Service")[other]["metadata"]["labels"]
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= other_labels.items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    # The operator names the job after the Service; the alert rules select job="fairstream-worker", and the
    # dashboard and the runbook name job fairstream-monitor (deploy/prometheus/prometheus.yml's job for the agent).
    assert service["metadata"]["name"] == name and "jobLabel" not in monitor["spec"]
    assert 'job="fairstream-worker"' in ALERTS_YML.read_text()
    prometheus = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    assert name in {job["job_name"] for job in prometheus["scrape_configs"]}


def test_the_prometheusrule_is_the_rule_file_rendered_up_to_date():
    (rule,) = objects("PrometheusRule").values()
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS_YML.read_text())["groups"]
    rendered_now = subprocess.run([sys.executable, str(K8S / "render_prometheusrule.py"), str(ALERTS_YML)], check=False,
                                  capture_output=True, text=True, timeout=60)
    assert rendered_now.returncode == 0, rendered_now.stderr
    assert rendered_now.stdout == (K8S / "monitoring" / "prometheusrule.yaml").read_text(), \
        "deploy/k8s/monitoring/prometheusrule.yaml is out of date with deploy/prometheus/alerts.yml: run `make k8s-rules`"


def test_the_alertmanagerconfig_is_the_route_of_alertmanager_yml_to_the_refit_service():
    (config,) = objects("AlertmanagerConfig").values()
    plain = yaml.safe_load(ALERTMANAGER_YML.read_text())
    (route,) = [r for r in plain["route"]["routes"] if r["receiver"] == "fairstream-refit"]
    spec_route = config["spec"]["route"]
    assert [f'{m["name"]} {m["matchType"]} "{m["value"]}"' for m in spec_route["matchers"]] == route["matchers"]
    assert (spec_route["groupBy"], spec_route["groupWait"], spec_route["groupInterval"], spec_route["repeatInterval"]) \
        == (route["group_by"], route["group_wait"], route["group_interval"], route["repeat_interval"])
    (receiver,) = config["spec"]["receivers"]
    (hook,) = receiver["webhookConfigs"]
    (plain_hook,) = next(r for r in plain["receivers"] if r["name"] == "fairstream-refit")["webhook_configs"]
    assert hook["sendResolved"] == plain_hook["send_resolved"] and hook["maxAlerts"] == plain_hook["max_alerts"]
    refit = objects("Service")["fairstream-refit"]
    (port,) = refit["spec"]["ports"]
    namespace = refit["metadata"]["namespace"]
    assert hook["url"] == f"http://{refit['metadata']['name']}.{namespace}.svc:{port['port']}/alertmanager"
    assert hook["httpConfig"]["authorization"] == {"type": "Bearer",
                                                   "credentials": {"name": WEBHOOK_SECRET, "key": "token"}}


def test_the_kubernetes_pipeline_is_valid_toml_with_the_k8s_paths():
    data = tomllib.loads((K8S / "base" / "pipeline.toml").read_text())
    mounts = {m["mountPath"] for c in containers() for m in c["volumeMounts"]}
    assert data["pipeline"]["artifact_dir"] in mounts
