"""``fairstream``: the command line. Each subcommand is a small function; heavy imports stay inside them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _cmd_repair(args: argparse.Namespace) -> int:
    from .batch import BatchRepairConfig, format_report, run_batch_repair

    config = BatchRepairConfig(dataset=args.dataset, features=tuple(args.features.split(",")) if args.features else None,
                               n_research=args.n_research, n_q=args.n_q, repair_amount=args.repair_amount,
                               seed=args.seed, bins=args.bins, out=Path(args.out))
    report = run_batch_repair(config, progress=not args.quiet)
    print(format_report(report))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fairstream",
        description="Repair unfairness in data while it streams: fit optimal-transport repair plans offline, "
                    "apply them to Kafka streams, monitor fairness and re-fit on drift.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    rep = sub.add_parser("repair", help="batch job: fit a plan on a research split, repair the archive, report E",
                         description="Fit a distributional OT repair plan on a labelled research split of a data set, "
                                     "repair the rest (the archive) with the frozen plan, print the dependence E per "
                                     "feature before/after (with the estimator's noise floor), save the plan artifact "
                                     "and a PNG of the group-conditional distributions.")
    rep.add_argument("--dataset", default="adult", help="adult, compas, german, crime, law, health or simulation (default: adult)")
    rep.add_argument("--features", help="comma-separated feature columns (default: the data set's defaults)")
    rep.add_argument("--n-research", type=int, default=10_000, help="rows in the research split (default: 10000)")
    rep.add_argument("--n-q", type=int, default=250, help="grid nodes per stratum and feature (default: 250)")
    rep.add_argument("--repair-amount", type=float, default=1.0, help="0 = identity, 1 = full repair (default: 1)")
    rep.add_argument("--seed", type=int, default=0, help="seed of the research/archive split (default: 0)")
    rep.add_argument("--bins", type=int, default=30, help="histogram bins of the E estimator (default: 30)")
    rep.add_argument("--out", default="runs/adult-repair", help="output folder (default: runs/adult-repair)")
    rep.add_argument("--quiet", action="store_true", help="no progress bar")
    rep.set_defaults(func=_cmd_repair)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
