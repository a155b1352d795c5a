"""A test-only kind placed after the scorer: it reads the score and writes the decision (as group thresholds do).

Registered for a test only (``monkeypatch.setitem(MODULE_KINDS, CUTOFFS, GroupCutoffs)``): the worker, the
monitor, the codec and the config know it by its capabilities alone.
"""

from __future__ import annotations

import numpy as np

from fairstream.repair.protocol import Applied, Batch, Capabilities

CUTOFFS = "test_cutoffs"


class GroupCutoffs:
    """Decision 1 where the score reaches the cutoff of the record's group (``cutoffs``: group -> cutoff)."""

    kind = CUTOFFS
    capabilities = Capabilities(agent="records", reads=frozenset({"score"}), writes=frozenset({"decision"}),
                                place="post", needs_s=True)
    seed = ""

    def __init__(self, cutoffs: dict):
        self.cutoffs = cutoffs

    def decide(self, score: np.ndarray, s: np.ndarray) -> np.ndarray:
        groups = np.array(list(self.cutoffs))
        cut = np.array(list(self.cutoffs.values()))[np.searchsorted(groups, s)]
        return (score >= cut).astype(np.int64)

    def apply(self, batch: Batch) -> Applied:
        return Applied.all_ok(batch, batch.X, decision=self.decide(batch.added["score"], np.asarray(batch.s)))
