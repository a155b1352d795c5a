"""Re-fits on a team's own records: the ``research`` topic and JSON-lines files carry loan applications as the
pipeline's mapping reads them (``y`` mapped), decoded by the worker's decoder; CSV files stay fairstream's columns.

End to end on Apache Kafka: ``fairstream refit --kind plan`` publishes a plan fitted on the loan records of the
research topic, the same plan as one fitted offline on their arrays.
"""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest
from confluent_kafka import Producer

from fairstream.models.plan import DistributionalRepair
from fairstream.streams.config import PipelineConfig
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.refit.sources import ResearchWindow, read_research_file, read_research_topic, stratified_split
from fairstream.streams.topics import ensure_topics
from tests.streams.refit.test_job import control_history, refit_cli

pytestmark = pytest.mark.integration

FEATURES = ["age", "income", "amount"]


def loans_config(artifact_dir: str = "artifacts", **mapping) -> PipelineConfig:
    """The lender's pipeline, its labels mapped from ``outcome``, on topics of its own."""
    prefix = f"research-loans-{uuid.uuid4().hex[:8]}"
    return PipelineConfig.from_dict({
        "pipeline": {"name": "loans", "features": FEATURES, "groups": ["female", "male"],
                     "strata": ["north", "south"], "label": True, "artifact_dir": artifact_dir},
        "topics": {"prefix": prefix, "input": f"{prefix}.applications", "output": f"{prefix}.applications.fair"},
        "mapping": {"id": "application_id", "time": {"path": "submitted_at", "format": "iso8601"},
                    "s": {"path": "applicant.sex", "values": {"F": "female", "M": "male"}},
                    "u": {"path": "branch", "default": "north"}, "y": "outcome",
                    "features": {"age": "applicant.age", "income": "applicant.income", "amount": "amount"},
                    **mapping},
    })


def labelled_loans(n: int, seed: int) -> list[dict]:
    """Labelled loan applications whose income and amount depend on the applicant's sex, in both branches."""
    rng = np.random.default_rng(seed)
    records = []
    for i in range(n):
        female = bool(rng.random() < 0.5)
        records.append({
            "application_id": f"A-{i}", "submitted_at": "2026-11-28T10:00:00Z",
            "applicant": {"age": int(rng.integers(20, 70)), "income": int(rng.normal(45000 if female else 55000, 8000)),
                          "sex": "F" if female else "M"},
            "amount": int(rng.normal(11000 if female else 13000, 2000)), "channel": "web",
            "branch": "south" if rng.random() < 0.5 else "north", "outcome": int(rng.random() < 0.4)})
    return records


def arrays(records: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(X, s, u, y, ids) of loan records, read by hand from their fields."""
    X = np.array([[r["applicant"]["age"], r["applicant"]["income"], r["amount"]] for r in records], dtype=float)
    s = np.array([{"F": "female", "M": "male"}[r["applicant"]["sex"]] for r in records], dtype=object)
    u = np.array([r.get("branch", "north") for r in records], dtype=object)
    return X, s, u, np.array([r["outcome"] for r in records]), np.array([r["application_id"] for r in records])


def bad_loans() -> list[tuple[dict, str]]:
    """Records a worker dead-letters, each with its reason."""
    no_sex = {"application_id": "B-1", "applicant": {"age": 30, "income": 40000}, "amount": 9000, "outcome": 1}
    old = {"application_id": "B-2", "applicant": {"age": "old", "income": 40000, "sex": "F"}, "amount": 9000}
    unlabelled = {"application_id": "B-3", "applicant": {"age": 30, "income": 40000, "sex": "F"}, "amount": 9000,
                  "outcome": 2}
    return [(no_sex, "missing field applicant.sex (mapping.s)"),
            (old, 'mapping: applicant.age: expected a number, found "old"'),
            (unlabelled, "mapping: outcome: expected 0, 1, true or false, found 2")]


def to_research_topic(bootstrap: str, config: PipelineConfig, records: list[dict], keys: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, record in zip(keys, records):
        producer.produce(config.topics.research, json.dumps(record).encode(), key)
    assert producer.flush(30) == 0


def same_window(window: ResearchWindow, records: list[dict]) -> None:
    X, s, u, y, ids = arrays(records)
    order = np.argsort(ids, kind="stable")
    window = window.in_key_order()
    assert window.keys.tolist() == ids[order].tolist()
    assert np.array_equal(window.X, X[order]) and window.y.tolist() == y[order].tolist()
    assert window.s.tolist() == s[order].tolist() and window.u.tolist() == u[order].tolist()


# --------------------------------------------------------------------------- the research topic


def test_a_research_window_from_loan_records_counts_the_refused_ones_with_their_path_reasons(broker):
    config = loans_config(id="$key")  # the id is the Kafka key: the topic's reader passes the keys along
    ensure_topics(broker.bootstrap, config.topics)
    good = labelled_loans(200, seed=1)
    bad = bad_loans()
    records = good + [record for record, _ in bad]
    keys = [r["application_id"].encode() for r in records]
    to_research_topic(broker.bootstrap, config, records, keys)

    window = read_research_topic(broker.bootstrap, config, last_n=None)

    same_window(window, good)
    assert window.n_invalid == len(bad) and window.source == f"topic {config.topics.research}"
    assert sorted(window.invalid_examples) == sorted(reason for _, reason in bad)


# --------------------------------------------------------------------------- research files


def test_a_json_lines_research_file_holds_the_pipelines_own_records(tmp_path):
    config = loans_config()
    good = labelled_loans(50, seed=2)
    bad = bad_loans()
    path = tmp_path / "loans.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in good[:20] + [record for record, _ in bad] + good[20:]) + "\n")

    window = read_research_file(path, config)

    same_window(window, good)
    assert window.n_invalid == len(bad) and sorted(window.invalid_examples) == sorted(reason for _, reason in bad)


def test_a_file_has_no_kafka_keys_so_a_line_number_is_the_key_of_an_id_taken_from_the_key(tmp_path):
    config = loans_config(id="$key")
    path = tmp_path / "loans.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in labelled_loans(3, seed=3)).replace("\n", "\n\n") + "\n")

    window = read_research_file(path, config)

    assert window.keys.tolist() == ["1", "3", "5"] and window.n_invalid == 0


def test_a_csv_research_file_stays_fairstreams_columns_whatever_the_mapping(tmp_path):
    config = loans_config()
    path = tmp_path / "loans.csv"
    path.write_text("id,age,income,amount,s,u,y\nA-1,37,52000,12000,female,north,1\nA-2,41,48000,9000,F,south,0\n")

    window = read_research_file(path, config)

    # Columns named by feature, s, u, y: the mapping's paths and value map do not apply ("F" is no group).
    assert window.keys.tolist() == ["A-1"] and window.X.tolist() == [[37.0, 52000.0, 12000.0]]
    assert window.y.tolist() == [1] and window.n_invalid == 1 and "not a configured group" in window.invalid_examples[0]


# --------------------------------------------------------------------------- end to end


def test_fairstream_refit_publishes_a_plan_fitted_on_the_loan_records_of_the_research_topic(broker, tmp_path,
                                                                                          capsys):
    config = loans_config(str(tmp_path / "artifacts"))
    ensure_topics(broker.bootstrap, config.topics)
    records = labelled_loans(2000, seed=4)
    to_research_topic(broker.bootstrap, config, records, [r["application_id"].encode() for r in records])
    toml = tmp_path / "loans.toml"
    toml.write_text(config.to_toml())
    args = refit_cli().parse_args(["refit", "--kind", "plan", "--config", str(toml), "--broker",
                                   f"kafka://{broker.bootstrap}", "--n-q", "50"])

    assert args.func(args) == 0

    assert "re-fit of plan: published plan v1" in capsys.readouterr().out
    (record,) = control_history(broker, config)
    published = DistributionalRepair.from_artifact(ArtifactStore(config.artifact_dir).get(record.sha256))
    # Offline: the same records as arrays, in key order, split and fitted as the trainer does (holdout 0.2, seed 0;
    # no posterior Pr[s | x, u]: the pipeline does not impute s).
    X, s, u, y, ids = arrays(records)
    window = ResearchWindow.of(X, s, u, keys=ids, y=y).in_key_order()
    fit_rows, _ = stratified_split(window.s, window.u, 0.2, 0)
    fit = window.subset(fit_rows)
    offline = DistributionalRepair(n_q=50, columns=FEATURES, posterior=False).fit(fit.X, fit.s, fit.u)
    # The fit ran in another process: its fitted arrays are compared to rounding (threads may sum in another order),
    # not its draws, which a last-bit change of a probability may move to a neighbouring bin.
    ours, theirs = offline.to_artifact().arrays, published.to_artifact().arrays
    assert ours.keys() == theirs.keys()
    for name in ours:
        if ours[name].dtype.kind == "f":
            np.testing.assert_allclose(theirs[name], ours[name], rtol=1e-9, atol=1e-12, err_msg=name)
        else:  # labels, counts, flags: exact
            np.testing.assert_array_equal(theirs[name], ours[name], err_msg=name)
    assert not np.array_equal(offline.transform(X, s, u, keys=ids), X)  # the plan repairs: the check can fail
