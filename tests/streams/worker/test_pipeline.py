"""The pipeline end to end on Apache Kafka with a real worker process.

One worker is shared by the whole module (joining a consumer group takes about 30 s); tests use
distinct record ids and read outputs by id, and run in file order (the hot-swap test advances the
served version for the tests after it).
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field

import numpy as np
import pytest
from kafka import KafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from fairstream.repair import artifacts, datasets
from fairstream.models.plan import DistributionalRepair
from fairstream.streams.config import adult_config
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.records import control_key, encode_control
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.demo.collect import TopicReader
from fairstream.streams.demo.replay import bad_messages, interleave, record_messages
from fairstream.streams.kafka import KAFKA_API_VERSION
from fairstream.streams.ops.prometheus import binary
from fairstream.streams.ops.supervise import WorkerProcess
from fairstream.streams.schemas import ControlRecord
from fairstream.streams.topics import ensure_topics

from .outputs import collect_outputs, send

pytestmark = pytest.mark.integration


@dataclass
class LivePipeline:
    config: object
    bootstrap: str
    worker: WorkerProcess
    control: ControlClient
    plans: dict = field(default_factory=dict)  # version -> the fitted DistributionalRepair it carries
    archive: object = None

    def publish(self, plan) -> int:
        record = self.control.publish_sync(plan.to_artifact())
        self.plans[record.version] = plan
        return record.version

    def send(self, messages, rate=None) -> None:
        send(self.bootstrap, self.config, messages, rate)

    def outputs(self, ids: set, timeout: float = 120.0) -> tuple[dict, dict]:
        """Every repaired record and dead letter for ``ids`` (lists: duplicates are kept), once all arrived."""
        alive = lambda: None if self.worker.running else self.worker.log_tail()  # noqa: E731
        return collect_outputs(self.bootstrap, self.config, ids, timeout, alive)


def features(records, config):
    return np.array([[r["features"][f] for f in config.features] for r in records])


@pytest.fixture(scope="module")
def pipeline(broker, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("pipeline")
    config = adult_config(artifact_dir=str(run_dir / "artifacts")).with_topics(prefix="itest")
    data = datasets.load("adult")
    research, archive = data.split(10_000, seed=0)
    ensure_topics(broker.bootstrap, config.topics)
    worker = WorkerProcess(config, broker.bootstrap, run_dir).start()
    try:
        live = LivePipeline(config, broker.bootstrap, worker, ControlClient(broker.bootstrap, config.topics,
                                                                           ArtifactStore(config.artifact_dir)),
                            archive=archive)
        live.publish(DistributionalRepair(n_q=250, out_of_range="reject").fit(research.X, research.s, research.u))
        warm = record_messages(archive.subset(slice(0, 1)), config, id_prefix="warmup")
        live.send(warm)
        live.outputs({"warmup-0"}, timeout=180)
        yield live
    finally:
        worker.stop()


def test_every_record_ends_repaired_or_dead_lettered_exactly_once(pipeline):
    good = record_messages(pipeline.archive.subset(slice(0, 3000)), pipeline.config, id_prefix="once")
    bad = bad_messages(pipeline.config, 60, id_prefix="once-bad")
    pipeline.send(interleave(good, bad, seed=1))
    repaired, dead = pipeline.outputs({k.decode() for k, _ in good + bad})
    assert not repaired.keys() & dead.keys()
    assert all(len(v) == 1 or all(json.dumps(x["features"]) == json.dumps(v[0]["features"]) for x in v)
               for v in repaired.values())  # at-least-once: a duplicate, if any, is identical
    bad_ids = {k.decode() for k, _ in bad}
    assert bad_ids <= set(dead)
    # Good records are dead-lettered only under the plan's out-of-range policy ("reject" here).
    assert all("outside the plan range" in dead[rid][0]["reason"] for rid in set(dead) - bad_ids)
    assert len(repaired) + len(dead) == len(good) + len(bad)
    for rid, (letter,) in dead.items():
        assert letter["reason"] and letter["topic"] == pipeline.config.topics.records_in and letter["offset"] >= 0
    original = dict(good + bad)
    assert all(base64.b64decode(d[0]["original_b64"]) == original[rid.encode()] for rid, d in dead.items())


def test_stream_output_equals_batch_transform_bit_for_bit(pipeline):
    part = pipeline.archive.subset(slice(3000, 4000))
    messages = record_messages(part, pipeline.config, id_prefix="exact")
    pipeline.send(messages)
    repaired, dead = pipeline.outputs({k.decode() for k, _ in messages})
    ids = [k.decode() for k, _ in messages]
    ok = [i for i, rid in enumerate(ids) if rid in repaired]
    assert len(ok) >= len(ids) - 5 and all("outside the plan range" in d[0]["reason"] for d in dead.values())
    (version,) = {repaired[ids[i]][0]["provenance"]["version"] for i in ok}
    expected = pipeline.plans[version].transform(part.X[ok], part.s[ok], part.u[ok], keys=[ids[i] for i in ok])
    got = features([repaired[ids[i]][0] for i in ok], pipeline.config)
    assert np.array_equal(got, expected)


def scrape(worker: WorkerProcess) -> str:
    """The worker's /metrics (its port is any free one, logged at start)."""
    port = int(re.findall(r"serving Prometheus /metrics on port (\d+)", worker.log_path.read_text())[-1])
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def test_a_live_scrape_after_records_flowed_passes_promtool_and_every_family_names_the_pipeline(pipeline):
    """`promtool check metrics` lints names (units, suffixes); every fairstream_ series carries ``pipeline``."""
    # Records until the monitor's window holds enough to export its gauges (at once after this module's
    # earlier tests; run alone, a few rounds), then a scrape once they are exported (at most once a second).
    deadline, start = time.monotonic() + 120, 0
    while True:
        time.sleep(1.1)
        messages = record_messages(pipeline.archive.subset(slice(start, start + 500)), pipeline.config,
                                   id_prefix=f"scraped-{start}")
        pipeline.send(messages)
        pipeline.outputs({k.decode() for k, _ in messages})
        text = scrape(pipeline.worker)
        for _ in range(10):  # observed after the batch's commit
            if "fairstream_fairness_dependence{" in text:
                break
            time.sleep(0.2)
            text = scrape(pipeline.worker)
        if "fairstream_fairness_dependence{" in text or time.monotonic() > deadline:
            break
        start += 500
    lint = subprocess.run([binary("promtool"), "check", "metrics"], input=text, capture_output=True, text=True,
                          timeout=60)
    assert lint.returncode == 0, f"promtool check metrics:\n{lint.stdout}{lint.stderr}"
    samples = {family.name: family.samples for family in text_string_to_metric_families(text)
               if family.name.startswith("fairstream_")}
    assert {"fairstream_records_group_imputed", "fairstream_records_repaired", "fairstream_fairness_dependence",
            "fairstream_out_of_range_ratio", "fairstream_worker_info"} <= {n for n, s in samples.items() if s}
    unlabelled = {name for name, series in samples.items()
                  if any(sample.labels.get("pipeline") != pipeline.config.name for sample in series)}
    assert not unlabelled, f"families without pipeline={pipeline.config.name!r}: {sorted(unlabelled)}"


def test_hot_swap_mid_replay_stamps_one_version_per_record_and_loses_nothing(pipeline):
    part = pipeline.archive.subset(slice(4000, 10000))
    messages = record_messages(part, pipeline.config, id_prefix="swap")
    other_research = datasets.load("adult").split(5_000, seed=7)[0]
    new_plan = DistributionalRepair(n_q=100, out_of_range="reject").fit(
        other_research.X, other_research.s, other_research.u)
    sender = threading.Thread(target=pipeline.send, args=(messages, 1000.0))  # 6 s of records
    sender.start()
    time.sleep(2.0)
    new_version = pipeline.publish(new_plan)
    sender.join()
    ids = [k.decode() for k, _ in messages]
    repaired, dead = pipeline.outputs(set(ids))
    versions = [repaired[rid][0]["provenance"]["version"] for rid in ids if rid in repaired]
    assert set(versions) == {new_version - 1, new_version}, "the swap happened mid-replay"
    for version in (new_version - 1, new_version):
        rows = [i for i, rid in enumerate(ids) if rid in repaired and repaired[rid][0]["provenance"]["version"] == version]
        expected = pipeline.plans[version].transform(part.X[rows], part.s[rows], part.u[rows], keys=[ids[i] for i in rows])
        assert np.array_equal(features([repaired[ids[i]][0] for i in rows], pipeline.config), expected)


def test_tampered_artifact_is_refused_and_the_old_version_keeps_serving(pipeline):
    serving = max(pipeline.plans)
    artifact = pipeline.plans[serving].to_artifact(version=serving + 1)
    blob = bytearray(artifacts.encode(artifact))
    blob[-100] ^= 0xFF  # one flipped payload byte
    record = ControlRecord(kind="plan", version=serving + 1, sha256=artifact.sha256, blob_b64=base64.b64encode(bytes(blob)).decode())
    producer = KafkaProducer(bootstrap_servers=pipeline.bootstrap, api_version=KAFKA_API_VERSION)
    value = encode_control(record)  # under its own key: refused for its payload, not for a key mismatch
    producer.send(pipeline.config.topics.control, key=control_key(record, value), value=value).get(timeout=30)
    producer.close()
    assert pipeline.worker.wait_for_log(f"refused publish of plan version {serving + 1}", timeout=60)
    refusal = next(line for line in pipeline.worker.log_path.read_text().splitlines()
                   if f"refused publish of plan version {serving + 1}" in line)
    assert "payload sha256 mismatch" in refusal, refusal
    messages = record_messages(pipeline.archive.subset(slice(10000, 10200)), pipeline.config, id_prefix="after-tamper")
    pipeline.send(messages)
    repaired, _ = pipeline.outputs({k.decode() for k, _ in messages})
    assert {r[0]["provenance"]["version"] for r in repaired.values()} == {serving}


def test_embeddings_go_through_the_identity_module_and_bad_vectors_are_dead_lettered(pipeline):
    topic = pipeline.config.topics.embeddings_in
    dim = pipeline.config.embeddings.dimension
    producer = KafkaProducer(bootstrap_servers=pipeline.bootstrap, api_version=KAFKA_API_VERSION)
    good = {f"emb-{i}": [float(i + j) for j in range(dim)] for i in range(20)}
    for rid, vector in good.items():
        producer.send(topic, key=rid.encode(), value=json.dumps({"id": rid, "vector": vector, "group": 1}).encode())
    producer.send(topic, key=b"emb-short", value=json.dumps({"id": "emb-short", "vector": [1.0]}).encode())
    producer.flush()
    producer.close()
    out, dead = {}, {}
    with TopicReader(pipeline.bootstrap, pipeline.config.topics.embeddings_repaired) as rep, \
            TopicReader(pipeline.bootstrap, pipeline.config.topics.dlq) as dlq:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (len(out) < len(good) or not dead):
            out.update({r["id"]: r for r in map(lambda m: json.loads(m.value), rep.poll())})
            dead.update({base64.b64decode(d["key_b64"]).decode(): d for d in map(lambda m: json.loads(m.value), dlq.poll())
                         if d["agent"] == "embeddings"})
    # The identity module normalises, as a trained module's input is normalised.
    assert out.keys() == good.keys()
    for rid, vector in good.items():
        np.testing.assert_allclose(out[rid]["vector"], np.array(vector) / np.linalg.norm(vector), rtol=1e-12)
    assert "expected 8" in dead["emb-short"]["reason"]


def test_a_crashed_worker_resumes_and_replays_identically(pipeline):
    part = pipeline.archive.subset(slice(10200, 16200))
    messages = record_messages(part, pipeline.config, id_prefix="crash")
    pipeline.send(messages[:3000])
    time.sleep(2.0)
    pipeline.worker.kill()  # no clean shutdown: some outputs may be produced again after restart
    pipeline.send(messages[3000:])
    pipeline.worker.start()
    ids = [k.decode() for k, _ in messages]
    repaired, dead = pipeline.outputs(set(ids), timeout=240)
    for rid in ids:
        copies = repaired.get(rid, [])
        assert len({json.dumps(c["features"]) + str(c["provenance"]) for c in copies}) <= 1
    assert len(repaired) + len(dead) == len(ids)
