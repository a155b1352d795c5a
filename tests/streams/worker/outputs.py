"""Reading what a pipeline produced, for the integration tests of the worker."""

from __future__ import annotations

import base64
import json
import time
from typing import Callable

from fairstream.streams.demo.collect import TopicReader
from fairstream.streams.demo.replay import replay


def send(bootstrap: str, config, messages, rate=None) -> None:
    """Replay ``messages`` to the pipeline's input, all acknowledged."""
    assert replay(bootstrap, config.topics.records_in, messages, rate=rate, progress=False) == len(messages)


def collect_outputs(bootstrap: str, config, ids: set, timeout: float, alive: Callable[[], str | None] = lambda: None
                    ) -> tuple[dict, dict]:
    """Every repaired record and dead letter for ``ids`` (lists keep duplicates), once all came out.

    ``alive()`` returns None while the workers run, else what to show (a log tail) when one died.
    """
    repaired, dead = {}, {}
    with TopicReader(bootstrap, config.topics.records_repaired) as rep, TopicReader(bootstrap, config.topics.dlq) as dlq:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not ids <= (repaired.keys() | dead.keys()):
            for m in rep.poll():
                record = json.loads(m.value)
                if record["id"] in ids:
                    repaired.setdefault(record["id"], []).append(record)
            for m in dlq.poll():
                letter = json.loads(m.value)
                rid = base64.b64decode(letter["key_b64"]).decode() if letter.get("key_b64") else None
                if rid in ids:
                    dead.setdefault(rid, []).append(letter)
            died = alive()
            assert died is None, died
    missing = ids - repaired.keys() - dead.keys()
    assert not missing, f"{len(missing)} ids never came out, e.g. {sorted(missing)[:5]}"
    return repaired, dead
