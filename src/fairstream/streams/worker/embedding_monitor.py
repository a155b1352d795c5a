"""The verification monitor of the embeddings stream: windowed FAR / FNMR per group, BFAR and BFRR.

Face-verification fairness is about pairs: two vectors of one identity should be accepted as a
match (else a false non-match), two of different identities rejected (else a false accept), equally
often in every group. Identity labels arrive on a sample of ``embeddings.in`` records (field
``identity``); each labelled output vector is paired with the last ``reference_vectors`` labelled
vectors of its group (genuine when the identities agree), scored by cosine similarity, and counted
in a :class:`~fairstream.repair.measure.verification.CalibratedVerificationAccumulator`: per-group
score histograms of the genuine and impostor pairs.

**Operating point.** A module version is read at the threshold that gives the configured FAR
(``[agents.embeddings] far``) on the pooled impostor pairs of the window, not at a fixed cosine
score: a new embedding module changes the scale of its scores, so a fixed score would compare two
versions at two different FARs. At that threshold each window reports per-group FAR and FRR, the
pooled FNMR and FAR (at most the configured FAR, by construction), BFAR / BFRR (max over the
geometric mean of the groups' rates, Conti and Clémençon's bias measures) and the threshold itself.
A new version starts empty windows and an empty reference set, so its threshold is calibrated on
its own pairs only. Nothing is reported until a window holds ``1 / far`` impostor pairs (fewer
allow no false accept at the target, and the FARs would say nothing).

A record id already among the kept vectors (a replay after a crash) is not counted again.
"""

from __future__ import annotations

import logging
import time
from collections import deque

import numpy as np

from fairstream.repair.measure.accumulators import EncodedLabels
from fairstream.repair.measure.verification import CalibratedVerificationAccumulator, VerificationRates, l2_normalise
from fairstream.repair.measure.windows import BatchWindow
from fairstream.streams.config import PipelineConfig

log = logging.getLogger(__name__)

def configured_far(config: PipelineConfig) -> float:
    """The FAR at which the monitor sets each version's threshold: ``[agents.embeddings] far``."""
    return float(config.embeddings.far)


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
    """Windows of verification counts for the embedding module version in use, read at its calibrated threshold.

    >>> from fairstream.streams.config import adult_config
    >>> rng = np.random.default_rng(0)
    >>> people = rng.normal(size=(30, 8))  # 30 identities, two images each, in group 0
    >>> vectors = np.repeat(people, 2, axis=0) + 0.1 * rng.normal(size=(60, 8))
    >>> monitor = EmbeddingMonitor(adult_config())
    >>> monitor.observe(vectors, identities=np.repeat(np.arange(30), 2).tolist(), groups=[0] * 60,
    ...                 ids=[f"r{i}" for i in range(60)], version=1)
    >>> rates = monitor.rates("count")  # 1,740 impostor pairs: at FAR 1e-3 one may pass
    >>> int(rates.impostor_pairs[0]), int(rates.false_accepts[0]), rates.fnmr
    (1740, 1, 0.0)
    """

    def __init__(self, config: PipelineConfig):
        self.config, self.embeddings, self.monitor = config, config.embeddings, config.monitor
        self.groups = list(config.groups)
        self.far = configured_far(config)
        self.version: int | None = None
        self._empty = CalibratedVerificationAccumulator(self.groups, self.far)
        self._codes = EncodedLabels.encode(self.groups, self.groups, "groups").tolist()  # each group's index

    def _start(self, version: int) -> None:
        m = self.monitor
        self.version = version
        self.references = {g: LabelledVectors(self.embeddings.reference_vectors, self.embeddings.dimension)
                           for g in self.groups}
        self.windows = {"count": BatchWindow(records=m.window_records, buckets=m.buckets),
                        "time": BatchWindow(seconds=m.window_seconds, buckets=m.buckets)}
        self.pairs = {"genuine": 0, "impostor": 0}
        log.info("verification monitor on embedding version %s (threshold at FAR %g on its own pairs)", version,
                 self.far)

    def observe(self, vectors: np.ndarray, identities: list, groups: list, ids: list, version: int,
                ts: float | None = None) -> None:
        """Count the pairs of a batch's output ``vectors`` whose ``identities`` are known (None: unlabelled)."""
        if version != self.version:
            self._start(version)
        labelled = [i for i, (who, g) in enumerate(zip(identities, groups)) if who is not None and g in self.groups]
        if not labelled:
            return
        unit = l2_normalise(vectors[labelled])
        scores, genuine, codes = [np.zeros(0)], [np.zeros(0, dtype=bool)], [np.zeros(0, dtype=np.intp)]
        for group, code in zip(self.groups, self._codes):
            rows = [k for k, i in enumerate(labelled) if groups[i] == group]
            if rows:
                pair_scores, same = self.references[group].pair(unit[rows], [identities[labelled[k]] for k in rows],
                                                                [ids[labelled[k]] for k in rows])
                scores.append(pair_scores)
                genuine.append(same)
                codes.append(np.full(len(pair_scores), code, dtype=np.intp))
        pair_groups = np.concatenate(codes).view(EncodedLabels)
        pair_groups.classes = self._empty.groups  # already codes: no labels encoded per pair
        accumulator = self._empty.fresh().update(np.concatenate(scores), np.concatenate(genuine), pair_groups)
        for window in self.windows.values():
            window.add(accumulator, n_records=len(labelled), ts=time.time() if ts is None else ts)

    def rates(self, window: str = "count") -> VerificationRates | None:
        """The window's rates at its calibrated threshold, or None before it holds ``1 / far`` impostor pairs."""
        if self.version is None or not self.windows[window].n_records:
            return None
        pairs = self.windows[window].accumulator()
        return pairs.value() if pairs.calibrated else None

    def rows(self, window: str = "count") -> list[tuple[str, str, float]]:
        """(rate, group, value) for the gauges: far/frr per group; fnmr, far_overall, bfar, bfrr, threshold for all."""
        rates = self.rates(window)
        if rates is None:
            return []
        rows = [(name, str(g), float(v)) for name in ("far", "frr")
                for g, v in zip(rates.groups.tolist(), getattr(rates, name))]
        rows += [(name, "all", float(getattr(rates, name))) for name in ("fnmr", "far_overall", "bfar", "bfrr")]
        rows.append(("threshold", "all", rates.threshold))
        return [row for row in rows if np.isfinite(row[2])]
