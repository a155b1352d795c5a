"""The verification monitor of the embeddings stream: windowed FAR / FNMR per group, BFAR and BFRR.

Face-verification fairness is about pairs: two vectors of one identity should score above the
match threshold (else a false non-match), two of different identities below it (else a false
accept), equally often in every group. Identity labels arrive on a sample of ``embeddings.in``
records (field ``identity``); each labelled output vector is paired with the last
``reference_vectors`` labelled vectors of its group (genuine when the identities agree), scored by
cosine similarity at ``match_threshold``, and counted in a
:class:`~fairstream.repair.measure.verification.VerificationAccumulator`. A count window and a time
window of those counts give per-group FAR and FRR, the pooled FNMR and FAR, and BFAR / BFRR
(max over the geometric mean of the groups' rates, Conti and Clémençon's bias measures) for the
module version in use; a new version starts empty windows and an empty reference set (its scores
are on another scale).

A record id already among the kept vectors (a replay after a crash) is not counted again.
"""

from __future__ import annotations

import logging
import time
from collections import deque

import numpy as np

from fairstream.repair.measure.verification import VerificationAccumulator, l2_normalise
from fairstream.repair.measure.windows import BatchWindow
from fairstream.streams.config import PipelineConfig

log = logging.getLogger(__name__)


class LabelledVectors:
    """The last ``size`` labelled vectors of one group, with their identities and record ids."""

    def __init__(self, size: int, dimension: int):
        self.vectors = np.zeros((0, dimension))
        self.identities: deque = deque(maxlen=size)
        self.ids: deque = deque(maxlen=size)
        self._kept: set = set()  # the ids in ``ids``, for O(1) replay checks
        self.size = size

    def pair(self, vectors: np.ndarray, identities: list, ids: list) -> tuple[np.ndarray, np.ndarray]:
        """Scores and genuine flags of the new vectors against the kept ones and each other, then keep them.

        A record already kept (a replay after a crash) is left out: it would count its pairs twice.
        """
        fresh = [k for k, rid in enumerate(ids) if rid not in self._kept and rid not in ids[:k]]
        vectors, who = vectors[fresh], np.array([identities[k] for k in fresh], dtype=object)
        kept_who = np.array(self.identities, dtype=object)
        upper = np.triu(np.ones((len(who), len(who)), dtype=bool), k=1)  # each pair of new vectors once
        scores = np.concatenate([(vectors @ self.vectors.T).ravel(), (vectors @ vectors.T)[upper]])
        genuine = np.concatenate([(who[:, None] == kept_who[None, :]).ravel(), (who[:, None] == who[None, :])[upper]])
        self.vectors = np.vstack([self.vectors, vectors])[-self.size:]
        self.identities.extend(who.tolist())
        for k in fresh:
            if len(self.ids) == self.size:
                self._kept.discard(self.ids[0])
            self.ids.append(ids[k])
            self._kept.add(ids[k])
        return scores, genuine


class EmbeddingMonitor:
    """Windows of verification counts for the embedding module version in use.

    >>> from fairstream.streams.config import adult_config
    >>> monitor = EmbeddingMonitor(adult_config())
    >>> vectors = np.array([[1.0, 0, 0, 0, 0, 0, 0, 0], [0.9, 0.1, 0, 0, 0, 0, 0, 0], [0, 1.0, 0, 0, 0, 0, 0, 0]])
    >>> monitor.observe(vectors, identities=[7, 7, 8], groups=[0, 0, 0], ids=["a", "b", "c"], version=1)
    >>> rates = monitor.rates("count")
    >>> rates.frr.tolist()[0], rates.far.tolist()[0]  # the genuine pair matches, the impostor pairs do not
    (0.0, 0.0)
    """

    def __init__(self, config: PipelineConfig):
        self.config, self.embeddings, self.monitor = config, config.embeddings, config.monitor
        self.groups = list(config.groups)
        self.version: int | None = None

    def _start(self, version: int) -> None:
        m = self.monitor
        self.version = version
        self.references = {g: LabelledVectors(self.embeddings.reference_vectors, self.embeddings.dimension)
                           for g in self.groups}
        self.windows = {"count": BatchWindow(records=m.window_records, buckets=m.buckets),
                        "time": BatchWindow(seconds=m.window_seconds, buckets=m.buckets)}
        self.pairs = {"genuine": 0, "impostor": 0}
        log.info("verification monitor on embedding version %s (threshold %s)", version,
                 self.embeddings.match_threshold)

    def observe(self, vectors: np.ndarray, identities: list, groups: list, ids: list, version: int,
                ts: float | None = None) -> None:
        """Count the pairs of a batch's output ``vectors`` whose ``identities`` are known (None: unlabelled)."""
        if version != self.version:
            self._start(version)
        labelled = [i for i, (who, g) in enumerate(zip(identities, groups)) if who is not None and g in self.groups]
        if not labelled:
            return
        unit = l2_normalise(vectors[labelled])
        accumulator = VerificationAccumulator(self.groups, self.embeddings.match_threshold)
        for group in self.groups:
            rows = [k for k, i in enumerate(labelled) if groups[i] == group]
            if not rows:
                continue
            scores, genuine = self.references[group].pair(unit[rows], [identities[labelled[k]] for k in rows],
                                                          [ids[labelled[k]] for k in rows])
            if len(scores):
                accumulator.update(scores, genuine.astype(np.int64), [group] * len(scores))
        for window in self.windows.values():
            window.add(accumulator, n_records=len(labelled), ts=time.time() if ts is None else ts)

    def rates(self, window: str = "count"):
        """The window's :class:`~fairstream.repair.measure.verification.VerificationRates`, or None before any pair."""
        if self.version is None or not self.windows[window].n_records:
            return None
        return self.windows[window].value()

    def rows(self, window: str = "count") -> list[tuple[str, str, float]]:
        """(rate, group, value) for the gauges: far/frr per group, and fnmr, far_overall, bfar, bfrr for all."""
        rates = self.rates(window)
        if rates is None:
            return []
        rows = [(name, str(g), float(v)) for name in ("far", "frr")
                for g, v in zip(rates.groups.tolist(), getattr(rates, name))]
        rows += [(name, "all", float(getattr(rates, name))) for name in ("fnmr", "far_overall", "bfar", "bfrr")]
        return [row for row in rows if np.isfinite(row[2])]
