"""The worker's batch logic without a broker: records through the module protocol, imputed s, event times."""

import base64
import json
import time

import confluent_kafka
import numpy as np
import pytest

from fairstream.repair import datasets
from fairstream.models.plan import DistributionalRepair
from fairstream.repair.protocol import IncompatibleArtifact
from fairstream.streams.config import AgentConfig, ConfigError, adult_config
from fairstream.streams.control.registry import Active
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.worker.processing import RecordRepairer, Served, SimpleMessage, as_actives

IMPUTING = adult_config(records=AgentConfig(artifact="plan", missing_s="impute"))


@pytest.fixture(scope="module")
def adult():
    research, archive = datasets.load("adult").split(10_000, seed=0)
    plan = DistributionalRepair(n_q=100).fit(research.X, research.s, research.u)
    return archive.subset(slice(0, 400)), Active("plan", 3, "a" * 64, None, plan)


def messages(data, config, drop_s_every=0, prefix="r"):
    out = []
    for i, (key, value) in enumerate(record_messages(data, config, id_prefix=prefix)):
        record = json.loads(value)
        if drop_s_every and i % drop_s_every == 0:
            if i % (2 * drop_s_every):
                record["s"] = None  # explicit null
            else:
                del record["s"]  # absent
        out.append(SimpleMessage(json.dumps(record).encode(), key))
    return out


def outputs(outcome):
    return {json.loads(v)["id"]: json.loads(v) for _, v in outcome.repaired}


def test_missing_s_is_dead_lettered_by_default(adult):
    data, plan = adult
    config = adult_config()
    outcome = RecordRepairer(config).process(messages(data, config, drop_s_every=4), plan)
    reasons = [json.loads(v)["reason"] for _, v in outcome.dead]
    assert len(outcome.dead) == 100 and len(outcome.repaired) == 300
    assert all("missing field(s) ['s']" in r or "s value None is not a configured group" in r for r in reasons)
    assert all("s_imputed" not in r for r in outputs(outcome).values())


def test_an_imputing_input_repairs_records_without_s_and_says_so(adult):
    data, plan = adult
    outcome = RecordRepairer(IMPUTING).process(messages(data, IMPUTING, drop_s_every=4), plan)
    assert outcome.dead == [] and len(outcome.repaired) == 400 and outcome.imputed == 100
    out = outputs(outcome)
    imputed = {rid for rid, r in out.items() if r["s_imputed"]}
    assert len(imputed) == 100 and all(out[rid]["s"] is None for rid in imputed)
    assert all(r["s"] in (0, 1) for rid, r in out.items() if rid not in imputed)
    # The monitor sees only the records with their true s.
    assert len(outcome.monitor_batch) == 300 and set(outcome.monitor_batch.s.tolist()) <= {0, 1}


def test_the_imputed_draw_is_a_function_of_the_record_key_not_of_the_batch(adult):
    data, plan = adult
    batch = messages(data, IMPUTING, drop_s_every=2)
    whole = outputs(RecordRepairer(IMPUTING).process(batch, plan))
    reordered = batch[::-1][:150] + batch[150:][::3]
    part = outputs(RecordRepairer(IMPUTING).process(reordered, plan))
    assert part and all(part[rid] == whole[rid] for rid in part)


def test_a_plan_without_a_posterior_cannot_serve_an_imputing_pipeline(adult):
    data, _ = adult
    rng = np.random.default_rng(0)
    s, u = rng.integers(0, 2, 300), rng.integers(0, 2, 300)
    plan = DistributionalRepair(n_q=30, posterior=False).fit(rng.normal(size=(300, 2)) + s[:, None], s, u)
    with pytest.raises(IncompatibleArtifact, match="posterior"):
        plan.check_compatible(IMPUTING.schema())
    plan.check_compatible(adult_config().schema())


def test_missing_s_must_name_a_known_policy():
    with pytest.raises(ConfigError, match="missing_s must be 'dead_letter' or 'impute', got 'guess'"):
        AgentConfig(artifact="plan", missing_s="guess")


def with_ts(message: SimpleMessage, ts, timestamp_ms=None) -> SimpleMessage:
    """The message with its record's ts replaced (None: no ts) and a Kafka timestamp."""
    record = {k: v for k, v in json.loads(message.value()).items() if k != "ts"}
    return SimpleMessage(json.dumps(record if ts is None else {**record, "ts": ts}).encode(), message.key(),
                         timestamp=timestamp_ms)


def test_an_implausible_event_time_is_counted_and_the_monitor_files_the_record_at_its_arrival(adult):
    data, plan = adult
    config = adult_config()  # max_event_time_skew = 60 s
    now = time.time()
    sent = messages(data.subset(slice(0, 4)), config)
    batch = [with_ts(sent[0], now - 30),  # plausible: believed
             with_ts(sent[1], 1e15, timestamp_ms=int((now - 5) * 1000)),  # 30 million years ahead: its arrival
             with_ts(sent[2], -1e15, timestamp_ms=-1),  # long before the epoch, and no Kafka timestamp: now
             with_ts(sent[3], None, timestamp_ms=int((now - 3) * 1000))]  # no ts: its arrival, not counted
    outcome = RecordRepairer(config).process(batch, plan)
    assert len(outcome.repaired) == 4 and outcome.skewed == 2  # the consumer counts them once delivered
    ts = outcome.monitor_batch.ts
    assert ts[0] == now - 30 and ts[1] == pytest.approx(now - 5, abs=0.01) and ts[3] == pytest.approx(now - 3, abs=0.01)
    assert now <= ts[2] <= time.time()
    # The records themselves keep the ts they were sent with: it is the user's data.
    assert [json.loads(v).get("ts") for _, v in outcome.repaired] == [now - 30, 1e15, -1e15, None]
    assert outcome.event_times == [now - 30, 1e15, -1e15]  # the latency histogram skips the implausible itself


def kafka_message(value: bytes, key: bytes | None = None, offset: int = 0,
                  timestamp_ms: int | None = None) -> confluent_kafka.Message:
    """A message as the worker's consumer returns it (confluent-kafka), on partition 2 of the input topic."""
    stamp = ((confluent_kafka.TIMESTAMP_NOT_AVAILABLE, 0) if timestamp_ms is None
             else (confluent_kafka.TIMESTAMP_CREATE_TIME, timestamp_ms))
    return confluent_kafka.Message(topic="fairstream.records.in", partition=2, offset=offset, key=key, value=value,
                                   timestamp=stamp)


def test_the_batch_logic_reads_the_consumers_messages_through_their_methods(adult):
    data, plan = adult
    config = adult_config()
    now = time.time()
    sent = messages(data.subset(slice(0, 3)), config)
    stray = with_ts(sent[2], 1e15).value()  # implausible: filed at its Kafka timestamp
    batch = [kafka_message(sent[0].value(), b"k0", offset=10), kafka_message(sent[1].value(), None, offset=11),
             kafka_message(stray, b"k2", offset=12, timestamp_ms=int((now - 5) * 1000)),
             kafka_message(b"{not json", b"bad", offset=13)]
    outcome = RecordRepairer(config).process(batch, plan)
    keyless_id = json.loads(sent[1].value())["id"]
    assert [k for k, _ in outcome.repaired] == [b"k0", keyless_id.encode(), b"k2"]  # keyless: the id's text
    ((key, value),) = outcome.dead
    letter = json.loads(value)
    assert key == b"bad" and (letter["topic"], letter["partition"], letter["offset"]) == (
        "fairstream.records.in", 2, 13)
    assert base64.b64decode(letter["original_b64"]) == b"{not json" and letter["reason"].startswith("malformed JSON")
    assert outcome.skewed == 1 and outcome.monitor_batch.ts[2] == pytest.approx(now - 5, abs=0.01)
    # A test's SimpleMessage is read the same way, to the byte.
    same = [SimpleMessage(m.value(), m.key(), topic=m.topic(), partition=m.partition(), offset=m.offset(),
                          timestamp=None if m.timestamp()[0] == confluent_kafka.TIMESTAMP_NOT_AVAILABLE
                          else m.timestamp()[1]) for m in batch]
    again = RecordRepairer(config).process(same, plan)
    assert again.repaired == outcome.repaired and again.dead == outcome.dead


def test_every_repaired_value_read_back_is_the_plans_transform_bit_for_bit(adult):
    data, plan = adult
    config = adult_config()
    batch = [kafka_message(v, k, offset=i) for i, (k, v) in enumerate(record_messages(data, config, "exact"))]
    outcome = RecordRepairer(config).process(batch, plan)
    records = [json.loads(v) for _, v in outcome.repaired]
    rows = [int(r["id"].split("-")[1]) for r in records]
    assert len(records) + len(outcome.dead) == len(data) and len(records) > 0.9 * len(data)
    written = np.array([[r["features"][name] for name in config.features] for r in records])
    original = np.array([[r["original"][name] for name in config.features] for r in records])
    part = data.subset(np.array(rows))
    expected = plan.module.transform(part.X, part.s, part.u, keys=[r["id"] for r in records])
    assert written.tobytes() == np.asarray(expected, dtype=np.float64).tobytes()  # the promise: bit for bit
    assert original.tobytes() == np.asarray(part.X, dtype=np.float64).tobytes()


# --------------------------------------------------------------------------- a candidate chain in shadow


@pytest.fixture(scope="module")
def candidates():
    """A candidate plan fitted on younger people only, refusing older ones (out of its range), and a scorer."""
    from fairstream.models.scorer import LogisticScorer

    research, _ = datasets.load("adult").split(10_000, seed=0)
    young = research.subset(np.flatnonzero(research.X[:, 0] < 50))
    plan = DistributionalRepair(n_q=100, out_of_range="reject", posterior=False).fit(young.X, young.s, young.u)
    scorer = LogisticScorer().fit(research.X, research.y)
    return Active("plan", 4, "c" * 64, None, plan), Active("scorer", 1, "d" * 64, None, scorer)


def same_arrays(a, b, names=("before", "after", "s", "u", "keys", "ts", "y", "out_of_range", "decision", "score")):
    return all((getattr(a, n) is None and getattr(b, n) is None) or
               np.asarray(getattr(a, n)).tobytes() == np.asarray(getattr(b, n)).tobytes() for n in names)


def test_a_candidate_in_shadow_leaves_the_outputs_bit_for_bit_and_is_measured_on_the_same_records(adult, candidates):
    data, plan = adult
    candidate, _ = candidates
    config = adult_config()
    batch = messages(data, config)
    alone = RecordRepairer(config).process(batch, plan)
    shadowed = RecordRepairer(config).process(batch, Served((plan,), (candidate,)))
    assert shadowed.repaired == alone.repaired and shadowed.dead == alone.dead and len(alone.repaired) > 300
    assert same_arrays(shadowed.monitor_batch, alone.monitor_batch)
    assert alone.candidate_batch is None and alone.candidate_refused == 0
    # What the candidate alone makes of the records, row for row; the older people it refuses are counted.
    own = RecordRepairer(config).process(batch, candidate).monitor_batch
    assert same_arrays(shadowed.candidate_batch, own, names=("before", "after", "s", "u", "keys", "y", "out_of_range"))
    older = int((alone.monitor_batch.before[:, 0] >= 50).sum())
    assert shadowed.candidate_refused == len(alone.monitor_batch) - len(own) > 0 and older > 0
    assert set(shadowed.candidate_batch.keys.tolist()) <= set(alone.monitor_batch.keys.tolist())
    same_records = np.isin(alone.monitor_batch.keys, shadowed.candidate_batch.keys)
    assert not np.array_equal(shadowed.candidate_batch.after, alone.monitor_batch.after[same_records])


def test_a_served_chain_without_a_candidate_is_its_active_chain(adult):
    data, plan = adult
    config = adult_config()
    batch = messages(data.subset(slice(0, 50)), config)
    served = RecordRepairer(config).process(batch, Served((plan,), None))
    assert as_actives(Served((plan,), None)) == (plan,) and served.candidate_batch is None
    assert served.repaired == RecordRepairer(config).process(batch, plan).repaired


def test_a_candidate_chain_carries_its_own_scores_and_decisions(adult, candidates):
    data, plan = adult
    candidate, scorer = candidates
    config = adult_config(records=AgentConfig(artifact=("plan", "scorer")))
    batch = messages(data, config)
    alone = RecordRepairer(config).process(batch, (plan, scorer))
    shadowed = RecordRepairer(config).process(batch, Served((plan, scorer), (candidate, scorer)))
    assert shadowed.repaired == alone.repaired and shadowed.dead == alone.dead
    own = RecordRepairer(config).process(batch, (candidate, scorer)).monitor_batch
    measured = shadowed.candidate_batch
    assert measured.decision is not None and measured.score is not None
    assert same_arrays(measured, own, names=("after", "keys", "decision", "score"))
    same_records = np.isin(alone.monitor_batch.keys, measured.keys)
    assert not np.array_equal(measured.score, alone.monitor_batch.score[same_records])


class Raising:
    """A candidate module whose apply fails with an error outside the module protocol's (a bug, memory)."""

    def __init__(self, inner, error):
        self.inner, self.error = inner, error

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def apply(self, batch):
        raise self.error


@pytest.mark.parametrize("error", [TypeError("bug"), RuntimeError("oops"), MemoryError()])
def test_a_candidate_that_raises_never_fails_the_batch_and_refuses_every_record(adult, candidates, error, caplog):
    data, plan = adult
    broken = Active("plan", 4, "c" * 64, None, Raising(candidates[0].module, error))
    config = adult_config()
    batch = messages(data.subset(slice(0, 100)), config)
    alone = RecordRepairer(config).process(batch, plan)
    repairer = RecordRepairer(config)
    with caplog.at_level("ERROR", logger="fairstream.streams.worker.processing"):
        shadowed = [repairer.process(batch, Served((plan,), (broken,))) for _ in range(2)]
    for outcome in shadowed:  # the active chain's outputs, bit for bit, delivered
        assert outcome.repaired == alone.repaired and outcome.dead == alone.dead and len(outcome.repaired) > 90
        assert same_arrays(outcome.monitor_batch, alone.monitor_batch)
        assert outcome.candidate_batch is None and outcome.candidate_refused == len(alone.monitor_batch)
        assert outcome.candidate_failed.startswith(type(error).__name__)
    assert len(caplog.records) == 1 and "plan version 4 failed in shadow" in caplog.records[0].getMessage()
