"""The pipeline configuration: the deployed TOML loads, and every mistake is a ConfigError naming the key."""

from __future__ import annotations

import copy
import math
import tomllib
from dataclasses import fields, replace
from pathlib import Path

import pytest

from fairstream.streams.config import (
    AgentConfig,
    ConfigError,
    EmbeddingConfig,
    PipelineConfig,
    adult_config,
    reference_rows,
)
from fairstream.streams.topics import TopicConfig

ROOT = Path(__file__).resolve().parents[2]
ADULT_TOML = ROOT / "deploy" / "pipeline.adult.toml"
SECTIONS = {"topics", "records", "embeddings", "monitor", "shadow", "kafka", "delivery", "mapping", "output",
            "schema_registry"}
PIPELINE_FIELDS = [f.name for f in fields(PipelineConfig) if f.name not in SECTIONS]


def adult_data() -> dict:
    """The parsed TOML of the Adult pipeline, a fresh copy to break."""
    with open(ADULT_TOML, "rb") as fh:
        return copy.deepcopy(tomllib.load(fh))


def as_config_value(value):
    if isinstance(value, dict):  # [pipeline.valid_ranges]: stored as (feature, (min, max)) pairs
        return tuple((name, tuple(bounds)) for name, bounds in value.items())
    return tuple(value) if isinstance(value, list) else value


def config_error(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        PipelineConfig.from_dict(data)
    return str(info.value)


# --------------------------------------------------------------------------- the deployed file


def test_adult_toml_loads():
    config = PipelineConfig.from_toml(ADULT_TOML)
    assert config.name == "adult"
    assert config.features == ("age", "hours-per-week")
    assert config.groups == (0, 1) and config.strata == (0, 1)
    assert (config.s_name, config.u_name, config.label) == ("sex", "education-num > 9", True)
    assert config.max_message_bytes == 65536 and config.include_original is True
    assert config.topics == TopicConfig(prefix="fairstream", partitions=4)
    assert config.records == AgentConfig(artifact=("plan", "scorer"), batch_size=1000, batch_within=0.05)
    assert config.embeddings == EmbeddingConfig(artifact="identity", dimension=8, batch_size=500)
    assert config.monitor.thresholds == {"dependence_e": 0.1, "dp_difference": 0.1, "mdp": 0.1}


def test_adult_toml_loads_from_a_string_path_too():
    assert PipelineConfig.from_toml(str(ADULT_TOML)) == PipelineConfig.from_toml(ADULT_TOML)


def test_every_key_of_the_toml_file_is_used():
    data = adult_data()
    config = PipelineConfig.from_toml(ADULT_TOML)
    for key, value in data["pipeline"].items():
        assert getattr(config, key) == as_config_value(value), key
    for key, value in data["topics"].items():
        assert getattr(config.topics, key) == value, key
    for agent in ("records", "embeddings"):
        for key, value in data["agents"][agent].items():
            assert getattr(getattr(config, agent), key) == as_config_value(value), (agent, key)


def test_adult_config_matches_the_toml_pipeline():
    from_file, built = PipelineConfig.from_toml(ADULT_TOML), adult_config()
    assert {name: getattr(built, name) for name in PIPELINE_FIELDS} == {
        name: getattr(from_file, name) for name in PIPELINE_FIELDS}
    data = adult_data()["pipeline"]
    assert {k: getattr(built, k) for k in data} == {k: as_config_value(v) for k, v in data.items()}
    # The built-in pipeline applies a plan alone (tests publish plans only); the deployed one adds a scorer.
    assert built.topics == from_file.topics and built.records == replace(from_file.records, artifact="plan")


def test_adult_config_accepts_changes():
    config = adult_config(include_original=False, max_message_bytes=100)
    assert (config.include_original, config.max_message_bytes, config.name) == (False, 100, "adult")


def test_to_toml_reads_back_equal(tmp_path):
    for config in (PipelineConfig.from_toml(ADULT_TOML), adult_config(groups=("f", "m"), features=('a"b', "ü"))):
        path = tmp_path / "pipeline.toml"
        path.write_text(config.to_toml(), encoding="utf-8")
        assert PipelineConfig.from_toml(path) == config


# --------------------------------------------------------------------------- the delivery guarantee


def test_the_delivery_guarantee_is_at_least_once_unless_exactly_once_is_asked_for(tmp_path):
    assert PipelineConfig.from_toml(ADULT_TOML).delivery.guarantee == "at_least_once"
    assert adult_config().delivery.guarantee == "at_least_once"
    data = adult_data()
    data["delivery"] = {"guarantee": "exactly_once"}
    config = PipelineConfig.from_dict(data)
    assert config.delivery.guarantee == "exactly_once"
    path = tmp_path / "pipeline.toml"
    path.write_text(config.to_toml())
    assert PipelineConfig.from_toml(path) == config == PipelineConfig.from_toml(ADULT_TOML).with_delivery(
        guarantee="exactly_once")


def test_an_unknown_delivery_key_is_named_with_the_allowed_ones():
    data = adult_data()
    data["delivery"] = {"guarantee": "exactly_once", "transactions": True}
    assert config_error(data) == "[delivery] has unknown key(s) ['transactions']; allowed: ['guarantee']"


# --------------------------------------------------------------------------- topic names


def test_topic_names_come_from_the_prefix():
    topics = PipelineConfig.from_toml(ADULT_TOML).topics
    assert topics.records_in == "fairstream.records.in"
    assert topics.records_repaired == "fairstream.records.repaired"
    assert topics.embeddings_in == "fairstream.embeddings.in"
    assert topics.embeddings_repaired == "fairstream.embeddings.repaired"
    assert topics.dlq == "fairstream.dlq"
    assert topics.control == "fairstream.control"


def test_another_prefix_renames_every_topic(tmp_path):
    data = adult_data()
    path = tmp_path / "acme.toml"
    path.write_text(ADULT_TOML.read_text().replace('prefix = "fairstream"', 'prefix = "acme.tenant1"'))
    config = PipelineConfig.from_toml(path)
    assert config.topics.prefix == "acme.tenant1"
    assert config.topics.records_in == "acme.tenant1.records.in"
    assert config.topics.dlq == "acme.tenant1.dlq"
    names = [spec.name for spec in config.topics.specs()]
    assert names and all(name.startswith("acme.tenant1.") for name in names)
    assert len(set(names)) == len(names)
    assert config.with_topics(prefix="other").topics.records_in == "other.records.in"
    assert PipelineConfig.from_dict(data).topics.records_in == "fairstream.records.in"


# --------------------------------------------------------------------------- mistakes


def test_unknown_section(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(ADULT_TOML.read_text() + '\n[alerts]\nport = 9000\n')
    with pytest.raises(ConfigError, match=r"unknown top-level section\(s\): \['alerts'\]"):
        PipelineConfig.from_toml(path)


@pytest.mark.parametrize("name", ["recods", "record", "embedding"])
def test_unknown_agent_section(name):
    # A misspelt [agents.records] would otherwise silently fall back to the defaults.
    data = adult_data()
    data["agents"][name] = {"batch_size": 10}
    assert name in config_error(data)


@pytest.mark.parametrize("section, key", [
    ("pipeline", "featurs"),
    ("pipeline", "group"),
    ("topics", "partition"),
    ("agents.records", "batchsize"),
    ("agents.embeddings", "dim"),
])
def test_unknown_key_is_named(section, key):
    data = adult_data()
    table = data
    for part in section.split("."):
        table = table[part]
    table[key] = 1
    message = config_error(data)
    assert repr(key) in message and section in message


def test_unknown_key_in_a_file_is_named(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(ADULT_TOML.read_text().replace("label = true", "lable = true"))
    with pytest.raises(ConfigError, match="'lable'"):
        PipelineConfig.from_toml(path)


@pytest.mark.parametrize("key", ["name", "features", "groups", "strata"])
def test_missing_required_key_is_named(key):
    data = adult_data()
    del data["pipeline"][key]
    assert f"pipeline.{key} is required" in config_error(data)


def test_missing_pipeline_section():
    data = adult_data()
    del data["pipeline"]
    assert "required" in config_error(data)


@pytest.mark.parametrize("key", ["s_name", "u_name", "label", "max_message_bytes", "include_original", "artifact_dir"])
def test_optional_pipeline_keys_have_defaults(key):
    data = adult_data()
    del data["pipeline"][key]
    config = PipelineConfig.from_dict(data)
    default = next(f.default for f in fields(PipelineConfig) if f.name == key)
    assert getattr(config, key) == default


def test_minimal_config_uses_every_default():
    config = PipelineConfig.from_dict({"pipeline": {"name": "m", "features": ["x"], "groups": [0, 1], "strata": [0]}})
    assert config.topics == TopicConfig() and config.records == AgentConfig(artifact="plan")
    assert config.embeddings == EmbeddingConfig()


@pytest.mark.parametrize("features, fragment", [
    (["age", "age"], "duplicates"),
    (["age", "hours-per-week", "age"], "duplicates"),
    ([], "non-empty names"),
])
def test_bad_features(features, fragment):
    data = adult_data()
    data["pipeline"]["features"] = features
    message = config_error(data)
    assert "pipeline.features" in message and fragment in message


@pytest.mark.parametrize("features", ["age", [1, 2], ["age", 2.5], ["age", ["x"]]], ids=["a string", "ints", "float", "list"])
def test_features_must_be_a_list_of_strings(features):
    # JSON object keys are strings: any other feature name can never match a record, and
    # features = "age" would silently become the three features 'a', 'g', 'e'.
    data = adult_data()
    data["pipeline"]["features"] = features
    assert "features" in config_error(data)


@pytest.mark.parametrize("key", ["groups", "strata"])
@pytest.mark.parametrize("values, fragment", [
    ([True, False], "integers or strings"),
    ([0, True], "integers or strings"),
    ([0.0, 1.0], "integers or strings"),
    ([0, 1.5], "integers or strings"),
    ([], "non-empty"),
    ([0, 0], "distinct"),
    (["f", "f"], "distinct"),
    ([0, 2**63], "64-bit integer"),  # the label arrays are int64: every batch would fail to decode
    ([0, -(2**63) - 1], "64-bit integer"),
    (["f", "\ud800"], "lone surrogate"),  # no UTF-8 bytes: no output could carry it
])
def test_bad_groups_and_strata(key, values, fragment):
    data = adult_data()
    data["pipeline"][key] = values
    message = config_error(data)
    assert f"pipeline.{key}" in message and fragment in message


@pytest.mark.parametrize("groups", [["f", "m"], [0, 1, 2], ["0", "1"], [-1, 7]])
def test_good_groups(groups):
    data = adult_data()
    data["pipeline"]["groups"] = groups
    assert PipelineConfig.from_dict(data).groups == tuple(groups)


@pytest.mark.parametrize("agent", ["records", "embeddings"])
@pytest.mark.parametrize("batch_size", [0, -1, -1000])
def test_bad_batch_size(agent, batch_size):
    data = adult_data()
    data["agents"][agent]["batch_size"] = batch_size
    message = config_error(data)
    assert "batch_size" in message and str(batch_size) in message


@pytest.mark.parametrize("batch_size", [True, 1.5, "10"], ids=["bool", "float", "string"])
def test_batch_size_must_be_an_integer(batch_size):
    data = adult_data()
    data["agents"]["records"]["batch_size"] = batch_size
    assert "batch_size" in config_error(data)


@pytest.mark.parametrize("batch_within", [0, -0.5])
def test_bad_batch_within(batch_within):
    data = adult_data()
    data["agents"]["records"]["batch_within"] = batch_within
    assert "batch_within" in config_error(data)


@pytest.mark.parametrize("artifact", ["plan", "", "Identity", "embeddings"])
def test_bad_embedding_artifact(artifact):
    data = adult_data()
    data["agents"]["embeddings"]["artifact"] = artifact
    message = config_error(data)
    assert "agents.embeddings.artifact" in message and repr(artifact) in message
    assert "'identity'" in message and "'embedding'" in message


@pytest.mark.parametrize("artifact", ["identity", "embedding"])
def test_good_embedding_artifact(artifact):
    data = adult_data()
    data["agents"]["embeddings"]["artifact"] = artifact
    assert PipelineConfig.from_dict(data).embeddings.artifact == artifact


@pytest.mark.parametrize("dimension", [0, -3])
def test_bad_embedding_dimension(dimension):
    data = adult_data()
    data["agents"]["embeddings"]["dimension"] = dimension
    assert "agents.embeddings.dimension" in config_error(data)


@pytest.mark.parametrize("key, value", [("partitions", 0), ("replication", 0), ("prefix", ""), ("prefix", ".x")])
def test_bad_topics_are_config_errors(key, value):
    # Loading a pipeline file reports every mistake the same way, as a ConfigError naming the key.
    data = adult_data()
    data["topics"][key] = value
    assert key in config_error(data)


# --------------------------------------------------------------------------- types and ranges of every key


def table_of(data: dict, section: str) -> dict:
    for part in section.split("."):
        data = data.setdefault(part, {})
    return data


@pytest.mark.parametrize("section, key", [(row[0], row[1]) for row in reference_rows()], ids="{0[0]}.{0[1]}".format)
def test_every_key_refuses_a_value_of_the_wrong_type_naming_expected_and_found(section, key):
    data = adult_data()
    table_of(data, section)[key] = {"x": [1]}
    message = config_error(data)
    assert message.startswith(f"{section}.{key} must be ") and message.endswith("got {'x': [1]}"), message


@pytest.mark.parametrize("section, key, value, expected", [
    ("topics", "partitions", "4", "an integer >= 1 and <= 10000"),
    ("monitor", "metrics_port", "9464", "an integer >= 0 and <= 65535 or 'off'"),
    ("monitor", "metrics_port", 70000, "an integer >= 0 and <= 65535 or 'off'"),
    ("monitor", "metrics_port", -1, "an integer >= 0 and <= 65535 or 'off'"),
    ("agents.records", "batch_within", 1e308, "a number > 0 and <= 60"),
    ("agents.records", "batch_within", float("nan"), "a number > 0 and <= 60"),
    ("agents.records", "batch_size", 10**9, "an integer >= 1 and <= 100000"),
    ("agents.records", "artifact", "plna", "an artifact kind ('flow', 'plan', 'scorer'"),  # then any later kinds
    ("agents.records", "artifact", "plna", "('plna' is not a record kind (known: ['flow', 'plan', 'scorer'"),
    ("agents.records", "artifact", ["scorer", "plan"], "'plan' (place repair) cannot come after 'scorer'"),
    ("agents.records", "artifact", ["plan", "plan"], "or a list of distinct kinds"),
    ("monitor", "threshold", float("inf"), "a number in (0, 1e6]"),
    ("monitor", "threshold", {"dependence_e": -1.0}, "a table of statistic = number"),
    ("monitor", "statistic", "e", "a statistic ('dependence_e', 'w1',"),
    ("monitor", "statistic", ["w1", "w1"], "a non-empty list of distinct ones"),
    ("pipeline", "max_message_bytes", 2**30, "an integer >= 64 and <= 524288"),
    ("monitor", "max_event_time_skew", 0, "a number > 0 and <= 604800"),
    ("monitor", "max_event_time_skew", float("inf"), "a number > 0 and <= 604800"),
    ("pipeline", "name", "my pipeline", "a name of letters, digits, '_', '-' and inner dots (at most 200 characters)"),
    ("pipeline", "label", "yes", "true or false"),
    ("pipeline", "promotion", "manual", "'auto', 'shadow' or 'approve'"),
    ("shadow", "min_records", 0, "an integer >= 1"),
    ("shadow", "min_improvement", -0.01, "a number >= 0"),
    ("shadow", "max_accuracy_drop", 1.5, "a number >= 0 and <= 1"),
    ("shadow", "max_decision_rate_change", float("nan"), "a number >= 0 and <= 1"),
    ("shadow", "statistic", "e", "a statistic ('dependence_e', 'w1',"),
    ("shadow", "statistic", ["w1", "w1"], "a list of distinct ones ([]: the monitor's)"),
    ("delivery", "guarantee", "exactly-once", "'at_least_once' or 'exactly_once'"),
], ids=lambda v: str(v)[:20])
def test_values_outside_their_range_are_named_with_what_was_expected_and_found(section, key, value, expected):
    data = adult_data()
    table_of(data, section)[key] = value
    message = config_error(data)
    assert message.startswith(f"{section}.{key} must be ") and message.endswith(f", got {value!r}"), message
    assert expected in message


@pytest.mark.parametrize("key", ["min_records", "buckets"])
def test_monitor_settings_that_would_silence_the_monitor_are_refused(key):
    data = adult_data()
    data["monitor"].update(window_records=100, min_records=50, buckets=10)
    data["monitor"][key] = 101
    assert config_error(data) == f"monitor.{key} must be at most monitor.window_records (100), got 101"


def test_an_event_time_skew_wider_than_the_time_window_is_refused():
    # A believed ts further ahead than the window would leave every batch after it out of the time window.
    data = adult_data()
    data["monitor"].update(window_seconds=30, max_event_time_skew=31)
    assert config_error(data) == "monitor.max_event_time_skew must be at most monitor.window_seconds (30.0), got 31.0"
    data["monitor"]["max_event_time_skew"] = 30
    assert PipelineConfig.from_dict(data).monitor.max_event_time_skew == 30.0
    assert adult_config().monitor.max_event_time_skew == 60.0


@pytest.mark.parametrize("port", [0, 9464, "off"])
def test_metrics_port_is_a_port_any_free_port_or_off(port):
    data = adult_data()
    data["monitor"]["metrics_port"] = port
    assert PipelineConfig.from_dict(data).monitor.metrics_port == port


@pytest.mark.parametrize("ranges, message", [
    ({"hours-per-weak": [0, 168]}, "pipeline.valid_ranges names 'hours-per-weak', which is not a configured feature"),
    ({"age": [120, 0]}, "pipeline.valid_ranges.age must be [min, max] with min <= max, got [120.0, 0.0]"),
    ({"age": [0, float("nan")]}, "pipeline.valid_ranges.age must be [min, max] with min <= max, got [0.0, nan]"),
    ({"age": [0]}, "pipeline.valid_ranges must be a table of feature = [min, max]"),
    ({"age": ["0", "120"]}, "pipeline.valid_ranges must be a table of feature = [min, max]"),
    ([0, 120], "pipeline.valid_ranges must be a table of feature = [min, max]"),
])
def test_bad_valid_ranges_are_named(ranges, message):
    data = adult_data()
    data["pipeline"]["valid_ranges"] = ranges
    assert message in config_error(data)


def test_valid_ranges_may_be_one_sided_and_read_back(tmp_path):
    config = adult_config(valid_ranges={"hours-per-week": (0, math.inf), "age": (-math.inf, 120)})
    assert config.valid_ranges == (("age", (-math.inf, 120.0)), ("hours-per-week", (0.0, math.inf)))
    assert config.range_bounds() == ([-math.inf, 0.0], [120.0, math.inf])
    path = tmp_path / "p.toml"
    path.write_text(config.to_toml())
    assert PipelineConfig.from_toml(path) == config
    assert adult_config(valid_ranges={}).range_bounds() == ([-math.inf] * 2, [math.inf] * 2)


def test_the_shipped_adult_config_declares_valid_ranges():
    assert dict(PipelineConfig.from_toml(ADULT_TOML).valid_ranges) == {"age": (0.0, 120.0),
                                                                        "hours-per-week": (0.0, 168.0)}


# --------------------------------------------------------------------------- file errors name the file


@pytest.mark.parametrize("content, message", [
    (None, "no such pipeline config file"),
    (b"[pipeline\nname = 'x'\n",
     "not valid TOML: Expected ']' at the end of a table declaration (at line 1, column 10)"),
    (b"name = \xff\n", "not a UTF-8 text file"),
    (b"", "pipeline.name is required"),
    (b"[pipeline]\nname = 'a'\nfeatures = ['x']\ngroups = [0, 1]\nstrata = [0]\n[topics]\npartitions = '4'\n",
     "topics.partitions must be an integer >= 1 and <= 10000, got '4'"),
], ids=["missing", "syntax", "not utf-8", "empty", "typed"])
def test_a_file_error_starts_with_the_path(content, message, tmp_path):
    path = tmp_path / "pipeline.toml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        PipelineConfig.from_toml(path)
    assert str(info.value).startswith(f"{path}: {message}")


def test_a_directory_is_not_a_config(tmp_path):
    with pytest.raises(ConfigError, match=f"^{tmp_path}: cannot read the pipeline config"):
        PipelineConfig.from_toml(tmp_path)


# --------------------------------------------------------------------------- the documentation's reference


def test_the_configuration_reference_lists_every_key_with_type_default_and_range():
    # docs/hooks.py puts reference_markdown() in place of this marker when the site is built (tests/test_docs.py).
    page = (ROOT / "docs" / "reference" / "configuration.md").read_text()
    assert "\n<!-- generated: configuration -->\n" in page, "docs/reference/configuration.md lost its generated table"
    documented = {(row[0], row[1]) for row in reference_rows()}
    config = PipelineConfig.from_toml(ADULT_TOML)
    keys = {("pipeline", f.name) for f in fields(PipelineConfig) if f.name not in SECTIONS}
    keys |= {("topics", f.name) for f in fields(TopicConfig)}
    keys |= {(section, f.name) for section, obj in (("agents.records", config.records),
                                                    ("agents.embeddings", config.embeddings),
                                                    ("monitor", config.monitor), ("shadow", config.shadow),
                                                    ("kafka", config.kafka), ("delivery", config.delivery),
                                                    ("schema_registry", config.schema_registry))
             for f in fields(obj)}
    assert documented == keys
    assert all(row[2] and row[3] and row[4] and row[5] for row in reference_rows())


# --------------------------------------------------------------------------- record chains and monitored statistics


def test_a_record_chain_reads_back_and_names_its_kinds_in_order():
    data = adult_data()
    data["agents"]["records"]["artifact"] = ["flow", "scorer"]
    data["monitor"].update(statistic=["dp_difference", "eopp"], threshold={"dp_difference": 0.1, "eopp": 0.15})
    config = PipelineConfig.from_dict(data)
    assert config.records.chain == ("flow", "scorer") and config.refit_kind == "flow"
    assert config.monitor.statistics == ("dp_difference", "eopp")
    assert config.monitor.thresholds == {"dp_difference": 0.1, "eopp": 0.15}
    assert PipelineConfig.from_dict(tomllib.loads(config.to_toml())) == config
    assert PipelineConfig.from_dict(adult_data()).records.chain == ("plan", "scorer")
    assert adult_config().records.chain == ("plan",)


@pytest.mark.parametrize("statistic, needs", [
    ("dp_difference", "writes a decision"), ("dp_ratio", "writes a decision"), ("conditional_dp", "writes a decision"),
    ("eopp", "writes a decision"), ("mdp", "writes a score"), ("otf", "writes a score")])
def test_a_statistic_of_decisions_or_scores_needs_a_chain_that_writes_them(statistic, needs):
    data = adult_data()
    data["agents"]["records"]["artifact"] = "plan"
    data["monitor"].update(statistic=statistic, threshold=0.1)
    assert config_error(data) == (f"monitor.statistic {statistic!r} needs a record chain that {needs} (it writes: "
                                  "features), got agents.records.artifact = ['plan']")


@pytest.fixture
def post_kind(monkeypatch):
    """A kind placed after the scorer (reads the score, writes the decision), registered for one test."""
    from fairstream.models.kinds import MODULE_KINDS

    from .worker.post_module import CUTOFFS, GroupCutoffs

    monkeypatch.setitem(MODULE_KINDS, CUTOFFS, GroupCutoffs)
    return CUTOFFS


def test_a_kind_placed_after_the_scorer_is_a_record_kind_by_its_capabilities_alone(post_kind):
    data = adult_data()
    data["agents"]["records"]["artifact"] = ["plan", "scorer", post_kind]
    data["monitor"].update(statistic=["dp_difference", "mdp"], threshold=0.1)
    config = PipelineConfig.from_dict(data)
    assert config.records.chain == ("plan", "scorer", post_kind) and config.refit_kind == "plan"
    data["agents"]["records"]["artifact"] = ["scorer", post_kind]
    assert PipelineConfig.from_dict(data).refit_kind == "scorer"  # no repair stage: the first kind
    for chain, problem in ((["plan", post_kind], f"{post_kind!r} reads the score, which nothing before it provides"),
                           (["scorer", post_kind, "plan"], f"'plan' (place repair) cannot come after {post_kind!r} (place post)")):
        data["agents"]["records"]["artifact"] = chain
        message = config_error(data)
        assert message.startswith("agents.records.artifact must be ") and f"({problem})" in message, message


def test_mdp_needs_a_score_module_that_matches_counterparts(post_kind, monkeypatch):
    from fairstream.models.scorer import Scorer
    from fairstream.repair.protocol import Capabilities

    bare = dict(vars(Scorer.capabilities), counterparts=False)
    monkeypatch.setattr(Scorer, "capabilities", Capabilities(**bare))
    data = adult_data()
    data["monitor"].update(statistic="mdp", threshold=0.1)
    assert config_error(data) == ("monitor.statistic 'mdp' needs a record chain that has a score module that matches "
                                  "counterparts (a group map), got agents.records.artifact = ['plan', 'scorer']")


def test_equal_opportunity_needs_labelled_records():
    data = adult_data()
    data["pipeline"]["label"] = False
    data["agents"]["records"]["artifact"] = ["plan", "scorer"]
    data["monitor"].update(statistic="eopp", threshold=0.1)
    assert config_error(data) == "monitor.statistic 'eopp' needs labelled records: set pipeline.label = true"


@pytest.mark.parametrize("thresholds, problem", [
    ({"dependence_e": 0.1}, "missing ['w1']"),
    ({"dependence_e": 0.1, "w1": 2.0, "mdp": 0.1}, "unknown ['mdp']"),
])
def test_per_statistic_thresholds_cover_exactly_the_monitored_statistics(thresholds, problem):
    data = adult_data()
    data["monitor"].update(statistic=["dependence_e", "w1"], threshold=thresholds)
    assert config_error(data) == ("monitor.threshold must give a number for every monitored statistic "
                                  f"['dependence_e', 'w1']: {problem}")


# --------------------------------------------------------------------------- promotion policy and the shadow section


def test_promotion_is_auto_and_the_shadow_policy_compares_the_monitored_statistics_by_default():
    config = PipelineConfig.from_dict(adult_data())
    assert config.promotion == "auto"
    assert (config.shadow.min_records, config.shadow.min_improvement, config.shadow.max_accuracy_drop,
            config.shadow.max_decision_rate_change) == (2000, 0.0, 0.02, 0.05)
    assert config.shadow.statistics == () and config.shadow_statistics == config.monitor.statistics


@pytest.mark.parametrize("promotion", ["auto", "shadow", "approve"])
def test_a_promotion_policy_and_shadow_settings_read_back(promotion):
    data = adult_data()
    data["pipeline"]["promotion"] = promotion
    data["shadow"] = {"min_records": 500, "statistic": ["dp_difference", "w1"], "min_improvement": 0.01,
                      "max_accuracy_drop": 0.05, "max_decision_rate_change": 0.1}
    config = PipelineConfig.from_dict(data)
    assert config.promotion == promotion and config.shadow_statistics == ("dp_difference", "w1")
    assert config.shadow.min_records == 500 and config.shadow.max_decision_rate_change == 0.1
    assert PipelineConfig.from_dict(tomllib.loads(config.to_toml())) == config
    assert config.with_shadow(statistic="w1").shadow_statistics == ("w1",)


def test_an_unknown_shadow_key_is_named():
    data = adult_data()
    data["shadow"] = {"min_record": 10}
    assert config_error(data).startswith("[shadow] has unknown key(s) ['min_record']; allowed: ")


@pytest.mark.parametrize("statistic, label, message", [
    ("dp_difference", True, "shadow.statistic 'dp_difference' needs a record chain that writes a decision (it writes: "
                            "features), got agents.records.artifact = ['plan']"),
    ("eopp", False, "shadow.statistic 'eopp' needs"),
])
def test_a_shadow_statistic_needs_what_a_monitored_one_needs(statistic, label, message):
    data = adult_data()
    data["pipeline"]["label"] = label
    data["agents"]["records"]["artifact"] = "plan" if statistic != "eopp" else ["plan", "scorer"]
    data["monitor"].update(statistic="dependence_e", threshold=0.1)
    data["shadow"] = {"statistic": statistic}
    assert config_error(data).startswith(message)
