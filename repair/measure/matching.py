"""Legacy MDP counterparts: a plan's per-feature map, each record matched to the next group cyclically.

**Superseded** by the scorer's frozen multivariate OT map:
:meth:`fairstream.models.scorer.Scorer.matched_counterparts` (a
:class:`~fairstream.repair.group_maps.GroupTransportMap`: every group matched to one reference group)
with :class:`~fairstream.repair.measure.mdp.MatchedDPAccumulator`. Kept unchanged until the stream
monitor switches to them.

MDP compares a score on a record with the score on its counterpart: the record carried into
another protected group by a transport map between the groups' distributions (within its stratum).
This module builds the counterparts from plain arrays and a map callable (here a repair plan's
per-feature quantile map); :class:`~fairstream.repair.measure.accumulators.MatchedGapAccumulator`
then averages ``|f(x) - f(T(x))|``. For more than two groups each record is matched to the *next*
group in the listed order (cyclically), so every group is both a source and a target once.

>>> import numpy as np
>>> X = np.array([[1.0], [2.0], [10.0]])
>>> s, u = np.array([0, 0, 1]), np.array([0, 0, 0])
>>> shift = lambda x, stratum, source, target: x + (5.0 if target == 1 else -5.0)
>>> counterparts, matched = matched_counterparts(X, s, u, groups=(0, 1), transport_map=shift)
>>> counterparts.ravel().tolist(), matched.tolist()
([6.0, 7.0, 5.0], [1, 1, 0])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

TransportMap = Callable[[np.ndarray, object, object, object], np.ndarray]
"""``transport_map(x_rows, stratum, source_group, target_group)`` -> the rows carried into the target group."""


def next_group(s: np.ndarray, groups: Sequence) -> np.ndarray:
    """The group each record is matched to: the next one in ``groups``, cyclically."""
    matched = np.empty_like(s)
    for i, group in enumerate(groups):  # one vectorised pass per group, none per record
        matched[s == group] = groups[(i + 1) % len(groups)]
    return matched


def matched_counterparts(X: np.ndarray, s: np.ndarray, u: np.ndarray, groups: Sequence,
                         transport_map: TransportMap) -> tuple[np.ndarray, np.ndarray]:
    """Each row's counterpart ``T(x)`` in its matched group, and that group; one map call per (u, s) cell."""
    matched = next_group(s, groups)
    out = X.copy()
    for stratum, group in set(zip(u.tolist(), s.tolist())):
        rows = (u == stratum) & (s == group)
        out[rows] = transport_map(X[rows], stratum, group, matched[rows][0])
    return out, matched
