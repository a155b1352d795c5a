"""The monitor's windows of one kind (count or time) and the gauge rows read from them.

:class:`StatisticWindows` holds one window per (statistic, stage) accumulator of a chain version and turns their
values into rows ``(statistic, stage, stratum, feature, group_pair, value)``, one per gauge, and into the scalar a
drift detector watches (:data:`.drift.DETECTED`).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np

from fairstream.repair.measure.windows import BatchWindow

from .drift import DETECTED

if TYPE_CHECKING:
    from .monitor import BatchStatistics


class StatisticWindows:
    """Every statistic's window of one kind (count or time) for one chain version."""

    def __init__(self, make_window: Callable[[], BatchWindow], statistics: BatchStatistics, features: list):
        self.make_window = make_window
        self.windows = {key: make_window() for key in statistics.factories}
        self.features = features

    def add(self, accumulators: dict, n_records: int, ts: float) -> None:
        """Add one batch's accumulators (a statistic first met, e.g. the first labelled records', gets its window)."""
        for key, accumulator in accumulators.items():
            window = self.windows.get(key)
            if window is None:
                window = self.windows[key] = self.make_window()
            window.add(accumulator, n_records, ts=ts)

    def group_records(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Records per (stratum, group) in the window, and the groups and strata they are of (None before any):
        what says whether the statistics between groups can be measured (:func:`measurable`)."""
        window = self.windows.get(("dependence_e", "after"))
        if window is None or not window.n_records:
            return None
        accumulator = window.accumulator()
        return accumulator.counts_[0].sum(axis=2), accumulator.groups, accumulator.strata

    @property
    def n_records(self) -> int:
        """Records in the window now."""
        return self.windows["out_of_range_rate", "before"].n_records

    def _values(self, statistic: str, stages) -> dict:
        return {stage: window.value() for (name, stage), window in self.windows.items()
                if name == statistic and window.n_records and (stages is None or stage in stages)}

    def detector_value(self, statistic: str) -> float | None:
        """``statistic`` after the chain over all strata and features (see :data:`DETECTED`), or None."""
        key, scalar = DETECTED[statistic]
        window = self.windows.get(key)
        if window is None or not window.n_records:
            return None
        value = float(scalar(window.value()))
        return value if np.isfinite(value) else None

    def rows(self, statistic: str | None = None, stages=None) -> Iterable[tuple[str, str, str, str, str, float]]:
        """(statistic, stage, stratum, feature, group_pair, value) for every gauge, or for one statistic."""
        for names, rows in self._row_makers():
            if statistic is None or statistic in names:
                yield from (row for row in rows(stages) if statistic is None or row[0] == statistic)

    def _row_makers(self):
        return [(("dependence_e",), self._e_rows), (("w1",), self._w1_rows),
                (("dp_difference", "dp_ratio", "conditional_dp"), self._dp_rows), (("eopp",), self._eopp_rows),
                (("mdp",), self._mdp_rows), (("otf",), self._otf_rows), (("out_of_range_rate",), self._oor_rows)]

    def _e_rows(self, stages=None):
        for stage, r in self._values("dependence_e", stages).items():
            yield from _per_stratum_feature("dependence_e", stage, r.strata, self.features, r.per_stratum, "all")
            yield from (("dependence_e", stage, "all", f, "all", v) for f, v in zip(self.features, r.per_feature))
            yield "dependence_e", stage, "all", "all", "all", r.total

    def _w1_rows(self, stages=None):
        for stage, r in self._values("w1", stages).items():
            for j, p, k in itertools.product(range(len(r.strata)), range(len(r.pairs)), range(len(self.features))):
                yield "w1", stage, str(r.strata[j]), self.features[k], "-".join(map(str, r.pairs[p])), r.per_pair[j, p, k]
            yield from (("w1", stage, "all", f, "all", v) for f, v in zip(self.features, r.per_feature))
            yield "w1", stage, "all", "all", "all", float(np.mean(r.per_feature))

    def _dp_rows(self, stages=None):
        for stage, r in self._values("dp", stages).items():
            yield "dp_difference", stage, "all", "all", "all", r.difference
            yield "dp_ratio", stage, "all", "all", "all", r.ratio
            yield "conditional_dp", stage, "all", "all", "all", r.conditional_difference
            yield from (("dp_difference", stage, str(a), "all", "all", v) for a, v in zip(r.strata, r.stratum_difference))

    def _eopp_rows(self, stages=None):
        for stage, r in self._values("eopp", stages).items():
            yield "eopp", stage, "all", "all", "all", r.difference
            yield from (("eopp", stage, str(a), "all", "all", v) for a, v in zip(r.strata, r.stratum_difference))

    def _mdp_rows(self, stages=None):
        for stage, r in self._values("mdp", stages).items():
            yield from (("mdp", stage, str(a), "all", "all", v) for a, v in zip(r.strata, r.per_stratum))
            yield from (("mdp", stage, "all", "all", f"{a}-{b}", v) for (a, b), v in zip(r.pairs, r.pair_values))
            yield "mdp", stage, "all", "all", "all", r.overall

    def _otf_rows(self, stages=None):
        for stage, r in self._values("otf", stages).items():
            if r is not None:
                yield "otf", stage, "all", "all", "all", r.value

    def _oor_rows(self, stages=None):
        for _, r in self._values("out_of_range_rate", stages).items():
            yield from (("out_of_range_rate", "before", str(a), "all", "all", v) for a, v in zip(r.strata, r.per_stratum))
            yield "out_of_range_rate", "before", "all", "all", "all", r.overall


def _per_stratum_feature(statistic, stage, strata, features, values, pair):
    for j, k in itertools.product(range(len(strata)), range(len(features))):
        yield statistic, stage, str(strata[j]), features[k], pair, values[j, k]


BETWEEN_GROUPS_EXEMPT = ("out_of_range_rate",)
"""The statistics that are not comparisons between groups: measurable whatever groups the window holds."""


def measurable(rows: Iterable[tuple], records: tuple | None, minimum: int) -> tuple[list, dict]:
    """The gauge rows that can be reported, and why the others cannot: (rows, {group: reason}).

    A statistic between groups over a window that holds fewer than ``minimum`` records of a configured group (none,
    when the group stopped arriving) would read as fair, or as noise, and is not a measurement: every row of every
    such statistic is left out, and the group is named with its reason (``no_records`` or ``too_few_records``). A
    per-stratum row of a stratum that holds too few records of a group is left out likewise. ``records``:
    :meth:`StatisticWindows.group_records`.
    """
    if records is None:
        return [], {}
    counts, groups, strata = records
    per_group = counts.sum(axis=0)
    short = {str(g): "no_records" if n == 0 else "too_few_records" for g, n in zip(groups, per_group) if n < minimum}
    thin_strata = {str(u) for u, row in zip(strata, counts) if (row < minimum).any()}
    kept = [row for row in rows if row[0] in BETWEEN_GROUPS_EXEMPT
            or (not short and (row[2] == "all" or row[2] not in thin_strata))]
    return kept, short
