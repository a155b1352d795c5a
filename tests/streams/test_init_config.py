"""``fairstream init``: the mapping inferred from sample records, its comments, and the config it writes."""

from __future__ import annotations

import json
import random
import tomllib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairstream.streams.cli import main
from fairstream.streams.config import PipelineConfig
from fairstream.streams.init_config import (
    MAX_LEVELS,
    MONITOR_ONLY,
    check_config,
    InitError,
    infer_config,
    parse_samples,
    render_toml,
    survey,
)
from fairstream.streams.mapping import KAFKA_KEY, get_path, parse_path

LOAN = {"application_id": "A-1", "submitted_at": "2026-11-28T10:00:00Z",
        "applicant": {"age": 37, "income": 52000, "sex": "F"}, "amount": 12000, "channel": "web", "branch": "north"}
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def loan_variants(n: int = 50, seed: int = 31) -> list[dict]:
    """The loan record of issue 31 and ``n - 1`` variants: other people, amounts, channels, branches and offsets."""
    rng = random.Random(seed)
    variants = [LOAN]
    for i in range(2, n + 1):
        offset = rng.choice(["Z", "+01:00", "-05:00", ".250Z"])
        variants.append({
            "application_id": f"A-{i}", "submitted_at": f"2026-11-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:"
                                                        f"{rng.randint(0, 59):02d}:00{offset}",
            "applicant": {"age": rng.randint(18, 80), "income": rng.choice([rng.randint(9000, 250000), 52000.5]),
                          "sex": rng.choice("FM")},
            "amount": rng.randint(500, 60000), "channel": rng.choice(["web", "app", "phone"]),
            "branch": rng.choice(["north", "south"])})
    return variants


def config_of(text: str, tmp_path: Path) -> PipelineConfig:
    path = tmp_path / "inferred.toml"
    path.write_text(text)
    return PipelineConfig.from_toml(path)


# --------------------------------------------------------------------------- the loan sample


def test_the_loan_sample_maps_every_role_of_issue_31():
    inferred = infer_config(loan_variants(), name="loans", input_topic="loan-applications")
    assert inferred.features == {"age": "applicant.age", "income": "applicant.income", "amount": "amount"}
    assert (inferred.s.path, inferred.s.values) == ("applicant.sex", ("F", "M"))
    assert (inferred.u.path, inferred.u.values) == ("branch", ("north", "south"))
    assert (inferred.time.path, inferred.time.format) == ("submitted_at", "iso8601")
    assert inferred.id == "application_id"
    assert (inferred.y, inferred.score, inferred.decision) == (None, None, None)
    assert [group.describe() for group in inferred.group_candidates] == [
        "applicant.sex (2 values)", "channel (3 values)", "branch (2 values)"]


def test_the_rendered_loan_config_names_the_candidates_and_parses():
    text = render_toml(infer_config(loan_variants(), name="loans", input_topic="loan-applications"))
    assert "# s: which field is the protected attribute? candidates: applicant.sex (2 values), channel (3 values), " \
           "branch (2 values)\n" in text
    assert "# u: the stratum the repair is fitted within; candidates: channel (3 values), branch (2 values)\n" in text
    data = tomllib.loads(text)
    assert data["pipeline"]["features"] == ["age", "income", "amount"]
    assert data["pipeline"]["groups"] == ["F", "M"] and data["pipeline"]["strata"] == ["north", "south"]
    assert data["topics"] == {"input": "loan-applications", "output": "loan-applications.fair", "format": "json",
                              "prefix": "fairstream.loans"}
    assert data["mapping"]["time"] == {"path": "submitted_at", "format": "iso8601"}
    assert data["mapping"]["features"] == {"age": "applicant.age", "income": "applicant.income", "amount": "amount"}
    assert data["agents"]["records"]["artifact"] == ["plan"]
    assert "label" not in data["pipeline"] and "y" not in data["mapping"]


def test_the_loan_config_validates(tmp_path):
    config = config_of(render_toml(infer_config(loan_variants(), name="loans", input_topic="loan-applications")),
                       tmp_path)
    assert config.features == ("age", "income", "amount")
    assert config.groups == ("F", "M") and config.strata == ("north", "south")


# --------------------------------------------------------------------------- each rule


def test_epoch_seconds_and_milliseconds_are_told_by_magnitude_and_are_no_features():
    records = [{"ref": f"r{i}", "at_ms": 1_764_324_000_000 + i, "x": 1.5 * i, "g": "ab"[i % 2],
                "count": 12_000 + i} for i in range(6)]
    inferred = infer_config(records)
    assert (inferred.time.path, inferred.time.format) == ("at_ms", "epoch_ms")
    assert inferred.features == {"x": "x", "count": "count"}  # 12000 is neither seconds nor milliseconds
    seconds = [{**record, "at_ms": 1_764_324_000 + i, "created": 1_764_324_000_000} for i, record in
               enumerate(records)]
    inferred = infer_config(seconds)
    assert [(t.path, t.format) for t in inferred.time_candidates] == [("at_ms", "epoch_s"), ("created", "epoch_ms")]
    assert "created" not in inferred.features.values()  # a time that is not the chosen one is no feature either
    assert any("created (epoch_ms) read as times" in note for note in inferred.notes)


def test_a_naive_iso_time_is_chosen_with_a_note_and_a_date_alone_is_not_a_time():
    records = [{"id": f"i{i}", "when": f"2026-11-28 10:0{i}:00", "born": "1990-01-0{i}", "v": i, "g": "ab"[i % 2]}
               for i in range(1, 5)]
    inferred = infer_config(records)
    assert (inferred.time.path, inferred.time.format) == ("when", "iso8601")
    assert "time: 4 of the sample's when values have no UTC offset; fairstream reads them as UTC" in inferred.notes


def test_without_a_unique_field_the_id_is_the_kafka_key():
    records = [{"v": float(i), "g": "ab"[i % 2], "h": "xy"[i % 2]} for i in range(4)]
    assert infer_config(records, keys=[b"k0", b"k1", b"k2", b"k3"]).id == KAFKA_KEY
    repeated = infer_config(records, keys=[b"k0", b"k0", None, b"k3"])
    assert "(1 missing, 1 repeated)" in " ".join(repeated.notes)
    assert "# id: the Kafka key ($key)" in render_toml(repeated)


def test_an_integer_is_an_id_only_by_its_name():
    records = [{"income": 1000 * i, "customer_id": 70 + i, "g": "ab"[i % 2], "h": "xy"[i // 2 % 2]} for i in range(4)]
    inferred = infer_config(records)
    assert inferred.id == "customer_id" and inferred.features == {"income": "income"}


def test_a_boolean_group_is_labelled_0_and_1_by_a_value_map(tmp_path):
    records = [{"id": f"i{i}", "female": i % 2 == 0, "region": "ns"[i // 2 % 2], "v": i * 0.5} for i in range(4)]
    inferred = infer_config(records)
    assert (inferred.s.path, inferred.s.values, inferred.s.value_map) == ("female", (0, 1),
                                                                           (("false", 0), ("true", 1)))
    assert tomllib.loads(render_toml(inferred))["mapping"]["s"] == {"path": "female",
                                                                     "values": {"false": 0, "true": 1}}
    assert config_of(render_toml(inferred), tmp_path).groups == (0, 1)


def test_a_key_with_a_dot_is_written_as_a_json_pointer(tmp_path):
    records = [{"id": f"i{i}", "rates": {"1.5y": 0.1 * i}, "g": "ab"[i % 2], "u": "xy"[i % 2]} for i in range(4)]
    inferred = infer_config(records)
    assert inferred.features == {"1_5y": "/rates/1.5y"}
    assert get_path(records[1], parse_path(tomllib.loads(render_toml(inferred))["mapping"]["features"]["1_5y"])) \
        == 0.1
    assert config_of(render_toml(inferred), tmp_path).features == ("1_5y",)


def test_features_sharing_a_key_are_named_by_their_parents():
    records = [{"applicant": {"age": 30 + i}, "co": {"age": 40 + i}, "g": "ab"[i % 2], "u": "xy"[i % 2]}
               for i in range(4)]
    assert infer_config(records).features == {"age": "applicant.age", "co_age": "co.age"}


def test_a_number_missing_from_some_records_is_no_feature_and_a_note_says_so():
    records = [{"id": f"i{i}", "x": i * 1.0, "g": "ab"[i % 2], "u": "xy"[i % 2], **({"bonus": 5} if i else {})}
               for i in range(4)]
    inferred = infer_config(records)
    assert "bonus" in inferred.feature_candidates and "bonus" not in inferred.features.values()
    assert any(note.startswith("features: bonus missing from some") for note in inferred.notes)


def test_chosen_roles_win_over_the_inference():
    inferred = infer_config(loan_variants(), s="channel", u="/applicant/sex")
    assert (inferred.s.path, inferred.s.values, inferred.u.path) == ("channel", ("app", "phone", "web"),
                                                                      "applicant.sex")
    assert "# u: the stratum the repair is fitted within; candidates: applicant.sex (2 values), branch (2 values)" \
        in render_toml(inferred)
    with pytest.raises(InitError, match=r"--s applicant\.gender: no such field in the sample; its fields: "
                                        r"application_id, submitted_at, applicant\.age"):
        infer_config(loan_variants(), s="applicant.gender")
    with pytest.raises(InitError, match=r"--u applicant\.age: a group field holds strings, integers or booleans"):
        infer_config([{**LOAN, "applicant": {**LOAN["applicant"], "age": 37.5}}], u="applicant.age")


def test_a_label_score_and_decision_are_found_by_name_and_suggest_monitoring_only(tmp_path):
    records = [{**record, "outcome": i % 2, "model": {"score": round(0.1 * (i % 10), 2), "decision": i % 3 == 0}}
               for i, record in enumerate(loan_variants(20))]
    inferred = infer_config(records)
    assert (inferred.y, inferred.score, inferred.decision) == ("outcome", "model.score", "model.decision")
    assert inferred.monitor_only and "model.score" not in inferred.features.values()
    text = render_toml(inferred)
    assert "label = true" in text and config_of(text, tmp_path).label is True
    chosen = infer_config(records, label="model.decision")
    assert (chosen.y, chosen.decision) == ("model.decision", None)  # one field, one role
    config = check_config(monitoring_only(text))
    assert config.records.chain == () and config.monitor.statistics == ("dp_difference", "conditional_dp", "eopp")
    scored = [{**record, "model": {"score": record["model"]["score"]}} for record in records]
    config = check_config(monitoring_only(render_toml(infer_config(scored))))
    assert config.records.chain == () and config.monitor.statistics == ("otf",)
    assert "artifact = []" not in render_toml(infer_config(loan_variants()))


def monitoring_only(text: str) -> str:
    """The config with its commented monitor-only alternative in place of [agents.records]."""
    head, _, tail = text.partition("[agents.records]\n")
    alternative = [line.removeprefix(MONITOR_ONLY) for line in tail.splitlines() if line.startswith(MONITOR_ONLY)]
    assert alternative, text
    return head + "\n".join(alternative) + "\n"


def test_a_sample_without_a_number_or_a_group_says_what_to_pass():
    with pytest.raises(InitError, match="no sample records"):
        infer_config([])
    with pytest.raises(InitError, match="no numeric field in every sample record"):
        infer_config([{"id": "a", "g": "x", "u": "y"}])
    with pytest.raises(InitError, match="no field for s: .* pass --s PATH"):
        infer_config([{"x": float(i), "when": 1_764_324_000 + i} for i in range(4)])


def test_without_a_field_for_u_every_record_is_in_one_stratum(tmp_path):
    inferred = infer_config([{"x": float(i), "sex": "FM"[i % 2], "stratum": 0.5} for i in range(4)])
    assert (inferred.u.path, inferred.u.values, inferred.u.default) == ("stratum_", ("all",), "all")
    assert any(note.startswith("u: no field left for a stratum") for note in inferred.notes)
    assert tomllib.loads(render_toml(inferred))["mapping"]["u"] == {"path": "stratum_", "default": "all"}
    assert config_of(render_toml(inferred), tmp_path).strata == ("all",)


def test_parse_samples_names_the_origin_of_what_is_not_a_json_object():
    assert parse_samples([b'{"a": {"b": 1}}'], ["p0"]) == [{"a": {"b": 1}}]
    with pytest.raises(InitError, match=r"^f line 2: not JSON"):
        parse_samples(['{"a": 1}', "{oops"], ["f line 1", "f line 2"])
    with pytest.raises(InitError, match=r"^p3: not JSON \(Avro in the Confluent wire format\? magic byte 0, schema id "
                                        r"7\); init reads JSON records$"):
        parse_samples([b"\x00\x00\x00\x00\x07\x02ab"], ["p3"])


# --------------------------------------------------------------------------- invariants

SCALARS = {
    "int": st.integers(-10**6, 10**6),
    "float": st.floats(-1e6, 1e6, allow_nan=False),
    "str": st.sampled_from(["a", "b", "c"]),
    "text": st.text(max_size=8),
    "bool": st.booleans(),
}
KEYS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=6)


@st.composite
def samples(draw) -> list[dict]:
    """Records over one random layout (nested objects included), each field of one type, some fields optional;
    one float and two few-valued strings are always there, so a config can be inferred."""
    layout = draw(st.dictionaries(st.tuples(KEYS, KEYS | st.none()), st.sampled_from(sorted(SCALARS)), max_size=6))
    n = draw(st.integers(1, 30))
    records = []
    for _ in range(n):
        record = {"x0": draw(SCALARS["float"]), "g0": draw(SCALARS["str"]), "g1": draw(SCALARS["str"])}
        for (outer, inner), kind in layout.items():
            if outer in record and not isinstance(record[outer], dict) or not draw(st.integers(0, 4)):
                continue  # a key taken by a scalar, or a field this record lacks
            value = draw(SCALARS[kind])
            if inner is None:
                record.setdefault(outer, value)
            elif isinstance(record.setdefault(outer, {}), dict):
                record[outer][inner] = value
        records.append(record)
    return records


@PROPERTY
@given(samples())
def test_every_numeric_leaf_is_a_feature_candidate_and_the_id_is_unique(records):
    inferred = infer_config(records)
    leaves = survey(records)
    numeric = {leaf.path for leaf in leaves if leaf.values and leaf.kinds <= {"int", "float"}}
    assert set(inferred.feature_candidates) == numeric
    roles = {inferred.id, inferred.s.path, inferred.u.path, inferred.y, inferred.score, inferred.decision,
             *(t.path for t in inferred.time_candidates)}
    assert set(inferred.features.values()) <= numeric - roles
    assert all(len([r for r in records if get_path(r, parse_path(p)) is not None]) == len(records)
               for p in inferred.features.values())
    if inferred.id != KAFKA_KEY:
        ids = [json.dumps(get_path(record, parse_path(inferred.id))) for record in records]
        assert len(set(ids)) == len(records)
    assert inferred.s.path != inferred.u.path and len(inferred.s.values) <= MAX_LEVELS


@PROPERTY
@given(samples())
def test_the_rendered_toml_parses_validates_and_maps_what_was_inferred(records):
    inferred = infer_config(records)
    data = tomllib.loads(render_toml(inferred))
    config = check_config(render_toml(inferred))  # it validates
    assert config.features == tuple(inferred.features) and config.mapping.s.text == inferred.s.path
    assert data["pipeline"]["features"] == list(inferred.features)
    assert data["mapping"]["features"] == inferred.features
    assert data["mapping"]["id"] == inferred.id and data["mapping"]["s"]["path"] == inferred.s.path
    seen = {get_path(record, parse_path(inferred.s.path)) for record in records}
    values = dict(inferred.s.value_map)
    assert set(data["pipeline"]["groups"]) == {values.get(json.dumps(v), v) for v in seen}


def test_check_config_refuses_in_one_line_what_a_worker_would_refuse():
    text = render_toml(infer_config(loan_variants(), name="loans", input_topic="loan-applications"))
    assert check_config(text).mapping.feature("income").text == "applicant.income"
    with pytest.raises(InitError, match=r"^the inferred config is refused \(mapping\.features\.amount: feature "
                                        r"'amount' has no path .*\): choose the roles with --s, --u or --label$"):
        check_config(text.replace('amount = "amount"\n', ""))


# --------------------------------------------------------------------------- the command


def test_init_writes_the_config_of_a_json_lines_file(tmp_path, capsys):
    sample = tmp_path / "loans.jsonl"
    sample.write_text("\n".join(json.dumps(record) for record in loan_variants()) + "\n\n")
    out = tmp_path / "loans.toml"
    assert main(["init", str(sample), "--out", str(out), "-n", "20"]) == 0
    assert capsys.readouterr().err.startswith(f"wrote {out} from 20 sample records")
    text = out.read_text()
    assert "# CHECK topics.input: 'loans' is a guess" in text
    assert config_of(text, tmp_path).features == ("age", "income", "amount")
    assert main(["init", str(sample), "--s", "channel"]) == 0
    assert 's = { path = "channel" }' in capsys.readouterr().out


def test_init_reads_a_file_that_starts_with_a_byte_order_mark(tmp_path, capsys):
    sample = tmp_path / "export.jsonl"  # as Windows tools write UTF-8
    sample.write_bytes(b"\xef\xbb\xbf" + "\n".join(json.dumps(record) for record in loan_variants()).encode())
    assert main(["init", str(sample)]) == 0
    assert 's = { path = "applicant.sex" }' in capsys.readouterr().out


def test_init_refuses_two_sources_or_none_in_one_line(tmp_path, capsys):
    assert main(["init"]) == 1
    assert capsys.readouterr().err == ("fairstream init: error: give one source of sample records: a JSON-lines FILE "
                                       "or --from-topic NAME\n")
    sample = tmp_path / "bad.jsonl"
    sample.write_text('{"a": 1}\n[2]\n')
    assert main(["init", str(sample)]) == 1
    assert capsys.readouterr().err == (f"fairstream init: error: {sample} line 2: not a JSON object (a list); init "
                                       "reads JSON records\n")


# --------------------------------------------------------------------------- on Apache Kafka


def send_keyed(bootstrap: str, topic: str, records: list[dict], key: str = "application_id") -> None:
    """``records`` to a new 4-partition ``topic``, each keyed by its ``key`` field."""
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    from fairstream.streams.kafka import KAFKA_API_VERSION

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, api_version=KAFKA_API_VERSION)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=4, replication_factor=1)])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, api_version=KAFKA_API_VERSION)
    try:
        for record in records:
            producer.send(topic, key=record[key].encode(), value=json.dumps(record).encode())
        producer.flush()
    finally:
        producer.close()


def init_from_topic(broker, topic: str, out: Path, capsys, *extra) -> str:
    code = main(["init", "--from-topic", topic, "-n", "100", "--broker", broker.url, "--out", str(out), *extra])
    err = capsys.readouterr().err
    assert code == 0, err
    return out.read_text()


@pytest.mark.integration
def test_init_reads_its_samples_from_a_topic_and_falls_back_to_the_kafka_key(broker, tmp_path, capsys):
    send_keyed(broker.bootstrap, "loan-applications", loan_variants(150))
    text = init_from_topic(broker, "loan-applications", tmp_path / "loans.toml", capsys)
    assert text.startswith("# Inferred by `fairstream init` from 100 sample records of 'loan-applications'.\n")
    config = PipelineConfig.from_toml(tmp_path / "loans.toml")
    assert (config.name, config.features, config.groups) == ("loan-applications", ("age", "income", "amount"),
                                                            ("F", "M"))
    data = tomllib.loads(text)
    assert data["mapping"]["id"] == "application_id" and data["topics"]["input"] == "loan-applications"
    anonymous = [{k: v for k, v in record.items() if k != "application_id"} | {"ref": record["application_id"]}
                 for record in loan_variants(30)]
    send_keyed(broker.bootstrap, "loans-without-ids", anonymous, key="ref")
    text = init_from_topic(broker, "loans-without-ids", tmp_path / "anonymous.toml", capsys)
    assert tomllib.loads(text)["mapping"]["id"] == "ref"  # a unique string over 30 records: an id
    assert main(["init", "--from-topic", "no-such-topic", "--broker", broker.url]) == 1
    assert capsys.readouterr().err == f"fairstream init: error: no topic 'no-such-topic' on {broker.url}\n"


@pytest.mark.integration
def test_the_config_init_writes_runs_a_worker_that_repairs_the_loan_records(broker, tmp_path, capsys):
    from dataclasses import replace

    from fairstream.models.plan import DistributionalRepair
    from fairstream.streams.control.client import ControlClient
    from fairstream.streams.control.store import ArtifactStore
    from fairstream.streams.demo.collect import TopicReader, collect_until
    from fairstream.streams.ops.supervise import WorkerProcess
    from fairstream.streams.topics import ensure_topics

    records = loan_variants(200, seed=7)
    send_keyed(broker.bootstrap, "loans-run", records)
    init_from_topic(broker, "loans-run", tmp_path / "loans.toml", capsys)
    config = replace(PipelineConfig.from_toml(tmp_path / "loans.toml"), artifact_dir=str(tmp_path / "artifacts"))
    paths = [parse_path(path) for path in tomllib.loads((tmp_path / "loans.toml").read_text())["mapping"]["features"]
             .values()]
    X = [[float(get_path(record, path)) for path in paths] for record in records]
    sex, branch = [record["applicant"]["sex"] for record in records], [record["branch"] for record in records]
    plan = DistributionalRepair(n_q=50).fit(np.array(X), np.array(sex), np.array(branch))
    ensure_topics(broker.bootstrap, config.topics)
    ControlClient(broker.bootstrap, config.topics, ArtifactStore(config.artifact_dir)).publish_sync(plan.to_artifact())
    worker = WorkerProcess(config, broker.bootstrap, tmp_path / "worker").start()
    try:
        with TopicReader(broker.bootstrap, "loans-run.fair") as reader:
            out = collect_until({"out": reader}, lambda got: len(got["out"]) >= len(records), timeout=180)["out"]
    finally:
        worker.stop()
    outputs = {json.loads(m.value)["application_id"]: json.loads(m.value) for m in out}
    assert len(outputs) == len(records), worker.log_tail()
    ids = [record["application_id"] for record in records]
    expected = plan.transform(np.array(X), np.array(sex), np.array(branch), keys=ids)
    repaired = [[get_path(outputs[rid], path) for path in paths] for rid in ids]
    assert np.array_equal(np.array(repaired), expected) and not np.array_equal(expected, np.array(X))
    for record, (age, income, amount) in zip(records, X):
        output = outputs[record["application_id"]]
        assert output["fairstream"]["original"] == {"age": age, "income": income, "amount": amount}
        assert {k: v for k, v in output.items() if k not in ("applicant", "amount", "fairstream")} == \
            {k: v for k, v in record.items() if k not in ("applicant", "amount")}  # the rest passes through
        assert output["applicant"]["sex"] == record["applicant"]["sex"] and "provenance" in output["fairstream"]
