"""A signed pipeline end to end, with a real worker process on Apache Kafka: the operator publishes the config, the
re-fit service's key publishes a candidate, a person's key approves it, and the worker serves it; a publish through a
copy of the config saying "auto" (with a real publisher key) and an unsigned approval written by a plain producer change
nothing the worker serves, and the worker counts both by why. The unsigned twin of the same run shows what the
signatures add: there, the forged approval serves."""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.request

import pytest

from fairstream.streams.control.gate import seal
from fairstream.streams.control.records import decision_record
from fairstream.streams.demo.collect import TopicReader, last_messages
from fairstream.streams.ops.supervise import WorkerProcess

from .test_hostile import CRO, approved_plan_one, cli, head_of, key_of, keys, pipeline, plans, raw_write  # noqa: F401

pytestmark = pytest.mark.integration


def metrics_of(worker: WorkerProcess) -> str:
    port = int(re.findall(r"serving Prometheus /metrics on port (\d+)", worker.log_path.read_text())[-1])
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def refused(metrics: str, reason: str) -> float:
    found = re.findall(r'^fairstream_artifacts_refused_total\{[^}]*reason="' + reason + r'"[^}]*\} (\S+)$', metrics,
                       re.M)
    return sum(map(float, found))


def served_versions(broker, config, n: int) -> list[int]:
    with TopicReader(broker.bootstrap, config.topics.records_repaired) as reader:
        return [json.loads(message.value)["provenance"]["version"] for message in last_messages(reader, n, 90)]


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_a_worker_serves_only_what_the_pipelines_keys_and_policy_allow(broker, tmp_path, keys, plans, capsys,
                                                                       signed):
    toml, config = pipeline(tmp_path, keys, signed=signed, promotion="approve", broker=broker)
    config = dataclasses.replace(config, monitor=dataclasses.replace(config.monitor, metrics_port=0))
    toml.write_text(config.to_toml())
    common = ["--broker", broker.url, "--config", toml]
    operator = ["--key", key_of(keys, "operator")] if signed else []
    code, out, err = cli(capsys, "config", "publish", *common, *operator, "--reason", "first config")
    assert code == 0, err
    worker = WorkerProcess(config, broker.bootstrap, tmp_path / "worker")
    with worker:
        approved_plan_one(broker, toml, keys, plans, capsys, signed=signed)  # candidate by the re-fit key, approved
        assert worker.wait_for_log("now serving plan artifact version 1", timeout=90), worker.log_tail()
        # The attacker's copy of the config says "auto": its CLI writes a publish that serves at once.
        copy_toml, copy = pipeline(tmp_path, keys, signed=signed, promotion="auto", prefix=config.topics.prefix,
                                   folder="attacker")
        publisher = ["--key", key_of(keys, "publisher")] if signed else []
        code, out, err = cli(capsys, "artifacts", "publish", plans[1], "--broker", broker.url, "--config", copy_toml,
                             "--by", "refit@vm", "--reason", "Alertmanager: FairstreamFairnessDrift", *publisher)
        assert code == 0 and "published plan version 2 " in out and "candidate" not in out, err
        assert worker.wait_for_log("refused publish of plan version 2", timeout=30), worker.log_tail()
        # A candidate by the rules (version 2 again: the refused publish claimed nothing), then an approval forged by a
        # plain producer: no key at all.
        code, out, err = cli(capsys, "artifacts", "publish", plans[2], *common, "--by", "refit@vm", *publisher)
        assert code == 0 and "published plan version 2 as a candidate" in out, err
        forged = decision_record("plan", 2, candidate_sha(broker, toml, capsys), "approve", CRO, reason="forged")
        # Well formed, after the trail's last record, for this pipeline: only the signature is missing.
        raw_write(broker, config.topics.control, [seal(forged, head_of(broker, config), config.topics.control)[2]])
        version = 1 if signed else 2
        if signed:
            assert worker.wait_for_log("refused approve of plan version 2", timeout=30), worker.log_tail()
        else:
            assert worker.wait_for_log("now serving plan artifact version 2", timeout=30), worker.log_tail()
        code, out, err = cli(capsys, "replay", "--limit", "300", "--quiet", *common)
        assert code == 0, err
        assert set(served_versions(broker, config, 300)) == {version}
        metrics = metrics_of(worker)
    assert refused(metrics, "policy") >= 1  # the publish that would serve at once, in either pipeline
    assert refused(metrics, "unsigned") == (1 if signed else 0)
    trail = [json.loads(line) for line in cli(capsys, "artifacts", "history", "--json", *common)[1].splitlines()]
    bypass, candidate = [entry for entry in trail if (entry["kind"], entry["version"], entry["action"]) ==
                         ("plan", 2, "publish")]
    assert bypass["refused"].startswith("promotion is 'approve': a publish that would serve at once")
    assert candidate["refused"] is None and candidate["candidate"]
    (approval,) = [entry for entry in trail if (entry["version"], entry["action"]) == (2, "approve")]
    assert approval["actor"] == CRO and (approval["refused"] is not None) == signed
    if signed:
        assert approval["refused"].startswith("not signed")
        assert [entry["signer"] for entry in trail if entry["refused"] is None] == [
            "operator", "publisher", "approver", "publisher"]  # the config, v1, its approval, the candidate


def candidate_sha(broker, toml, capsys) -> str:
    code, out, err = cli(capsys, "artifacts", "history", "--json", "--broker", broker.url, "--config", toml)
    return [entry["sha256"] for entry in map(json.loads, out.splitlines())
            if entry["kind"] == "plan" and entry["candidate"] and entry["refused"] is None][-1]
