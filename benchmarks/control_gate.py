"""What the control plane's checks cost a reader: a trail of signed records admitted through the gate, against the same
trail unsigned and against the version rule alone, measured in the same run.

A worker replays the whole control topic at start, then admits each new record as it comes; the figures say how long a
replay of N records takes and what one record costs, for small decisions and for publishes carrying an inline artifact.

    .venv/bin/python benchmarks/control_gate.py --records 2000
"""

from __future__ import annotations

import argparse
import base64
import os
import time

from fairstream.streams.control.gate import GENESIS, Authority, record_hash, seal
from fairstream.streams.control.records import VersionLedger, decision_record
from fairstream.streams.control.signing import Signer, generate_key, public_key_text
from fairstream.streams.control.trust import Trust
from fairstream.streams.schemas import ControlRecord

PIPELINE = "bench.control"


def trail(n: int, signer: Signer | None, blob_bytes: int) -> list[tuple[ControlRecord, bytes]]:
    """``n`` records: candidate publishes (each with an inline blob of ``blob_bytes``) and their approvals, chained."""
    blob = base64.b64encode(os.urandom(blob_bytes)).decode() if blob_bytes else None
    sealed, head = [], GENESIS
    for i in range(n):
        version = i // 2 + 1
        sha = f"{version:064x}"
        record = (ControlRecord("plan", version, sha, blob_b64=blob, path=None if blob else "p", candidate=True,
                                actor="refit@bench") if i % 2 == 0 else
                  decision_record("plan", version, sha, "approve", "Chief Risk Officer", reason="reviewed"))
        placed, _, value = seal(record, head, PIPELINE, signer)
        sealed.append((placed, value))
        head = record_hash(value)
    return sealed


def admit_all(sealed, authority: Authority | None) -> float:
    """Seconds to admit every record in order (``authority`` None: the version rule alone)."""
    ledger = VersionLedger()
    gate = None if authority is None else authority.gate()
    started = time.perf_counter()
    for offset, (record, value) in enumerate(sealed):
        refusal = ledger.admit(record, offset) if gate is None else gate.admit(record, value, offset, ledger).refusal
        assert refusal is None, refusal
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    signer = Signer("refit@bench", generate_key())
    roles = '["publisher", "approver"]'
    trust = Trust.parse(f'[keys."refit@bench"]\npublic_key = "{public_key_text(signer.key)}"\nroles = {roles}\n', "t")
    for blob_bytes, what in ((0, "records by path (decisions and publishes, ~400 B)"),
                             (12_000, "publishes with a 16 kB inline artifact, and their approvals")):
        signed, unsigned = trail(args.records, signer, blob_bytes), trail(args.records, None, blob_bytes)
        best = {name: min(admit_all(records, authority) for _ in range(args.repeats))
                for name, records, authority in (("version rule alone", unsigned, None),
                                                 ("gate, unsigned pipeline", unsigned, Authority(promotion="approve",
                                                                                                 pipeline=PIPELINE)),
                                                 ("gate, signed pipeline", signed, Authority(trust, "approve",
                                                                                             PIPELINE)))}
        base = best["version rule alone"]
        print(f"{args.records} {what}:")
        for name, seconds in best.items():
            print(f"  {name:<26} {seconds * 1e3:8.1f} ms  {seconds / args.records * 1e6:7.1f} us/record  "
                  f"{seconds / base:6.1f}x the version rule alone")


if __name__ == "__main__":
    main()
