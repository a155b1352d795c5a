"""The record mapping: field paths, the [mapping] and [output] tables, and the topics they name."""

from __future__ import annotations

import tomllib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairstream.streams.config import ConfigError, PipelineConfig, adult_config, reference_markdown
from fairstream.streams.mapping import (
    KAFKA_KEY,
    MISSING,
    REFERENCE,
    get_path,
    parse_path,
    path_text,
    set_path,
)
from fairstream.streams.topics import TopicConfig

keys = st.text(min_size=1, max_size=8)
paths = st.lists(keys, min_size=1, max_size=4).map(tuple)
plain_keys = st.text(st.characters(blacklist_characters="./~", blacklist_categories=("Cs",)), min_size=1, max_size=8)

LOANS = """
[pipeline]
name = "loans"
features = ["age", "income", "amount"]
groups = ["female", "male"]
strata = ["north", "south"]
label = true

[topics]
input = "loan-applications"
output = "loan-applications.fair"

[mapping]
id = "application_id"
time = { path = "submitted_at", format = "iso8601" }
s = { path = "applicant.sex", values = { F = "female", M = "male" } }
u = { path = "branch", default = "north" }
y = "outcome"
score = "model.score"
decision = "model.decision"

[mapping.features]
age = "applicant.age"
income = "/applicant/income"
amount = "amount"

[output]
repaired = "under"
field = "meta.fairstream"
provenance = "headers"
"""


def loans(**tables) -> dict:
    data = tomllib.loads(LOANS)
    for name, table in tables.items():
        section, _, key = name.partition("__")
        if key:
            data[section][key] = table
        else:
            data[section] = table
    return data


def refusal(data: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        PipelineConfig.from_dict(data)
    return str(caught.value)


# --------------------------------------------------------------------------- paths


@given(paths)
def test_a_path_reads_back_from_its_text(path):
    assert parse_path(path_text(path)) == path


@given(st.lists(plain_keys, min_size=1, max_size=4).map(tuple))
def test_a_dotted_path_and_its_json_pointer_name_the_same_keys(path):
    pointer = "".join("/" + key for key in path)
    assert parse_path(pointer) == path
    if not path[0].startswith("/") and ".".join(path) != KAFKA_KEY:
        assert parse_path(".".join(path)) == path


def test_json_pointer_escapes_and_the_kafka_key():
    assert parse_path("/a~1b/c~0d/~01") == ("a/b", "c~d", "~1")
    assert parse_path(KAFKA_KEY) == ()
    for bad in ("", "a..b", "/a//b", "/a~2"):
        with pytest.raises(ValueError):
            parse_path(bad)


@given(st.dictionaries(keys, st.integers(), min_size=1), st.data())
def test_set_path_keeps_a_replaced_key_in_place_and_appends_a_new_one(record, data):
    order = list(record)
    replaced = data.draw(st.sampled_from(order))
    set_path(record, (replaced,), "new")
    assert list(record) == order and record[replaced] == "new"
    new = data.draw(keys.filter(lambda key: key not in record))
    set_path(record, (new, "inner"), 1.5)
    assert list(record) == [*order, new] and get_path(record, (new, "inner")) == 1.5


def test_get_path_says_missing_for_an_absent_key_or_a_value_on_the_way():
    record = {"applicant": {"age": 37}, "amount": 5}
    assert get_path(record, ("applicant", "age")) == 37
    assert get_path(record, ("applicant", "sex")) is MISSING
    assert get_path(record, ("amount", "x")) is MISSING
    with pytest.raises(ValueError, match="amount holds int, not an object"):
        set_path(record, ("amount", "x"), 1)


# --------------------------------------------------------------------------- the config tables


def test_the_loan_mapping_reads_every_role_and_writes_back_equal(tmp_path):
    config = PipelineConfig.from_dict(tomllib.loads(LOANS))
    mapping = config.mapping
    assert mapping.feature("income").path == ("applicant", "income") and mapping.feature("income").text == \
        "/applicant/income"
    assert mapping.s.label("F") == "female" and mapping.s.label("male") == "male"
    assert mapping.u.has_default and mapping.u.default == "north" and mapping.time.format == "iso8601"
    assert (config.output.repaired, config.output.path, config.output.provenance) == \
        ("under", ("meta", "fairstream"), "headers")
    path = tmp_path / "loans.toml"
    path.write_text(config.to_toml())
    assert PipelineConfig.from_toml(path) == config


def test_a_pipeline_without_a_mapping_writes_its_config_as_before():
    text = adult_config().to_toml()
    assert "[mapping]" not in text and "[output]" not in text
    assert PipelineConfig.from_dict(tomllib.loads(text)).mapping is None


@pytest.mark.parametrize("tables, message", [
    ({"mapping__features": {"age": "a", "income": "b", "amount": "c", "debt": "d"}},
     "mapping.features.debt: 'debt' is not in pipeline.features"),
    ({"mapping__features": {"age": "a", "income": "b"}}, "mapping.features.amount: feature 'amount' has no path"),
    ({"mapping__features": {"age": "a", "income": "a", "amount": "c"}},
     "mapping.features.income: path 'a' is also mapping.features.age's"),
    ({"mapping__u": "applicant.age"}, "path 'applicant.age' is also mapping.u's"),
    ({"mapping__time": {"path": "t", "format": "rfc822"}}, "mapping.time.format: unknown time format 'rfc822'"),
    ({"mapping__s": {"path": "sex", "values": {"F": "woman"}}}, "mapping.s.values.F: 'woman' is not a configured"),
    ({"mapping__s": KAFKA_KEY}, "mapping.s.path: only mapping.id may be '$key'"),
    ({"mapping__y": {"path": "y", "default": 2}}, "mapping.y.default: 2 is not a valid y value"),
    ({"mapping__id": {"path": "id", "default": "x"}}, "mapping.id.default: an id has no default"),
    ({"mapping__amount": "x"}, "mapping: unknown key(s) ['amount']"),
    ({"mapping__u": {"path": "branch", "fromat": "x"}}, "mapping.u: unknown key(s) ['fromat']"),
    ({"mapping__decision": "model"}, "mapping.score: path 'model.score' lies inside mapping.decision's 'model'"),
    ({"output__field": "applicant"}, "output.field: 'applicant' overlaps mapping.s"),
    ({"output__repaired": "beside"}, "output.repaired must be 'in_place' or 'under', got 'beside'"),
    ({"topics__format": "xml"}, "topics.format must be 'json' or 'avro', got 'xml'"),
    ({"topics__input": "bad name!"}, "topics.input must be a topic name"),
    ({"mapping__features": {"age": {"path": "a", "default": float("nan")}, "income": "b", "amount": "c"}},
     "mapping.features.age.default: nan is not a valid feature value"),
    ({"mapping__time": {"path": "t", "default": float("inf")}}, "mapping.time.default: inf is not a valid time value"),
    ({"topics__output": "loan-applications"}, "topics.output 'loan-applications' is the input topic"),
    ({"topics__input": "fairstream.dlq"}, "topics.input 'fairstream.dlq' is one of the pipeline's own topics"),
])
def test_a_mapping_mistake_is_one_config_error_naming_the_key(tables, message):
    assert message in refusal(loans(**tables))


def test_an_output_table_without_a_mapping_is_refused():
    data = tomllib.loads(adult_config().to_toml())
    data["output"] = {"repaired": "under"}
    assert refusal(data).startswith("output: [output] places what fairstream adds to a mapped record")


def test_the_reference_documents_every_mapping_and_output_key():
    page = reference_markdown()
    for section, key, kind, default, valid, doc in REFERENCE:
        assert f"| `[{section}]` | `{key}` |" in page and kind and default and valid and doc
    config = PipelineConfig.from_dict(tomllib.loads(LOANS))
    assert {key for section, key, *_ in REFERENCE if section == "output"} == set(vars(config.output))
    assert {key for section, key, *_ in REFERENCE if section == "mapping"} == \
        {"id", "time", "s", "u", "y", "score", "decision", "strict", "features"}
    for key in ("input", "output", "format"):
        assert f"| `[topics]` | `{key}` |" in page


def test_configured_topics_replace_the_record_topics_only():
    topics = TopicConfig(prefix="p", input="loan-applications", output="loan-applications.fair")
    assert (topics.records_in, topics.records_repaired, topics.dlq) == \
        ("loan-applications", "loan-applications.fair", "p.dlq")
    specs = {spec.name: spec for spec in topics.specs()}
    assert specs["loan-applications"].teams and specs["loan-applications.fair"].teams and not specs["p.dlq"].teams
    assert (TopicConfig(prefix="p").records_in, TopicConfig(prefix="p").records_repaired) == \
        ("p.records.in", "p.records.repaired")
