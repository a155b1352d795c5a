"""Replay a data set onto ``records.in``: records as the pipeline expects them, plus bad ones on demand.

``fairstream replay --dataset adult --rate 2000`` sends the archive part of a data set as JSON
records keyed by id, with a kafka-python producer at a target rate and a progress bar. Bad records
of every kind the worker must dead-letter can be mixed in, to exercise the dead-letter path.
``--research`` sends the labelled research split to the ``research`` topic instead, where re-fits
read it (what the labelling process does in production).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Iterator

import numpy as np
from tqdm import tqdm

from fairstream.repair.datasets import Dataset
from fairstream.streams.config import PipelineConfig
from fairstream.streams.kafka import KAFKA_API_VERSION, kafka_python_options

log = logging.getLogger(__name__)


def replay_part(data: Dataset, n_research: int | None, seed: int, research: bool = False) -> Dataset:
    """What ``fairstream replay`` sends: the archive (the rows outside the research split), or the research split.

    ``n_research`` None is the data set's default split (:func:`default_research_rows`); 0 sends every row as
    archive. Raises ValueError (naming ``--n-research``) for a split that leaves nothing to send.
    """
    from .batch_job import default_research_rows  # here: the batch job's module imports matplotlib

    n_research = default_research_rows(len(data)) if n_research is None else n_research
    if research and n_research <= 0:
        raise ValueError(f"--research sends the research split, but --n-research is {n_research}")
    if not 0 <= n_research < len(data):
        raise ValueError(f"--n-research {n_research} must be at least 0 and leave an archive: "
                         f"{data.name} has {len(data)} rows")
    if n_research == 0:
        return data
    return data.split(n_research, seed=seed)[0 if research else 1]


def record_messages(data: Dataset, config: PipelineConfig, id_prefix: str, start_ts: float | None = None,
                    spacing: float = 0.0) -> list[tuple[bytes, bytes]]:
    """(key, value) pairs for every row of ``data``; the key is the record id.

    Event times ``ts`` start at ``start_ts`` (default: now, on the wall clock, so the worker's
    latency histogram measures event time to output) and advance by ``spacing`` seconds per record.
    """
    start_ts = time.time() if start_ts is None else start_ts
    if list(data.feature_names) != list(config.features):
        raise ValueError(f"data set features {list(data.feature_names)} differ from the pipeline's {list(config.features)}")
    ids = [f"{id_prefix}-{i}" for i in range(len(data))]
    rows = data.X.tolist()
    ys = data.y.tolist() if data.y is not None else [None] * len(data)
    messages = []
    for i, (rid, row, s, u, y) in enumerate(zip(ids, rows, data.s.tolist(), data.u.tolist(), ys)):
        record = {"id": rid, "ts": start_ts + i * spacing, "features": dict(zip(config.features, row)), "s": s, "u": u}
        if config.label and y is not None:
            record["y"] = y
        messages.append((rid.encode(), json.dumps(record).encode()))
    return messages


def bad_messages(config: PipelineConfig, count: int, id_prefix: str = "bad", seed: int = 0) -> list[tuple[bytes, bytes]]:
    """``count`` invalid messages cycling through every kind of bad input the worker must dead-letter."""
    f0, *rest = config.features
    good = {name: 1.0 for name in config.features}
    kinds = [
        lambda rid: b"{not json " + rid.encode(),
        lambda rid: b"",
        lambda rid: json.dumps({"id": rid, "features": good, "s": config.groups[0]}).encode(),  # missing u
        lambda rid: json.dumps({"id": rid, "features": good, "s": config.groups[0], "u": config.strata[0], "extra": 1}).encode(),
        lambda rid: json.dumps({"id": rid, "features": {**good, f0: "abc"}, "s": config.groups[0], "u": config.strata[0]}).encode(),
        lambda rid: json.dumps({"id": rid, "features": {**good, f0: float("nan")}, "s": config.groups[0], "u": config.strata[0]}).encode(),
        lambda rid: json.dumps({"id": rid, "features": good, "s": "no-such-group", "u": config.strata[0]}).encode(),
        lambda rid: json.dumps({"id": rid, "features": {f0: 1.0}, "s": config.groups[0], "u": config.strata[0]}).encode() if rest else b"[]",
        lambda rid: json.dumps({"id": rid, "features": good, "s": config.groups[0], "u": config.strata[0],
                                "ts": "x" * config.max_message_bytes}).encode(),  # oversized
        lambda rid: json.dumps({"id": rid, "features": {**good, f0: 1e12}, "s": config.groups[0], "u": config.strata[0]}).encode(),
    ]
    order = np.random.default_rng(seed).permutation(count) % len(kinds)
    return [(f"{id_prefix}-{i}".encode(), kinds[k](f"{id_prefix}-{i}")) for i, k in enumerate(order)]


def interleave(good: list, bad: list, seed: int = 0) -> list:
    """``bad`` messages scattered at random positions among ``good`` ones (order within each kept)."""
    is_bad = np.zeros(len(good) + len(bad), dtype=bool)
    is_bad[np.random.default_rng(seed).choice(len(is_bad), size=len(bad), replace=False)] = True
    good_it, bad_it = iter(good), iter(bad)
    return [next(bad_it) if b else next(good_it) for b in is_bad]


def paced(items: list, rate: float | None) -> Iterator:
    """Yield items no faster than ``rate`` per second (None: as fast as possible)."""
    start = time.monotonic()
    for i, item in enumerate(items):
        if rate:
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        yield item


def replay(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]], rate: float | None = None,
           progress: bool = True) -> int:
    """Send ``messages`` with a kafka-python producer; returns how many were acknowledged."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, batch_size=256 * 1024, acks=1,
                             max_request_size=4 * 1024 * 1024, api_version=KAFKA_API_VERSION, **kafka_python_options())
    try:
        futures = [producer.send(topic, key=k, value=v)
                   for k, v in tqdm(paced(messages, rate), total=len(messages), desc=f"replay -> {topic}",
                                    unit="rec", disable=not progress)]
        producer.flush()
        failed = [f for f in futures if not f.succeeded()]
        if failed:  # say why, once: "sent 345 of 2000" alone reads like a short data set
            log.warning("%d of %d records were not acknowledged by the broker at %s: %s", len(failed), len(futures),
                        bootstrap, failed[0].exception or "no answer")
        return len(futures) - len(failed)
    finally:
        producer.close()
