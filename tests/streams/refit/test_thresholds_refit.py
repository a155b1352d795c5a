"""Group thresholds after the scorer: ``fairstream refit --kind thresholds`` fits them on scores of the published chain.

On the embedded broker a pipeline ``scorer -> thresholds`` has a scorer published; the re-fit (the command line,
``--constraint dp``) scores a labelled research file with it, fits thresholds, validates them against the scorer's
own decisions and publishes them. (Which modules score the window, the chain up to the scorer, is
``published_before``'s, tested with a plan in front in ``test_trainer_table``.) A worker's registry loads them with the pipeline's
schema, and on Adult rows neither fit nor held out their decisions have a smaller DP gap than the scorer's alone.
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import numpy as np
import pytest

from fairstream.models.scorer import LogisticScorer
from fairstream.repair import datasets
from fairstream.repair.measure.metrics import dp_difference
from fairstream.repair.protocol import Batch, apply_chain
from fairstream.streams.config import AgentConfig, adult_config
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.refit.job import RefitJob
from fairstream.streams.refit.sources import ResearchWindow
from fairstream.streams.refit.trainers import TrainerError, Validation, trainer_class
from fairstream.streams.refit.trainers.thresholds import ThresholdsTrainer, decision_metrics
from fairstream.streams.topics import ensure_topics
from tests.streams.refit.test_flow_refit import balanced_scorer  # its decisions at 0.5 differ by sex
from tests.streams.test_cli import run_main


@pytest.fixture(scope="module")
def adult():
    research, rest = datasets.load("adult").split(4000, seed=3)
    fresh, _ = rest.split(3000, seed=4)
    return research, fresh


def research_csv(path, data) -> str:
    rows = np.column_stack([data.X, data.s, data.u, data.y])
    np.savetxt(path, rows, delimiter=",", fmt="%g", header="age,hours-per-week,s,u,y", comments="")
    return str(path)


@pytest.mark.integration
def test_thresholds_are_refitted_behind_the_published_chain_and_close_the_dp_gap(broker, adult, tmp_path, capsys):
    research, fresh = adult
    config = adult_config(artifact_dir=str(tmp_path / "artifacts"),
                          records=AgentConfig(artifact=("scorer", "thresholds")),
                          ).with_topics(prefix=f"thr-{uuid.uuid4().hex[:8]}")
    toml = tmp_path / "pipeline.toml"
    toml.write_text(config.to_toml())
    ensure_topics(broker.bootstrap, config.topics)
    control = ControlClient(broker.bootstrap, config.topics, ArtifactStore(config.artifact_dir))
    control.publish_sync(balanced_scorer(research).to_artifact())

    code, out, err = run_main(["refit", "--broker", broker.url, "--config", str(toml), "--kind", "thresholds",
                               "--constraint", "dp", "--source", research_csv(tmp_path / "research.csv", research)],
                              capsys)

    assert code == 0 and "re-fit of thresholds: published thresholds v1" in out, out + err
    serving = RefitJob(config, broker.bootstrap, kind="thresholds").serving()  # a worker's registry, replayed
    thresholds = serving["thresholds"]
    assert thresholds.version == 1 and thresholds.module.constraint == "dp"
    manifest = control.store.get(thresholds.sha256).manifest.metrics
    # Per stratum by default: validated on the worst within-stratum gap, the overall one sealed next to it.
    assert manifest["holdout_statistic"] == "conditional DP gap" and manifest["scope"] == "conditional"
    assert manifest["holdout_value"] == manifest["conditional_dp_gap"] < manifest["current_holdout_value"]
    assert 0.0 <= manifest["dp_gap"] <= 1.0
    # Which scorer they cut: the one the worker serves.
    scorer = serving["scorer"]
    assert manifest["fitted_behind"] == [{"kind": "scorer", "version": scorer.version, "sha256": scorer.sha256}]

    chain = [serving["scorer"].module]
    batch = Batch(X=fresh.X, keys=np.array([f"fresh-{i}" for i in range(len(fresh.X))], dtype=object), s=fresh.s,
                  u=fresh.u)
    alone, after = apply_chain(chain, batch), apply_chain(chain + [thresholds.module], batch)
    assert alone.ok.all() and after.ok.all()
    gap_alone = dp_difference(alone.columns["decision"], fresh.s)
    gap_after = dp_difference(after.columns["decision"], fresh.s)
    assert gap_alone > 0.05 and gap_after < gap_alone / 2, (gap_alone, gap_after)


# --------------------------------------------------------------------------- the trainer alone


def test_the_thresholds_trainer_is_the_kinds_capability():
    assert trainer_class("thresholds") is ThresholdsTrainer


def test_thresholds_behind_no_scorer_read_the_records_own_score_and_are_not_re_fitted():
    # No module before them writes a score: they decide on the score the records carry (a monitor-only
    # pipeline's), which a research window does not hold.
    config = SimpleNamespace(records=SimpleNamespace(chain=("plan", "thresholds")))
    plan = SimpleNamespace(module=SimpleNamespace(kind="plan"))
    with pytest.raises(TrainerError, match=r"thresholds reads what the records carry of their own model, not what a "
                                           r"module of the chain \['plan', 'thresholds'\] writes"):
        ThresholdsTrainer(config).fit(None, {"plan": plan})


def test_a_window_without_the_labels_the_constraint_needs_is_a_refusal_not_a_crash(adult):
    """Equalized odds needs both labels in every group: a window whose group 1 has no y = 0 is a TrainerError."""
    research, _ = adult
    keep = (research.s == 0) | (research.y == 1)
    window = ResearchWindow.of(research.X[keep], research.s[keep], research.u[keep], y=research.y[keep])
    config = SimpleNamespace(records=SimpleNamespace(chain=("scorer", "thresholds")), groups=(0, 1), strata=(0, 1))
    scorer = SimpleNamespace(module=balanced_scorer(research))
    with pytest.raises(TrainerError, match=r"cannot fit eo thresholds: .*y = 0"):
        ThresholdsTrainer(config, constraint="eo").fit(window, {"scorer": scorer})


def test_an_unknown_constraint_or_scope_is_refused_naming_the_known_ones():
    with pytest.raises(TrainerError, match=r"constraint must be one of \['dp', 'eopp', 'eo'\], got 'parity'"):
        ThresholdsTrainer(adult_config(), constraint="parity")
    with pytest.raises(TrainerError, match=r"scope must be one of \['conditional', 'overall'\], got 'global'"):
        ThresholdsTrainer(adult_config(), scope="global")


@pytest.fixture(scope="module")
def simpson():
    """Groups spread differently over the strata (s = 1 mostly in u = 1, where positives are frequent): equal
    positive rates within every stratum leave a wide gap over all records, and the other way round."""
    rng = np.random.default_rng(0)
    n = 4000
    s = rng.integers(0, 2, n)
    u = (rng.uniform(size=n) < np.where(s == 1, 0.8, 0.2)).astype(int)
    y = (rng.uniform(size=n) < 0.25 + 0.5 * u).astype(int)
    X = np.column_stack([u + rng.normal(0, 0.1, n), y + rng.normal(0, 0.6, n)])
    window = ResearchWindow.of(X, s, u, y=y)
    actives = {"scorer": SimpleNamespace(module=LogisticScorer().fit(X, y, columns=["a", "b"]), version=3,
                                         sha256="ab" * 32)}
    config = SimpleNamespace(records=SimpleNamespace(chain=("scorer", "thresholds")), groups=(0, 1), strata=(0, 1))
    return config, window.subset(np.arange(0, n, 2)), window.subset(np.arange(1, n, 2)), actives


@pytest.mark.parametrize("scope, name, validated, other, stratified", [
    ("conditional", "conditional DP gap", "conditional_dp_gap", "dp_gap", True),
    ("overall", "DP gap", "dp_gap", "conditional_dp_gap", False),
])
def test_the_scope_says_what_the_thresholds_equalise_and_the_gap_they_are_validated_on(
        simpson, scope, name, validated, other, stratified):
    config, fit, held, actives = simpson
    trainer = ThresholdsTrainer(config, scope=scope)
    thresholds = trainer.fit(fit, actives)
    validation = trainer.validate(thresholds, held, actives)
    assert thresholds.stratified_ is stratified and validation.name == name
    assert validation.value == validation.metrics[validated] < 0.05  # closed where the scope closes it
    assert validation.metrics[other] > 0.2  # and both figures sealed: Simpson's gap stays wide on the other side
    assert validation.metrics["scope"] == scope
    assert validation.metrics["fitted_behind"] == [{"kind": "scorer", "version": 3, "sha256": "ab" * 32}]


def test_a_holdout_group_without_the_labels_a_gap_compares_is_an_error_not_a_perfect_gap():
    decision, s, y = np.array([1, 0, 1, 1, 0, 1]), np.array([0, 0, 0, 1, 1, 1]), np.array([0, 0, 0, 1, 0, 1])
    with pytest.raises(TrainerError, match=r"^holdout group 0 has no positives: the eopp gap is undefined$"):
        decision_metrics(decision, s, y)
    with pytest.raises(TrainerError, match=r"^holdout group 1 has no negatives: the eo gap is undefined$"):
        decision_metrics(decision, s, np.array([0, 1, 0, 1, 1, 1]), needed=("eo_gap",))
    # The figure compared is defined: the others are sealed as undefined, not as 0.
    assert decision_metrics(decision, s, y, needed=("dp_gap",)) == \
        {"accuracy": pytest.approx(4 / 6), "dp_gap": 0.0, "eopp_gap": None, "eo_gap": None}
    u = np.array([0, 1, 1, 0, 1, 1])  # group 0 has a positive, but none in stratum 1
    with pytest.raises(TrainerError, match=r"^holdout group 0 in stratum u=1 has no positives: the conditional "
                                           r"eopp gap is undefined$"):
        decision_metrics(decision, s, np.array([1, 0, 0, 1, 0, 1]), u, needed=("conditional_eopp_gap",))


@pytest.mark.parametrize("candidate, current, refused", [
    ((0.02, 0.70), (0.15, 0.70), None),
    ((0.12, 0.70), (0.10, 0.70), None),  # within 10 % + 0.01
    ((0.13, 0.70), (0.10, 0.70), "candidate DP gap 0.13 > current 0.1 x 1.10 + 0.01"),
    ((0.01, 0.725), (0.15, 0.75), None),  # the price of parity: 2.5 points, within the default 0.03
    ((0.01, 0.715), (0.15, 0.75), "candidate accuracy 0.715 is 0.035 below the current 0.750"),
])
def test_thresholds_are_refused_for_a_wider_gap_or_more_than_the_price_of_the_constraint(candidate, current, refused):
    trainer = ThresholdsTrainer(adult_config(), tolerance=0.1)
    as_validation = lambda gap, acc: Validation("DP gap", gap, "", metrics={"accuracy": acc})  # noqa: E731
    reason = trainer.refusal(as_validation(*candidate), as_validation(*current))
    assert reason == refused if refused is None else reason.startswith(refused)
