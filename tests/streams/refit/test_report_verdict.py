"""The report's opening, from figures alone: what the evidence means, in words.

The monitoring agent announces the pipeline-wide figures of a pending candidate (its verdict, the confidence bounds
behind it, the decisions it changes); the report opens with them in plain words, sets the re-fit's holdout beside
them and says which the rule trusts when they disagree, and says so plainly when only workers' figures exist.
The evidence is built here by hand (``test_report.py`` gathers it on Kafka and opens the page in Chromium).
"""

from __future__ import annotations

import html
import re
import time

import pytest

from fairstream.streams.config import AgentConfig, ShadowConfig, adult_config
from fairstream.streams.control.records import WorkerStatus
from fairstream.streams.refit import report
from fairstream.streams.refit.evidence import Chains, Evidence, HoldoutFigures, holdout_figures, is_agent
from fairstream.streams.schemas import ControlRecord

SHA = "c" * 64
AGENT = "fairstream-adult.monitor"
WORKER = "fairstream-adult"


def status(app_id: str, at: float | None = None) -> WorkerStatus:
    return WorkerStatus(worker=f"{app_id}@host-1:77", app_id=app_id, host="host-1", pid=77,
                        at=time.time() if at is None else at, every=300.0, kinds=("plan", "scorer"), serving=(),
                        shadowing=(("plan", 2, SHA),), shadow={"records": 1.0})


def agent_figures(verdict: float, estimate: float, lower: float, upper: float, records: float = 12_400, **more):
    """What the agent announces for a DP-gap comparison with the decision-rate guard (agent/service.py's keys)."""
    return {"records": records, "alpha": 0.05, "verdict": verdict,
            "bound.dp_difference.estimate": estimate, "bound.dp_difference.lower": lower,
            "bound.dp_difference.upper": upper,
            "guard.decision_rate.estimate": 0.012, "guard.decision_rate.lower": 0.004,
            "guard.decision_rate.upper": 0.02,
            "changed": 1240.0, "records.0": 7650.0, "changed.0": 620.0, "records.1": 4750.0, "changed.1": 620.0,
            "active.dp_difference": 0.081, "candidate.dp_difference": 0.081 - estimate,
            "active.decision_rate": 0.31, "candidate.decision_rate": 0.322, **more}


def evidence(pipeline: dict | None = None, workers: tuple = (), holdout: HoldoutFigures | None = None,
             promotion: str = "shadow", min_improvement: float = 0.005, agent_at: float | None = None) -> Evidence:
    config = adult_config(records=AgentConfig(artifact=("plan", "scorer")), promotion=promotion,
                          shadow=ShadowConfig(statistic="dp_difference", min_improvement=min_improvement,
                                              min_records=2000, max_records=200_000))
    publish = ControlRecord("plan", 2, SHA, path="p", candidate=True, actor="refit@w", reason="drift")
    chains = Chains(("plan", "scorer"), (None, None), (None, None), {"plan": 1, "scorer": 1})
    return Evidence(config=config, kind="plan", version=2, publish=publish, trail=(), state="candidate",
                    pending=(2, SHA), artifact=None, artifact_refusal=None, chains=chains,
                    shadow=tuple((status(WORKER), figures) for figures in workers), window=None, window_note=None,
                    topic="records.in", generated_at=time.time(),
                    pipeline=None if pipeline is None else (status(AGENT, agent_at), pipeline), holdout=holdout)


def opening(ev: Evidence) -> str:
    """The verdict section's text, unescaped, tags removed."""
    page = report.render(ev)
    found = re.search(r"<section id=verdict>(.*?)</section>", page, flags=re.S)
    assert found is not None and page.index("<section id=verdict>") < page.index("<section id=summary>")
    return html.unescape(re.sub(r"<[^>]+>", " ", found.group(1)))


def test_the_report_opens_with_a_promotion_and_its_bounds_in_words():
    text = opening(evidence(agent_figures(1.0, 0.018, 0.006, 0.031)))
    assert ("The shadow policy would promote this candidate now: on 12,400 paired live records its DP gap is lower "
            "than the serving chain's by 0.018 (between 0.006 and 0.031 with 95% confidence at every look); its "
            "overall decision rate changes by 0.012 (between 0.004 and 0.020 with 95% confidence at every look; at "
            "most 0.05 allowed). The false-promotion rate is alpha = 0.05.") in text
    assert "Every compared statistic is better by more than the required improvement of 0.005 for sure" in text


def test_a_candidate_the_policy_waits_on_says_which_interval_is_undecided():
    text = opening(evidence(agent_figures(0.0, 0.004, -0.003, 0.011)))
    assert ("The shadow policy would not decide yet: on 12,400 paired live records its DP gap is lower than the "
            "serving chain's by 0.004 (between -0.003 and 0.011 with 95% confidence at every look)") in text
    assert ("It waits until the intervals settle: the interval of its DP gap still straddles the required improvement "
            "of 0.005. It retires the candidate at 200,000 paired records without a promotion.") in text


def test_before_the_first_look_the_wait_names_the_records_still_missing():
    text = opening(evidence(agent_figures(0.0, 0.01, -0.2, 0.2, records=900)))
    assert "It looks first after 2,000 paired records; 900 were compared so far." in text


def test_a_retirement_says_the_interval_excludes_an_improvement():
    text = opening(evidence(agent_figures(-1.0, -0.012, -0.02, -0.004)))
    assert ("The shadow policy would retire this candidate now: on 12,400 paired live records its DP gap is higher "
            "than the serving chain's by 0.012 (its improvement lies between -0.020 and -0.004 with 95% confidence at "
            "every look)") in text
    assert "It retires the candidate because the interval of its DP gap excludes an improvement of more than 0.005." \
        in text


def test_under_approval_the_verdict_is_what_the_policy_would_do_and_a_person_decides():
    text = opening(evidence(agent_figures(1.0, 0.018, 0.006, 0.031), promotion="approve"))
    assert "would promote this candidate now (under promotion = 'approve' it does not act: a person decides)" in text


def test_the_decisions_the_candidate_changes_are_counted_overall_and_per_group():
    text = opening(evidence(agent_figures(1.0, 0.018, 0.006, 0.031)))
    assert ("The candidate decides 1,240 of the 12,400 shadowed records differently (10.0%): 8.1% of sex=0 (620 of "
            "7,650) and 13.1% of sex=1 (620 of 4,750).") in text


def test_when_the_holdout_says_worse_and_live_says_better_the_page_says_which_the_rule_trusts():
    holdout = HoldoutFigures("E", candidate=0.052, serving=0.031, rows=600)
    text = opening(evidence(agent_figures(1.0, 0.018, 0.006, 0.031), holdout=holdout))
    assert ("The holdout and the live figures disagree. On the research holdout (600 rows) the candidate's dependence "
            "E is 0.052 against 0.031 for the plan version it would replace: worse. On 12,400 paired live records its "
            "DP gap is lower than the serving chain's by 0.018: better. The rule trusts the paired live figures: they "
            "are the records the pipeline actually decides, measured on both chains; the holdout is labelled research "
            "data, a different and possibly older sample.") in text
    assert text.count("E (dependence E) is how much the features still depend on the protected attribute") == 1


def test_when_the_holdout_and_live_agree_the_page_says_so():
    holdout = HoldoutFigures("DP gap", candidate=0.02, serving=0.05, rows=600)
    text = opening(evidence(agent_figures(1.0, 0.018, 0.006, 0.031), holdout=holdout))
    assert "The holdout and the live figures agree: the candidate is better on both" in text
    assert "disagree" not in text and "E (dependence E)" not in text  # E is defined only where the page shows it


def test_with_only_workers_figures_there_is_no_pipeline_wide_verdict():
    ev = evidence(workers=({"records": 800.0, "active.dp_difference": 0.09, "candidate.dp_difference": 0.07},))
    text = opening(ev)
    assert ("No pipeline-wide verdict: the monitoring agent is not running (no fairstream monitor process of this "
            "pipeline has announced figures for this version), so this page has no verdict") in text
    assert "Only 1 worker announced figures, each of its own partitions" in text
    assert "would promote" not in text and "would not decide" not in text and "would retire" not in text
    shadow = report.render(ev).split("<section id=shadow>")[1].split("</section>")[0]
    assert "the monitoring agent has announced no figures for this version" in shadow
    assert "DP gap" in shadow and "candidate lower" in shadow  # the worker's own figures, labelled, as diagnostics


def test_nothing_announced_says_there_are_no_live_figures():
    text = opening(evidence())
    assert "No pipeline-wide verdict: the monitoring agent is not running" in text
    assert "no worker has announced figures of its own either, so there are no live figures" in text


def test_an_agent_silent_for_long_is_said_to_be_perhaps_down():
    text = opening(evidence(agent_figures(0.0, 0.004, -0.003, 0.011), agent_at=time.time() - 3600))
    assert "the agent may be down, and these are its last figures" in text


def test_internal_keys_become_labelled_rows_with_their_unit():
    ev = evidence(agent_figures(1.0, 0.018, 0.006, 0.031, **{"some.new.figure": 3.0}))
    shadow = html.unescape(report.render(ev).split("<section id=shadow>")[1].split("</section>")[0])
    rows = dict(re.findall(r"<tr><td>([^<]*)</td><td class=num>([^<]*)</td>", shadow))
    assert rows["DP gap improvement, lower bound"] == "0.006" and rows["DP gap improvement, upper bound"] == "0.031"
    assert rows["the shadow policy's verdict now"] == "promote" and rows["paired live records compared"] == "12,400"
    assert rows["decisions changed, sex=1"] == "620" and rows["decision-rate change, upper bound"] == "0.02"
    assert rows["DP gap, serving chain"] == "0.081" and rows["other figure some.new.figure"] == "3"
    assert "bound.dp_difference" not in shadow.replace("other figure", "")
    assert "difference of the groups' decision rates, 0 to 1; serving minus candidate" in shadow
    assert "<figure id=interval-plot" in report.render(ev)


@pytest.mark.parametrize("app_id, agent", [(AGENT, True), (WORKER, False), ("monitor", False)])
def test_the_agent_is_told_from_workers_by_its_app_id(app_id, agent):
    assert is_agent(status(app_id)) is agent


def test_the_holdout_is_read_from_the_publish_records_figures_when_the_artifact_has_none():
    record = ControlRecord("plan", 2, SHA, path="p", statistics={"E": 0.05, "current E": 0.03})
    assert holdout_figures(record, None) == HoldoutFigures("E", 0.05, 0.03)
    assert holdout_figures(record, None).candidate_better is False
    by_hand = ControlRecord("plan", 2, SHA, path="p", statistics={"E": 0.05, "W1": 0.2})
    assert holdout_figures(by_hand, None) is None


def test_a_live_figure_whose_interval_spans_no_change_is_better_only_so_far():
    holdout = HoldoutFigures("E", candidate=0.052, serving=0.031, rows=600)
    text = opening(evidence(agent_figures(0.0, 0.004, -0.003, 0.011), holdout=holdout))
    assert ("its DP gap is lower than the serving chain's by 0.004: better so far (its interval still spans no "
            "change). The rule trusts the paired live figures") in text
