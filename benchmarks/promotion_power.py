"""The shadow policy's error rates: false promotions under equal fairness, look by look, and its power.

Runs the simulation of ``tests/streams/agent/test_promotion.py`` (the product's own ``verdict``, the default
``ShadowConfig()``: first look at 2,000 paired records, alpha 0.05, cap 200,000) with more repetitions: two groups
(shares 0.35 / 0.65), correlated chains (the candidate decides as the active chain does except that each decision
is re-drawn with probability 0.1), a look every 500 records.

- **Equal fairness**: the candidate equals the active chain in distribution (the true gap is identical), for active
  rates 0.30 / 0.22 (a DP gap of 0.08), 0.26 / 0.26 (none) and 0.40 / 0.20 (0.2). Printed: the cumulative share of
  repetitions promoted by each look (every 2,000 records shown, the largest over every look), to ``--records``.
- **Power**: the candidate narrows the 0.08 gap by 0.01, 0.02 and 0.05. Printed: the share promoted by the cap, the
  median and 90th percentile of the records it took, the share retired and the share still undecided.

    .venv/bin/python benchmarks/promotion_power.py [--repetitions 2000] [--records 40000]

About 1 minute on a 2-core machine with the defaults (one verdict takes about 0.1 ms).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: the tests' simulation

from fairstream.streams.agent.promotion import PROMOTE, RETIRE, WAIT  # noqa: E402
from fairstream.streams.config import ShadowConfig  # noqa: E402
from tests.streams.agent.test_promotion import (  # noqa: E402
    ACTIVE_RATES,
    BLOCK,
    improved,
    promoted_by_look,
    simulate,
)

GAPS = {"gap 0.08": ACTIVE_RATES, "no gap": (0.26, 0.26), "gap 0.2": (0.40, 0.20)}
IMPROVEMENTS = (0.01, 0.02, 0.05)


def false_promotions(repetitions: int, records: int) -> None:
    """The cumulative share promoted by each look, for each gap size, with the candidate exactly as fair."""
    config = ShadowConfig()
    looks = range(config.min_records, records + 1, BLOCK)
    shares = {}
    for name, rates in GAPS.items():
        actions, when = simulate(repetitions, rates, records=records, active_rates=rates)
        shares[name] = promoted_by_look(actions, when, looks)
    print(f"equal fairness, {repetitions} repetitions, alpha {config.alpha:g}: share promoted by each look")
    print("records  " + "  ".join(f"{name:>9}" for name in GAPS))
    for i, look in enumerate(looks):
        if look % 2000 == 0:
            print(f"{look:7d}  " + "  ".join(f"{shares[name][i]:9.4f}" for name in GAPS))
    print("largest  " + "  ".join(f"{shares[name].max():9.4f}" for name in GAPS))


def power(repetitions: int) -> None:
    """The share promoted by the cap and the records it took, for each improvement of the 0.08 gap."""
    config = ShadowConfig()
    print(f"\npower, {repetitions} repetitions, up to the cap ({config.max_records} records), gap 0.08 narrowed by:")
    print("improvement  promoted  median records  90th percentile  retired  undecided")
    for improvement in IMPROVEMENTS:
        actions, when = simulate(repetitions, improved(ACTIVE_RATES, improvement), records=config.max_records,
                                 seed=1)
        promoted = when[actions == PROMOTE]
        median, p90 = (np.percentile(promoted, q) if len(promoted) else np.nan for q in (50, 90))
        print(f"{improvement:11.2f}  {np.mean(actions == PROMOTE):8.4f}  {median:14.0f}  {p90:15.0f}  "
              f"{np.mean(actions == RETIRE):7.4f}  {np.mean(actions == WAIT):9.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=2000, help="repetitions of each scenario")
    parser.add_argument("--records", type=int, default=40_000, help="paired records simulated under equal fairness")
    args = parser.parse_args()
    start = time.perf_counter()
    false_promotions(args.repetitions, args.records)
    power(args.repetitions)
    print(f"\n{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
