"""The candidate report: one self-contained HTML page a person can approve or reject a candidate from.

``fairstream artifacts report KIND VERSION`` calls :func:`write_report`: it gathers the
:class:`~fairstream.streams.refit.evidence.Evidence` on the version and :func:`render` turns it into
the page, from that data only. What it shows of the sampled records follows what the kinds write:
the repaired features per group for a kind that writes features, the scores and decision rates per
group where the chain scores and decides.

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

from .evidence import Evidence, gather

if TYPE_CHECKING:
    from fairstream.streams.config import PipelineConfig

__all__ = ["SECTIONS", "render", "write_report"]

log = logging.getLogger(__name__)

SECTIONS = ("summary", "trigger", "holdout", "shadow", "distributions", "provenance", "audit")
"""The page's sections, by their ``id`` (stable: tests and links name them)."""
_ROLES = ("active", "candidate", "noise")  # the roles in a worker's shadow figure names: "<role>.<measure>"


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
        rows.append(("shadow policy", f"decides after {config.shadow.min_records} live records"))
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


def _holdout(ev: Evidence) -> str:
    parts = []
    statistics = ev.publish.statistics or {}
    if statistics:
        parts.append("<h3>Figures on the publish record</h3>" + _kv_table(sorted(
            (name, _number(value)) for name, value in statistics.items())))
    metrics = {} if ev.artifact is None else dict(ev.artifact.manifest.metrics)
    if metrics:
        parts.append("<h3>Fit-time metrics of the artifact</h3>" + _kv_table(sorted(
            (name, _value(value)) for name, value in metrics.items())))
        plot = _holdout_plot(metrics)
        if plot:
            parts.append(plot)
    if not parts:
        parts.append(_note("neither the publish record nor the artifact carries holdout figures (published by hand "
                           "without --reason statistics, or not a re-fit)"))
    return "\n".join(parts)


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
    policy = _policy(ev.config)
    if not ev.shadow:
        return policy + _note("no live figures yet: no worker has announced shadow figures for this version (it is not "
                     "pending, no worker runs it in shadow, or fewer records than one announcement have passed)")
    parts = [policy]
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
    compared = ", ".join(config.shadow_statistics)
    decides = "decides" if promotion == "shadow" else f"would decide (promotion is {promotion!r}: a person decides)"
    return (f"<p>The shadow policy {_e(decides)} after {shadow.min_records} live records: the candidate must be lower "
            f"than the active chain by more than {_e(_number(shadow.min_improvement))} on {_e(compared)}, its "
            f"accuracy at most {_e(_number(shadow.max_accuracy_drop))} below the active chain's (with labels), else "
            f"its decision rate within {_e(_number(shadow.max_decision_rate_change))} of it.</p>")


def _measures(figures: dict) -> list[str]:
    """The measures of a worker's figures (``active.X``, ``candidate.X``, ``noise.X``: X), statistics first."""
    names = {key.split(".", 1)[1] for key in figures if key.split(".", 1)[0] in _ROLES and "." in key}
    order = {"decision_rate": 1, "accuracy": 2}
    return sorted(names, key=lambda name: (order.get(name.split(".", 1)[0], 0), name))


def _measure_name(measure: str, s_name: str) -> str:
    """``decision_rate.0`` as "decision rate, sex=0"; a statistic's name as it is."""
    what, _, group = measure.partition(".")
    if what not in ("decision_rate", "accuracy"):
        return measure
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
