"""No output of the worker's batch logic is anything but JSON, and no single input or output stops a batch.

An embedding ``group`` of NaN, Infinity or 1e999 was repaired and written as ``{"group":NaN}``; a group nested
2,000 deep made every batch holding it raise; a plan whose grid overflows wrote ``inf`` into
``records.repaired``; rows the embedding module refused went out with their input vector as if repaired.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fairstream.models.embedding import FairnessModule
from fairstream.repair import datasets
from fairstream.models.plan import DistributionalRepair
from fairstream.streams.config import EmbeddingConfig, adult_config
from fairstream.streams.control.registry import Active
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.worker.processing import EmbeddingRepairer, RecordRepairer, SimpleMessage

CONFIG = adult_config(embeddings=EmbeddingConfig(dimension=4))


def strict_json(value: bytes):
    """json.loads as a non-Python consumer reads: NaN and Infinity are not JSON."""
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")
    return json.loads(value.decode("utf-8"), parse_constant=refuse)


def embedding(rid: str, group: str, vector=(0.5, 0.5, 0.5, 0.5), identity: str = "") -> SimpleMessage:
    text = '{"id":"%s","vector":[%s],"group":%s%s}' % (rid, ",".join(map(str, vector)), group, identity)
    return SimpleMessage(text.encode(), key=rid.encode())


def dead_reasons(outcome) -> dict:
    """Dead-letter reason by the Kafka key of the input."""
    return {key.decode(): json.loads(value)["reason"] for key, value in outcome.dead}


def test_an_embedding_group_that_is_not_a_label_is_dead_lettered_and_every_output_is_json():
    messages = [embedding("nan", "NaN"), embedding("inf", "Infinity"), embedding("big", "1e999"),
                embedding("nested", '{"x":[NaN]}'), embedding("deep", "[" * 2000 + "]" * 2000),
                embedding("fine", '"a"', identity=',"identity":7'), embedding("int", "1")]
    outcome = EmbeddingRepairer(CONFIG).process(messages)
    for _, value in outcome.repaired + outcome.dead:
        strict_json(value)
    assert sorted(json.loads(v)["id"] for _, v in outcome.repaired) == ["fine", "int"]
    why = dead_reasons(outcome)
    assert why["nan"] == "group must be an integer or a string, got nan"
    assert why["big"] == why["inf"] == "group must be an integer or a string, got inf"
    assert why["nested"] == "group must be an integer or a string, got a JSON object"
    assert why["deep"].startswith("malformed JSON: maximum recursion depth exceeded")
    assert outcome.labelled[1:] == ((7,), ("a",), ("fine",))


def test_rows_the_embedding_module_refuses_are_dead_lettered_not_sent_with_their_input_vector():
    # Weights of 1e300 overflow on some rows only (relu leaves the others untouched): the chain refuses those
    # rows, and their input vector must not go out as if it were their repaired one.
    d, hidden = 4, 3
    module = FairnessModule(w1=np.full((hidden, d), 1e300), b1=np.zeros(hidden), w2=np.full((d, hidden), 1e300),
                            b2=np.zeros(d))
    active = Active("embedding", 1, "e" * 64, None, module)
    messages = [embedding("up", "0", (1, 0, 0, 0), ',"identity":1'), embedding("down", "0", (-1, 0, 0, 0),
                                                                                ',"identity":2'),
                embedding("side", "1", (0, 1, 0, 0), ',"identity":3')]
    outcome = EmbeddingRepairer(CONFIG).process(messages, active)
    assert [json.loads(v)["id"] for _, v in outcome.repaired] == ["down"]
    assert set(dead_reasons(outcome)) == {"up", "side"}
    assert all("non-finite" in reason for reason in dead_reasons(outcome).values())
    assert outcome.labelled[1:] == ((2,), (0,), ("down",))  # only what was sent feeds the verification monitor
    for _, value in outcome.repaired + outcome.dead:
        strict_json(value)


@pytest.fixture(scope="module")
def overflowing_plan():
    """A plan whose grids start at 1e308 with steps of 1e308 (built directly: load refuses such an artifact)."""
    research, archive = datasets.load("adult").split(2_000, seed=0)
    plan = DistributionalRepair(n_q=30).fit(research.X, research.s, research.u)
    plan.grid_start_ = np.full_like(plan.grid_start_, 1e308)
    plan.grid_step_ = np.full_like(plan.grid_step_, 1e308)
    with np.errstate(over="ignore"):
        plan.grid_stop_ = plan.grid_start_ + plan.grid_step_ * (plan.grid_size_ - 1)
    return archive.subset(slice(0, 200)), Active("plan", 2, "o" * 64, None, plan)


def test_a_plan_whose_output_overflows_writes_only_json_and_dead_letters_those_records(overflowing_plan):
    data, plan = overflowing_plan
    config = adult_config()
    messages = [SimpleMessage(v, k) for k, v in record_messages(data, config, id_prefix="o")]
    outcome = RecordRepairer(config).process(messages, plan)
    assert len(outcome.repaired) + len(outcome.dead) == len(messages) and outcome.dead and outcome.repaired
    for _, value in outcome.repaired + outcome.dead:
        strict_json(value)
    assert all("non-finite" in r or "JSON cannot carry" in r for r in dead_reasons(outcome).values())
    assert np.isfinite(outcome.monitor_batch.after).all() and len(outcome.monitor_batch) == len(outcome.repaired)
