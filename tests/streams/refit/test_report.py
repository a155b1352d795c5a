"""The candidate report in a real browser: ``write_report`` on Apache Kafka, opened by headless Chromium.

A pipeline ``plan -> scorer`` under ``promotion = "approve"`` serves a scorer and a plan, has a candidate
plan pending, a worker's and the monitoring agent's announcements of live shadow figures for it, and a few
hundred records on ``records.in`` (the scenario of ``test_evidence.py``). Chromium (Debian's package, installed by the
Makefile) loads the page: every section is there and every embedded plot decoded (an inline script of
the page counts them after ``load``), and a screenshot is not blank. Actors and reasons are user
input: a hostile one is shown, not run.
"""

from __future__ import annotations

import re
import subprocess
import time

import numpy as np
import pytest

from fairstream.streams.control.records import ControlError
from fairstream.streams.refit import report
from fairstream.streams.refit.evidence import gather
from fairstream.streams.refit.report import SECTIONS, write_report
# The scenario the evidence is gathered from; adult and with_candidate are fixtures.
from tests.streams.refit.test_evidence import adult, pipeline, plan, serve, to_records_in, with_candidate  # noqa: F401
from tests.streams.refit.test_flow_refit import balanced_scorer
from tests.streams.test_cli import run_main

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
HOSTILE = ("<script>document.body.setAttribute('data-pwned', 'yes')</script>"
           "<img src=x onerror=\"document.body.setAttribute('data-pwned', 'yes')\">")


def chromium(*args: str) -> str:
    result = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", *args], check=False,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def rendered(path) -> str:
    """The page's DOM after Chromium loaded it (scripts run)."""
    return chromium("--dump-dom", path.resolve().as_uri())


def body_attribute(dom: str, name: str) -> str | None:
    found = re.search(r"<body[^>]*\s" + re.escape(name) + r'="([^"]*)"', dom)
    return None if found is None else found.group(1)


def section(dom: str, ident: str) -> str:
    found = re.search(rf'<section id="?{ident}"?>(.*?)</section>', dom, flags=re.S)
    assert found is not None, f"no section {ident}"
    return found.group(1)


def test_the_report_renders_every_section_and_plot_in_headless_chromium(broker, with_candidate, tmp_path):
    config, _, candidate, figures = with_candidate
    started = time.monotonic()
    path = write_report(config, broker.bootstrap, "plan", 2, out=tmp_path / "plan-v2.html", sample=300)
    seconds = time.monotonic() - started
    page = path.read_text()
    assert "http://" not in page and "https://" not in page  # self-contained: nothing fetched

    dom = rendered(path)

    for ident in SECTIONS:
        section(dom, ident)
    n_images = len(re.findall(r"<img\b", page))
    # holdout, the agent's intervals, the worker's figures, the two repaired features, the score and decision rates
    assert n_images == 7, n_images
    assert body_attribute(dom, "data-images") == body_attribute(dom, "data-images-decoded") == str(n_images)
    opening = section(dom, "verdict")
    assert ("The shadow policy would promote this candidate now (under promotion = 'approve' it does not act: a "
            "person decides): on 12,400 paired live records its dependence E is lower than the serving chain's by "
            "0.018 (between 0.006 and 0.031 with 95% confidence at every look)") in opening.replace("&#x27;", "'")
    assert "The candidate decides 1,240 of the 12,400 shadowed records differently (10.0%)" in opening
    assert "The holdout and the live figures agree: the candidate is better on both" in opening
    assert opening.count("E (dependence E) is how much") == 1
    assert "candidate" in section(dom, "summary") and "approve plan 2" in section(dom, "summary")
    assert "scorer v1" in section(dom, "summary") and "plan v1" in section(dom, "summary")
    assert "refit@worker-7" in section(dom, "trigger") and "alert FairstreamDrift" in section(dom, "trigger")
    holdout = section(dom, "holdout")
    assert "0.031" in holdout and "0.094" in holdout
    shadow = section(dom, "shadow")
    assert f"{figures['records']:.0f} live records" in shadow and "decision rate, sex=1" in shadow
    assert f"from {config.shadow.min_records:,} on" in shadow  # what the policy requires
    assert "candidate lower" in shadow  # the worker's: 0.034 against 0.092, beyond the noise floor 0.011
    assert "dependence E improvement, lower bound" in shadow and "bound.dependence_e" not in shadow
    assert shadow.index("pipeline-wide figures") < shadow.index("per-worker figures")
    distributions = section(dom, "distributions")
    assert "300 latest valid records" in distributions
    assert candidate.sha256 in section(dom, "provenance")
    assert section(dom, "audit").count("<tr>") == 2  # header and the candidate publish: nothing decided yet
    print(f"report written in {seconds:.1f}s, {len(page) / 1024:.0f} KiB")


def test_a_screenshot_of_the_report_is_not_blank(broker, with_candidate, tmp_path):
    from matplotlib import image

    config = with_candidate[0]
    path = write_report(config, broker.bootstrap, "plan", 2, out=tmp_path / "plan-v2.html", sample=100)
    shot = tmp_path / "shot.png"
    chromium(f"--screenshot={shot}", "--window-size=1200,1600", "--hide-scrollbars", path.resolve().as_uri())
    pixels = image.imread(shot)
    assert pixels.shape[:2] == (1600, 1200)
    # Text, tables and plots: many distinct colours, and far from one colour over the page.
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 50 and float(pixels.std()) > 0.05


def test_a_hostile_actor_and_reason_are_shown_escaped_never_run(broker, adult, tmp_path):
    research, shifted, _ = adult
    config, control = pipeline(broker, tmp_path)
    serve(control, plan(research))
    control.publish_sync(plan(shifted), actor=HOSTILE[:200], reason=HOSTILE, candidate=True)
    control.decide_sync("plan", 2, "reject", actor=HOSTILE[:200], reason=HOSTILE)
    path = write_report(config, broker.bootstrap, "plan", 2, out=tmp_path / "plan-v2.html", sample=50)

    dom = rendered(path)

    assert body_attribute(dom, "data-pwned") is None  # the script never ran
    assert "<script>document.body" not in path.read_text()
    assert re.search(r"<img[^>]*onerror", dom) is None  # shown as text, not an element
    audit = section(dom, "audit")
    assert audit.count("&lt;script&gt;document.body.setAttribute") == 4  # actor and reason of both records
    assert "&lt;script&gt;document.body.setAttribute" in section(dom, "trigger")
    assert "rejected" in section(dom, "summary") and "Decide with" not in section(dom, "summary")
    assert audit.count("<tr>") == 3


def test_an_approved_candidate_is_compared_with_the_version_it_replaced(broker, adult, tmp_path):
    research, shifted, live = adult
    config, control = pipeline(broker, tmp_path)
    serve(control, balanced_scorer(research).to_artifact())
    serve(control, plan(research))
    control.publish_sync(plan(shifted), candidate=True)
    control.decide_sync("plan", 2, "approve", actor="carol@bank", reason="shadow E closes the gap")
    to_records_in(broker, config, live)

    evidence = gather(config, broker.bootstrap, "plan", 2, sample=100)
    page = report.render(evidence)

    assert evidence.state == "approved" and evidence.chains.versions == {"plan": 1, "scorer": 1}
    assert set(evidence.applied) == {"active", "candidate"}
    assert "plan v2 serves now; the active chain shown is the one it replaced (plan v1)" in page
    assert "approve</b> by carol@bank" in page and "Decide with" not in page


def test_missing_records_versions_and_figures_are_said_on_the_page(broker, adult, tmp_path):
    research, _, _ = adult
    config, control = pipeline(broker, tmp_path)
    control.publish_sync(plan(research), actor="bob@bank", reason="first plan, by hand", candidate=True)

    page = write_report(config, broker.bootstrap, "plan", 1, out=tmp_path / "plan-v1.html", sample=50).read_text()

    assert "no live figures yet" in page and "No pipeline-wide verdict: the monitoring agent is not running" in page
    assert f"no valid record on {config.topics.records_in}" in page
    assert "no plan version is active" in page and "no scorer version is active" in page
    assert all(f"<section id={ident}>" in page for ident in SECTIONS)
    assert "a publish by hand" in page


def test_an_unknown_version_is_one_line_naming_the_published_ones(broker, adult, tmp_path):
    research, _, _ = adult
    config, control = pipeline(broker, tmp_path)
    serve(control, plan(research))
    with pytest.raises(ControlError, match=r"^no plan version 7 was published on .*\(published plan versions: 1\)"):
        write_report(config, broker.bootstrap, "plan", 7, out=tmp_path / "x.html")
    with pytest.raises(ControlError, match=r"published flow versions: none"):
        write_report(config, broker.bootstrap, "flow", 1, out=tmp_path / "x.html")
    assert not (tmp_path / "x.html").exists()


def test_the_command_line_writes_the_report_and_names_an_unknown_version_in_one_line(broker, with_candidate,
                                                                                       tmp_path, capsys):
    config = with_candidate[0]
    toml = tmp_path / "pipeline.toml"
    toml.write_text(config.to_toml())
    out_file = tmp_path / "decide.html"
    base = ["artifacts", "report", "--broker", broker.url, "--config", str(toml)]

    code, out, err = run_main([*base, "plan", "2", "--out", str(out_file), "--sample", "100"], capsys)
    assert (code, out.strip()) == (0, str(out_file)), err
    assert all(f"<section id={ident}>" in out_file.read_text() for ident in SECTIONS)

    code, out, err = run_main([*base, "plan", "9"], capsys)
    assert code == 1 and out == "" and err.count("\n") == 1 and "no plan version 9 was published" in err, err


def test_figure_names_are_drawn_as_text_never_parsed_as_tex():
    import matplotlib.pyplot as plt

    figures = {"records": 500.0, "active.$\\nosuchcommand{$": 0.1, "candidate.$\\nosuchcommand{$": 0.05}
    drawn = report._shadow_plot(figures, "w1", "sex")
    assert drawn.startswith("<figure id=shadow-plot") and "data:image/png;base64," in drawn
    assert plt.rcParams["text.parse_math"]  # only the report's plots draw text as is


def test_a_plot_that_cannot_be_drawn_is_a_note_and_leaves_no_figure_open():
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    drawn = report._shadow_plot({"records": 5.0, "active.w1": 0.1, "candidate.w1": 0.05, "noise.w1": -1.0}, "w", "s")
    assert drawn == ("<p class=note>the live shadow figures plot could not be drawn: ValueError: &#x27;xerr&#x27; must "
                     "not contain negative values</p>")
    assert plt.get_fignums() == before
