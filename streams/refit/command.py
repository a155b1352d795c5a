"""The ``fairstream refit`` command: once, on a schedule, or as a service.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import signal
import threading
from typing import TYPE_CHECKING, Callable, Iterator

from fairstream.streams.parsing import parse_duration

from .job import REFIT_KINDS, RefitJob, format_outcome
from .schedule import run_every
from .service import RefitService
from .sources import research_source, resolve_source
from .webhook import add_webhook_arguments, webhook_from_args, webhook_token_from_args

if TYPE_CHECKING:
    from fairstream.streams.config import PipelineConfig

log = logging.getLogger(__name__)
# =============================================================================== command line


def _duration_arg(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _fraction_arg(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a fraction strictly between 0 and 1, got {text}")
    return value


def _non_negative_arg(text: str) -> float:
    value = float(text)
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _positive_int_arg(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


_EPILOG = """\
examples:
  fairstream refit --kind plan                         re-fit once on the last 10000 research records
  fairstream refit --kind flow --lam 0.5               re-fit the flow in front of the published scorer
  fairstream refit --kind embedding --source faces.npz re-fit the embedding module on labelled vectors
  fairstream refit --kind scorer --method ftm          re-fit the scorer at the end of the chain (FTM)
  fairstream refit --source research.jsonl             re-fit once on a file (JSON lines or CSV)
  fairstream refit --every 6h                          re-fit every 6 hours until stopped
  fairstream refit --serve --min-interval 10m          answer the monitor's requests on refit.requests
  fairstream refit --serve --webhook-port 9095         also answer Alertmanager's drift alerts

A plan is published only when no plan is active or when its E on the holdout is at most
(1 + tolerance) times the current plan's; a flow only when its DP gap (of the scorer's decisions)
is at most (1 + tolerance) times the current flow's (or the scorer alone's) plus 0.01 and its
accuracy at most --max-accuracy-drop lower; an embedding module only when its BFAR at --far on
held-out identities is at most (1 + tolerance) times the current module's (or the identity's) and
its FNMR at most one point worse. Otherwise the reason, with both numbers, is printed.
A single re-fit exits 0 when a candidate was trained and validated (published, or refused with its
numbers), 1 when none could be (an empty or too small window, a chain module not yet published, no
labels): a script or a CronJob then sees that the research data or the chain needs attention.
"""


def add_refit_parser(subparsers, broker_context: Callable, add_common: Callable[[argparse.ArgumentParser], None],
                     load_config: Callable[[argparse.Namespace], "PipelineConfig"]) -> argparse.ArgumentParser:
    """Add ``fairstream refit`` to the CLI's subparsers.

    ``broker_context(args)`` is a context manager yielding an object with ``.bootstrap`` (the CLI's
    ``_broker``: a re-fit never starts a broker, it stops in one line when none is found), ``add_common(parser)`` adds ``--broker``/``--run-dir``/``--config`` (the CLI's
    ``_add_common``) and ``load_config(args)`` reads the pipeline (the CLI's ``_config``).
    """
    parser = subparsers.add_parser(
        "refit", help="fit, validate and publish a new plan, flow or embedding module (once, on a schedule, "
                      "or on request)",
        # Line breaks by hand: the raw formatter keeps the epilog's example table aligned.
        description="Fit a new artifact on a labelled research window, validate it against the active one\n"
                    "on a holdout part of the window, and publish it on the control topic if it is not\n"
                    "worse; every worker then hot-swaps it.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(parser)
    parser.add_argument("--kind", choices=REFIT_KINDS, default=None,
                        help="artifact kind to re-fit (default: the first kind of the config's record chain)")
    parser.add_argument("--source", default="topic", metavar="topic|PATH",
                        help="research window: 'topic' for the pipeline's research topic (default), or a file of "
                             "records.in JSON lines or a CSV with the feature columns, s and u")
    parser.add_argument("--last", type=_positive_int_arg, default=10_000, metavar="N",
                        help="with --source topic: use the latest N valid records (default: 10000)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--every", type=_duration_arg, metavar="DURATION",
                      help="re-fit now and then every DURATION (90s, 5m, 6h, 1h30m) until stopped")
    mode.add_argument("--serve", action="store_true",
                      help="answer re-fit requests from refit.requests until stopped (de-duplicated, coalesced)")
    parser.add_argument("--min-interval", type=_duration_arg, default=300.0, metavar="DURATION",
                        help="with --serve: at least this long between the end of one re-fit and the next (default: 5m)")
    parser.add_argument("--holdout", type=_fraction_arg, default=0.2, metavar="FRACTION",
                        help="fraction of every (u, s) cell held out for validation (default: 0.2)")
    parser.add_argument("--tolerance", type=_non_negative_arg, default=0.1, metavar="FRACTION",
                        help="refuse a candidate whose holdout E exceeds the current plan's by more than this "
                             "fraction (default: 0.1)")
    parser.add_argument("--n-q", type=_positive_int_arg, default=250, metavar="N", help="grid nodes per stratum and feature (default: 250)")
    parser.add_argument("--out-of-range", choices=("clamp", "reject"), default="clamp",
                        help="what the new plan does with values outside its grid (default: clamp)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the holdout split and the training (default: 0)")
    flows = parser.add_argument_group("flows (--kind flow)")
    flows.add_argument("--lam", type=_fraction_arg, default=0.5, metavar="WEIGHT",
                       help="AdapFair's trade-off: lam * cross-entropy + (1 - lam) * fairness (default: 0.5)")
    flows.add_argument("--notion", choices=("dp", "eopp", "eo"), default="dp",
                       help="fairness notion the flow is trained and validated on (default: dp)")
    flows.add_argument("--steps", type=_positive_int_arg, default=200, metavar="N", help="Adam steps (default: 200)")
    flows.add_argument("--max-accuracy-drop", type=_non_negative_arg, default=0.02, metavar="POINTS",
                       help="refuse a flow or scorer whose holdout accuracy is lower than the current one's by more "
                            "(default: 0.02)")
    scorers = parser.add_argument_group("scorers (--kind scorer)")
    scorers.add_argument("--method", choices=("ftm", "otf", "reg", "norm", "unconstrained", "logistic"), default="ftm",
                         help="training method: FTM (matched DP), OTF (optimal-transport fairness), the Reg and "
                              "norm-penalty baselines, or none (default: ftm)")
    scorers.add_argument("--weight", type=_non_negative_arg, default=1.0, metavar="LAMBDA",
                         help="the fairness term's weight (ftm, reg: lambda; otf, norm: alpha in [0, 1]) (default: 1)")
    add_webhook_arguments(parser)
    embeddings = parser.add_argument_group("embedding modules (--kind embedding)")
    embeddings.add_argument("--epochs", type=_positive_int_arg, default=20, metavar="N",
                            help="training epochs of the Fairness Module (default: 20)")
    embeddings.add_argument("--far", type=_fraction_arg, default=1e-4, metavar="RATE",
                            help="the global false accept rate the module is validated at (default: 1e-4)")
    parser.set_defaults(func=functools.partial(run_refit_command, broker_context=broker_context, load_config=load_config))
    return parser


def run_refit_command(args: argparse.Namespace, broker_context: Callable, load_config: Callable) -> int:
    """The handler of ``fairstream refit`` (bound by :func:`add_refit_parser`)."""
    from fairstream.streams.control.store import ArtifactStore
    from fairstream.streams.topics import ensure_topics

    if not logging.getLogger().handlers:
        # A service or a schedule logs what it does; a single re-fit prints its outcome, so only problems are logged.
        level = logging.INFO if args.serve or args.every else logging.WARNING
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = load_config(args)
    kind = args.kind or config.refit_kind
    token = webhook_token_from_args(args)  # the webhook's options and token file, before anything connects
    if args.source != "topic" or kind == "embedding":  # a file is read once before anything connects: its errors
        # (and a source an embedding re-fit cannot use) come first, in one line
        resolve_source(research_source(args.source, "", config, args.last, kind=kind))
    with broker_context(args) as broker:
        ensure_topics(broker.bootstrap, config.topics)
        job = RefitJob(config, broker.bootstrap, ArtifactStore(config.artifact_dir), kind=kind, holdout=args.holdout,
                       tolerance=args.tolerance, seed=args.seed, **trainer_params(kind, args))
        source = research_source(args.source, broker.bootstrap, config, args.last, kind=kind)
        if args.serve or args.every:
            with _stop_on_signals() as stop:
                if args.serve:
                    service = RefitService(job, source, min_interval_seconds=args.min_interval, triggers=args.triggers)
                    with webhook_from_args(args, broker.bootstrap, config, kind, token):
                        service.serve(stop)
                else:
                    run_every(job, source, args.every, stop, on_outcome=lambda o: print(format_outcome(o), flush=True))
            return 0
        outcome = job.run_once(source)
        print(format_outcome(outcome))
    return 0 if outcome.published or outcome.candidate_value is not None else 1


def trainer_params(kind: str, args: argparse.Namespace) -> dict:
    """The command-line options of ``kind``'s trainer."""
    if kind == "plan":
        return dict(n_q=args.n_q, out_of_range=args.out_of_range)
    if kind == "flow":
        return dict(lam=args.lam, notion=args.notion, n_steps=args.steps, max_accuracy_drop=args.max_accuracy_drop)
    if kind == "embedding":
        return dict(epochs=args.epochs, far=args.far)
    if kind == "scorer":
        return dict(method=args.method, lam=args.weight, max_accuracy_drop=args.max_accuracy_drop)
    return {}


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGTERM (Kubernetes stopping the pod) or Ctrl-C, so loops end between re-fits."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
