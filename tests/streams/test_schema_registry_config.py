"""``[schema_registry]``: where the schemas of Avro topics are; read, checked, written back and documented."""

from __future__ import annotations

import pytest

from fairstream.streams.config import ConfigError, PipelineConfig, SchemaRegistryConfig, reference_markdown

LOANS = {"pipeline": {"name": "loans", "features": ["age"], "groups": ["female", "male"], "strata": ["north"]},
         "mapping": {"id": "application_id", "s": {"path": "applicant.sex", "values": {"F": "female", "M": "male"}},
                     "u": "branch", "features": {"age": "applicant.age"}},
         "topics": {"input": "loan-applications", "format": "avro"}}


def test_an_avro_pipeline_reads_its_registry_url_and_writes_it_back(tmp_path):
    url = "http://127.0.0.1:40321/apis/ccompat/v7"
    config = PipelineConfig.from_dict({**LOANS, "schema_registry": {"url": url}})
    assert config.schema_registry.url == url and config.topics.format == "avro"
    (tmp_path / "loans.toml").write_text(config.to_toml())
    assert PipelineConfig.from_toml(tmp_path / "loans.toml") == config
    assert PipelineConfig.from_dict(LOANS).schema_registry == SchemaRegistryConfig()  # the local default


def test_a_json_pipeline_writes_no_registry_section():
    json_loans = {**LOANS, "topics": {"input": "loan-applications"}}
    assert "[schema_registry]" not in PipelineConfig.from_dict(json_loans).to_toml()


def test_avro_without_a_mapping_and_a_url_that_is_not_one_are_refused_in_one_line():
    with pytest.raises(ConfigError, match=r'^topics.format = "avro" reads a team\'s own records: add a \[mapping\]'):
        PipelineConfig.from_dict({"pipeline": LOANS["pipeline"], "topics": {"format": "avro"}})
    with pytest.raises(ConfigError, match=r"^schema_registry.url") as refused:
        PipelineConfig.from_dict({**LOANS, "schema_registry": {"url": "127.0.0.1:8081"}})
    assert "\n" not in str(refused.value)


def test_the_reference_documents_the_registry_url():
    (row,) = [line for line in reference_markdown().splitlines() if line.startswith("| `[schema_registry]` | `url`")]
    assert "`\"http://127.0.0.1:8081\"`" in row and "ccompat" in row
