"""Hostile records through the worker's batch logic: impossible values, and ids that arrive twice."""

import json

import numpy as np
import pytest

from fairstream.repair import datasets
from fairstream.models.plan import DistributionalRepair
from fairstream.streams.codec.records import input_digest
from fairstream.streams.config import adult_config
from fairstream.streams.control.registry import Active
from fairstream.streams.worker.processing import RecordRepairer, SimpleMessage

CONFIG = adult_config()  # valid ranges: age [0, 120], hours-per-week [0, 168]


@pytest.fixture(scope="module")
def clamping_plan():
    research, _ = datasets.load("adult").split(5_000, seed=0)
    plan = DistributionalRepair(n_q=100, out_of_range="clamp").fit(research.X, research.s, research.u)
    return Active("plan", 2, "c" * 64, None, plan)


def message(rid, age, hours, s=0, u=1, offset=0) -> SimpleMessage:
    value = json.dumps({"id": rid, "features": {"age": age, "hours-per-week": hours}, "s": s, "u": u}).encode()
    return SimpleMessage(value, key=str(rid).encode(), topic="fairstream.records.in", offset=offset)


def test_an_impossible_value_is_dead_lettered_whatever_the_plan_policy(clamping_plan):
    messages = [message("huge", 1e308, 40), message("old", 100, 40), message("negative", 30, -2),
                message("fine", 30, 40)]
    outcome = RecordRepairer(CONFIG).process(messages, clamping_plan)
    letters = {k.decode(): json.loads(v) for k, v in outcome.dead}
    assert set(letters) == {"huge", "negative"}
    assert letters["huge"]["reason"] == ("feature 'age' value 1e+308 is outside its valid range [0, 120] "
                                         "(pipeline.valid_ranges)")
    assert "feature 'hours-per-week' value -2.0 is outside its valid range [0, 168]" in letters["negative"]["reason"]
    # A valid age above the research grid (Adult's oldest is 90) is still clamped by the plan and flagged.
    repaired = {json.loads(v)["id"]: json.loads(v) for _, v in outcome.repaired}
    assert set(repaired) == {"old", "fine"} and outcome.out_of_range == 1
    assert repaired["old"]["original"]["age"] == 100.0


def test_a_conflicting_id_is_told_apart_from_a_replay_by_the_input_digest(clamping_plan):
    first, conflicting = message("dup", 30, 40, offset=1), message("dup", 52, 60, s=1, offset=2)
    repairer = RecordRepairer(CONFIG)
    outcome = repairer.process([first, conflicting], clamping_plan)
    replayed = repairer.process([first], clamping_plan)  # at-least-once: the same message again
    out = [json.loads(v) for _, v in outcome.repaired]
    assert [o["id"] for o in out] == ["dup", "dup"] and {o["provenance"]["version"] for o in out} == {2}
    assert [o["input_digest"] for o in out] == [input_digest(first.value()), input_digest(conflicting.value())]
    assert out[0]["input_digest"] != out[1]["input_digest"]  # same (id, version): a conflict, not a replay
    assert replayed.repaired == outcome.repaired[:1]  # a replay is bit-identical, digest included
    letter = json.loads(repairer.process([message("dup", 1e308, 40)], clamping_plan).dead[0][1])
    assert letter["input_digest"] == input_digest(message("dup", 1e308, 40).value())
    assert np.unique([o["input_digest"] for o in out] + [letter["input_digest"]]).size == 3


def test_a_keyless_record_whose_id_has_no_utf8_text_is_dead_lettered_not_a_crash(clamping_plan):
    # json.loads keeps the lone surrogate; the output key of a keyless message (the id's UTF-8 text) raised,
    # and the batch, and every replay of it, failed.
    value = b'{"id": "\\ud800x", "features": {"age": 30, "hours-per-week": 40}, "s": 0, "u": 1}'
    outcome = RecordRepairer(CONFIG).process([SimpleMessage(value, key=None), message("after", 30, 40)],
                                             clamping_plan)
    assert [key for key, _ in outcome.repaired] == [b"after"]
    ((key, letter),) = outcome.dead
    assert key is None and json.loads(letter)["reason"].startswith("id must be Unicode text without lone surrogates")
