"""Monitor-only pipelines at config load: the empty chain, group thresholds on the records' own score, and the
re-fit settings that make no sense without a chain, each refused in one line naming its key."""

import argparse
import tomllib

import pytest

from fairstream.streams.config import ConfigError, PipelineConfig, adult_config
from fairstream.streams.refit.command import run_refit_command
from fairstream.streams.refit.trainers import TrainerError, configured_chain

MAPPING = {"id": "application_id", "s": {"path": "applicant.sex", "values": {"F": 0, "M": 1}}, "u": "branch",
           "y": "repaid", "features": {"age": "applicant.age", "hours-per-week": "applicant.hours"}}


def document(chain, mapping=None, **sections) -> dict:
    """The Adult pipeline's TOML document with ``chain`` as agents.records.artifact, a [mapping] and other tables."""
    data = tomllib.loads(adult_config().to_toml())
    data["agents"]["records"]["artifact"] = list(chain)
    if mapping is not None:
        data["mapping"] = mapping
    for name, table in sections.items():
        data.setdefault(name, {}).update(table)
    return data


def refusal(data: dict) -> str:
    with pytest.raises(ConfigError) as error:
        PipelineConfig.from_dict(data)
    message = str(error.value)
    assert "\n" not in message
    return message


def test_an_empty_chain_loads_reads_back_and_has_nothing_to_refit():
    config = PipelineConfig.from_dict(document([]))
    assert config.records.chain == () and config.refit_kind is None and config.carried == frozenset()
    assert PipelineConfig.from_dict(tomllib.loads(config.to_toml())) == config


def test_decision_statistics_of_an_empty_chain_need_the_records_own_decisions():
    statistics = {"statistic": ["dp_difference", "conditional_dp", "eopp"], "threshold": 0.1}
    message = refusal(document([], MAPPING, monitor=statistics))
    assert message.startswith("monitor.statistic 'dp_difference' needs a record chain that writes a decision")
    assert "mapping.decision" in message
    config = PipelineConfig.from_dict(document([], {**MAPPING, "decision": "model.decision"}, monitor=statistics))
    assert config.carried == {"decision"} and config.monitor.statistics == ("dp_difference", "conditional_dp", "eopp")


def test_thresholds_alone_need_the_records_own_score_and_are_not_refitted():
    message = refusal(document(["thresholds"], MAPPING))
    assert message.startswith("agents.records.artifact must be ") and message.endswith("(mapping.score, "
                                                                                     "mapping.decision)")
    assert "('thresholds' reads the score, which nothing before it provides), got 'thresholds'; " in message
    config = PipelineConfig.from_dict(document(["thresholds"], {**MAPPING, "score": "model.score"},
                                               monitor={"statistic": "dp_difference"}))
    assert config.records.chain == ("thresholds",) and config.refit_kind is None
    with pytest.raises(TrainerError, match="reads what the records carry of their own model"):
        configured_chain(config, "thresholds")


def test_a_plan_before_thresholds_on_the_records_own_score_is_refitted_alone():
    config = PipelineConfig.from_dict(document(["plan", "thresholds"], {**MAPPING, "score": "model.score"}))
    assert config.refit_kind == "plan" and configured_chain(config, "plan") == ("plan", "thresholds")
    with pytest.raises(TrainerError):
        configured_chain(config, "thresholds")


@pytest.mark.parametrize("chain", [[], ["thresholds"]])
@pytest.mark.parametrize("sections, key", [
    ({"pipeline": {"promotion": "shadow"}}, "pipeline.promotion"),
    ({"pipeline": {"promotion": "approve"}}, "pipeline.promotion"),
    ({"shadow": {"min_records": 50}}, "shadow.min_records"),
    ({"shadow": {"max_accuracy_drop": 0.5}}, "shadow.max_accuracy_drop"),
])
def test_refit_settings_of_a_monitor_only_pipeline_are_refused_naming_the_key(chain, sections, key):
    message = refusal(document(chain, {**MAPPING, "score": "model.score"}, **sections))
    assert message.startswith(key) and "only monitors, nothing is re-fitted" in message
    # The same settings are a chain's to use once it has a kind to re-fit.
    assert PipelineConfig.from_dict(document(["plan", *chain], {**MAPPING, "score": "model.score"}, **sections))


def test_the_refit_command_refuses_a_monitor_only_pipeline_before_connecting():
    config = PipelineConfig.from_dict(document([]))
    never = lambda args: pytest.fail("the command connected to a broker")  # noqa: E731
    args = argparse.Namespace(kind=None, serve=False, every=None)
    with pytest.raises(TrainerError, match=r"only monitors what the records carry: there is nothing to re-fit"):
        run_refit_command(args, broker_context=never, load_config=lambda _: config)


def test_a_monitor_only_pipeline_gets_the_alert_rules_of_a_pipeline_whose_scorer_decides():
    from fairstream.streams.ops.alert_rules import render_threshold_rules

    monitor = {"statistic": ["dp_difference", "conditional_dp", "eopp"], "threshold": 0.08}
    own = PipelineConfig.from_dict(document([], {**MAPPING, "decision": "model.decision"}, monitor=monitor))
    scored = PipelineConfig.from_dict(document(["plan", "scorer"], monitor=monitor))
    rules = render_threshold_rules(own)
    assert rules == render_threshold_rules(scored)
    assert all(f'statistic="{name}"' in rules for name in monitor["statistic"])
