"""docs/runbook.md answers every alert: each rule links its section, and each section points at real things.

- every alert rule, in deploy/prometheus/alerts.yml and in the PrometheusRule rendered from it, has a
  ``runbook_url`` whose anchor is a ``##`` heading of docs/runbook.md (as GitHub makes anchors);
- every section of an alert says what it means, what to look at first and what to do; it names at
  least one dashboard panel (``panel **Title**``), and every panel it names is in the dashboard;
- every ``fairstream`` command in a code span parses with the real command line (so no option or
  subcommand the CLI lacks), and no section is left for an alert that no longer exists.
"""

from __future__ import annotations

import json
import re
import shlex
from functools import cache

import yaml

from fairstream.streams.ops.prometheus import ALERTS_YML, REPO

from .conftest import DASHBOARD_JSON, K8S, parse_cli

RUNBOOK_MD = REPO / "docs" / "runbook.md"
PROMETHEUS_RULE = K8S / "monitoring" / "prometheusrule.yaml"
RUNBOOK_PATH = "/blob/main/docs/runbook.md"  # where the URLs point: the file in the repository
PARTS = ("**What it means.**", "**Look first.**", "**What to do.**")
_PANEL = re.compile(r"\b[Pp]anel\s+\*\*(.+?)\*\*", re.S)
_CODE = re.compile(r"```[^\n]*\n(.*?)```|`([^`\n]+)`", re.S)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def sections() -> dict[str, str]:
    """The runbook's ``##`` sections: heading -> text up to the next one."""
    parts = re.split(r"^## (.+)$", RUNBOOK_MD.read_text(), flags=re.M)
    return {heading.strip(): body for heading, body in zip(parts[1::2], parts[2::2])}


def alert_rules() -> dict[str, list[dict]]:
    """Every alert rule, by the file it is in."""
    rule_files = {ALERTS_YML.name: yaml.safe_load(ALERTS_YML.read_text())["groups"],
                  PROMETHEUS_RULE.name: yaml.safe_load(PROMETHEUS_RULE.read_text())["spec"]["groups"]}
    return {name: [rule for group in groups for rule in group["rules"] if "alert" in rule]
            for name, groups in rule_files.items()}


def alert_names() -> set[str]:
    return {rule["alert"] for rule in alert_rules()[ALERTS_YML.name]}


def panel_titles() -> set[str]:
    return {panel["title"] for panel in json.loads(DASHBOARD_JSON.read_text())["panels"] if panel["type"] != "row"}


def cli_commands(text: str) -> list[list[str]]:
    """The argv after ``fairstream`` of every fairstream command in the code spans and blocks of ``text``.

    A command starts a shell segment (``fairstream ...``), follows ``--`` (``kubectl exec ... --
    fairstream ...``), or is the compose CLI service's (``docker compose ... run --rm cli ...``).
    """
    commands = []
    for block, span in _CODE.findall(text):
        for line in (block or span).splitlines():
            for segment in re.split(r"\|\||&&|[|;]", line):
                words = shlex.split(segment, comments=True)
                if words[:1] == ["fairstream"] and words[1:]:  # a bare `fairstream` is the name in prose
                    commands.append(words[1:])
                elif "--" in words and words[words.index("--") + 1:][:1] == ["fairstream"]:
                    commands.append(words[words.index("--") + 2:])
                elif words[:2] == ["docker", "compose"] and "cli" in words and "run" in words:
                    commands.append(words[words.index("cli") + 1:])
    return commands


def test_every_alert_rule_links_a_section_of_the_runbook():
    anchors = {github_anchor(heading) for heading in sections()}
    rules = alert_rules()
    assert {rule["alert"] for rule in rules[PROMETHEUS_RULE.name]} == alert_names()
    for file_name, file_rules in rules.items():
        assert file_rules, file_name
        for rule in file_rules:
            url = rule.get("annotations", {}).get("runbook_url", "")
            path, _, anchor = url.partition("#")
            assert path.startswith("https://") and path.endswith(RUNBOOK_PATH), f"{file_name}: {rule['alert']}: {url!r}"
            assert anchor == github_anchor(rule["alert"]) and anchor in anchors, \
                f"{file_name}: {rule['alert']}: no runbook heading for #{anchor}"


def test_every_alert_has_a_whole_section_and_no_section_is_stale():
    alerts = alert_names()
    assert len(alerts) >= 8
    documented = {heading for heading in sections() if heading.startswith("Fairstream")}
    assert documented == alerts, f"missing: {sorted(alerts - documented)}, stale: {sorted(documented - alerts)}"
    for alert in alerts:
        body = sections()[alert]
        positions = [body.find(part) for part in PARTS]
        assert -1 not in positions and positions == sorted(positions), f"{alert}: needs {PARTS} in that order"


def test_every_alert_section_names_panels_of_the_dashboard():
    titles = panel_titles()
    for alert in alert_names():
        named = {" ".join(title.split()) for title in _PANEL.findall(sections()[alert])}
        assert named, f"{alert}: names no dashboard panel (write: panel **Title**)"
        assert named <= titles, f"{alert}: no such dashboard panel(s): {sorted(named - titles)}"


def test_every_fairstream_command_in_the_runbook_exists():
    commands = cli_commands(RUNBOOK_MD.read_text())
    assert {argv[0] for argv in commands} >= {"artifacts", "refit"}
    for argv in commands:
        parse_cli(argv)
    for alert in alert_names():
        assert cli_commands(sections()[alert]), f"{alert}: no fairstream command to run"


def test_the_checks_can_fail():
    assert github_anchor("FairstreamWorkerDown") == "fairstreamworkerdown"
    assert github_anchor("Before you start") == "before-you-start"
    assert cli_commands("run `fairstream artifacts rollback plan | cat` and\n```\nkubectl exec x -- fairstream refit "
                        "--kind plan\ndocker compose -f c.yaml run --rm cli artifacts list\n```") == [
        ["artifacts", "rollback", "plan"], ["refit", "--kind", "plan"], ["artifacts", "list"]]
    for wrong in (["artifacts", "undo", "plan"], ["refit", "--kind", "model"], ["alerts", "--write"]):
        try:
            parse_cli(wrong)
        except AssertionError:
            continue
        raise AssertionError(f"fairstream {shlex.join(wrong)} parsed")
    assert not _PANEL.findall("the dashboard's **Consumer lag**")
    found = _PANEL.findall("Panel **Consumer lag** and panel\n  **Batch duration**")
    assert found == ["Consumer lag", "Batch duration"]
