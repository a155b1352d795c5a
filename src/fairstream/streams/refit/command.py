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

from fairstream.models.kinds import capabilities
from fairstream.streams.parsing import parse_duration

from .job import RefitJob, format_outcome
from .options import add_trainer_arguments, collect_options, foreign_option, fraction_arg, non_negative_arg, \
    positive_int_arg, seed_arg, trainer_params
from .schedule import run_every
from .service import RefitService
from .sources import research_source, resolve_source
from .trainers import TrainerError, configured_chain, refit_kinds, trainer_class
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


_EPILOG = """\
examples:
  fairstream refit --kind plan                         re-fit once on the last 10000 research records
  fairstream refit --kind flow --lam 0.5               re-fit the flow in front of the published scorer
  fairstream refit --kind embedding --source faces.npz re-fit the embedding module on labelled vectors
  fairstream refit --kind scorer --method ftm          re-fit the scorer of the chain (FTM)
  fairstream refit --kind thresholds --constraint dp   re-fit the group thresholds after the scorer
  fairstream refit --source research.jsonl             re-fit once on a file (JSON lines or CSV)
  fairstream refit --every 6h                          re-fit every 6 hours until stopped
  fairstream refit --serve --min-interval 10m          answer the monitor's requests on refit.requests
  fairstream refit --serve --webhook-port 9095         also answer Alertmanager's drift alerts

A plan is published only when no plan is active or when its E on the holdout is at most
(1 + tolerance) times the current plan's; a flow only when its DP gap (of the scorer's decisions)
is at most (1 + tolerance) times the current flow's (or the scorer alone's) plus 0.01 and its
accuracy at most --max-accuracy-drop lower (scorers and thresholds likewise, by their fairness
figure: MDP or DP gap; the --constraint's gap, the worst stratum's by default, see --scope); an
embedding module only when its BFAR at --far on held-out identities is at most (1 + tolerance)
times the current module's (or the identity's) and its FNMR at most one point worse. Otherwise
the reason, with both numbers, is printed.
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
    kinds = refit_kinds()
    parser = subparsers.add_parser(
        "refit", help=f"fit, validate and publish a new {', '.join(kinds[:-1])} or {kinds[-1]} module "
                      "(once, on a schedule, or on request)",
        # Line breaks by hand: the raw formatter keeps the epilog's example table aligned.
        description="Fit a new artifact on a labelled research window, validate it against the active one\n"
                    "on a holdout part of the window, and publish it on the control topic if it is not\n"
                    "worse; every worker then hot-swaps it.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(parser)
    parser.add_argument("--kind", choices=kinds, default=None,
                        help="artifact kind to re-fit (default: the first kind of the config's record chain)")
    parser.add_argument("--source", default="topic", metavar="topic|PATH",
                        help="research window: 'topic' for the pipeline's research topic (default), or a file of "
                             "records.in JSON lines or a CSV with the feature columns, s and u")
    parser.add_argument("--last", type=positive_int_arg, default=10_000, metavar="N",
                        help="with --source topic: use the latest N valid records (default: 10000)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--every", type=_duration_arg, metavar="DURATION",
                      help="re-fit now and then every DURATION (90s, 5m, 6h, 1h30m) until stopped")
    mode.add_argument("--serve", action="store_true",
                      help="answer re-fit requests from refit.requests until stopped (de-duplicated, coalesced)")
    parser.add_argument("--min-interval", type=_duration_arg, default=300.0, metavar="DURATION",
                        help="with --serve: at least this long between the end of one re-fit and the next (default: 5m)")
    parser.add_argument("--holdout", type=fraction_arg, default=0.2, metavar="FRACTION",
                        help="fraction of every (u, s) cell held out for validation (default: 0.2)")
    parser.add_argument("--tolerance", type=non_negative_arg, default=0.1, metavar="FRACTION",
                        help="refuse a candidate whose compared holdout figure (a plan's E, a gap, a BFAR) exceeds "
                             "the current module's by more than this fraction (default: 0.1)")
    parser.add_argument("--seed", type=seed_arg, default=0, metavar="SEED",
                        help="seed of the holdout split and the training, an integer in [0, 2**64) (default: 0)")
    add_webhook_arguments(parser)
    parser.add_argument("--key", metavar="FILE", help="the private key (NAME.key) that signs the service's publishes "
                                                      "(publisher role) and its webhook's requests (requester role); "
                                                      "default: the file $FAIRSTREAM_KEY names")
    add_trainer_arguments(parser, _trainers())
    parser.set_defaults(func=functools.partial(run_refit_command, broker_context=broker_context, load_config=load_config))
    return parser


def run_refit_command(args: argparse.Namespace, broker_context: Callable, load_config: Callable) -> int:
    """The handler of ``fairstream refit`` (bound by :func:`add_refit_parser`)."""
    from fairstream.streams.control.gate import unsigned_warning
    from fairstream.streams.control.signing import Signer
    from fairstream.streams.control.store import ArtifactStore
    from fairstream.streams.topics import ensure_topics

    if not logging.getLogger().handlers:
        # A service or a schedule logs what it does; a single re-fit prints its outcome, so only problems are logged.
        level = logging.INFO if args.serve or args.every else logging.WARNING
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = load_config(args)
    kind = args.kind or config.refit_kind
    if kind is None:  # a monitor-only pipeline: refused before anything connects
        raise TrainerError(f"agents.records.artifact = {list(config.records.chain)} only monitors what the records "
                           "carry: there is nothing to re-fit (--kind names an embedding kind to re-fit)")
    # Refused in one line before anything connects: an option of another kind, the webhook's options and token
    # file, a research file's errors (a file is read once here), a source an embedding re-fit cannot use and a
    # kind the pipeline's chain does not apply (its module would never be served).
    params = trainer_options(kind, args)
    token = webhook_token_from_args(args)
    if args.source != "topic" or capabilities(kind).agent == "embeddings":
        resolve_source(research_source(args.source, "", config, args.last, kind=kind))
    configured_chain(config, kind)
    signer = Signer.from_option(args.key)
    with broker_context(args) as broker:
        ensure_topics(broker.bootstrap, config.topics)
        job = RefitJob(config, broker.bootstrap, ArtifactStore(config.artifact_dir), kind=kind, holdout=args.holdout,
                       tolerance=args.tolerance, seed=args.seed, signer=signer, **params)
        warning = unsigned_warning(job.control.authority)
        if warning is not None and (args.serve or args.every):
            log.warning(warning)
        source = research_source(args.source, broker.bootstrap, config, args.last, kind=kind)
        if args.serve or args.every:
            with _stop_on_signals() as stop:
                if args.serve:
                    service = RefitService(job, source, min_interval_seconds=args.min_interval, triggers=args.triggers)
                    with webhook_from_args(args, broker.bootstrap, config, kind, token, signer=signer):
                        service.serve(stop)
                else:
                    run_every(job, source, args.every, stop, on_outcome=lambda o: print(format_outcome(o), flush=True))
            return 0
        outcome = job.run_once(source, trigger="command")
        print(format_outcome(outcome))
    return 0 if outcome.published or outcome.candidate_value is not None else 1


def _trainers() -> list[type]:
    """The trainer of every re-fittable kind, whose options the command offers."""
    return [trainer_class(kind) for kind in refit_kinds()]


def trainer_options(kind: str, args: argparse.Namespace) -> dict:
    """The options of ``kind``'s trainer set on the command line; one of another kind's is a TrainerError."""
    cls = trainer_class(kind)
    problem = foreign_option(cls, args, collect_options(_trainers()))
    if problem:
        raise TrainerError(problem)
    return trainer_params(cls, args)


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
