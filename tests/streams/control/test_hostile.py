"""Issue 33's opening, reproduced by a hostile operator with network access to the broker, on Apache Kafka: each case
is refused by every reader that follows the pipeline's own config (a worker's registry, ``artifacts history``), for a
signed pipeline and, where it applies, an unsigned one.

a. approval bypassed (a copy of the config saying promotion "auto", with a publisher's key, with none, a plain
   producer; the re-fit service's name on a key without the publisher role);
b. forged decisions (a shadow policy's promote in an approve pipeline; an approval by name without the approver's key;
   with it, the approver's name kept as given);
c. ``history --verify`` names altered, dropped and reordered records, and an intact trail verifies, a lost race
   included;
d. a human decision that lost a race is in the trail;
e. a record copied from another pipeline's control topic is refused;
f. a key rotated out at an offset signs what is below it only.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import uuid
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from fairstream.repair import artifacts
from fairstream.streams.control import client as client_module
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.gate import GENESIS, Authority, record_hash, seal
from fairstream.streams.control.records import ControlError, control_key, decision_record, parse_control
from fairstream.streams.control.registry import ArtifactRegistry, module_loaders
from fairstream.streams.control.signing import Signer
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.schemas import ControlRecord
from fairstream.streams.topics import ensure_topics

from ..test_cli import pipeline_toml, run_main, tiny_plan
from .test_registry import catch_up, read_log, write_log

pytestmark = pytest.mark.integration

FEATURES = ["age", "hours-per-week"]
REFIT = ["--by", "refit@vm", "--reason", "Alertmanager: FairstreamFairnessDrift"]
CRO = "Chief Risk Officer (CRO)"
ROLES = {"publisher": ["publisher"], "approver": ["approver"], "operator": ["operator"], "policy": ["policy"]}


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Key pairs written by ``fairstream keys generate`` (NAME.key, NAME.pub) and a trust file listing them."""
    folder = tmp_path_factory.mktemp("keys")
    from fairstream.streams.cli import main
    for name in ROLES:
        assert main(["keys", "generate", name, "--dir", str(folder)]) == 0
    trust = folder / "trust.toml"
    trust.write_text(trust_text(folder, ROLES))
    return folder


def trust_text(folder: Path, roles: dict[str, list[str]], until: dict[str, int] | None = None) -> str:
    lines = []
    for name, granted in roles.items():
        lines += [f'[keys."{name}"]', f'public_key = "{(folder / f"{name}.pub").read_text().strip()}"',
                  f"roles = {json.dumps(granted)}"]
        if until and name in until:
            lines.append(f"until_offset = {until[name]}")
    return "\n".join(lines) + "\n"


def key_of(keys: Path, name: str) -> str:
    return str(keys / f"{name}.key")


def signer(keys: Path, name: str) -> Signer:
    return Signer.from_file(keys / f"{name}.key")


@pytest.fixture
def plans(tmp_path):
    """Three plan files that fit the pipeline (the second one 'changes nothing': the attacker's)."""
    return [artifacts.save(tiny_plan(FEATURES, seed).to_artifact(), tmp_path / f"plan{seed}.json") for seed in (1, 2, 3)]


def pipeline(tmp_path, keys, signed: bool, promotion: str = "approve", prefix: str | None = None,
             folder: str = "pipeline", broker=None):
    """(toml path, config) of a pipeline on its own topics (created on ``broker``), signed with the module's trust
    file or not."""
    where = tmp_path / folder
    where.mkdir(exist_ok=True)
    prefix = prefix or f"hostile-{uuid.uuid4().hex[:10]}"
    toml, config = pipeline_toml(where, prefix, promotion=promotion, trust=str(keys / "trust.toml") if signed else "none")
    if broker is not None:
        ensure_topics(broker.bootstrap, config.topics)
    return toml, config


def cli(capsys, *args) -> tuple[int, str, str]:
    return run_main([str(a) for a in args], capsys)


def history(broker, toml, capsys, *extra) -> list[dict]:
    code, out, err = cli(capsys, "artifacts", "history", "--json", "--broker", broker.url, "--config", toml, *extra)
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def follow(broker, config) -> tuple[ArtifactRegistry, list[tuple[str, str, str]]]:
    """A fresh worker registry of ``config``'s pipeline (its own authority), fed the whole control topic."""
    refusals = []
    registry = ArtifactRegistry(module_loaders(config.schema()), ArtifactStore(config.artifact_dir),
                                authority=Authority.of(config),
                                on_refuse=lambda kind, reason, category: refusals.append((kind, category, reason)))
    asyncio.run(catch_up(registry, broker.bootstrap, config.topics.control))
    return registry, refusals


def serving(registry: ArtifactRegistry):
    active = registry.current("plan")
    return None if active is None else active.version


def raw_write(broker, topic: str, values: list[bytes | None], keys: list[bytes] | None = None) -> None:
    """What anyone with network access does: a plain producer, each record under the key its bytes imply."""
    if keys is None:
        keys = [control_key(parse_control(value), value) for value in values]
    asyncio.run(write_log(broker.bootstrap, topic, list(zip(keys, values))))


def head_of(broker, config) -> str:
    """The hash of the trail's last admitted record, as the pipeline's readers see it (what a forger names)."""
    return ControlClient.of(config, broker.bootstrap).read_sync().gate.head


def plan_record(plan_file: Path, version: int, **fields) -> ControlRecord:
    artifact = artifacts.with_version(artifacts.load(plan_file), version)
    return ControlRecord("plan", version, artifact.sha256, action="publish",
                         blob_b64=base64.b64encode(artifacts.encode(artifact)).decode(), published_at=1.0, **fields)


def approved_plan_one(broker, toml, keys, plans, capsys, signed: bool) -> None:
    """Plan version 1 published as a candidate by the re-fit service and approved by a person: it serves."""
    key = ["--key", key_of(keys, "publisher")] if signed else []
    code, out, err = cli(capsys, "artifacts", "publish", plans[0], "--broker", broker.url, "--config", toml, *REFIT,
                         *key)
    assert code == 0 and "as a candidate" in out, err
    key = ["--key", key_of(keys, "approver")] if signed else []
    code, out, err = cli(capsys, "artifacts", "approve", "plan", 1, "--by", CRO, "--reason", "reviewed",
                         "--broker", broker.url, "--config", toml, *key)
    assert code == 0 and f"approved plan version 1" in out and f"as {CRO}:" in out, err


# --------------------------------------------------------------------------- a. approval bypassed


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_a_publish_under_a_copy_of_the_config_saying_auto_never_serves(broker, tmp_path, keys, plans, capsys, signed):
    toml, config = pipeline(tmp_path, keys, signed)
    approved_plan_one(broker, toml, keys, plans, capsys, signed)
    # The attacker's copy: the same topics (and trust), promotion "auto".
    attacker_toml, _ = pipeline(tmp_path, keys, signed, promotion="auto", prefix=config.topics.prefix,
                                folder="attacker")
    key = ["--key", key_of(keys, "publisher")] if signed else []
    code, out, err = cli(capsys, "artifacts", "publish", plans[1], "--broker", broker.url, "--config", attacker_toml,
                         *REFIT, *key)
    assert code == 0 and "published plan version 2" in out and "candidate" not in out, err  # its own config lets it
    # A plain producer writing the same record (after the trail's head, signed as the publisher or unsigned).
    forged, _, value = seal(plan_record(plans[2], 3, actor="refit@vm", reason="Alertmanager: FairstreamFairnessDrift"),
                            head_of(broker, config), config.topics.control,
                            signer(keys, "publisher") if signed else None)
    raw_write(broker, config.topics.control, [value])

    registry, refusals = follow(broker, config)
    assert serving(registry) == 1 and registry.candidate("plan") is None
    assert [(kind, category) for kind, category, _ in refusals] == [("plan", "policy"), ("plan", "policy")]
    assert registry.refused_total["plan"] == 2
    trail = history(broker, toml, capsys)
    bypasses = [row for row in trail if row["action"] == "publish" and not row["candidate"]]
    assert [row["version"] for row in bypasses] == [2, 3]
    for row in bypasses:
        assert row["refused"].startswith("promotion is 'approve': a publish that would serve at once is refused")
        assert row["actor"] == "refit@vm" and row["signer"] == ("publisher" if signed else None)
        assert row["breaks_trail"] is False
    code, out, _ = cli(capsys, "artifacts", "history", "--broker", broker.url, "--config", toml)
    lines = [line for line in out.splitlines() if "REFUSED: promotion is 'approve'" in line]
    assert len(lines) == 2 and all(("[signed publisher]" in line) == signed for line in lines), out


def test_a_signed_pipeline_refuses_the_bypass_without_a_key_and_with_a_key_lacking_the_role(broker, tmp_path, keys,
                                                                                            plans, capsys):
    toml, config = pipeline(tmp_path, keys, signed=True)
    approved_plan_one(broker, toml, keys, plans, capsys, signed=True)
    attacker_toml, _ = pipeline(tmp_path, keys, True, promotion="auto", prefix=config.topics.prefix, folder="copy")
    # Without a key, under the same trust: refused before anything is written.
    code, out, err = cli(capsys, "artifacts", "publish", plans[1], "--broker", broker.url, "--config", attacker_toml,
                         *REFIT)
    assert code == 1 and "not signed: this pipeline takes only records signed by a key of its trust file" in err
    # The re-fit service's name, signed by the approver's key (no publisher role): refused before it is written.
    code, out, err = cli(capsys, "artifacts", "publish", plans[1], "--broker", broker.url, "--config", attacker_toml,
                         *REFIT, "--key", key_of(keys, "approver"))
    assert code == 1 and "signed by 'approver', whose roles are approver: a publish needs the publisher role" in err
    # A copy that says trust "none": the client writes it unsigned.
    unsigned_toml, _ = pipeline(tmp_path, keys, False, promotion="auto", prefix=config.topics.prefix,
                                folder="unsigned-copy")
    code, out, err = cli(capsys, "artifacts", "publish", plans[1], "--broker", broker.url, "--config", unsigned_toml,
                         *REFIT)
    assert code == 0 and "published plan version 2" in out, err
    # And the spoof written by a plain producer, signed by the approver's key.
    _, _, spoof = seal(plan_record(plans[2], 3, actor="refit@vm", reason="Alertmanager: FairstreamFairnessDrift",
                                   candidate=True), head_of(broker, config), config.topics.control,
                       signer(keys, "approver"))
    raw_write(broker, config.topics.control, [spoof])

    registry, refusals = follow(broker, config)
    assert serving(registry) == 1 and registry.candidate("plan") is None
    assert [category for _, category, _ in refusals] == ["unsigned", "role"]
    trail = {row["version"]: row for row in history(broker, toml, capsys) if row["action"] == "publish"}
    assert trail[2]["refused"].startswith("not signed") and trail[2]["signer"] is None
    assert trail[3]["refused"] == "signed by 'approver', whose roles are approver: a publish needs the publisher role"
    assert trail[3]["signer"] == "approver" and trail[3]["actor"] == "refit@vm"


def test_a_workers_own_registry_refuses_the_bypass_and_counts_it(tmp_path, keys, plans):
    from fairstream.streams.worker.app import WorkerHooks

    _, config = pipeline(tmp_path, keys, signed=False)  # promotion "approve"
    config = dataclasses.replace(config, monitor=dataclasses.replace(config.monitor, metrics_port="off"))
    hooks = WorkerHooks(config, "127.0.0.1:1", "hostile-worker")
    _, _, value = seal(plan_record(plans[1], 1, actor="refit@vm"), GENESIS, config.topics.control)
    labels = {"pipeline": config.name, "kind": "plan", "reason": "policy"}
    before = REGISTRY.get_sample_value("fairstream_artifacts_refused_total", labels) or 0.0
    assert hooks.registry.apply(value, control_key(parse_control(value), value), 0) is False
    assert hooks.registry.current("plan") is None and hooks.registry.refused_total["plan"] == 1
    assert REGISTRY.get_sample_value("fairstream_artifacts_refused_total", labels) == before + 1


# --------------------------------------------------------------------------- b. forged decisions


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_a_shadow_policys_promote_in_an_approve_pipeline_is_refused(broker, tmp_path, keys, plans, capsys, signed):
    toml, config = pipeline(tmp_path, keys, signed)
    key = ["--key", key_of(keys, "publisher")] if signed else []
    code, _, err = cli(capsys, "artifacts", "publish", plans[0], "--broker", broker.url, "--config", toml, *REFIT, *key)
    assert code == 0, err
    client = ControlClient.of(config, broker.bootstrap, signer=signer(keys, "policy") if signed else None)
    with pytest.raises(ControlError, match="promotion is 'approve': only a person decides a candidate"):
        client.decide_sync("plan", 1, "promote", actor="shadow-policy@w", reason="better")
    sha = client.read_sync().ledger.pending("plan")[1]
    promote = decision_record("plan", 1, sha, "promote", "shadow-policy@worker-1", reason="candidate better",
                              statistics={"records": 5000, "candidate.E": 0.01, "active.E": 0.2})
    _, _, value = seal(promote, head_of(broker, config), config.topics.control,
                       signer(keys, "policy") if signed else None)
    raw_write(broker, config.topics.control, [value])

    registry, refusals = follow(broker, config)
    assert serving(registry) is None and registry.candidate("plan").version == 1  # still waiting for a person
    assert [category for _, category, _ in refusals] == ["policy"]
    row = [row for row in history(broker, toml, capsys) if row["action"] == "promote"]
    assert len(row) == 1 and row[0]["refused"].startswith("promotion is 'approve': only a person decides")
    assert row[0]["actor"] == "shadow-policy@worker-1" and row[0]["signer"] == ("policy" if signed else None)


def test_an_approval_by_name_needs_the_approvers_key_and_keeps_the_name_as_given(broker, tmp_path, keys, plans,
                                                                                 capsys):
    toml, config = pipeline(tmp_path, keys, signed=True)
    code, _, err = cli(capsys, "artifacts", "publish", plans[0], "--broker", broker.url, "--config", toml, *REFIT,
                       "--key", key_of(keys, "publisher"))
    assert code == 0, err
    approve = ["artifacts", "approve", "plan", 1, "--by", CRO, "--reason", "looks fine", "--broker", broker.url,
               "--config", toml]
    code, out, err = cli(capsys, *approve)
    assert (code, out) == (1, "") and "not signed" in err and err.count("\n") == 1
    code, out, err = cli(capsys, *approve, "--key", key_of(keys, "publisher"))
    assert code == 1 and "signed by 'publisher', whose roles are publisher: an approve needs the approver role" in err
    # Written by a plain producer, signed with the publisher's key: refused by every reader.
    sha = ControlClient.of(config, broker.bootstrap).read_sync().ledger.pending("plan")[1]
    _, _, forged = seal(decision_record("plan", 1, sha, "approve", CRO, reason="x"), head_of(broker, config),
                        config.topics.control, signer(keys, "publisher"))
    raw_write(broker, config.topics.control, [forged])
    registry, refusals = follow(broker, config)
    assert serving(registry) is None and [c for _, c, _ in refusals] == ["role"]

    code, out, err = cli(capsys, *approve, "--key", key_of(keys, "approver"))
    assert code == 0 and f"approved plan version 1 (sha256 {sha[:12]}) as {CRO}:" in out, err
    registry, _ = follow(broker, config)
    assert serving(registry) == 1
    approvals = [row for row in history(broker, toml, capsys) if row["action"] == "approve"]
    assert [(row["actor"], row["signer"], row["refused"] is None) for row in approvals] == [
        (CRO, "publisher", False), (CRO, "approver", True)]
    code, out, err = cli(capsys, "artifacts", "list", "--broker", broker.url, "--config", toml)
    assert code == 0 and CRO in out, out
    code, out, err = cli(capsys, "artifacts", "history", "--broker", broker.url, "--config", toml)
    assert f"{CRO}  looks fine  [signed approver]" in out, out


# --------------------------------------------------------------------------- c. history --verify


def sealed_trail(keys: Path, plans, topic: str, signed: bool, records=None) -> list[bytes]:
    """Candidate 1, approve 1, candidate 2, approve 2, candidate 3: sealed one after the other for ``topic``."""
    if records is None:
        records = []
        for version, plan in enumerate(plans, start=1):
            records.append(plan_record(plan, version, candidate=True, actor="refit@vm"))
            if version < len(plans):
                records.append(decision_record("plan", version, records[-1].sha256, "approve", CRO, reason="ok"))
    head, values = GENESIS, []
    for record in records:
        who = None if not signed else "publisher" if record.action == "publish" else "approver"
        _, _, value = seal(record, head, topic, None if who is None else signer(keys, who))
        values.append(value)
        head = record_hash(value)
    return values


def altered(value: bytes) -> bytes:
    data = json.loads(value)
    data.pop("candidate")  # the candidate made to serve at once
    return json.dumps(data, sort_keys=True).encode()


REWRITES = {
    "intact": (lambda v: v, {True: [], False: []}),
    # signed: the altered record itself, and the two after it (each names a record no reader admitted); unsigned:
    # nothing proves the altered record was altered, the records after it name it
    "altered": (lambda v: v[:2] + [altered(v[2])] + v[3:], {True: [2, 3, 4], False: [3, 4]}),
    "dropped": (lambda v: v[:1] + v[2:], {True: [1], False: [1]}),
    "reordered": (lambda v: v[:1] + [v[2], v[1]] + v[3:], {True: [1, 2], False: [1, 2]}),
}


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
@pytest.mark.parametrize("rewrite", sorted(REWRITES))
def test_history_verify_names_each_altered_dropped_and_moved_record(broker, tmp_path, keys, plans, capsys, rewrite,
                                                                     signed):
    toml, config = pipeline(tmp_path, keys, signed, broker=broker)
    change, broken = REWRITES[rewrite]
    raw_write(broker, config.topics.control, change(sealed_trail(keys, plans, config.topics.control, signed)))
    code, out, err = cli(capsys, "artifacts", "history", "--verify", "--broker", broker.url, "--config", toml)
    named = sorted(int(line.split("BROKEN at offset ")[1].split(":")[0]) for line in out.splitlines()
                   if "BROKEN at offset" in line)
    assert named == broken[signed], out + err
    assert code == (1 if broken[signed] else 0), out + err
    assert out.rstrip().endswith("verify: the trail was rewritten" if broken[signed] else "verify: the trail is intact")
    checked = "signatures, roles and the hash chain" if signed else "the hash chain only: this pipeline is unsigned"
    assert checked in out


def test_history_verify_names_a_dropped_publish(broker, tmp_path, keys, plans, capsys):
    toml, config = pipeline(tmp_path, keys, True, promotion="auto", broker=broker)
    records = [plan_record(plan, version, actor="refit@vm") for version, plan in enumerate(plans, start=1)]
    values = sealed_trail(keys, plans, config.topics.control, True, records)
    raw_write(broker, config.topics.control, values[:1] + values[2:])
    code, out, _ = cli(capsys, "artifacts", "history", "--verify", "--broker", broker.url, "--config", toml)
    assert code == 1 and "BROKEN at offset 1" in out, out  # refused by the version rule too: still a break


@pytest.fixture
def race(monkeypatch):
    """``race()``: from now on, two writers read the trail at the same moment (each ``_write``'s first reading waits
    for the other's), so both seal on the same head."""
    original = client_module._Reader.read_to_end
    barrier = asyncio.Barrier(2)
    waits = []

    async def read_to_end(self, control):
        await original(self, control)
        if waits:
            waits.pop()
            await asyncio.wait_for(barrier.wait(), 60)

    monkeypatch.setattr(client_module._Reader, "read_to_end", read_to_end)
    return lambda: waits.extend([True, True])


def test_an_intact_trail_verifies_after_a_lost_race(broker, tmp_path, keys, plans, capsys, race):
    toml, config = pipeline(tmp_path, keys, signed=True, promotion="auto")
    first = ControlClient.of(config, broker.bootstrap, signer=signer(keys, "publisher"))
    second = ControlClient.of(config, broker.bootstrap, signer=signer(keys, "publisher"))

    async def both():
        return await asyncio.gather(first.publish(artifacts.load(plans[0]), actor="alice"),
                                    second.publish(artifacts.load(plans[1]), actor="bob"))

    race()
    records = asyncio.run(both())
    assert sorted(record.version for record in records) == [1, 2]  # the loser wrote again, under the next version
    trail = history(broker, toml, capsys)
    lost = [row for row in trail if row["refused"] is not None]
    assert len(lost) == 1 and lost[0]["refused"].startswith("lost a race to the record at offset 0")
    assert lost[0]["signer"] == "publisher" and lost[0]["breaks_trail"] is False
    code, out, err = cli(capsys, "artifacts", "history", "--verify", "--broker", broker.url, "--config", toml)
    assert code == 0 and "BROKEN" not in out and "1 refused record(s) changed nothing" in out, out + err
    registry, refusals = follow(broker, config)
    assert serving(registry) == 2 and [c for _, c, _ in refusals] == ["stale"]


# --------------------------------------------------------------------------- d. a refused human decision in the trail


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_a_human_decision_that_lost_a_race_is_in_the_trail(broker, tmp_path, keys, plans, capsys, race, signed):
    toml, config = pipeline(tmp_path, keys, signed)
    publisher = ControlClient.of(config, broker.bootstrap, signer=signer(keys, "publisher") if signed else None)
    asyncio.run(publisher.publish_under(artifacts.load(plans[0]), "approve", actor="refit@vm"))
    approver = signer(keys, "approver") if signed else None
    ada = ControlClient.of(config, broker.bootstrap, signer=approver)
    bob = ControlClient.of(config, broker.bootstrap, signer=approver)

    async def both():
        return await asyncio.gather(ada.decide("plan", 1, "approve", actor="Ada Lovelace", reason="fine"),
                                    bob.decide("plan", 1, "reject", actor="Bob (risk)", reason="not fine"),
                                    return_exceptions=True)

    race()
    outcomes = asyncio.run(both())
    lost = [o for o in outcomes if isinstance(o, Exception)]
    assert len(lost) == 1 and isinstance(lost[0], ControlError), outcomes
    decisions = [row for row in history(broker, toml, capsys) if row["action"] in ("approve", "reject")]
    assert len(decisions) == 2, decisions  # the loser is in the trail, refused, with who it was
    loser = [row for row in decisions if row["refused"] is not None]
    assert len(loser) == 1 and loser[0]["actor"] in ("Ada Lovelace", "Bob (risk)")
    assert loser[0]["signer"] == ("approver" if signed else None)
    assert loser[0]["refused"].startswith("lost a race" if signed else "plan version 1 was already")
    code, out, _ = cli(capsys, "artifacts", "history", "--broker", broker.url, "--config", toml)
    assert any(loser[0]["actor"] in line and "REFUSED: " in line for line in out.splitlines()), out


# --------------------------------------------------------------------------- e. cross-pipeline replay


def test_a_record_copied_from_another_pipeline_is_refused(broker, tmp_path, keys, plans, capsys):
    staging_toml, staging = pipeline(tmp_path, keys, True, promotion="auto", folder="staging")
    prod_toml, prod = pipeline(tmp_path, keys, True, promotion="auto", folder="prod", broker=broker)
    client = ControlClient.of(staging, broker.bootstrap, signer=signer(keys, "publisher"))
    client.publish_sync(artifacts.load(plans[0]), actor="refit@vm")
    copied = [(key, value) for key, value in asyncio.run(read_log(broker.bootstrap, staging.topics.control))
              if value is not None and b'"action"' in value]
    assert len(copied) == 1
    asyncio.run(write_log(broker.bootstrap, prod.topics.control, copied))

    registry, refusals = follow(broker, prod)
    assert serving(registry) is None and [c for _, c, _ in refusals] == ["pipeline"]
    row, = history(broker, prod_toml, capsys)
    assert row["signer"] == "publisher" and row["refused"].startswith(
        f"written for pipeline '{staging.topics.control}', not for {prod.topics.control}")
    assert serving(follow(broker, staging)[0]) == 1  # where it was written, it serves


# --------------------------------------------------------------------------- f. rotation and revocation


def test_a_key_rotated_out_signs_below_its_offset_only(broker, tmp_path, keys, plans, capsys):
    folder = tmp_path / "rotation"
    folder.mkdir()
    for name in ("old", "new"):
        assert run_main(["keys", "generate", name, "--dir", str(folder)], capsys)[0] == 0
    trust = folder / "trust.toml"
    trust.write_text(trust_text(folder, {"old": ["publisher"]}))
    toml, config = pipeline_toml(folder, f"hostile-{uuid.uuid4().hex[:10]}", promotion="auto", trust=str(trust))
    old = ControlClient.of(config, broker.bootstrap, signer=Signer.from_file(folder / "old.key"))
    old.publish_sync(artifacts.load(plans[0]), actor="old")
    end = old.read_sync().next_offset
    trust.write_text(trust_text(folder, {"old": ["publisher"], "new": ["publisher"]}, until={"old": end}))

    code, _, err = cli(capsys, "artifacts", "publish", plans[1], "--broker", broker.url, "--config", toml,
                       "--key", folder / "old.key")
    assert code == 1 and f"a key rotated out at control offset {end}" in err, err
    _, _, late = seal(plan_record(plans[1], 2, actor="old"), head_of(broker, config), config.topics.control,
                      Signer.from_file(folder / "old.key"))
    raw_write(broker, config.topics.control, [late])
    code, out, err = cli(capsys, "artifacts", "publish", plans[2], "--broker", broker.url, "--config", toml,
                         "--key", folder / "new.key")
    assert code == 0 and "published plan version 2" in out, err

    registry, refusals = follow(broker, config)
    assert serving(registry) == 2 and [c for _, c, _ in refusals] == ["untrusted"]
    rows = history(broker, toml, capsys)
    assert [(row["version"], row["signer"], row["refused"] is None) for row in rows] == [
        (1, "old", True), (2, "old", False), (2, "new", True)]
    code, out, err = cli(capsys, "artifacts", "history", "--verify", "--broker", broker.url, "--config", toml)
    assert code == 0 and "verify: the trail is intact" in out, out + err
    # Removed from the trust file: revoked, its past records included, and --verify says which.
    trust.write_text(trust_text(folder, {"new": ["publisher"]}))
    registry, refusals = follow(broker, config)
    assert [(c, "does not trust" in reason) for _, c, reason in refusals] == [("untrusted", True)] * 2
    assert serving(registry) == 2  # the new key's record follows a record no reader admits now: a break, admitted
