"""The alert rules that carry fairness thresholds, rendered from the pipeline config (one place for thresholds).

The monitor counts a statistic as unfair above ``monitor.threshold`` (per statistic) and the
embeddings above ``agents.embeddings.bfar_threshold``; Prometheus must page at the same values. Each
statistic is read from its family (:data:`~fairstream.streams.worker.metrics.FAIRNESS_FAMILIES`), in
which higher is always worse (``dp_ratio`` is exported as 1 - ratio), so every rule is ``> threshold``;
each reads the pipeline's value (``scope="pipeline"``: the monitoring agent's figure over every worker's
records, never one worker's ``scope="worker"`` diagnostic) of the serving chain only (``role="active"``: a
pending candidate measured in shadow never pages), each aggregates ``by (pipeline, ...)`` and names its
section of docs/runbook.md (``runbook_url``).
So those rules are not written by hand: ``fairstream alerts --config PIPELINE --write
deploy/prometheus/alerts.yml`` renders them between two marker lines of the rules file (the
other rules stay as written), and a test fails the build when the file and the deployed config
disagree.

>>> from fairstream.streams.config import adult_config
>>> text = render_threshold_rules(adult_config())
>>> "statistic=\\"dependence_e\\"" in text and "scope=\\"pipeline\\"" in text and ") > 0.1" in text
True
"""

from __future__ import annotations

from pathlib import Path

from fairstream.streams.config import PipelineConfig
from fairstream.streams.worker.metrics import fairness_family

BEGIN = "      # BEGIN fairness thresholds"
END = "      # END fairness thresholds"
_FOR = "1m"  # 12 scrapes at 5s: one noisy window slide does not page
RUNBOOK = "https://github.com/fairstream/fairstream/blob/main/docs/runbook.md"


def runbook_url(alertname: str) -> str:
    """The runbook section of an alert (docs/runbook.md has one ``## AlertName`` heading per alert)."""
    return f"{RUNBOOK}#{alertname.lower()}"


_GAP_RULE = """\
      - alert: FairstreamFairnessGapHigh
        # {statistic} after the record chain, from {family} (0 is fair, higher is worse): the pipeline's value
        # (scope="pipeline": the monitoring agent's, over every worker's records; one worker's own value,
        # scope="worker", is a diagnostic and never pages), count window, all-features / all-group-pairs row,
        # per stratum; the chain that serves only (role="active"): a candidate measured in shadow never pages.
        # `max by` drops the agent's job and instance: a standby that takes over continues the same alert.
        expr: |
          max by (pipeline, statistic, stratum, feature) (
            {family}{{stage="after", statistic="{statistic}", role="active", scope="pipeline", window="count", feature="all", group_pair="all"}}
          ) > {threshold}
        for: {for_}
        labels:
          severity: warning
          statistic: {statistic}  # one rule per statistic: the labels keep them apart
        annotations:
          summary: "Fairness gap after repair is high ({{{{ $labels.pipeline }}}}, stratum {{{{ $labels.stratum }}}})"
          description: >-
            {{{{ $labels.statistic }}}}{shown} after repair is {{{{ $value | printf "%.4f" }}}} over the records
            of pipeline {{{{ $labels.pipeline }}}} (every worker's), stratum {{{{ $labels.stratum }}}}
            (feature {{{{ $labels.feature }}}}), above
            the {threshold} threshold for {for_}.
            The repair artifact may no longer fit the stream: check the drift alerts and re-fit requests.
          runbook_url: {runbook}
"""

_BFAR_RULE = """\
      - alert: FairstreamVerificationBiasHigh
        # BFAR of labelled embeddings (max over the geometric mean of the groups' false accept rates at the
        # match threshold), worst worker of the pipeline, count window: the verification rates are each worker's
        # own (the monitoring agent merges the records chain's statistics, not the embeddings').
        expr: |
          max by (pipeline, rate) (fairstream_verification{{rate="bfar", group="all", window="count"}}) > {threshold}
        for: 5m
        labels:
          severity: warning
        annotations:
          summary: "False accepts are unevenly spread across groups ({{{{ $labels.pipeline }}}})"
          description: >-
            BFAR of the embeddings stream of pipeline {{{{ $labels.pipeline }}}} is {{{{ $value | printf "%.2f" }}}},
            above {threshold} for 5m: one group is falsely matched far more often than the others at the match
            threshold. Re-fit the embedding module (fairstream refit --kind embedding) on recent labelled vectors.
          runbook_url: {runbook}
"""


def render_threshold_rules(config: PipelineConfig) -> str:
    """The rules for every monitored statistic's threshold and the embeddings' BFAR, between the markers."""
    source = "generated from the pipeline config by `fairstream alerts --write`; change the config, not these lines"
    rules = [_gap_rule(name, threshold) for name, threshold in config.monitor.thresholds.items()]
    rules.append(_BFAR_RULE.format(threshold=config.embeddings.bfar_threshold,
                                   runbook=runbook_url("FairstreamVerificationBiasHigh")))
    return f"{BEGIN}: {source}\n" + "\n".join(rules) + f"{END}\n"


def _gap_rule(statistic: str, threshold: float) -> str:
    # Every family is "higher is worse" (dp_ratio is exported as 1 - ratio), so every rule is `> threshold`.
    return _GAP_RULE.format(statistic=statistic, family=fairness_family(statistic), threshold=f"{threshold:g}",
                            for_=_FOR, shown=" (1 - ratio)" if statistic == "dp_ratio" else "",
                            runbook=runbook_url("FairstreamFairnessGapHigh"))


def with_threshold_rules(rules_text: str, config: PipelineConfig) -> str:
    """``rules_text`` (an alerts.yml) with the block between the markers replaced by the rendered rules."""
    start, end = rules_text.find(BEGIN), rules_text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the rules file has no {BEGIN.strip()!r} ... {END.strip()!r} block to fill")
    end = rules_text.index("\n", end) + 1
    return rules_text[:start] + render_threshold_rules(config) + rules_text[end:]


def write_threshold_rules(path: str | Path, config: PipelineConfig) -> bool:
    """Rewrite the block in the rules file at ``path``; True if the file changed."""
    path = Path(path)
    before = path.read_text()
    after = with_threshold_rules(before, config)
    if after != before:
        path.write_text(after)
    return after != before
