"""The verification monitor reads every embedding module version at the threshold of the configured FAR."""

from dataclasses import replace

import numpy as np
import pytest

from fairstream.repair.measure.verification import threshold_at_far, verification_rates
from fairstream.streams.config import EmbeddingConfig, adult_config
from fairstream.streams.worker.embedding_monitor import EmbeddingMonitor

DIM, GROUPS, IDENTITIES, IMAGES = 32, (0, 1, 2, 3), 40, 4
BIN = 2.0 / 20_000  # the monitor's score bins on the cosine range
DEFAULT_FAR = EmbeddingConfig().far


def monitor_config(far: float = DEFAULT_FAR):
    """Four groups; every labelled vector of a group kept as a reference, so every same-group pair is scored."""
    embeddings = EmbeddingConfig(dimension=DIM, reference_vectors=IDENTITIES * IMAGES, far=far)
    return replace(adult_config(groups=GROUPS).with_monitor(window_records=5000, buckets=4), embeddings=embeddings)


def faces(seed=0):
    """40 identities x 4 images per group, noisier in higher groups (so their error rates differ), with a last
    coordinate of 0: adding a constant there is a second module whose cosine scores are a monotone function
    of the first's, (cos + c^2) / (1 + c^2)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(len(GROUPS) * IDENTITIES, DIM - 1))
    who = np.repeat(np.arange(len(centres)), IMAGES)
    groups = who // IDENTITIES
    noise = (0.5 + 0.1 * groups)[:, None] * rng.normal(size=(len(who), DIM - 1))
    vectors = np.column_stack([centres[who] + noise, np.zeros(len(who))])
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True), who, groups


def second_module(vectors, c=1.0):
    """The same people under a module whose scores are (cos + c^2) / (1 + c^2): a monotone rescaling."""
    moved = vectors.copy()
    moved[:, -1] = c
    return moved


def all_pairs(vectors, who, groups):
    """Scores, genuine flags and groups of every same-group pair."""
    out = []
    for g in GROUPS:
        rows = np.flatnonzero(groups == g)
        unit = vectors[rows] / np.linalg.norm(vectors[rows], axis=1, keepdims=True)
        i, j = np.triu_indices(len(rows), k=1)
        out.append(((unit[i] * unit[j]).sum(axis=1), who[rows][i] == who[rows][j], np.full(len(i), g)))
    return [np.concatenate(part) for part in zip(*out)]


def observe(monitor, vectors, who, groups, version, prefix):
    monitor.observe(vectors, who.tolist(), groups.tolist(), [f"{prefix}{i}" for i in range(len(who))], version=version,
                    ts=1000.0)


def counts(rates):
    return {name: getattr(rates, name).tolist() for name in ("false_accepts", "impostor_pairs", "false_rejects",
                                                             "genuine_pairs")}


def test_two_module_versions_whose_scores_differ_by_a_monotone_rescaling_read_the_same():
    vectors, who, groups = faces()
    scores, genuine, pair_group = all_pairs(vectors, who, groups)
    far = DEFAULT_FAR
    t = threshold_at_far(scores[~genuine], far)
    # The monitor places its threshold on a bin edge: it accepts exactly the pairs above t unless a pair
    # shares the threshold's bin (1e-4 wide, 2e-4 in the first module's units for the second). None does here.
    assert not np.any((scores > t) & (scores <= t + 2 * BIN))
    exact = verification_rates(scores, genuine, pair_group, threshold=t, groups=GROUPS)
    assert exact.false_accepts.sum() == np.floor(far * (~genuine).sum()) >= 20 and np.isfinite(exact.bfar)
    read = []
    for version, module in ((1, vectors), (2, second_module(vectors))):
        monitor = EmbeddingMonitor(monitor_config(far))
        observe(monitor, module, who, groups, version, "r")
        read.append(monitor.rates("count"))
    assert counts(read[0]) == counts(exact) and counts(read[1]) == counts(exact)
    assert read[0].fnmr == read[1].fnmr == exact.fnmr and read[0].bfar == read[1].bfar == exact.bfar
    assert read[0].far_overall <= far and read[0].bfrr == read[1].bfrr
    assert read[1].threshold == pytest.approx((read[0].threshold + 1) / 2, abs=2 * BIN)


def test_a_swap_recalibrates_on_the_new_versions_pairs_only():
    vectors, who, groups = faces(seed=1)
    monitor = EmbeddingMonitor(monitor_config())
    observe(monitor, vectors, who, groups, 1, "a")
    first = monitor.rates("count")
    swapped = second_module(vectors, c=2.0)  # scores (cos + 4) / 5: every impostor above the first threshold
    observe(monitor, swapped, who, groups, 2, "b")
    after = monitor.rates("count")
    fresh = EmbeddingMonitor(monitor_config())
    observe(fresh, swapped, who, groups, 2, "b")
    assert counts(after) == counts(fresh.rates("count")) and after.threshold == fresh.rates("count").threshold
    # A new operating point on the new scale: the first threshold carried over, not the first one.
    assert after.threshold == pytest.approx((first.threshold + 4) / 5, abs=2 * BIN)
    assert after.threshold > first.threshold
    assert after.far_overall <= DEFAULT_FAR and abs(after.fnmr - first.fnmr) <= 0.02
    gauges = {(rate, group): value for rate, group, value in monitor.rows("count")}
    assert gauges["threshold", "all"] == after.threshold and gauges["fnmr", "all"] == after.fnmr


def test_nothing_is_reported_before_the_window_holds_one_over_far_impostor_pairs():
    vectors, who, groups = faces()
    monitor = EmbeddingMonitor(monitor_config())
    few = np.flatnonzero(groups == 0)[:40]  # 780 pairs of one group: fewer than 1 / 1e-3 impostors
    observe(monitor, vectors[few], who[few], groups[few], 1, "f")
    assert monitor.rates("count") is None and monitor.rows("count") == []
