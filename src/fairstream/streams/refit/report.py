"""The candidate report: one self-contained HTML page a person can approve or reject a candidate from.

``fairstream artifacts report KIND VERSION`` calls :func:`write_report`: it gathers the
:class:`~fairstream.streams.refit.evidence.Evidence` on the version and :func:`render` turns it into
the page, from that data only. What it shows of the sampled records follows what the kinds write:
the repaired features per group for a kind that writes features, the scores and decision rates per
group where the chain scores and decides.

The page opens with what the evidence means (section ``verdict``): the verdict the shadow policy would
reach now and the confidence bounds behind it, in words, from the monitoring agent's pipeline-wide
figures; how many of the shadowed records the candidate decides differently, overall and per group;
and whether the re-fit's holdout and the live figures agree, and if not which one the rule trusts and
why. Without the agent's figures it says there is no pipeline-wide verdict. Every figure is shown
under a label, with its unit and definition, never under its internal key.

The page has no external resource (CSS inline, plots as ``data:`` PNGs), so it can be mailed or
archived with the decision. Every text that comes from the control topic (actors, reasons, worker
names) is escaped: it is user input. What is missing is said on the page, never an error.
"""

from __future__ import annotations

import base64
import datetime
import functools
import html
import io
import json
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

import numpy as np

from .evidence import Evidence, HoldoutFigures, gather

if TYPE_CHECKING:
    from fairstream.streams.config import PipelineConfig

__all__ = ["SECTIONS", "render", "write_report"]

log = logging.getLogger(__name__)

SECTIONS = ("verdict", "summary", "trigger", "holdout", "shadow", "distributions", "provenance", "audit")
"""The page's sections, by their ``id`` (stable: tests and links name them)."""
_ROLES = ("active", "candidate", "noise")  # the roles in a worker's shadow figure names: "<role>.<measure>"

STATISTIC_NAMES = {
    "dependence_e": ("dependence E", "E, unitless"),
    "w1": ("W1 between groups", "in the feature's own units"),
    "dp_difference": ("DP gap", "difference of the groups' decision rates, 0 to 1"),
    "dp_ratio": ("DP ratio gap", "1 - lowest / highest group decision rate, 0 to 1"),
    "conditional_dp": ("conditional DP gap", "difference of the groups' decision rates within each stratum, 0 to 1"),
    "eopp": ("equal-opportunity gap", "difference of the groups' decision rates among records with y = 1, 0 to 1"),
    "mdp": ("matched DP gap", "difference of the groups' decision rates on matched records, 0 to 1"),
    "otf": ("OTF transport cost", "score units per record"),
}
"""How the page names each statistic, and its unit: (label, unit). Lower is fairer for every one."""
E_DEFINITION = ("E (dependence E) is how much the features still depend on the protected attribute within each "
                "stratum: per feature, the mean symmetrised KL divergence between the groups' smoothed histograms, "
                "weighted by the strata's shares and summed over the features; 0 when they do not depend on it, "
                "unitless (lower is fairer).")
"""The page defines E once, where it first matters."""
VERDICTS = {1.0: "promote", 0.0: "wait", -1.0: "retire"}
"""The agent's ``verdict`` figure, as the policy's action."""
TRUSTED = ("The rule trusts the paired live figures: they are the records the pipeline actually decides, measured on "
           "both chains; the holdout is labelled research data, a different and possibly older sample.")
"""Which figures the rule trusts, and why: said wherever the holdout and the live figures disagree."""


def write_report(config: "PipelineConfig", bootstrap: str, kind: str, version: int, out: str | Path | None = None,
                 sample: int = 2000) -> Path:
    """Write the report on candidate ``kind`` ``version``.

    Parameters
    ----------
    config : PipelineConfig
    bootstrap : str
        The broker's bootstrap servers.
    kind, version : str, int
        The version to report on; it must have been published.
    out : str or Path, optional
        Where to write the page; default ``report-KIND-vVERSION.html``.
    sample : int, default 2000
        How many of the latest ``records.in`` records the two chains are applied to.

    Returns
    -------
    Path
        The page written.

    Raises
    ------
    ControlError
        For an unknown kind or version (:class:`~fairstream.streams.control.records.ControlError`).
    """
    if int(sample) < 1:
        raise ValueError(f"sample must be a positive number of records, got {sample!r}")
    evidence = gather(config, bootstrap, kind, int(version), int(sample))
    path = Path(out) if out is not None else Path(f"report-{kind}-v{int(version)}.html")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(evidence), encoding="utf-8")
    log.info("wrote the report on %s version %d to %s", kind, version, path)
    return path


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2rem auto;max-width:72rem;color:#1d2329;
 padding:0 1rem;line-height:1.45}
h1{font-size:1.6rem;margin-bottom:.2rem} h2{border-bottom:2px solid #d6dde4;padding-bottom:.2rem;margin-top:2.2rem}
table{border-collapse:collapse;margin:.6rem 0;font-size:.92rem} th,td{border:1px solid #d6dde4;padding:.25rem .6rem;
 text-align:left;vertical-align:top} th{background:#f1f4f7} td.num{text-align:right;font-variant-numeric:tabular-nums}
.note{background:#fff7e0;border-left:4px solid #e0a800;padding:.4rem .8rem;margin:.6rem 0}
.state{display:inline-block;padding:.1rem .6rem;border-radius:1rem;background:#e4ecf7;font-weight:600}
.better{color:#176c2e;font-weight:600} .worse{color:#a3261b;font-weight:600} .muted{color:#66707a}
figure{margin:1rem 0} figure img{max-width:100%;border:1px solid #e3e7eb} code{background:#f1f4f7;padding:0 .2rem}
"""

# Records, once the page has loaded, how many plots the browser decoded whole (the last row of pixels drawn, and
# the plots are opaque): a check a headless browser can read from the DOM.
_SCRIPT = """
function drawnWhole(img) {
  if (!img.complete || img.naturalWidth === 0) return false;
  try {
    var canvas = document.createElement("canvas");
    canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
    var context = canvas.getContext("2d");
    context.drawImage(img, 0, 0);
    var row = context.getImageData(0, img.naturalHeight - 1, img.naturalWidth, 1).data;
    for (var i = 3; i < row.length; i += 4) { if (row[i] !== 255) return false; }
    return true;
  } catch (e) { return false; }
}
window.addEventListener("load", function () {
  var images = Array.prototype.slice.call(document.images);
  document.body.setAttribute("data-images", String(images.length));
  document.body.setAttribute("data-images-decoded", String(images.filter(drawnWhole).length));
});
"""


def render(evidence: Evidence) -> str:
    """The page: every section of :data:`SECTIONS`, in that order, from ``evidence`` alone.

    Parameters
    ----------
    evidence : Evidence
        What :func:`~fairstream.streams.refit.evidence.gather` found.

    Returns
    -------
    str
        The self-contained HTML page.
    """
    title = f"fairstream candidate report: {evidence.kind} v{evidence.version}"
    body = "\n".join([
        f"<h1>{_e(title)}</h1>",
        f"<p class=muted>pipeline {_e(evidence.config.name)}, generated {_e(_when(evidence.generated_at))}</p>",
        _section("verdict", "What the evidence says", _evidence_says(evidence)),
        _section("summary", "Summary and decision", _summary(evidence)),
        _section("trigger", "What triggered it", _trigger(evidence)),
        _section("holdout", "Holdout figures from the re-fit", _holdout(evidence)),
        _section("shadow", "Live shadow figures", _shadow(evidence)),
        _section("distributions", "Distributions per group: active chain against candidate chain",
                 _distributions(evidence)),
        _section("provenance", "Provenance", _provenance(evidence)),
        _section("audit", "Audit trail", _audit(evidence)),
    ])
    return (f"<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><title>{_e(title)}</title>"
            f"<meta name=viewport content=\"width=device-width,initial-scale=1\"><style>{_CSS}</style></head>\n"
            f"<body>\n{body}\n<script>{_SCRIPT}</script>\n</body></html>\n")


def _section(ident: str, heading: str, content: str) -> str:
    return f"<section id={ident}><h2>{_e(heading)}</h2>\n{content}\n</section>"


# ------------------------------------------------------------------ verdict: what the evidence means


def _evidence_says(ev: Evidence) -> str:
    """The page's opening: the policy's verdict and its bounds, the decisions changed, holdout against live."""
    if ev.pipeline is None:
        paragraphs = [_no_agent(ev), _holdout_alone(ev.holdout, ev.kind)]
    else:
        status, figures = ev.pipeline
        paragraphs = [_verdict_sentence(figures, ev), _verdict_why(figures, ev), _changed_sentence(figures, ev.config),
                      _holdout_against_live(ev.holdout, figures, ev), _announced(status, ev)]
    if _mentions_e(ev):
        paragraphs.append(E_DEFINITION)
    return "\n".join(f"<p>{_e(text)}</p>" for text in paragraphs if text)


def _no_agent(ev: Evidence) -> str:
    """Why there is no verdict: no agent figures; and what the workers' own figures are (and are not)."""
    if not ev.shadow:
        return ("No pipeline-wide verdict: the monitoring agent is not running (no fairstream monitor process of this "
                "pipeline has announced figures for this version), and no worker has announced figures of its own "
                "either, so there are no live figures and no confidence bounds yet.")
    workers = len(ev.shadow)
    return (f"No pipeline-wide verdict: the monitoring agent is not running (no fairstream monitor process of this "
            f"pipeline has announced figures for this version), so this page has no verdict, no confidence bounds and "
            f"no count of the decisions the candidate changes. Only {workers} worker{'s' if workers != 1 else ''} "
            "announced figures, each of its own partitions; they are shown under Live shadow figures as diagnostics, "
            "not as the pipeline's numbers.")


def _verdict_sentence(figures: dict, ev: Evidence) -> str:
    """The verdict the policy would reach now, with each interval in words."""
    action = VERDICTS.get(figures.get("verdict"))
    opening = {"promote": "The shadow policy would promote this candidate now",
               "wait": "The shadow policy would not decide yet",
               "retire": "The shadow policy would retire this candidate now",
               None: "The monitoring agent announced figures but no verdict"}[action]
    if ev.config.promotion != "shadow":
        opening += f" (under promotion = {ev.config.promotion!r} it does not act: a person decides)"
    confidence = _confidence(figures, ev.config)
    clauses = [_statistic_clause(name, interval, confidence) for name, interval in _intervals(figures, "bound", ev)]
    clauses += [_guard_clause(name, interval, confidence, ev.config) for name, interval in
                _intervals(figures, "guard", ev)]
    records = _count(figures.get("records", 0.0))
    alpha = figures.get("alpha", ev.config.shadow.alpha)
    return (f"{opening}: on {records} paired live records " + "; ".join(clauses or ["nothing was compared yet"])
            + f". The false-promotion rate is alpha = {alpha:g}.")


def _confidence(figures: dict, config: "PipelineConfig") -> str:
    """"95% confidence at every look" for alpha = 0.05."""
    alpha = figures.get("alpha", config.shadow.alpha)
    return f"{100 * (1 - alpha):g}% confidence at every look"


def _intervals(figures: dict, prefix: str, ev: Evidence) -> list[tuple[str, dict]]:
    """(name, {estimate, lower, upper} as announced) of each ``<prefix>.<name>.<part>`` figure; for statistics,
    every compared one (an unmeasured one has no parts), configured order first."""
    found: dict[str, dict] = {}
    for key, value in figures.items():
        head, _, rest = key.partition(".")
        name, _, part = rest.rpartition(".")
        if head == prefix and name and part in ("estimate", "lower", "upper"):
            found.setdefault(name, {})[part] = value
    if prefix == "bound":
        for name in ev.config.shadow_statistics:
            found.setdefault(name, {})
        order = {name: i for i, name in enumerate(ev.config.shadow_statistics)}
        return sorted(found.items(), key=lambda item: (order.get(item[0], len(order)), item[0]))
    return sorted(found.items())


def _statistic_clause(name: str, interval: dict, confidence: str) -> str:
    """"its DP gap is lower than the serving chain's by 0.018 (between 0.006 and 0.031 with 95% confidence ...)"."""
    label = _statistic_label(name)
    estimate, lower, upper = (interval.get(part) for part in ("estimate", "lower", "upper"))
    if estimate is None or lower is None or upper is None:
        return f"its {label} is not measured yet (no interval: it cannot pass)"
    if estimate >= 0:
        return (f"its {label} is lower than the serving chain's by {_plain(estimate)} (between {_plain(lower)} and "
                f"{_plain(upper)} with {confidence})")
    return (f"its {label} is higher than the serving chain's by {_plain(-estimate)} (its improvement lies between "
            f"{_plain(lower)} and {_plain(upper)} with {confidence})")


def _guard_clause(name: str, interval: dict, confidence: str, config: "PipelineConfig") -> str:
    """The accuracy guard (a drop) or the decision-rate guard (an absolute change), with its interval and limit."""
    estimate, lower, upper = (interval.get(part) for part in ("estimate", "lower", "upper"))
    if name == "accuracy":
        what, limit = "accuracy", config.shadow.max_accuracy_drop
        if estimate is None or lower is None or upper is None:
            return "its accuracy is not measured yet"
        moved = f"lower by {_plain(estimate)}" if estimate >= 0 else f"higher by {_plain(-estimate)}"
        return (f"its {what} is {moved} (drop between {_plain(lower)} and {_plain(upper)} with {confidence}; at most "
                f"{limit:g} allowed)")
    limit = config.shadow.max_decision_rate_change
    if estimate is None or lower is None or upper is None:
        return "its decision rate is not measured yet"
    return (f"its overall decision rate changes by {_plain(estimate)} (between {_plain(lower)} and {_plain(upper)} "
            f"with {confidence}; at most {limit:g} allowed)")


def _verdict_why(figures: dict, ev: Evidence) -> str:
    """What makes the verdict: which intervals pass, which are undecided, which fail, or the record counts."""
    action, shadow = VERDICTS.get(figures.get("verdict")), ev.config.shadow
    statistics, guards = _intervals(figures, "bound", ev), _intervals(figures, "guard", ev)
    records = figures.get("records", 0.0)
    required = f"the required improvement of {shadow.min_improvement:g}"
    if action == "promote":
        guard = ", and the guard holds" if guards else ""
        return f"Every compared statistic is better by more than {required} for sure{guard}."
    if action == "wait":
        if records < shadow.min_records:
            return (f"It looks first after {shadow.min_records:,} paired records; {_count(records)} were compared "
                    "so far.")
        undecided = [_statistic_label(name) for name, interval in statistics if _passes(interval, shadow) is None]
        guarded = [name.replace("_", "-") for name, interval in guards if _guard_passes(name, interval, shadow) is None]
        reasons = ([f"the interval of its {_listed(undecided)} still straddles {required}"] if undecided else []) + (
            [f"the {_listed(guarded)} guard is undecided"] if guarded else [])
        return (f"It waits until the intervals settle: {'; '.join(reasons) or 'no interval is decided yet'}. It "
                f"retires the candidate at {shadow.max_records:,} paired records without a promotion.")
    if action == "retire":
        return "It retires the candidate because " + _retire_reasons(statistics, guards, records, shadow) + "."
    return ""


def _retire_reasons(statistics: list, guards: list, records: float, shadow) -> str:
    """What fails for sure: statistics whose interval excludes the required improvement, guards, the record cap."""
    failed = [f"the interval of its {_statistic_label(name)} excludes an improvement of more than "
              f"{shadow.min_improvement:g}" for name, interval in statistics if _passes(interval, shadow) is False]
    failed += [f"its {name.replace('_', ' ')} guard fails for sure" for name, interval in guards
               if _guard_passes(name, interval, shadow) is False]
    if records >= shadow.max_records:
        failed.append(f"the cap of {shadow.max_records:,} paired records was reached without a promotion")
    # The figures carry no failure reason: a chain that failed or refused records is said on the decision record.
    return _listed(failed) or "the candidate chain failed or refused records in shadow (the decision record says which)"


def _passes(interval: dict, shadow) -> bool | None:
    """The policy's reading of a statistic's interval: above min_improvement, at most it, or neither."""
    lower, upper = interval.get("lower"), interval.get("upper")
    if lower is None or upper is None:
        return None
    return True if lower > shadow.min_improvement else False if upper <= shadow.min_improvement else None


def _guard_passes(name: str, interval: dict, shadow) -> bool | None:
    """The policy's reading of a guard's interval: within its limit for sure, beyond it for sure, or neither."""
    lower, upper = interval.get("lower"), interval.get("upper")
    limit = shadow.max_accuracy_drop if name == "accuracy" else shadow.max_decision_rate_change
    if lower is None or upper is None:
        return None
    return True if upper <= limit else False if lower > limit else None


def _changed_sentence(figures: dict, config: "PipelineConfig") -> str:
    """How many shadowed records the candidate decides differently, and what share of each group."""
    changed, records = figures.get("changed"), figures.get("records")
    if changed is None or not records:
        return ("The agent announced no count of changed decisions: the chains write no decision, or none was "
                "compared yet.")
    shares = [f"{_share(changed_g, n_g)} of {config.s_name}={group} ({_count(changed_g)} of {_count(n_g)})"
              for group, n_g, changed_g in _per_group_changes(figures, config)]
    per_group = f": {_listed(shares)}" if shares else ""
    return (f"The candidate decides {_count(changed)} of the {_count(records)} shadowed records differently "
            f"({_share(changed, records)}){per_group}.")


def _per_group_changes(figures: dict, config: "PipelineConfig") -> list[tuple[str, float, float]]:
    """(group, records, changed) of each group the agent counted, configured groups first."""
    groups = [key.partition(".")[2] for key in figures if key.startswith("records.")]
    order = {str(group): i for i, group in enumerate(config.groups)}
    groups.sort(key=lambda group: (order.get(group, len(order)), group))
    return [(group, figures[f"records.{group}"], figures.get(f"changed.{group}", 0.0)) for group in groups
            if figures[f"records.{group}"] > 0]


def _holdout_against_live(holdout: HoldoutFigures | None, figures: dict, ev: Evidence) -> str:
    """Whether the re-fit's holdout and the live figures point the same way; when not, which one the rule trusts."""
    live = [(name, interval) for name, interval in _intervals(figures, "bound", ev)
            if interval.get("estimate") is not None and interval["estimate"] != 0]
    if holdout is None or holdout.candidate_better is None or not live:
        return _holdout_alone(holdout, ev.kind)  # nothing to set side by side
    on_holdout = _holdout_words(holdout, ev.kind)
    disagree = [(name, interval) for name, interval in live if (interval["estimate"] > 0) != holdout.candidate_better]
    if not disagree:
        verdict = "better" if holdout.candidate_better else "worse"
        return (f"The holdout and the live figures agree: the candidate is {verdict} on both ({on_holdout}; live, "
                f"{_listed([_live_words(name, interval) for name, interval in live])}).")
    records = _count(figures.get("records", 0.0))
    return (f"The holdout and the live figures disagree. {on_holdout[0].upper()}{on_holdout[1:]}. On {records} paired "
            f"live records {_listed([_live_words(name, interval) for name, interval in disagree])}. {TRUSTED}")


def _holdout_alone(holdout: HoldoutFigures | None, kind: str) -> str:
    if holdout is None:
        return "The re-fit recorded no holdout figures (a publish by hand): only the live figures speak."
    words = _holdout_words(holdout, kind)
    return (f"{words[0].upper()}{words[1:]}. The rule does not decide on the holdout: it decides on paired live "
            "records, the ones the pipeline actually decides.")


def _holdout_words(holdout: HoldoutFigures, kind: str) -> str:
    """"on the research holdout (600 rows) the candidate's dependence E is 0.052 against 0.031 ...: worse"."""
    rows = f" ({holdout.rows:,} rows)" if holdout.rows else ""
    label = _statistic_label(holdout.statistic)
    if holdout.serving is None:
        return f"on the research holdout{rows} the candidate's {label} is {_plain(holdout.candidate)}"
    verdict = {True: "better", False: "worse", None: "equal"}[holdout.candidate_better]
    return (f"on the research holdout{rows} the candidate's {label} is {_plain(holdout.candidate)} against "
            f"{_plain(holdout.serving)} for the {kind} version it would replace: {verdict}")


def _live_words(name: str, interval: dict) -> str:
    """"its DP gap is lower than the serving chain's by 0.018: better" (", so far" while its interval spans 0)."""
    estimate, lower, upper = (interval.get(part) for part in ("estimate", "lower", "upper"))
    sure = lower is not None and upper is not None and (lower > 0 or upper < 0)
    so_far = "" if sure else " so far (its interval still spans no change)"
    side = f"lower than the serving chain's by {_plain(estimate)}: better" if estimate > 0 else \
        f"higher than the serving chain's by {_plain(-estimate)}: worse"
    return f"its {_statistic_label(name)} is {side}{so_far}"


def _announced(status, ev: Evidence) -> str:
    """When the agent announced these figures; a warning when that was long ago or the version was decided since."""
    parts = [f"Figures announced by the monitoring agent {status.worker} at {_when(status.at)}."]
    if status.is_stale(ev.generated_at):
        parts.append("That is more than two announcement intervals ago: the agent may be down, and these are its last "
                     "figures, not today's.")
    if ev.state != "candidate":
        parts.append(f"The version is {ev.state} now: these are the last figures announced while it was pending.")
    return " ".join(parts)


def _mentions_e(ev: Evidence) -> bool:
    """Whether the page shows E anywhere: then it defines it (once)."""
    compared = set(ev.config.shadow_statistics)
    holdout = ev.holdout is not None and _statistic_label(ev.holdout.statistic) == STATISTIC_NAMES["dependence_e"][0]
    return holdout or "dependence_e" in compared


# ------------------------------------------------------------------ summary


def _summary(ev: Evidence) -> str:
    record, config = ev.publish, ev.config
    rows = [("artifact", f"{ev.kind} version {ev.version} (sha256 {record.sha256[:12]})"),
            ("state", ev.state),
            ("pipeline promotion policy", config.promotion),
            ("active chain", " → ".join(_chain_member(k, ev.chains.versions.get(k)) for k in ev.chains.kinds)),
            ("candidate chain", " → ".join(f"{k} v{ev.version} (candidate)" if k == ev.kind else
                                           _chain_member(k, ev.chains.versions.get(k)) for k in ev.chains.kinds))]
    if config.promotion == "shadow":
        rows.append(("shadow policy", f"decides on the paired live records the monitoring agent pools over every "
                                      f"worker, from {config.shadow.min_records:,} on, with a false-promotion rate "
                                      f"alpha = {config.shadow.alpha:g}"))
    parts = [f"<p><span class=state>{_e(ev.state)}</span></p>", _kv_table(rows)]
    decided = [e for e in ev.trail if e.refusal is None and e.record.action not in ("publish",)]
    if decided:
        last = decided[-1].record
        parts.append(f"<p>Last decision: <b>{_e(last.action)}</b> by {_e(last.actor or 'unknown')} at "
                     f"{_e(_when(last.published_at))}: {_e(last.reason or 'no reason given')}</p>")
    if ev.pending == (ev.version, record.sha256):
        parts.append("<p>This candidate is pending. Decide with <code>fairstream artifacts approve "
                     f"{_e(ev.kind)} {ev.version} --by NAME --reason TEXT</code> or <code>fairstream artifacts reject "
                     f"{_e(ev.kind)} {ev.version} --by NAME --reason TEXT</code>.</p>")
    parts += [_note(note) for note in ev.chains.notes]
    return "\n".join(parts)


def _chain_member(kind: str, version: int | None) -> str:
    return f"{kind} (none active)" if version is None else f"{kind} v{version}"


# ------------------------------------------------------------------ trigger


def _trigger(ev: Evidence) -> str:
    record = ev.publish
    rows = [("published by", record.actor or "unknown (a record without an actor)"),
            ("reason", record.reason or "none given"),
            ("what started it", _trigger_kind(record)),
            ("published at", _when(record.published_at))]
    return _kv_table(rows)


def _trigger_kind(record) -> str:
    """The re-fit's trigger, as the re-fit service names it in the reason; else a person's publish."""
    reason, actor = (record.reason or "").strip().lower(), (record.actor or "")
    if not actor.startswith("refit@"):
        return "a publish by hand (fairstream artifacts publish)"
    if reason == "schedule":
        return "the re-fit schedule"
    if reason == "command":
        return "a re-fit run by hand (fairstream refit)"
    return "a drift request (the monitor's or an alert's) answered by the re-fit service"


# ------------------------------------------------------------------ holdout


_METRIC_LABELS = {
    "holdout_statistic": "figure compared on the holdout (lower is better)",
    "holdout_value": "candidate's value on the holdout",
    "current_holdout_value": "value on the holdout of the version serving at the re-fit",
    "n_research": "research records read",
    "n_fit": "research records fitted on",
    "n_holdout": "research records held out",
    "n_invalid": "invalid research records skipped",
    "holdout_fraction": "share of each (u, s) cell held out",
    "tolerance": "tolerance: how much worse (relative) than the serving version the candidate may score",
    "seed": "seed of the split, the fit and the validation",
    "source": "research source",
    "replaces_version": "version serving at the re-fit",
    "E_holdout_after": "E on the holdout after the candidate's repair (unitless)",
    "E_holdout_before": "E on the holdout before any repair (unitless)",
    "E_holdout_floor": "E floor on the holdout: what an ideal repair still measures, s permuted within strata",
    "damage_holdout": "damage on the holdout per feature: how far the repair moves values, in each feature's units",
}
"""Labels of the fit-time metrics the re-fit job and the plan trainer write; other trainers' metrics keep their
names."""


def _holdout(ev: Evidence) -> str:
    parts = ["<p>The re-fit's research holdout: labelled research data held out of the fit, a different and possibly "
             "older sample than the live records the shadow policy decides on.</p>"]
    statistics = ev.publish.statistics or {}
    if statistics:
        parts.append("<h3>Figures on the publish record</h3>" + _kv_table(sorted(
            (_record_figure_label(name, ev.holdout), _number(value)) for name, value in statistics.items())))
    metrics = {} if ev.artifact is None else dict(ev.artifact.manifest.metrics)
    if metrics:
        parts.append("<h3>Fit-time metrics of the artifact</h3>" + _kv_table(sorted(
            (_METRIC_LABELS.get(name, name), _value(value)) for name, value in metrics.items())))
        plot = _holdout_plot(metrics)
        if plot:
            parts.append(plot)
    if len(parts) == 1:
        parts.append(_note("neither the publish record nor the artifact carries holdout figures (published by hand "
                           "without --reason statistics, or not a re-fit)"))
    return "\n".join(parts)


def _record_figure_label(name: str, holdout: HoldoutFigures | None) -> str:
    """The re-fit's pair on the publish record, ``E`` and ``current E``, as "dependence E, candidate" and "...,
    version serving at the re-fit"; anything else as named (a person's figures)."""
    if holdout is not None and name == holdout.statistic:
        return f"{_statistic_label(name)} on the holdout, candidate"
    if holdout is not None and name == f"current {holdout.statistic}":
        return f"{_statistic_label(holdout.statistic)} on the holdout, version serving at the re-fit"
    return name


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display
    import matplotlib.pyplot as plt

    return plt


def _plot(what: str):
    """Decorate a function drawing one plot: its failure becomes a note on the page, never a failed report.

    Labels come from the control topic (statistic and group names): drawn as text, never parsed as TeX
    (``text.parse_math`` off while the plot is drawn: ``$\\x{$`` would otherwise fail the drawing).
    """
    def decorate(draw):
        @functools.wraps(draw)
        def drawn(*args, **kwargs):
            plt = _pyplot()
            before = set(plt.get_fignums())
            try:
                with plt.rc_context({"text.parse_math": False}):
                    return draw(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - whatever one plot meets, the rest of the page stands
                for number in set(plt.get_fignums()) - before:
                    plt.close(number)
                log.warning("the %s plot could not be drawn: %r", what, exc)
                return _note(f"the {what} plot could not be drawn: {type(exc).__name__}: {str(exc)[:300]}")
        return drawn
    return decorate


@_plot("holdout")
def _holdout_plot(metrics: dict) -> str | None:
    name = metrics.get("holdout_statistic")
    values = [(label, metrics.get(key)) for label, key in (("candidate", "holdout_value"),
                                                           ("active", "current_holdout_value"))]
    values = [(label, float(v)) for label, v in values if _is_number(v)]
    if not values:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.5, 2.6))
    ax.barh([label for label, _ in values], [v for _, v in values], color=["#2f7ebc", "#999999"][:len(values)])
    ax.set_xlabel(f"{name} on the holdout (lower is better)")
    return _figure(fig, "holdout-plot", f"holdout {name}: candidate against the version it replaces")


# ------------------------------------------------------------------ shadow


def _shadow(ev: Evidence) -> str:
    parts = [_policy(ev.config), "<h3>pipeline-wide figures (the monitoring agent)</h3>", _pipeline_figures(ev),
             "<h3>per-worker figures (diagnostics: each worker's own partitions)</h3>"]
    if not ev.shadow:
        return "\n".join(parts + [_note(
            "no live figures yet from any worker: no worker has announced shadow figures for this version (it is not "
            "pending, no worker runs it in shadow, or fewer records than one announcement have passed)")])
    for status, figures in ev.shadow:
        records, since = figures.get("records"), figures.get("since")
        window = (f"{_number(records)} live records since {_when(since)}" if _is_number(records) else
                  "window not announced")
        parts.append(f"<h3>worker {_e(status.worker)}</h3><p>{_e(window)}; announced {_e(_when(status.at))}</p>")
        rows = _shadow_rows(figures, ev.config.s_name)
        parts.append(_table(("measure", "active chain", "candidate chain", "candidate − active", "noise floor",
                             "verdict"), rows, numeric=(1, 2, 3, 4)))
    plot = _shadow_plot(ev.shadow[0][1], ev.shadow[0][0].worker, ev.config.s_name)
    if plot:
        parts.append(plot)
    return "\n".join(parts)


def _policy(config: "PipelineConfig") -> str:
    """What the shadow policy requires of a candidate (it decides only under ``promotion = "shadow"``)."""
    shadow, promotion = config.shadow, config.promotion
    compared = _listed([_statistic_label(name) for name in config.shadow_statistics])
    decides = "decides" if promotion == "shadow" else f"would decide (promotion is {promotion!r}: a person decides)"
    return (f"<p>The shadow policy {_e(decides)} on the paired live records the monitoring agent pools over every "
            f"worker (both chains decide the same records), from {shadow.min_records:,} on and at every look after: "
            f"it promotes the candidate when, on {_e(compared)}, its improvement (serving minus candidate; positive: "
            f"the candidate is fairer) is above {_e(_number(shadow.min_improvement))} with confidence 1 - alpha = "
            f"{_e(f'{1 - shadow.alpha:g}')} at every look, and its accuracy drop is at most "
            f"{_e(_number(shadow.max_accuracy_drop))} (with labels), else its decision rate changes by at most "
            f"{_e(_number(shadow.max_decision_rate_change))}; it retires it when an interval excludes that, or after "
            f"{shadow.max_records:,} paired records.</p>")


def _pipeline_figures(ev: Evidence) -> str:
    """The agent's figures as labelled rows (figure, value, unit and definition), and the intervals as a plot."""
    if ev.pipeline is None:
        return _note("the monitoring agent has announced no figures for this version (it is not running, or has not "
                     "compared this candidate yet): no verdict and no confidence bounds")
    status, figures = ev.pipeline
    rows = _figure_rows(figures, ev.config)
    table = _table(("figure", "value", "unit and definition"), rows, numeric=(1,))
    intervals = [(_statistic_label(name), interval) for name, interval in _intervals(figures, "bound", ev)
                 if all(part in interval for part in ("estimate", "lower", "upper"))]
    plot = _interval_plot(intervals, ev.config.shadow.min_improvement) if intervals else None
    return f"<p>{_e(status.worker)}, announced {_e(_when(status.at))}</p>" + table + (plot or "")


def _figure_rows(figures: dict, config: "PipelineConfig") -> list[tuple[str, str, str]]:
    """Every announced figure under a label: the known keys in a reader's order, anything else last, as announced."""
    rows, shown = [], set()
    for key, label, unit in _known_figures(figures, config):
        if key in figures:
            rows.append((label, _figure_value(key, figures[key]), unit))
            shown.add(key)
    rows += [(f"other figure {key}", _number(value), "as the agent announced it") for key, value in figures.items()
             if key not in shown]
    return rows


def _figure_value(key: str, value: float) -> str:
    if key == "verdict":
        return VERDICTS.get(value, _number(value))
    if key == "records" or key.startswith(("records.", "changed")):
        return _count(value)
    return _number(value)


def _known_figures(figures: dict, config: "PipelineConfig") -> list[tuple[str, str, str]]:
    """(key, label, unit and definition) of every figure the agent announces, in a reader's order."""
    shadow = config.shadow
    known = [("verdict", "the shadow policy's verdict now", "what the rule makes of the intervals below (announced as "
                                                            "1 promote, 0 wait, -1 retire)"),
             ("records", "paired live records compared", "records both chains decided, pooled over every worker"),
             ("alpha", "false-promotion rate alpha", "the chance of promoting a candidate that is not better by "
                                                      "min_improvement; every interval holds with confidence 1 - alpha "
                                                      "at every look")]
    statistics = sorted({key.split(".")[1] for key in figures if key.startswith("bound.") and key.count(".") >= 2})
    for name in dict.fromkeys((*config.shadow_statistics, *statistics)):
        label, unit = STATISTIC_NAMES.get(name, (name, "as the agent measures it"))
        known += [(f"bound.{name}.{part}", f"{label} improvement, {words}",
                   f"{unit}; serving minus candidate: positive means the candidate is fairer (it must exceed "
                   f"{shadow.min_improvement:g})") for part, words in _PARTS]
        known += [(f"{role}.{name}", f"{label}, {chain}", f"{unit}, over the compared records")
                  for role, chain in _CHAINS]
    known += [(f"guard.accuracy.{part}", f"accuracy drop, {words}", f"share of labelled records decided correctly, "
               f"serving minus candidate; at most {shadow.max_accuracy_drop:g} allowed") for part, words in _PARTS]
    known += [(f"guard.decision_rate.{part}", f"decision-rate change, {words}", f"absolute change of the share of "
               f"records decided positively; at most {shadow.max_decision_rate_change:g} allowed")
              for part, words in _PARTS]
    for what, unit in (("accuracy", "share of labelled records decided correctly, 0 to 1"),
                       ("decision_rate", "share of records decided positively, 0 to 1")):
        known += [(f"{role}.{what}", f"{what.replace('_', ' ')}, {chain}", unit) for role, chain in _CHAINS]
    known.append(("changed", "decisions changed", "shadowed records the candidate decides differently"))
    for group, _, _ in _per_group_changes(figures, config):
        known += [(f"records.{group}", f"records, {config.s_name}={group}", "paired records of the group"),
                  (f"changed.{group}", f"decisions changed, {config.s_name}={group}",
                   "the group's records the candidate decides differently")]
    return known


_PARTS = (("estimate", "estimate"), ("lower", "lower bound"), ("upper", "upper bound"))
_CHAINS = (("active", "serving chain"), ("candidate", "candidate chain"))


@_plot("confidence interval")
def _interval_plot(intervals: list[tuple[str, dict]], min_improvement: float) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(intervals) + 1.4))
    y = np.arange(len(intervals))
    estimates = np.array([interval["estimate"] for _, interval in intervals])
    spans = np.array([[interval["estimate"] - interval["lower"], interval["upper"] - interval["estimate"]]
                      for _, interval in intervals]).T
    ax.errorbar(estimates, y, xerr=np.maximum(spans, 0.0), fmt="o", color="#2f7ebc", capsize=4)
    ax.axvline(0.0, color="#999999", linewidth=1)
    ax.axvline(min_improvement, color="#176c2e", linestyle="--", linewidth=1, label="required improvement")
    ax.set_yticks(y, [label for label, _ in intervals])
    ax.invert_yaxis()
    ax.set_xlabel("improvement, serving minus candidate (positive: the candidate is fairer)")
    ax.legend(loc="best", fontsize=8)
    return _figure(fig, "interval-plot", "each compared statistic's improvement and its anytime-valid interval")


def _measures(figures: dict) -> list[str]:
    """The measures of a worker's figures (``active.X``, ``candidate.X``, ``noise.X``: X), statistics first."""
    names = {key.split(".", 1)[1] for key in figures if key.split(".", 1)[0] in _ROLES and "." in key}
    order = {"decision_rate": 1, "accuracy": 2}
    return sorted(names, key=lambda name: (order.get(name.split(".", 1)[0], 0), name))


def _measure_name(measure: str, s_name: str) -> str:
    """``decision_rate.0`` as "decision rate, sex=0"; a statistic by its label ("dependence E")."""
    what, _, group = measure.partition(".")
    if what not in ("decision_rate", "accuracy"):
        return _statistic_label(measure)
    return what.replace("_", " ") + (f", {s_name}={group}" if group else "")


def _shadow_rows(figures: dict, s_name: str) -> list[tuple]:
    rows = []
    for measure in _measures(figures):
        active, candidate, noise = (figures.get(f"{role}.{measure}") for role in _ROLES)
        gap = candidate - active if _is_number(active) and _is_number(candidate) else None
        rows.append((_measure_name(measure, s_name), _number(active), _number(candidate), _number(gap), _number(noise),
                     _verdict(measure, gap, noise)))
    return rows


def _verdict(measure: str, gap, noise) -> str:
    if gap is None:
        return "-"
    if measure.split(".", 1)[0] in ("decision_rate", "accuracy"):
        return "guard"  # neither side is better by itself: the policy bounds the change
    if _is_number(noise) and abs(gap) <= noise:
        return "within noise"
    return "candidate lower" if gap < 0 else "candidate higher" if gap > 0 else "equal"


@_plot("live shadow figures")
def _shadow_plot(figures: dict, worker: str, s_name: str) -> str | None:
    measures = [m for m in _measures(figures) if _is_number(figures.get(f"active.{m}"))
                and _is_number(figures.get(f"candidate.{m}"))]
    if not measures:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(measures) + 1.4))
    y = np.arange(len(measures))
    ax.barh(y - 0.2, [figures[f"active.{m}"] for m in measures], 0.4, label="active", color="#999999")
    noise = [figures.get(f"noise.{m}", 0.0) if _is_number(figures.get(f"noise.{m}")) else 0.0 for m in measures]
    ax.barh(y + 0.2, [figures[f"candidate.{m}"] for m in measures], 0.4, xerr=noise, label="candidate (± noise)",
            color="#2f7ebc")
    ax.set_yticks(y, [_measure_name(m, s_name) for m in measures])
    ax.invert_yaxis()
    ax.legend(loc="best", fontsize=8)
    return _figure(fig, "shadow-plot", f"live shadow figures of worker {worker}")


# ------------------------------------------------------------------ distributions


def _distributions(ev: Evidence) -> str:
    notes = [] if ev.window_note is None else [_note(ev.window_note)]
    if ev.window is None or not len(ev.window):
        return "\n".join(notes)
    if ev.kind not in ev.chains.kinds:
        return "\n".join(notes + [_note(f"{ev.kind} is not in the record chain: nothing to apply it to")])
    if not ev.applied:
        return "\n".join(notes + [_note("neither chain can be applied to the sample (see the summary's notes)")])
    columns = ev.measured
    parts = notes + [f"<p>{len(ev.window)} latest valid records of <code>{_e(ev.topic)}</code> "
                     f"({ev.window.n_invalid} invalid skipped); {_refused_text(ev.applied)}.</p>"]
    groups = _group_masks(ev.window.s, ev.config.groups, ev.config.s_name)
    if "features" in columns:
        for j, name in enumerate(ev.config.features):
            parts.append(_distribution(ev, f"feature {name}", groups, lambda a, j=j: a.X[:, j], f"dist-feature-{j}"))
    if "score" in columns:
        parts.append(_distribution(ev, "score", groups, lambda a: a.columns.get("score"), "dist-score"))
    if "decision" in columns:
        parts.append(_decision_rates(ev, groups))
    return "\n".join(parts)


def _refused_text(applied: dict) -> str:
    return ", ".join(f"the {role} chain refused {int((~a.ok).sum())}" for role, a in applied.items())


def _group_masks(s: np.ndarray, groups, name: str) -> list[tuple[str, np.ndarray]]:
    """(label, rows) of each configured group, labelled by the protected attribute's name."""
    masks = []
    for group in groups:
        mask = np.array([value == group for value in s], dtype=bool) if s.dtype == object else s == group
        masks.append((f"{name}={group}", mask))
    return masks


def _distribution(ev: Evidence, what: str, groups, values_of, ident: str) -> str:
    """Per group: mean under each chain and the gap between group means; one histogram panel per chain."""
    series = {}
    for role, applied in ev.applied.items():
        values = values_of(applied)
        if values is not None:
            series[role] = [(label, np.asarray(values, dtype=float)[mask & applied.ok]) for label, mask in groups]
    if not series:
        return _note(f"no {what} under either chain")
    rows = []
    for role, per_group in series.items():
        means = [float(np.mean(v)) if len(v) else None for _, v in per_group]
        known = [m for m in means if m is not None]
        rows.append((role, *[_number(m) for m in means], _number(max(known) - min(known) if known else None)))
    headers = ("chain", *[f"mean, {label}" for label, _ in groups], "gap between group means")
    table = _table(headers, rows, numeric=tuple(range(1, len(headers))))
    return f"<h3>{_e(what)}</h3>" + table + _histograms(series, what, ident)


@_plot("distribution")
def _histograms(series: dict, what: str, ident: str) -> str:
    plt = _pyplot()
    everything = np.concatenate([v for per_group in series.values() for _, v in per_group] or [np.zeros(1)])
    edges = np.histogram_bin_edges(everything[np.isfinite(everything)] if everything.size else np.zeros(1), bins=30)
    fig, axes = plt.subplots(1, len(series), figsize=(5 * len(series), 2.8), squeeze=False, sharey=True)
    for ax, (role, per_group) in zip(axes[0], series.items()):
        for label, values in per_group:
            if len(values):
                ax.hist(values, edges, density=True, histtype="step", linewidth=1.6, label=label)
        ax.set_title(f"{role} chain")
        ax.set_xlabel(what)
        ax.legend(fontsize=8)
    return _figure(fig, ident, f"{what} per group under each chain")


def _decision_rates(ev: Evidence, groups) -> str:
    rows, rates = [], {}
    for role, applied in ev.applied.items():
        decision = applied.columns.get("decision")
        if decision is None:
            continue
        decision = np.asarray(decision, dtype=float)
        rates[role] = [float(np.mean(decision[mask & applied.ok])) if (mask & applied.ok).any() else None
                       for _, mask in groups]
        known = [r for r in rates[role] if r is not None]
        overall = float(np.mean(decision[applied.ok])) if applied.ok.any() else None
        rows.append((role, _number(overall), *[_number(r) for r in rates[role]],
                     _number(max(known) - min(known) if known else None)))
    if not rows:
        return _note("no decisions under either chain")
    headers = ("chain", "decision rate", *[f"rate, {label}" for label, _ in groups], "gap (DP difference)")
    return ("<h3>decisions</h3>" + _table(headers, rows, numeric=tuple(range(1, len(headers))))
            + _decision_plot(rates, groups))


@_plot("decision rate")
def _decision_plot(rates: dict, groups) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 2.8))
    x = np.arange(len(groups))
    for i, (role, values) in enumerate(rates.items()):
        ax.bar(x + (i - 0.5 * (len(rates) - 1)) * 0.38, [np.nan if v is None else v for v in values], 0.38,
               label=f"{role} chain", color=("#999999" if role == "active" else "#2f7ebc"))
    ax.set_xticks(x, [label for label, _ in groups])
    ax.set_ylabel("decision rate")
    ax.legend(fontsize=8)
    return _figure(fig, "dist-decision", "decision rate per group under each chain")


# ------------------------------------------------------------------ provenance and audit trail


def _provenance(ev: Evidence) -> str:
    record = ev.publish
    rows = [("version", str(record.version)), ("record sha256", record.sha256),
            ("transport", "inline in the control record" if record.blob_b64 is not None else f"by path {record.path}"),
            ("published by", record.actor or "unknown"), ("published at", _when(record.published_at))]
    if ev.artifact is None:
        return _kv_table(rows) + _note(f"the artifact cannot be fetched: {ev.artifact_refusal}")
    manifest = ev.artifact.manifest
    metrics = manifest.metrics
    rows += [("created", manifest.created), ("payload sha256", manifest.payload_sha256),
             ("payload size", f"{manifest.payload_size} bytes"),
             ("data fingerprint", manifest.data_fingerprint or "none recorded"),
             ("data window", _data_window(metrics)),
             ("schema version", str(manifest.schema_version))]
    parameters = sorted((name, _value(value)) for name, value in manifest.parameters.items())
    return _kv_table(rows) + "<h3>parameters</h3>" + _kv_table(parameters)


def _data_window(metrics: Mapping) -> str:
    known = [(label, metrics.get(key)) for label, key in (("source", "source"), ("research records", "n_research"),
                                                          ("fit", "n_fit"), ("holdout", "n_holdout"),
                                                          ("invalid skipped", "n_invalid"), ("seed", "seed"))]
    shown = [f"{label} {value}" for label, value in known if value is not None]
    return ", ".join(shown) or "not recorded"


def _audit(ev: Evidence) -> str:
    rows = [(str(e.offset), _when(e.record.published_at), e.record.action + (" (candidate)" if e.record.candidate
                                                                             else ""), e.record.actor or "-",
             e.record.reason or "-",
        ", ".join(f"{k}={_number(v)}" for k, v in sorted((e.record.statistics or {}).items())) or "-",
        e.refusal or "takes effect") for e in ev.trail]
    return _table(("offset", "time (UTC)", "action", "actor", "reason", "statistics", "verdict"), rows)


# =============================================================================== small helpers


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _note(text: str) -> str:
    return f"<p class=note>{_e(text)}</p>"


def _kv_table(rows) -> str:
    return "<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows) + "</table>"


def _table(headers, rows, numeric: tuple = ()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td{' class=num' if i in numeric else ''}>{_e(cell)}</td>"
                                    for i, cell in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(value) -> str:
    if not _is_number(value):
        return "-"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"


def _statistic_label(name: str) -> str:
    """A statistic's label: ``dp_difference`` as "DP gap"; the re-fit's ``E`` as "dependence E"; others as named."""
    if name == "E":  # the plan trainer's holdout figure: E summed over the features
        return STATISTIC_NAMES["dependence_e"][0]
    return STATISTIC_NAMES.get(name, (name, ""))[0]


def _plain(value: float) -> str:
    """A figure in a sentence: three decimals, or two significant digits when smaller than that shows."""
    if value == 0 or abs(value) >= 0.0005:
        return f"{value:.3f}"
    return f"{value:.2g}"


def _count(value: float) -> str:
    """A record count with thousands separators: 12,400."""
    return f"{int(round(value)):,}"


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _listed(items: list[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1] if items else ""


def _value(value) -> str:
    return _number(value) if _is_number(value) else json.dumps(value, default=str)[:300] if not isinstance(
        value, str) else value


def _when(timestamp) -> str:
    if not _is_number(timestamp) or not 0 <= timestamp < 253402300800:  # a wall-clock time up to year 9999
        return "unknown"
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _figure(fig, ident: str, caption: str) -> str:
    """A matplotlib figure as an embedded PNG (a ``data:`` URL), with its caption; closes the figure."""
    plt = _pyplot()
    buffer = io.BytesIO()
    try:
        fig.tight_layout()
        fig.savefig(buffer, format="png", dpi=90)
    finally:
        plt.close(fig)
    encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
    return (f"<figure id={_e(ident)} class=plot><img alt=\"{_e(caption)}\" src=\"data:image/png;base64,{encoded}\">"
            f"<figcaption>{_e(caption)}</figcaption></figure>")
