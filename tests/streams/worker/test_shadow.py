"""The shadow promotion policy: promote only when every compared statistic improves and the guard holds."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairstream.streams.config import ShadowConfig
from fairstream.streams.control.records import control_key, encode_control, read_message
from fairstream.streams.control.registry import Active
from fairstream.streams.worker.shadow import ShadowPolicy, decide

gaps = st.floats(0.0, 1.0, allow_nan=False)
rates = st.floats(0.0, 1.0, allow_nan=False)


@given(active=st.lists(gaps, min_size=1, max_size=3), candidate=st.lists(gaps, min_size=3, max_size=3),
       min_improvement=st.floats(0.0, 0.2), accuracy=st.tuples(rates, rates),
       max_drop=st.floats(0.0, 1.0))
def test_a_candidate_is_promoted_exactly_when_every_statistic_improves_enough_and_accuracy_holds(
        active, candidate, min_improvement, accuracy, max_drop):
    names = ("dependence_e", "w1", "dp_difference")[:len(active)]
    figures = {"records": 5000.0, "active.accuracy": accuracy[0], "candidate.accuracy": accuracy[1],
               **{f"active.{n}": a for n, a in zip(names, active)},
               **{f"candidate.{n}": c for n, c in zip(names, candidate)}}
    config = ShadowConfig(statistic=names, min_improvement=min_improvement, max_accuracy_drop=max_drop)
    better = all(a - c > min_improvement for a, c in zip(active, candidate))
    guarded = accuracy[0] - accuracy[1] <= max_drop
    action, reason = decide(figures, config)
    assert action == ("promote" if better and guarded else "retire")
    failing = [n for n, a, c in zip(names, active, candidate) if not a - c > min_improvement]
    failed_part = reason.split("; passed")[0] if action == "retire" else ""
    assert all(f"{n}: candidate" in failed_part for n in failing)
    assert ("accuracy guard" in failed_part) == (not guarded)
    assert all(f"{n}: candidate" in reason for n in names)  # every figure compared is named


@given(active=rates, candidate=rates, limit=st.floats(0.0, 1.0))
def test_without_labels_the_decision_rate_is_the_guard(active, candidate, limit):
    figures = {"records": 2000.0, "active.dp_difference": 0.2, "candidate.dp_difference": 0.05,
               "active.decision_rate": active, "candidate.decision_rate": candidate}
    action, reason = decide(figures, ShadowConfig(max_decision_rate_change=limit))
    assert action == ("promote" if abs(candidate - active) <= limit else "retire")
    assert "decision-rate guard" in reason and "accuracy" not in reason


BETTER = {"records": 2400.0, "active.dependence_e": 0.12, "candidate.dependence_e": 0.03,
          "noise.dependence_e": 0.01}


@pytest.mark.parametrize("extra, config, action, named", [
    ({}, ShadowConfig(), "promote", "no guard (the chains write no decision: statistics only)"),
    ({}, ShadowConfig(min_improvement=0.1), "retire", "failed dependence_e: candidate 0.0300 vs active 0.1200 "
                                                      "(noise floor 0.0100) (not lower by more than 0.1)"),
    ({"active.accuracy": 0.85, "candidate.accuracy": 0.80, "active.decision_rate": 0.3,
      "candidate.decision_rate": 0.3}, ShadowConfig(), "retire", "failed accuracy guard: candidate 0.8000 vs active "
                                                                 "0.8500 (drop 0.0500, at most 0.02)"),
    ({"active.decision_rate": 0.30, "candidate.decision_rate": 0.40}, ShadowConfig(), "retire",
     "failed decision-rate guard: candidate 0.4000 vs active 0.3000 (change 0.1000, at most 0.05)"),
    ({"active.decision_rate": 0.30, "candidate.decision_rate": 0.33}, ShadowConfig(), "promote",
     "promoted after 2400 live records: dependence_e: candidate 0.0300 vs active 0.1200 (noise floor 0.0100) "
     "(lower by 0.0900 > 0); decision-rate guard"),
    ({}, ShadowConfig(statistic=("dependence_e", "w1")), "retire", "failed w1: not measured on both chains"),
])
def test_the_reason_names_the_figures_that_decided(extra, config, action, named):
    decided, reason = decide({**BETTER, **extra}, config)
    assert decided == action and named in reason, reason
    assert reason.startswith("promoted after 2400 live records: " if action == "promote" else
                             "retired after 2400 live records: failed ")


def test_nothing_measured_on_both_chains_retires():
    assert decide({"records": 2000.0, "active.w1": 0.1}, ShadowConfig()) == (
        "retire", "retired after 2000 live records: failed statistics: none was measured on both chains; passed no "
                  "guard (the chains write no decision: statistics only)")


def test_the_policy_decides_each_candidate_once_after_min_records_and_its_record_reads_back():
    plan = Active("plan", 5, "e" * 64, None, None)
    policy = ShadowPolicy(ShadowConfig(min_records=1000), "shadow-policy@fairstream-adult@host:42")
    assert policy.due([plan], 999) == [] and policy.due([plan], 1000) == [plan]
    (record,) = policy.decisions([plan], {**BETTER, "since": 1.7e9, "": 1.0, "x" * 101: 2.0})
    assert (record.kind, record.version, record.sha256, record.action) == ("plan", 5, "e" * 64, "promote")
    assert record.actor == "shadow-policy@fairstream-adult@host:42" and record.reason.startswith("promoted after")
    assert record.statistics == {**BETTER, "since": 1.7e9}  # what a record cannot carry is left out
    value = encode_control(record)
    assert read_message(control_key(record, value), value).record == record
    assert policy.due([plan], 5000) == []  # decided once
    assert policy.due([plan, Active("scorer", 2, "f" * 64, None, None)], 5000)[0].kind == "scorer"


def test_a_candidate_that_refused_records_the_active_chain_repaired_is_retired_whatever_its_statistics():
    assert decide({**BETTER, "candidate.refused": 0.0}, ShadowConfig())[0] == "promote"
    action, reason = decide({**BETTER, "candidate.refused": 37.0}, ShadowConfig())
    assert action == "retire" and reason.startswith(
        "retired after 2400 live records: failed refusals: the candidate refused 37 records the active chain "
        "repaired (they would be dead-lettered); passed dependence_e: ")


def test_a_candidate_the_policy_cannot_judge_is_retired_once_with_why():
    plan = Active("plan", 6, "e" * 64, None, None)
    policy = ShadowPolicy(ShadowConfig(min_records=1000), "shadow-policy@fairstream-adult@host:42")
    (record,) = policy.retirements([plan], "its statistics cannot be measured: ValueError: x", {"records": 3.0})
    assert (record.kind, record.version, record.sha256, record.action) == ("plan", 6, "e" * 64, "retire")
    assert record.reason == "retired: its statistics cannot be measured: ValueError: x"
    assert record.statistics == {"records": 3.0} and policy.due([plan], 5000) == []
