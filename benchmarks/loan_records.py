"""The loan records of issue 31 for the benchmarks: a team's own topic, with and without 40 pass-through fields.

``loan_record(i, extra=40)`` is the issue's loan application (``application_id``, ``submitted_at``, ``applicant``
{``age``, ``income``, ``sex``}, ``amount``, ``channel``, ``branch``) with ``extra`` fields the mapping does not name
(strings, integers, floats, booleans, a nested object, an array; about 2 KB a record with 40, 174 bytes with none).
``envelope_record(i)`` holds the same values in fairstream's own envelope, for the baseline; ``loan_config`` is the
pipeline of either, ``loan_plan`` the plan both serve, ``avro_schema`` the Avro schema a producer would register.
"""

from __future__ import annotations

import json

import numpy as np

from fairstream.models.plan import DistributionalRepair
from fairstream.streams.config import PipelineConfig

FEATURES = ("age", "income", "amount")
LOAN_TOPIC = "loan-applications"
_WORDS = ("north", "south", "web", "branch", "mobile", "partner", "renewal", "retail", "campaign", "standard")


def _extra(i: int, k: int):
    """The k-th pass-through field of record i (its name and value; the types cycle)."""
    word = _WORDS[(i + k) % len(_WORDS)]
    kind = k % 6
    if kind == 0:
        return f"note_{k:02d}", f"{word} application reference {i:08d}-{k:02d}, received by the {word} desk"
    if kind == 1:
        return f"count_{k:02d}", (i * 7919 + k * 104729) % 1_000_003
    if kind == 2:
        return f"ratio_{k:02d}", round(((i * 31 + k) % 997) / 997, 6)
    if kind == 3:
        return f"flag_{k:02d}", (i + k) % 2 == 0
    if kind == 4:
        return f"origin_{k:02d}", {"system": f"crm-{word}", "batch": (i + k) % 500, "checked": (i + k) % 3 == 0}
    return f"tags_{k:02d}", [word, f"tier-{(i + k) % 4}", "v2", "reviewed"]


def loan_record(i: int, extra: int = 40, seed: int = 0) -> dict:
    """Loan application ``i``: the issue's record (income and amount depend on the applicant's sex) and ``extra``
    pass-through fields after it."""
    rng = np.random.default_rng((seed, i))
    female = bool(rng.random() < 0.5)
    record = {"application_id": f"A-{i}", "submitted_at": "2026-11-28T10:00:00Z",
              "applicant": {"age": int(rng.integers(20, 70)),
                            "income": int(rng.normal(45000 if female else 55000, 8000)), "sex": "F" if female else "M"},
              "amount": int(rng.normal(11000 if female else 13000, 2000)), "channel": "web",
              "branch": "north" if i % 3 else "south"}
    record.update(_extra(i, k) for k in range(extra))
    return record


def envelope_record(i: int, seed: int = 0) -> dict:
    """The same application in fairstream's envelope (``id``, ``ts``, ``s``, ``u``, ``features``)."""
    loan = loan_record(i, extra=0, seed=seed)
    return {"id": loan["application_id"], "ts": 1795860000.0,
            "features": {"age": loan["applicant"]["age"], "income": loan["applicant"]["income"],
                         "amount": loan["amount"]},
            "s": "female" if loan["applicant"]["sex"] == "F" else "male", "u": loan["branch"]}


def messages(n: int, kind: str, start: int = 0, prefix: str = "A") -> list[tuple[bytes, bytes]]:
    """``n`` (key, JSON value) pairs: ``kind`` is "envelope", "loan" (no extra field) or "loan2k" (40 extra)."""
    out = []
    for i in range(start, start + n):
        if kind == "envelope":
            record = envelope_record(i)
            record["id"] = f"{prefix}-{i}"
            key = record["id"]
        else:
            record = loan_record(i, extra=40 if kind == "loan2k" else 0)
            record["application_id"] = key = f"{prefix}-{i}"
        out.append((key.encode(), json.dumps(record).encode()))
    return out


def loan_config(mapped: bool = True, repaired: str = "under", fmt: str = "json", registry_url: str = "",
                topics: dict | None = None, **pipeline) -> PipelineConfig:
    """The loan pipeline: with ``mapped``, the team's records read by the mapping (``[output] repaired``); without,
    the same features, groups and strata in fairstream's envelope."""
    table = {"pipeline": {"name": "loans", "features": list(FEATURES), "groups": ["female", "male"],
                          "strata": ["north", "south"], **pipeline},
             "topics": {**(topics or {}), **({"format": fmt} if fmt != "json" else {})}}
    if mapped:
        table["mapping"] = {"id": "application_id", "time": {"path": "submitted_at", "format": "iso8601"},
                            "s": {"path": "applicant.sex", "values": {"F": "female", "M": "male"}},
                            "u": {"path": "branch", "default": "north"},
                            "features": {"age": "applicant.age", "income": "applicant.income", "amount": "amount"}}
        table["output"] = {"repaired": repaired, "field": "fairstream", "provenance": "field"}
    if registry_url:
        table["schema_registry"] = {"url": registry_url}
    return PipelineConfig.from_dict(table)


def loan_plan(n: int = 4000) -> DistributionalRepair:
    """A plan fitted on ``n`` research applications (other ids than the benchmark's)."""
    records = [loan_record(i, extra=0, seed=1) for i in range(n)]
    X = np.array([[r["applicant"]["age"], r["applicant"]["income"], r["amount"]] for r in records], dtype=float)
    s = np.array(["female" if r["applicant"]["sex"] == "F" else "male" for r in records], dtype=object)
    u = np.array([r["branch"] for r in records], dtype=object)
    return DistributionalRepair(n_q=250).fit(X, s, u)


def _avro_type(value, name: str):
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return {"type": "array", "items": _avro_type(value[0], name)}
    return {"type": "record", "name": f"R_{name}", "fields": [{"name": k, "type": _avro_type(v, f"{name}_{k}")}
                                                              for k, v in value.items()]}


def avro_schema(record: dict) -> dict:
    """The Avro record schema of a loan record as its producer would register it (the fields in their order)."""
    return {"type": "record", "name": "LoanApplication", "namespace": "com.example.loans",
            "fields": [{"name": k, "type": _avro_type(v, k)} for k, v in record.items()]}
