"""A mapped pipeline's batch logic without a broker: keys, headers and partitions follow the input; dead letters keep
the bytes and name the path."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from fairstream.models.plan import DistributionalRepair
from fairstream.repair import datasets
from fairstream.streams.codec.mapped import PROVENANCE_HEADER
from fairstream.streams.config import adult_config
from fairstream.streams.control.registry import Active
from fairstream.streams.worker.processing import RecordRepairer, SimpleMessage
from tests.streams.codec.test_mapped import LOAN, loan, loans_config


@pytest.fixture(scope="module")
def plan():
    rng = np.random.default_rng(0)
    n = 2000
    X = np.column_stack([rng.integers(20, 70, n), rng.normal(50000, 8000, n), rng.normal(12000, 2000, n)])
    s = np.where(rng.random(n) < 0.5, "female", "male").astype(object)
    u = np.where(rng.random(n) < 0.5, "north", "south").astype(object)
    return Active("plan", 4, "d" * 64, None, DistributionalRepair(n_q=50).fit(X, s, u))


def messages() -> list[SimpleMessage]:
    records = [loan(application_id=f"A-{i}", amount=10000 + 100 * i) for i in range(4)]
    records[2]["applicant"] = {"age": 30, "income": 1}  # no sex
    return [SimpleMessage(json.dumps(r).encode(), key=f"k-{i}".encode() if i != 1 else None, topic="loan-applications",
                          partition=i % 3, offset=i, headers=[("trace", f"t{i}".encode())] if i != 3 else None)
            for i, r in enumerate(records)]


@pytest.mark.parametrize("provenance", ["field", "headers"])
def test_outputs_follow_their_input_and_dead_letters_name_the_path(plan, provenance):
    config = loans_config({"repaired": "under", "provenance": provenance})
    sent = messages()
    outcome = RecordRepairer(config).process(sent, plan)
    assert [key for key, _ in outcome.repaired] == [b"k-0", b"A-1", b"k-3"]  # a keyless input: its id's text
    headers = [headers for headers, _ in outcome.routes]
    assert [partition for _, partition in outcome.routes] == [0, 1, 0]
    if provenance == "headers":
        assert [h[:-1] for h in headers] == [[("trace", b"t0")], [("trace", b"t1")], []]
        assert all(h[-1][0] == PROVENANCE_HEADER and json.loads(h[-1][1])["version"] == 4 for h in headers)
    else:
        assert headers == [[("trace", b"t0")], [("trace", b"t1")], None]
    outputs = [json.loads(value) for _, value in outcome.repaired]
    assert [{k: v for k, v in out.items() if k != "fairstream"} for out in outputs] == \
        [json.loads(sent[i].value()) for i in (0, 1, 3)]
    assert ("provenance" in outputs[0]["fairstream"]) == (provenance == "field")
    ((key, letter),) = outcome.dead
    letter = json.loads(letter)
    assert key == b"k-2" and letter["reason"] == "missing field applicant.sex (mapping.s)"
    assert base64.b64decode(letter["original_b64"]) == sent[2].value()
    assert outcome.monitor_batch is not None and len(outcome.monitor_batch) == 3


def test_only_a_mapped_pipeline_routes_its_outputs(plan):
    outcome = RecordRepairer(loans_config()).process([SimpleMessage(json.dumps(LOAN).encode(), key=b"k")], plan)
    assert outcome.routes == [(None, 0)] and outcome.repaired[0][0] == b"k"
    envelope = adult_config()
    value = json.dumps({"id": 1, "features": {"age": 30, "hours-per-week": 40}, "s": 0, "u": 1}).encode()
    research = datasets.load("adult").split(2000, seed=0)[0]
    adult_plan = Active("plan", 1, "e" * 64, None, DistributionalRepair(n_q=50).fit(research.X, research.s,
                                                                                     research.u))
    outcome = RecordRepairer(envelope).process([SimpleMessage(value, key=b"k")], adult_plan)
    assert len(outcome.repaired) == 1 and outcome.routes is None
