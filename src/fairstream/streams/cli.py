"""``fairstream``: the command line. Each subcommand is a small function; heavy imports stay inside them.

A user's mistake (a bad config, an unknown data set, a missing file, an unreachable broker, a
taken port) is reported in one line on stderr with exit status 1; the traceback is shown only with
``--debug`` (or ``FAIRSTREAM_DEBUG=1``), and for anything else, which is a bug.

The broker: ``--broker URL``, else ``$FAIRSTREAM_BROKER``, else the running embedded broker announced
in the user's runtime directory (whatever the current directory). Only ``broker start``, ``worker``
and ``demo`` start one when there is none; every other command then stops with a line saying how to
get one. Config and files are checked before any broker is looked for.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from pathlib import Path


def _cmd_repair(args: argparse.Namespace) -> int:
    from fairstream.repair.datasets import DATASET_NAMES
    from fairstream.streams.demo.batch_job import (
        BatchRepairConfig,
        format_report,
        run_batch_repair,
    )

    if args.dataset not in DATASET_NAMES:  # before the progress bar: the error is then the only line
        raise CliError(f"unknown dataset {args.dataset!r}; valid names: {', '.join(DATASET_NAMES)}")
    config = BatchRepairConfig(dataset=args.dataset, features=tuple(args.features.split(",")) if args.features else None,
                               n_research=args.n_research, n_q=args.n_q, repair_amount=args.repair_amount,
                               seed=args.seed, bins=args.bins, out=Path(args.out))
    try:
        report = run_batch_repair(config, progress=not args.quiet)
    except ValueError as exc:
        if not str(exc).startswith("--n-research"):  # the job's own check of that option; anything else is a bug
            raise
        raise CliError(str(exc)) from None
    print(format_report(report))
    return 0


DEFAULT_CONFIG = "deploy/pipeline.adult.toml"


class CliError(Exception):
    """A mistake in what the user asked for; reported in one line."""


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that are the user's to fix (input, config, files, broker, ports), not bugs."""
    types: list[type[BaseException]] = [CliError, FileNotFoundError, PermissionError, IsADirectoryError,
                                        NotADirectoryError, TimeoutError]
    for module, names in (("fairstream.streams.config", ["ConfigError"]),
                          ("fairstream.repair.artifacts", ["ArtifactError"]),
                          ("fairstream.repair.datasets", ["RepairInputError"]),
                          ("fairstream.streams.topics", ["TopicConfigError"]),
                          ("fairstream.streams.init_config", ["InitError"]),
                          ("fairstream.streams.codec.refit_requests", ["RefitRequestError"]),
                          ("fairstream.streams.refit.webhook", ["WebhookConfigError"]),
                          ("fairstream.streams.kafka", ["KafkaSecurityError"]),
                          ("fairstream.streams.refit.trainers", ["TrainerError"]),
                          ("fairstream.streams.refit.sources", ["ResearchFileError"]),
                          ("fairstream.streams.control.records", ["ControlError"]),
                          ("fairstream.streams.control.signing", ["SignatureError"]),
                          ("fairstream.streams.control.trust", ["TrustError"]),
                          ("fairstream.streams.ops.broker", ["BrokerError"]),
                          ("fairstream.streams.worker.metrics", ["MetricsPortError"]),
                          ("aiokafka.errors", ["KafkaError"]), ("kafka.errors", ["KafkaError"])):
        try:
            imported = __import__(module, fromlist=names)
        except ImportError:  # an extra that is not installed cannot have raised
            continue
        types += [getattr(imported, name) for name in names]
    return tuple(types)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    named = text.startswith(type(exc).__name__) or type(exc).__module__.startswith("fairstream")
    return text if named or isinstance(exc, CliError) else f"{type(exc).__name__}: {text}"


def _quiet_client_logs() -> None:
    """Kafka clients log a connection failure before raising it; without --debug the one-line error says it all."""
    import logging

    for name in ("aiokafka", "kafka"):
        # A handler stops Python's last-resort stderr output; configured handlers (worker, refit) still get their
        # warnings and errors, not their INFO lines (subscriptions, connections: --debug shows them).
        logging.getLogger(name).addHandler(logging.NullHandler())
        logging.getLogger(name).setLevel(logging.WARNING)


def _config(args: argparse.Namespace):
    """The pipeline config; its ``[kafka]`` security (under the environment) then applies to every client."""
    from .config import PipelineConfig, adult_config
    from .kafka import ClientSecurity, use

    config = PipelineConfig.from_toml(args.config) if args.config else adult_config()
    use(ClientSecurity.resolve(config.kafka))
    return config


NO_BROKER = "no broker: start one with 'fairstream broker start' (or pass --broker URL / set FAIRSTREAM_BROKER)"


@contextlib.contextmanager
def _broker(args: argparse.Namespace, may_start: bool = False):
    """The broker a command talks to: ``--broker``, else ``$FAIRSTREAM_BROKER``, else the running embedded broker.

    With none of them, ``worker`` and ``demo`` (``may_start``) start an embedded broker and announce it
    in the state file while they run; every other command stops with :data:`NO_BROKER`.
    """
    from fairstream.streams.ops.broker import EmbeddedBroker, ExternalBroker, parse_broker_url

    url, origin = _broker_url(args)
    if url:
        try:
            address = parse_broker_url(url)
        except ValueError as exc:
            raise CliError(f"{origin}: {exc}") from None
        yield ExternalBroker(address)
        return
    if not may_start:
        raise CliError(NO_BROKER)
    with EmbeddedBroker(Path(args.run_dir) / "broker", announce=True) as broker:
        print(f"started an embedded broker at {broker.url} (logs in {broker.log_path}); other commands use it "
              f"while this {args.command} runs", file=sys.stderr)
        yield broker


def _broker_url(args: argparse.Namespace) -> tuple[str | None, str]:
    """The URL of the broker to use and where it came from (for an error naming it), or (None, "")."""
    from fairstream.streams.ops.broker import running_broker, state_path

    if args.broker:
        return args.broker, "--broker"
    if os.environ.get("FAIRSTREAM_BROKER"):
        return os.environ["FAIRSTREAM_BROKER"], "FAIRSTREAM_BROKER"
    state = running_broker()
    return (state.url, str(state_path())) if state else (None, "")


def _cmd_broker(args: argparse.Namespace) -> int:
    from fairstream.streams.ops.broker import EmbeddedBroker

    if args.action != "start":
        return _stop_or_status(args)
    _refuse_second_broker()
    with EmbeddedBroker(Path(args.run_dir) / "broker", port=args.port, announce=True) as broker:
        return _serve_in_foreground(broker, "embedded Kafka-compatible broker", broker.log_path, "broker")


def _serve_in_foreground(broker, what: str, logs, command: str) -> int:
    """Say where the announced ``broker`` is, then block until it exits, Ctrl-C or ``fairstream COMMAND stop``."""
    from fairstream.streams.ops.broker import state_path

    print(f"{what} at {broker.bootstrap} ({broker.url}); logs: {logs}")
    print(f"every fairstream command without --broker uses it, from any directory ({state_path()}); "
          f"Ctrl-C or 'fairstream {command} stop' stops it", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        broker.wait()
    return 0


def _stop_or_status(args: argparse.Namespace) -> int:
    """``broker``/``kafka`` ``stop`` and ``status``: of whichever local broker is announced (embedded or Kafka)."""
    from fairstream.streams.ops.broker import running_broker, state_path, stop_running_broker

    if args.action == "stop":
        stopped = stop_running_broker(timeout=30.0)
        print(f"stopped {stopped.name} at {stopped.url} (pid {', '.join(map(str, (stopped.pid, *stopped.peers)))})"
              if stopped else "no running local broker")
        return 0
    state = running_broker() or _wait_for_broker(args.wait)
    if state is None:
        print("no running local broker" + (f" after waiting {args.wait:g} s" if args.wait else ""))
        return 1
    print(state.url)  # alone on stdout: --broker "$(fairstream broker status)" works
    print(f"{state.name}, pid {state.pid}, logs in {state.log} (announced in {state_path()})", file=sys.stderr)
    return 0


def _refuse_second_broker() -> None:
    from fairstream.streams.ops.broker import running_broker

    if (state := running_broker()) is not None:
        raise CliError(f"{state.name} already runs at {state.url} (pid {state.pid}) and every command uses it; "
                       "'fairstream broker stop' stops it")


def _cmd_kafka(args: argparse.Namespace) -> int:
    from fairstream.streams.ops.kafka_cluster import KAFKA_VERSION, KafkaCluster, fetch_kafka

    if args.action == "fetch":
        print(fetch_kafka())
        return 0
    if args.action != "start":
        return _stop_or_status(args)
    _refuse_second_broker()
    print(f"starting Apache Kafka {KAFKA_VERSION} ({args.brokers} KRaft node{'s' * (args.brokers > 1)}; fetched "
          "through Maven the first time)", file=sys.stderr, flush=True)
    with KafkaCluster(Path(args.run_dir) / "kafka", nodes=args.brokers, announce=True) as cluster:
        return _serve_in_foreground(cluster, f"Apache Kafka {KAFKA_VERSION}", f"{cluster.run_dir}/node-*/", "kafka")


def _cmd_schema_registry(args: argparse.Namespace) -> int:
    from fairstream.streams.ops.schema_registry import REGISTRY_VERSION, SchemaRegistry, fetch_registry

    if args.action == "fetch":
        print(fetch_registry())
        return 0
    print(f"starting Apicurio Registry {REGISTRY_VERSION} (in-memory storage; fetched through Maven the first time)",
          file=sys.stderr, flush=True)
    with SchemaRegistry(Path(args.run_dir) / "schema-registry", port=args.port) as registry:
        print(f"Schema Registry (Confluent-compatible API) at {registry.url}; logs: {registry.log_path}")
        print(f"a pipeline with [topics] format = \"avro\" takes [schema_registry] url = \"{registry.url}\"; "
              "Ctrl-C stops it (its schemas live in memory: they go with it)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            registry.wait()
    return 0


def _wait_for_broker(seconds: float):
    """The running broker's state once it has announced itself (a ``broker start &`` still starting), or None."""
    from fairstream.streams.ops.broker import running_broker

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if (state := running_broker()) is not None:
            return state
    return None


def _cmd_worker(args: argparse.Namespace) -> int:
    from fairstream.streams.worker.app import create_app, run_worker

    from .topics import ensure_topics

    config = _config(args)
    if args.metrics_port is not None:  # per worker: several workers on one host need several ports
        config = config.with_monitor(metrics_port=args.metrics_port)
    datadir = Path(args.run_dir) / "faust-data"
    datadir.mkdir(parents=True, exist_ok=True)  # a fresh --run-dir is created, not a FileNotFoundError
    with _broker(args, may_start=True) as broker:
        if args.supervise:  # the broker is resolved here, so every restarted worker talks to the same one
            from fairstream.streams.ops.supervise import Supervisor, worker_argv

            return Supervisor(worker_argv(args.config, broker.url, args.run_dir, args.app_id, args.metrics_port,
                                          args.loglevel, args.debug), max_restarts=args.max_restarts).run()
        ensure_topics(broker.bootstrap, config.topics)
        app = create_app(config, broker.bootstrap, app_id=args.app_id, datadir=str(datadir))
        run_worker(app, loglevel=args.loglevel)
    return 0


def _cmd_monitor(args: argparse.Namespace) -> int:
    from fairstream.streams.agent.service import run_agent
    from fairstream.streams.control.signing import Signer

    from .topics import ensure_topics

    config = _config(args)
    with _broker(args, may_start=False) as broker:
        ensure_topics(broker.bootstrap, config.topics)
        run_agent(config, broker.bootstrap, app_id=args.app_id, metrics_port=args.metrics_port,
                  signer=Signer.from_option(args.key))
    return 0


def _port_arg(text: str) -> int | str:
    if text == "off":
        return text
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port 0-65535 (0 = any free port) or 'off', got {text!r}")
    return port


def _whole_number(least: int):
    """An argparse type: a whole number >= ``least``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {least}, got {text!r}")
        return value
    return parse


_positive_int = _whole_number(1)
_count = _whole_number(0)


def _seconds(positive: bool):
    """An argparse type: a finite number of seconds, > 0 (``positive``) or >= 0."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
            raise argparse.ArgumentTypeError(f"expected a number {'>' if positive else '>='} 0, got {text!r}")
        return value
    return parse


def _cmd_replay(args: argparse.Namespace) -> int:
    from fairstream.repair import datasets
    from fairstream.streams.demo.replay import (
        bad_messages,
        interleave,
        record_messages,
        replay,
        replay_part,
    )

    from .topics import ensure_topics

    if args.limit is not None and args.bad > args.limit:
        raise CliError(f"--bad {args.bad} exceeds --limit {args.limit} (the records sent at most, the bad ones included)")
    if args.research and args.bad:
        raise CliError("--bad mixes invalid records into records.in; --research sends only the labelled research split")
    config = _config(args)
    data = datasets.load(args.dataset, features=config.features) if args.dataset != "simulation" else datasets.load("simulation")
    id_prefix = args.id_prefix or (f"{args.dataset}-research" if args.research else args.dataset)
    try:
        part = replay_part(data, args.n_research, args.seed, research=args.research)
        messages = record_messages(part.subset(slice(0, args.limit - args.bad)) if args.limit is not None else part, config,
                                   id_prefix=id_prefix)
    except ValueError as exc:  # the split leaves nothing to send, or the data set's features are not the pipeline's
        raise CliError(f"--dataset {args.dataset}: {exc}") from None
    if args.bad:
        messages = interleave(messages, bad_messages(config, args.bad, id_prefix=f"{id_prefix}-bad"), seed=args.seed)
    topic = config.topics.research if args.research else config.topics.records_in
    with _broker(args) as broker:
        ensure_topics(broker.bootstrap, config.topics)
        sent = replay(broker.bootstrap, topic, messages, rate=args.rate, progress=not args.quiet)
    print(f"sent {sent} of {len(messages)} records to {topic}")
    return 0 if sent == len(messages) else 1


def _cmd_tail(args: argparse.Namespace) -> int:
    from fairstream.streams.demo.collect import TopicReader, last_messages

    from .topics import existing_topics

    config = _config(args)
    topics = {spec.name for spec in config.topics.specs()}
    topic = config.topics.name(args.topic) if config.topics.name(args.topic) in topics else args.topic
    with _broker(args) as broker:
        if topic not in existing_topics(broker.bootstrap):  # asked through the admin API: a typo creates no topic
            suffixes = ", ".join(name.removeprefix(f"{config.topics.prefix}.") for name in sorted(topics))
            raise CliError(f"no topic {topic!r} on {broker.url}; the pipeline's topics (under the prefix "
                           f"{config.topics.prefix!r}): {suffixes}")
        with TopicReader(broker.bootstrap, topic, must_exist=True) as reader:
            messages = last_messages(reader, args.n, args.timeout)
    for message in messages:
        print((message.value or b"").decode("utf-8", errors="replace"))
    if len(messages) < args.n:
        from fairstream.streams.ops.broker import is_kafka_ready

        # A broker that went away mid-wait looks like a quiet topic: say which of the two it was.
        gone = not any(is_kafka_ready(host, port) for host, port in broker.address.hosts)
        print(f"fairstream tail: only {len(messages)} of {args.n} records on {topic} within {args.timeout:g} s"
              + (f" (the broker at {broker.url} does not answer any more)" if gone else ""), file=sys.stderr)
        return 1
    return 0


def _cmd_init(args: argparse.Namespace) -> int:
    from .init_config import check_config, infer_config, render_toml

    if (args.samples is None) == (args.from_topic is None):
        raise CliError("give one source of sample records: a JSON-lines FILE or --from-topic NAME")
    if args.samples is not None:
        records, keys, name = _file_samples(Path(args.samples), args.n), None, Path(args.samples).stem
    else:
        (records, keys), name = _topic_samples(args), args.from_topic
    inferred = infer_config(records, keys, s=args.s, u=args.u, label=args.label, name=args.name or name,
                            input_topic=args.from_topic)
    text = render_toml(inferred)
    check_config(text)  # what init writes, a worker reads
    if args.out is None:
        print(text, end="")
        return 0
    Path(args.out).write_text(text, encoding="utf-8")
    print(f"wrote {args.out} from {inferred.records} sample records: check each role and the lines marked CHECK, "
          f"then 'fairstream worker --config {args.out}'", file=sys.stderr)
    return 0


def _file_samples(path: Path, n: int) -> list[dict]:
    """The first ``n`` records of a JSON-lines file (blank lines skipped; a leading byte-order mark, as Windows
    tools write one, too)."""
    from .init_config import parse_samples

    lines = [(number, line) for number, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), 1)
             if line.strip()][:n]
    return parse_samples([line for _, line in lines], [f"{path} line {number}" for number, _ in lines])


def _topic_samples(args: argparse.Namespace) -> tuple[list[dict], list]:
    """The last ``-n`` records of ``--from-topic`` and their Kafka keys, read without joining a consumer group."""
    from fairstream.streams.demo.collect import TopicReader, UnknownTopicError, last_messages

    from .init_config import parse_samples

    topic = args.from_topic
    with _broker(args) as broker:
        try:
            with TopicReader(broker.bootstrap, topic, must_exist=True) as reader:
                messages = last_messages(reader, args.n, args.timeout)
        except UnknownTopicError:
            raise CliError(f"no topic {topic!r} on {broker.url}") from None
    if not messages:
        raise CliError(f"no records on {topic} within {args.timeout:g} s")
    records = parse_samples([m.value or b"" for m in messages],
                            [f"{topic} partition {m.partition} offset {m.offset}" for m in messages])
    return records, [m.key for m in messages]


def _control(config, bootstrap: str, args: argparse.Namespace | None = None):
    """The pipeline's control client: its schema (list and rollback check artifacts as its workers do), its trust and
    promotion policy (it reads the trail through the workers' gate), signing with ``--key`` or ``$FAIRSTREAM_KEY``."""
    from fairstream.streams.control.client import ControlClient
    from fairstream.streams.control.signing import Signer

    return ControlClient.of(config, bootstrap, signer=Signer.from_option(getattr(args, "key", None)))


def _add_key(parser: argparse.ArgumentParser, signs: str = "the record") -> None:
    """``--key FILE``: the private key that signs what the command writes (``signs`` says what)."""
    parser.add_argument("--key", metavar="FILE", help=f"the private key (NAME.key, from `fairstream keys generate`) "
                                                      f"that signs {signs}; default: the file $FAIRSTREAM_KEY names")


_DONE = {"approve": "approved", "reject": "rejected"}
_AFTER = {"approve": "the workers serve it once they read this", "reject": "it will not serve"}


def _cmd_artifacts(args: argparse.Namespace) -> int:
    from fairstream.repair import artifacts
    from fairstream.streams.control.client import check_fits

    config = _config(args)  # before the broker: a bad config stops the command before anything starts
    actor, reason = _audit_args(args)
    artifact = artifacts.load(args.file) if args.action == "publish" else None
    if artifact is not None and not args.force:  # what every worker would refuse at load is refused here
        check_fits(artifact, config.schema(), f"{config.name!r} ({args.config or 'the built-in Adult pipeline'})")
    promotion = config.promotion
    with _broker(args) as broker:
        control = _control(config, broker.bootstrap, args)
        if args.action == "publish":
            published = control.publish_under_sync(artifact, promotion, actor=actor, reason=reason)
            print(_published_line(published.record, control.topic, promotion, published.mode.why))
        elif args.action in _DONE:
            record = control.decide_sync(args.kind, args.version, args.action, actor=actor, reason=reason,
                                         force=getattr(args, "force", False))
            print(f"{_DONE[args.action]} {record.kind} version {record.version} (sha256 {record.sha256[:12]}) as "
                  f"{record.actor}: {_AFTER[args.action]}")
        elif args.action == "report":
            from fairstream.streams.refit.report import write_report

            out = None if args.out is None else Path(args.out)
            print(write_report(config, broker.bootstrap, args.kind, args.version, out, args.sample))
        elif args.action == "rollback":
            record = control.rollback_sync(args.kind, args.to, actor=actor, reason=reason)
            print(f"rolled {record.kind} back to version {record.version} (sha256 {record.sha256[:12]})")
        elif args.action == "history":
            return _print_history(control, args.kind, args.json, args.verify)
        else:
            _print_listing(control)
    return 0


def _published_line(record, topic: str, promotion: str, why: str) -> str:
    """What a publish did: served at once (and, unless promotion is "auto", why), or a candidate waiting for its
    decision."""
    how = f"sha256 {record.sha256[:12]}, {'inline' if record.blob_b64 else 'by path'}"
    if not record.candidate:
        because = "" if promotion == "auto" else f": {why}"
        return f"published {record.kind} version {record.version} ({how}) to {topic}{because}"
    waits = (f"'fairstream artifacts approve {record.kind} {record.version}' or 'reject'" if promotion == "approve"
             else "the shadow policy's promotion or retirement")
    return (f"published {record.kind} version {record.version} as a candidate ({how}) to {topic}: promotion is "
            f"{promotion!r}, so the workers shadow it until {waits}")


def _audit_args(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """``--by`` and ``--reason`` of publish, rollback, approve and reject, refused in one line where every reader
    would refuse them."""
    from fairstream.streams.control.client import check_audit

    actor, reason = getattr(args, "by", None), getattr(args, "reason", None)
    check_audit(actor, reason, names=("--by", "--reason"))
    return actor, reason


def _print_history(control, kind: str | None, as_json: bool, verify: bool = False) -> int:
    """The audit trail: every record in log order, one line each (or one JSON object), refused ones marked with why
    and the signer they claim; with ``verify``, the trail's signatures, roles and chain checked (exit status 1 when
    it was rewritten)."""
    import json

    trail = control.read_sync()
    entries = [entry for entry in trail.trail() if kind is None or entry.record.kind == kind]
    for entry in entries:
        record = entry.record
        row = {"offset": entry.offset, "at": record.published_at, "kind": record.kind, "version": record.version,
               "action": record.action, "actor": record.actor, "reason": record.reason,
               "statistics": record.statistics or {}, "sha256": record.sha256, "candidate": bool(record.candidate),
               "signer": entry.signer, "refused": entry.refusal, "remark": entry.remark,
               "breaks_trail": entry.breaks_trail,
               # Verified only on a signed pipeline, for a signature that matched a trusted key (the record may still be
               # refused for its role or the policy): otherwise the signer is only what the record claims.
               "verified": (control.authority.trust.signed and entry.signer is not None
                            and entry.category not in ("unsigned", "untrusted", "unreadable"))}
        print(json.dumps(row, sort_keys=True) if as_json else _history_line(row))
    if not entries and not as_json:
        print(f"(no {kind or 'artifact'} records on {control.topic})")
    return _verify_trail(control, trail.trail()) if verify else 0


def _verify_trail(control, entries) -> int:
    """Print what ``--verify`` concludes of the whole trail; 1 when a record shows it was rewritten."""
    broken = [entry for entry in entries if entry.breaks_trail]
    refused = [entry for entry in entries if entry.refusal is not None and not entry.breaks_trail]
    signed = control.authority.trust.signed
    checked = ("signatures, roles and the hash chain" if signed else
               "the hash chain only: this pipeline is unsigned (trust = \"none\"), so nothing proves who wrote a record")
    print(f"\nverify: {len(entries)} records on {control.topic}, {len(entries) - len(broken) - len(refused)} take "
          f"effect; checked {checked}")
    for entry in broken:
        why = entry.remark if entry.refusal is None else entry.refusal
        print(f"  BROKEN at offset {entry.offset}: {entry.record.action} of {entry.record.kind} version "
              f"{entry.record.version} (signer {entry.signer or 'none'}): {_collapsed(why)}")
    if refused:
        print(f"  {len(refused)} refused record(s) changed nothing (shown above as REFUSED)")
    print("verify: the trail was rewritten" if broken else "verify: the trail is intact")
    return 1 if broken else 0


def _history_line(entry: dict) -> str:
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(entry["at"])) if entry["at"] is not None else "-"
    # Whatever a record's texts hold (a reason over several lines, a newline in a statistic's name), it stays on its
    # line: no record can forge another line of the audit trail.
    figures = ", ".join(f"{_collapsed(name)}={value:.4g}" for name, value in entry["statistics"].items())
    reason, actor = _collapsed(entry["reason"] or "-"), _collapsed(entry["actor"] or "-")
    action = "candidate" if entry["candidate"] else entry["action"]  # a publish that does not serve (yet)
    signed = f"[{'signed' if entry.get('verified') else 'claims'} {_collapsed(entry['signer'])}]" if entry["signer"] else ""
    refused = f"REFUSED: {_collapsed(entry['refused'])}" if entry["refused"] else ""
    return "  ".join(part for part in (when, f"{entry['kind']:<12}", f"v{entry['version']:<5}", f"{action:<9}",
                                       actor, reason, figures, signed, refused) if part).rstrip()


def _collapsed(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) collapsed to one space."""
    return " ".join(text.split())


def _print_listing(control) -> None:
    """Every record with its verdict, the workers serving each version beside it, then every announced worker.

    "*" marks what the workers activate: a version they refuse at load is marked "refused" with the
    reason, and the version before it keeps the "*", as it keeps serving. "state" is what became of
    the version (active, candidate, promoted, approved, rejected, retired, superseded, published),
    "by" who wrote the record.
    """
    (rows, workers), now = control.status_sync(), time.time()
    print(f"{'kind':<12}{'version':>8}  {'sha256':<14}{'action':<10}{'via':<8}{'published':<22}{'active':<8}"
          f"{'state':<12}{'by':<24}served by")
    for row in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(row["published_at"])) if row["published_at"] else "-"
        mark = "refused" if row["refused"] else "*" if row["active"] else "-"
        served = ", ".join(f"{w['worker']} ({_ago(w['age'])}{', stale' if w['stale'] else ''})"
                           for w in row["served_by"])
        beside = served
        if row["refused"]:  # announcements stay beside a refused load: they are the ground truth
            why = "ignored by every worker" if row["refused_at"] == "log" else "refused at load"
            beside = f"{why}: {row['refused']}" + (f"; yet announced as served by {served}" if served else "")
        actor = _collapsed(row["actor"] or "-")  # kept as given, on one line
        print(f"{row['kind']:<12}{row['version']:>8}  {row['sha256']:<14}{row['action']:<10}{row['via']:<8}"
              f"{when:<22}{mark:<8}{row['state'] or '-':<12}{actor:<23} {beside}".rstrip())
    if not rows:
        print(f"(no artifacts published on {control.topic})")
    if workers:
        print(f"\nworkers (latest announcement on {control.topic}; a running worker announces every "
              f"{_ago(workers[0].every, '')}):")
    for worker in workers:
        serving = ", ".join(f"{kind} v{version}" for kind, version, _ in worker.serving) or (
            "nothing yet" if worker.kinds else "no module (monitors the records as they come)")
        shadows = "".join(f", shadows candidate {kind} v{version}" for kind, version, _ in worker.shadowing)
        state = "stopped" if worker.state == "stopped" else f"serves {serving}{shadows}"
        missing = [kind for kind in worker.kinds if kind not in {k for k, _, _ in worker.serving}]
        held = f"; holding input: no {', '.join(missing)} loaded" if missing and worker.state != "stopped" else ""
        stale = "; stale: no announcement since, the worker is probably gone" if worker.is_stale(now) else ""
        print(f"  {worker.worker}  {state}{held}  (announced {_ago(now - worker.at)}{stale})")


def _ago(seconds: float, suffix: str = " ago") -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}{suffix}"
    return f"{seconds:.0f}s{suffix}"


def _cmd_config(args: argparse.Namespace) -> int:
    """``config publish`` and ``config show`` (see their help)."""
    from fairstream.streams.control.pipeline_config import (decode_settings, differing_keys, encode_settings,
                                                            fingerprint, settings_of)
    from fairstream.streams.control.records import CONFIGURE, ControlError

    config = _config(args)
    mine = settings_of(config)
    settings = encode_settings(mine)
    digest = fingerprint(settings)
    source = args.config or "the built-in Adult pipeline"
    with _broker(args) as broker:
        control = _control(config, broker.bootstrap, args)
        taking = [e for e in control.read_sync().trail() if e.refusal is None and e.record.action == CONFIGURE]
        active = taking[-1].record if taking else None
        if args.action == "publish":
            if active is not None and active.sha256 == digest:
                print(f"{source} is already the pipeline's active config version {active.version} (fingerprint "
                      f"{digest[:12]}) on {control.topic}: nothing published")
                return 0
            actor, reason = _audit_args(args)
            record = control.configure_sync(settings, digest, actor=actor, reason=reason)
            print(f"published {source} as the pipeline's config version {record.version} (fingerprint {digest[:12]}) "
                  f"to {control.topic}: workers whose config differs from it take no partitions until they run it")
            return 0
    if active is None:
        print(f"no config is published on {control.topic}; this file's fingerprint is {digest[:12]} (publish it: "
              f"fairstream config publish --config FILE)")
        return 1
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(active.published_at)) if active.published_at else "-"
    print(f"active config: version {active.version}, fingerprint {active.sha256}, published {when} by "
          f"{_collapsed(active.actor or '-')}" + (f" ({_collapsed(active.reason)})" if active.reason else ""))
    if active.sha256 == digest:
        print(f"{source}: the same settings")
        return 0
    try:
        theirs = decode_settings(active)
    except ControlError as exc:
        print(f"{source}: fingerprint {digest[:12]}, and the active version cannot be read: {exc}")
        return 1
    differing = differing_keys(mine, theirs)
    if not differing:  # the same settings, encoded by another writer
        print(f"{source}: the same settings")
        return 0
    print(f"{source} (fingerprint {digest[:12]}) differs in {len(differing)} key(s):")
    for key in differing:
        print(f"  {key}: this file {_shown_setting(mine, key)}, active {_shown_setting(theirs, key)}")
    return 1


def _shown_setting(settings: dict, key: str) -> str:
    import json

    return json.dumps(settings[key], sort_keys=True) if key in settings else "(absent)"


def _cmd_keys(args: argparse.Namespace) -> int:
    import json

    from fairstream.streams.control.signing import write_key_pair

    try:
        private, public = write_key_pair(args.name, args.dir)
    except (FileExistsError, ValueError) as exc:
        print(f"fairstream keys: error: {exc}", file=sys.stderr)
        return 1
    print(f"{private} (private: keep it to its owner)\n{public} (public: list it in the pipeline's trust file)")
    if args.role:  # the trust file's table for this key, to paste (a TOML key is quoted: names may hold '@' or '.')
        print(f'\n[keys."{args.name}"]\npublic_key = "{public.read_text().strip()}"\n'
              f'roles = {json.dumps(list(dict.fromkeys(args.role)))}')
    return 0


def _cmd_alerts(args: argparse.Namespace) -> int:
    from fairstream.streams.ops.alert_rules import render_threshold_rules, write_threshold_rules

    config = _config(args)
    if args.write is None:
        print(render_threshold_rules(config), end="")
    else:
        changed = write_threshold_rules(args.write, config)
        print(f"{args.write}: {'updated' if changed else 'already up to date'} from {args.config}")
    return 0


def _cmd_acls(args: argparse.Namespace) -> int:
    from fairstream.streams.ops.acls import ROLES, AclError, apply_acls, parse_principals, pipeline_acls, render_acls
    from fairstream.streams.ops.broker import parse_broker_url

    config = _config(args)
    try:
        acls = pipeline_acls(config, app_id=args.app_id, principals=parse_principals(args.principal or ()),
                             roles=args.role or ROLES)
    except AclError as exc:
        raise CliError(str(exc)) from None
    if not args.apply:
        url, origin = (args.broker, "--broker") if args.broker else (os.environ.get("FAIRSTREAM_BROKER"),
                                                                     "FAIRSTREAM_BROKER")
        try:
            bootstrap = parse_broker_url(url).bootstrap if url else "BOOTSTRAP"
        except ValueError as exc:
            raise CliError(f"{origin}: {exc}") from None
        print(render_acls(acls, bootstrap, args.command_config or None, args.config or "the built-in Adult pipeline"),
              end="")
        return 0
    from confluent_kafka.admin import AdminClient

    from .kafka import librdkafka_options
    from .topics import ensure_topics

    with _broker(args) as broker:
        ensure_topics(broker.bootstrap, config.topics)  # the principals have no Create right: the admin's job
        apply_acls(AdminClient({"bootstrap.servers": broker.bootstrap, **librdkafka_options()}), acls)
        print(f"topics of {config.name!r} checked (created where missing) on {broker.url}")
    for acl in acls:
        pattern = " (prefix)" if acl.prefixed else ""
        print(f"created: allow {acl.principal} {', '.join(acl.operations)} on {acl.resource} {acl.name}{pattern}")
    return 0


_WRITES_CONTROL = ("publish", "approve", "reject", "rollback")


def _refusal(exc: BaseException, args: argparse.Namespace) -> str | None:
    """The one line for a broker's refusal of this command's principal (an ACL missing), else None.

    The refused resource is the one the error names when it names the one the command needs first (or
    none); what the command needed it for (read, write) is the command's: ``artifacts approve`` writes
    the control topic, ``worker`` reads the input, and so on.
    """
    from .kafka import authorization_refusal

    seen, refused = set(), None
    while exc is not None and id(exc) not in seen:  # the error and what it was raised from
        seen.add(id(exc))
        if _names_refusal(exc):
            refused = exc
            break
        exc = exc.__cause__ or exc.__context__
    if refused is None:
        return None
    text = " ".join(str(refused).split())
    if text.startswith("not authorised:"):  # said already (a worker's consumer)
        return text
    operation, resource, name = _needs(args)
    named = [arg for arg in getattr(refused, "args", ()) if isinstance(arg, str) and arg.count(" ") == 0]
    if "Group" in type(refused).__name__ or "GROUP_" in text:
        operation, resource, name = "read", "group", named[0] if named else "its consumer group"
    elif "Cluster" in type(refused).__name__ or "CLUSTER_" in text:
        operation, resource, name = "alter", "cluster", "kafka-cluster"
    elif resource == "topic" and named and name not in named:
        operation, name = "use", named[0]
    return authorization_refusal(operation, resource, name, config=getattr(args, "config", None))


def _names_refusal(exc: BaseException) -> bool:
    """Whether ``exc`` is Kafka's authorisation refusal (any client's), or a topic check that met one."""
    if "AuthorizationFailed" in type(exc).__name__:  # aiokafka's and kafka-python's error classes
        return True
    if type(exc).__name__ == "KafkaException" and exc.args and hasattr(exc.args[0], "name"):  # confluent-kafka
        return exc.args[0].name().endswith("_AUTHORIZATION_FAILED")
    # The topic check reports a refused creation by the error's class name (a topic the principal may not even
    # describe looks missing, so the check tries to create it).
    return type(exc).__name__ == "TopicConfigError" and "AuthorizationFailed" in str(exc)


def _needs(args: argparse.Namespace) -> tuple[str, str, str]:
    """(operation, resource type, name) the command needs first of the broker."""
    try:
        config = _config(args) if hasattr(args, "config") else None
    except Exception:  # the config was read once already; a second read that fails leaves the line general
        config = None
    topics = config.topics if config is not None else None
    action = getattr(args, "action", None)
    if topics is None:
        return "use", "topic", "its topics"
    if args.command == "artifacts":
        return ("write" if action in _WRITES_CONTROL else "read"), "topic", topics.control
    if args.command == "acls":
        return "alter", "cluster", "kafka-cluster"
    if args.command == "replay":
        return "write", "topic", topics.research if args.research else topics.records_in
    if args.command == "tail":
        named = topics.name(args.topic)
        return "read", "topic", named if named in {spec.name for spec in topics.specs()} else args.topic
    if args.command == "monitor":
        return "read", "topic", topics.stats
    if args.command == "refit":
        return "read", "topic", topics.refit_requests
    return "read", "topic", topics.records_in


def _cmd_demo(args: argparse.Namespace) -> int:
    from fairstream.streams.demo.run import DemoOptions, format_report, run_demo

    config = _config(args)
    options = DemoOptions(run_dir=Path(args.run_dir) / "demo", n_research=args.n_research, seed=args.seed,
                          bad=args.bad, rate=args.rate, timeout=args.timeout, act=args.act, workers=args.workers)
    config = config.with_topics(prefix=f"{config.topics.prefix}-demo-{int(time.time())}")  # a fresh run each time
    with _broker(args, may_start=True) as broker:
        try:
            report = run_demo(config, broker.bootstrap, options)
        except KeyboardInterrupt:
            print("\ninterrupted: the workers, the monitoring agent and the broker have been stopped", file=sys.stderr)
            return 130
    print(format_report(report))
    return 0


def _add_common(parser: argparse.ArgumentParser, config: bool = True) -> None:
    parser.add_argument("--broker", help="Kafka bootstrap URL, e.g. kafka://host:9092 (default: $FAIRSTREAM_BROKER, "
                                         "else the running embedded broker, found from any directory; with none, "
                                         "worker and demo start one, other commands stop)")
    parser.add_argument("--run-dir", default="runs", help="folder for logs and pid files (default: runs)")
    if config:
        parser.add_argument("--config", default=_default_config(),
                            help=f"pipeline TOML (default: $FAIRSTREAM_CONFIG, else {DEFAULT_CONFIG} if it exists "
                                 "here, else the built-in Adult pipeline)")


def _default_config() -> str | None:
    """``$FAIRSTREAM_CONFIG`` (a container's or a host's pipeline, for every command), else the checkout's Adult TOML."""
    return os.environ.get("FAIRSTREAM_CONFIG") or (DEFAULT_CONFIG if Path(DEFAULT_CONFIG).exists() else None)


def version_line() -> str:
    """``fairstream X.Y.Z (librdkafka A.B.C, Python D.E.F)``: what a bug report or an upgrade needs to name."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    from confluent_kafka import libversion

    try:
        ours = version("fairstream")
    except PackageNotFoundError:  # run from a checkout that was never installed
        ours = "unknown (not installed)"
    return f"fairstream {ours} (librdkafka {libversion()[0]}, Python {platform.python_version()})"


def build_parser() -> argparse.ArgumentParser:
    """The ``fairstream`` command line: one sub-command per job."""
    from fairstream.streams.demo.acts import ACTS, DEFAULT_ACT

    parser = argparse.ArgumentParser(
        prog="fairstream",
        description="Repair unfairness in data while it streams: fit optimal-transport repair plans offline, "
                    "apply them to Kafka streams, monitor fairness and re-fit on drift.",
    )
    parser.add_argument("--version", action="version", version=version_line(),
                        help="print the version of fairstream and of the Kafka client library it runs on, and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    rep = sub.add_parser("repair", help="batch job: fit a plan on a research split, repair the archive, report E",
                         description="Fit a distributional OT repair plan on a labelled research split of a data set, "
                                     "repair the rest (the archive) with the frozen plan, print the dependence E per "
                                     "feature before/after (with the estimator's noise floor), save the plan artifact "
                                     "and a PNG of the group-conditional distributions.")
    rep.add_argument("--dataset", default="adult", help="adult, compas, german, crime, law, health or simulation (default: adult)")
    rep.add_argument("--features", help="comma-separated feature columns (default: the data set's defaults)")
    rep.add_argument("--n-research", type=int, default=None,
                     help="rows in the research split (default: 10000, or half of a smaller data set)")
    rep.add_argument("--n-q", type=int, default=250, help="grid nodes per stratum and feature (default: 250)")
    rep.add_argument("--repair-amount", type=float, default=1.0, help="0 = identity, 1 = full repair (default: 1)")
    rep.add_argument("--seed", type=int, default=0, help="seed of the research/archive split (default: 0)")
    rep.add_argument("--bins", type=int, default=30, help="histogram bins of the E estimator (default: 30)")
    rep.add_argument("--out", default="runs/adult-repair", help="output folder (default: runs/adult-repair)")
    rep.add_argument("--quiet", action="store_true", help="no progress bar")
    rep.set_defaults(func=_cmd_repair)

    brk = sub.add_parser("broker", help="run the embedded Kafka-compatible broker (Tansu) on a free loopback port",
                         description="start: run the embedded broker in the foreground until Ctrl-C; it is announced "
                                     "in broker.json under $FAIRSTREAM_RUNTIME_DIR (else $XDG_RUNTIME_DIR/fairstream, "
                                     "else /tmp/fairstream-<uid>), so every command without --broker or "
                                     "$FAIRSTREAM_BROKER uses it, from any directory. status: print its URL (also of "
                                     "the broker a worker or the demo started); stop: stop it.")
    brk.add_argument("action", nargs="?", choices=("start", "stop", "status"), default="start")
    brk.add_argument("--port", type=int, help="port to listen on (default: a free one)")
    brk.add_argument("--wait", type=_seconds(positive=False), default=0.0, metavar="SECONDS",
                     help="with status: wait up to this long for a broker that is still starting (default: 0)")
    brk.add_argument("--run-dir", default="runs", help="folder for the broker's log and pid file (default: runs)")
    brk.set_defaults(func=_cmd_broker)

    kfk = sub.add_parser("kafka", help="run Apache Kafka locally (KRaft, 1 or 3 nodes on loopback ports)",
                         description="start: fetch the pinned Apache Kafka release through Maven into the cache "
                                     "($FAIRSTREAM_CACHE_DIR, else ~/.cache/fairstream; once), format KRaft storage "
                                     "under --run-dir and run one node or a three-node cluster in the foreground "
                                     "until Ctrl-C; it is announced like 'broker start', so every command without "
                                     "--broker uses it. stop, status: as for broker. fetch: only fetch the release "
                                     "and print where its jars are.")
    kfk.add_argument("action", nargs="?", choices=("start", "stop", "status", "fetch"), default="start")
    kfk.add_argument("--brokers", type=int, choices=(1, 3), default=1,
                     help="nodes, each a combined controller and broker (3: replication 3, min.insync.replicas=2)")
    kfk.add_argument("--wait", type=_seconds(positive=False), default=0.0, metavar="SECONDS",
                     help="with status: wait up to this long for a broker that is still starting (default: 0)")
    kfk.add_argument("--run-dir", default="runs", help="folder for the nodes' storage and logs (default: runs)")
    kfk.set_defaults(func=_cmd_kafka)

    reg = sub.add_parser("schema-registry", help="run a Schema Registry locally (Apicurio Registry, Confluent API)",
                         description="start: fetch the pinned Apicurio Registry release through Maven into the cache "
                                     "($FAIRSTREAM_CACHE_DIR, else ~/.cache/fairstream; once) and run it with "
                                     "in-memory storage in the foreground until Ctrl-C, serving the Confluent Schema "
                                     "Registry API that Avro topics need. fetch: only fetch the release and print "
                                     "where its runner jar is.")
    reg.add_argument("action", nargs="?", choices=("start", "fetch"), default="start")
    reg.add_argument("--port", type=int, default=8081, help="port to listen on (default: 8081)")
    reg.add_argument("--run-dir", default="runs", help="folder for the registry's log (default: runs)")
    reg.set_defaults(func=_cmd_schema_registry)

    wrk = sub.add_parser("worker", help="run the repair agents of one worker process",
                         description="Run the record and embedding agents. Several worker processes with the same "
                                     "--app-id form one consumer group and share the input partitions; every worker "
                                     "follows the control topic and hot-swaps new artifact versions.")
    _add_common(wrk)
    wrk.add_argument("--app-id", help="consumer group / Faust app id (default: <prefix>-<pipeline name>)")
    wrk.add_argument("--metrics-port", type=_port_arg, metavar="PORT|0|off",
                     help="this worker's /metrics port, overriding [monitor] metrics_port: 0 = any free port "
                          "(logged), off = no endpoint")
    wrk.add_argument("--loglevel", default="info")
    wrk.add_argument("--supervise", action="store_true",
                     help="run the worker as a child process and start it again whenever it exits non-zero "
                          "(back-off doubling from 1 s to 60 s); SIGTERM is passed on, a clean stop exits 0")
    wrk.add_argument("--max-restarts", type=int, default=10, metavar="N",
                     help="with --supervise: give up after N restarts within 10 minutes (default: 10)")
    wrk.set_defaults(func=_cmd_worker)

    keys = sub.add_parser("keys", help="generate the named Ed25519 key pairs that sign control records",
                          description="Generate an Ed25519 key pair for one signer (a person, the re-fit service, the "
                                      "shadow policy): NAME.key, its private key (readable by its owner only), and "
                                      "NAME.pub, the public key a pipeline's trust file lists.")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    generate = keys_sub.add_parser("generate", help="write NAME.key and NAME.pub (never over an existing key)")
    generate.add_argument("name", help="the signer's name (letters, digits, '.', '_', '@', '-')")
    generate.add_argument("--dir", default="keys", help="where to write them (default: keys)")
    from fairstream.streams.control.trust import ROLES as TRUST_ROLES

    generate.add_argument("--role", action="append", choices=TRUST_ROLES,
                          help="print the trust file's table for this key with this role (repeatable)")
    generate.set_defaults(func=_cmd_keys)

    mon = sub.add_parser("monitor", help="run the pipeline's monitoring agent (its fairness numbers, drift, promotions)",
                         description="Merge every worker's partial aggregates from the stats topic into the "
                                     "pipeline's windows, export the pipeline's fairness gauges, detect drift once per "
                                     "pipeline (one re-fit request per drift) and apply the shadow promotion policy. "
                                     "One per pipeline; a second one started with the same --app-id waits as a standby "
                                     "and takes over if the first goes.")
    _add_common(mon)
    mon.add_argument("--app-id", help="the workers' app id (default: <prefix>-<pipeline name>); the agent's group is "
                                      "<app id>.monitor")
    mon.add_argument("--metrics-port", type=_port_arg, metavar="PORT|0|off",
                     help="the agent's /metrics port, overriding [monitor] metrics_port: 0 = any free port (logged), "
                          "off = no endpoint")
    _add_key(mon, "the shadow policy's decisions (policy role) and the re-fit requests (requester role)")
    mon.set_defaults(func=_cmd_monitor)

    rpl = sub.add_parser("replay", help="send a data set to records.in (or its research split to research) as JSON records",
                         description="Send the archive part of a data set (the rows outside its research split) to "
                                     "records.in as JSON records keyed by id, with a progress bar; with --research, "
                                     "send the labelled research split to the research topic instead, where "
                                     "'fairstream refit' reads it.")
    _add_common(rpl)
    rpl.add_argument("--dataset", default="adult", help="adult, compas, german, crime, law, health or simulation "
                                                        "(default: adult)")
    rpl.add_argument("--research", action="store_true",
                     help="send the research split (with its labels) to the research topic instead of the archive")
    rpl.add_argument("--rate", type=_seconds(positive=True), help="records per second (default: as fast as possible)")
    rpl.add_argument("--n-research", type=int, default=None,
                     help="rows in the research split, which the archive leaves out (default: 10000, or half of a "
                          "smaller data set; 0: send every row)")
    rpl.add_argument("--seed", type=int, default=0, help="seed of the research/archive split (default: 0)")
    rpl.add_argument("--limit", type=_count, help="send at most this many records, the --bad ones included")
    rpl.add_argument("--bad", type=_count, default=0, help="mix in this many invalid records (they must be dead-lettered)")
    rpl.add_argument("--id-prefix", help="record ids are PREFIX-0, PREFIX-1, ... (default: the data set's name, "
                                         "with -research for --research)")
    rpl.add_argument("--quiet", action="store_true", help="no progress bar")
    rpl.set_defaults(func=_cmd_replay)

    tail = sub.add_parser("tail", help="print the last N records of a topic (repaired records, dead letters, ...)",
                          description="Print the last N records of a topic as they are stored (JSON, one a line, oldest "
                                      "first, by timestamp over its partitions), without joining a consumer group. "
                                      "While the topic holds fewer than N, wait up to --timeout seconds for more; exit 1 "
                                      "if fewer than N arrived.")
    _add_common(tail)
    tail.add_argument("topic", metavar="TOPIC",
                      help="a topic of the pipeline under its prefix (records.repaired, dlq, records.in, research, "
                           "control, ...) or any full topic name")
    tail.add_argument("-n", type=_positive_int, default=10, metavar="N", help="how many records (default: 10)")
    tail.add_argument("--timeout", type=_seconds(positive=False), default=10.0, metavar="SECONDS",
                      help="wait this long for the topic to hold N records (default: 10)")
    tail.set_defaults(func=_cmd_tail)

    init = sub.add_parser("init", help="infer a pipeline config (the record mapping) from a few sample records",
                          description="Read sample records (a JSON-lines FILE, or the last N records of a topic) and "
                                      "print a pipeline config whose [mapping] names the field of each role: numbers "
                                      "as features; strings, integers or booleans with few values as the protected "
                                      "attribute s and the stratum u; an ISO-8601 or epoch time; a field unique in "
                                      "the sample as the id (else the Kafka key, $key); a label, score or decision by "
                                      "its name. A comment above each role names the other candidates: check them, "
                                      "and the lines marked CHECK, before running a worker on it.")
    init.add_argument("samples", nargs="?", metavar="FILE", help="sample records, one JSON object a line")
    init.add_argument("--from-topic", metavar="NAME", help="read the samples from this topic instead (its last N "
                                                           "records, without joining a consumer group)")
    init.add_argument("-n", type=_positive_int, default=100, metavar="N",
                      help="read at most N sample records (default: 100)")
    init.add_argument("--timeout", type=_seconds(positive=False), default=10.0, metavar="SECONDS",
                      help="with --from-topic: wait this long for the topic to hold N records (default: 10)")
    init.add_argument("--s", metavar="PATH", help="the protected attribute's field (dotted or JSON Pointer), "
                                                  "instead of the inferred one")
    init.add_argument("--u", metavar="PATH", help="the stratum's field, instead of the inferred one")
    init.add_argument("--label", metavar="PATH",
                      help="the label's field (0/1 or true/false), instead of the inferred one")
    init.add_argument("--name", help="the pipeline name (default: the topic's, or the file's name without suffix)")
    init.add_argument("--out", metavar="FILE", help="write the config to FILE instead of printing it")
    _add_common(init, config=False)
    init.set_defaults(func=_cmd_init)

    art = sub.add_parser("artifacts", help="publish, approve, list, roll back and trace artifact versions on the "
                                           "control topic",
                         description="Artifacts (manifest JSON + .npz payload, sha256-checked) reach workers through "
                                     "the compacted control topic: inline while small, else by a path in the "
                                     "content-addressed artifact store. Every worker swaps to a new version between "
                                     "two batches; a refused artifact leaves the old version serving. Under a "
                                     "pipeline's promotion \"approve\", a publish is a candidate the workers apply "
                                     "in shadow until a person decides (the first version too: until then they hold "
                                     "input); under \"shadow\" too, once a version of the kind served and when the "
                                     "record chain applies it, until the shadow policy decides.")
    art_sub = art.add_subparsers(dest="action", required=True, metavar="ACTION")
    publish = art_sub.add_parser("publish", help="publish a saved artifact (its manifest .json or .npz path) as the "
                                                 "next version (a candidate under the pipeline's promotion \"approve\", and under "
                                                 "\"shadow\" once a version served; it says which)")
    publish.add_argument("file")
    publish.add_argument("--force", action="store_true",
                         help="publish even if the artifact does not fit the pipeline config (every worker refuses it)")
    art_sub.add_parser("list", help="every version published, which one is active and which workers serve it")
    rollback = art_sub.add_parser("rollback", help="re-activate the version that was active before the current one")
    rollback.add_argument("kind", help="artifact kind, e.g. plan")
    rollback.add_argument("--to", type=int, metavar="VERSION", help="re-activate this published version instead")
    outcomes = {"approve": "the workers serve it", "reject": "it never serves"}
    decisions = [art_sub.add_parser(action, help=f"{action} the pending candidate VERSION of KIND: {outcome}")
                 for action, outcome in outcomes.items()]
    for p in decisions:
        p.add_argument("kind", help="artifact kind, e.g. plan")
        p.add_argument("version", type=_positive_int, help="the pending candidate's version")
    decisions[0].add_argument("--force", action="store_true",
                              help="approve even a candidate whose chain failed in shadow on the workers' live records")
    for p in (publish, rollback, *decisions):  # the audit trail: who and why, on the record
        p.add_argument("--by", metavar="NAME", help="who does it, recorded in the audit trail (default: user@host)")
        p.add_argument("--reason", metavar="TEXT", required=p in decisions,
                       help="why, recorded in the audit trail" + (" (required)" if p in decisions else ""))
        _add_key(p)
    report = art_sub.add_parser("report", help="write an HTML report comparing candidate VERSION of KIND with the "
                                               "active chain, and print its path")
    report.add_argument("kind", help="artifact kind, e.g. plan")
    report.add_argument("version", type=_positive_int, help="the candidate's version")
    report.add_argument("--out", metavar="FILE", help="where to write the report (default: chosen by the report)")
    report.add_argument("--sample", type=_positive_int, default=2000, metavar="N",
                        help="the last N records of records.in the distributions are computed on (default: 2000)")
    history = art_sub.add_parser("history", help="the audit trail: every publish, decision (promote, approve, reject, "
                                                 "retire) and rollback in log order, with who, why and the statistics "
                                                 "at that moment")
    history.add_argument("--kind", metavar="KIND", help="only this artifact kind")
    history.add_argument("--json", action="store_true", help="one JSON object per line")
    history.add_argument("--verify", action="store_true",
                         help="check every record's signature and role and the hash chain; exit status 1 when a "
                              "record was altered, dropped, replayed or moved")
    for p in (publish, art_sub.choices["list"], rollback, *decisions, report, history):
        _add_common(p)
        p.set_defaults(func=_cmd_artifacts)

    cfg = sub.add_parser("config", help="publish the pipeline's config on its control topic, or show the active one",
                         description="One config per pipeline: its settings (every key that decides how a record is "
                                     "treated; not a worker's own: metrics port, Kafka credentials, artifact_dir, the "
                                     "schema registry's URL, the trust file's path) are published on the control topic "
                                     "as a versioned record. A worker whose config differs from the active version "
                                     "takes no partitions: it holds, not ready, naming the differing keys.")
    cfg_sub = cfg.add_subparsers(dest="action", required=True, metavar="ACTION")
    cfg_publish = cfg_sub.add_parser("publish", help="publish --config's settings as the pipeline's next config "
                                                     "version (workers with another config then hold)")
    cfg_publish.add_argument("--by", metavar="NAME", help="who does it, recorded in the audit trail (default: user@host)")
    cfg_publish.add_argument("--reason", metavar="TEXT", help="why, recorded in the audit trail")
    _add_key(cfg_publish)
    cfg_show = cfg_sub.add_parser("show", help="the active config version, its fingerprint, who published it, and the "
                                               "keys where --config differs (exit status 1 when it differs or none is "
                                               "published)")
    for p in (cfg_publish, cfg_show):
        _add_common(p)
        p.set_defaults(func=_cmd_config)

    demo = sub.add_parser("demo", help="the streaming demo end to end on the embedded default (what make run runs)",
                          description="Start a broker (embedded unless --broker), the topics, --workers workers, the "
                                      "pipeline's monitoring agent (its fairness statistics over every worker's "
                                      "records, drift), a re-fit service and (if installed) Prometheus; publish a plan "
                                      "fitted on the Adult research split; replay the archive with bad records mixed in; "
                                      "shift the distribution half way and show detection, alert, re-fit, swap and "
                                      "recovery live; then report the accounting, E before/after per plan version "
                                      "from the repaired topic, the timeline and plots. Ctrl-C stops everything cleanly.")
    _add_common(demo)
    demo.add_argument("--n-research", type=int, default=10_000)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--bad", type=int, default=100, help="invalid records mixed into the replay (default: 100)")
    demo.add_argument("--rate", type=float, default=2000.0, help="replay rate in records/s (default: 2000)")
    demo.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds")
    demo.add_argument("--workers", type=_positive_int, default=1, metavar="N",
                      help="worker processes sharing the pipeline's input (default: 1), beside one monitoring agent")
    demo.add_argument("--act", choices=tuple(ACTS), default=DEFAULT_ACT,
                      help="plan: drift answered by a new repair plan (default); flow: by a new AdapFair flow in "
                           "front of a frozen classifier, monitored on the decisions' DP gap; approve: the new plan "
                           "waits in shadow as a candidate until a named operator approves it")
    demo.set_defaults(func=_cmd_demo)

    alerts = sub.add_parser("alerts", help="render the alert rules that carry the config's fairness thresholds",
                            description="The FairstreamFairnessGapHigh rules (one per monitored statistic, at its "
                                        "monitor.threshold) and FairstreamVerificationBiasHigh (at agents.embeddings."
                                        "bfar_threshold), rendered from the pipeline config: printed, or written "
                                        "between the BEGIN/END markers of a rules file with --write.")
    _add_common(alerts)
    alerts.add_argument("--write", metavar="RULES_FILE", help="rewrite the generated block of this rules file "
                                                               "(e.g. deploy/prometheus/alerts.yml)")
    alerts.set_defaults(func=_cmd_alerts)

    acl = sub.add_parser("acls", help="the Kafka ACLs of the pipeline's principals: kafka-acls.sh lines, or --apply",
                         description="Print, for an operator to run as a super user, one kafka-acls.sh line per "
                                     "principal and resource: what the workers, the monitoring agent, the re-fit "
                                     "service, the approvers (people deciding on artifacts) and a separate webhook "
                                     "need of the pipeline's topics, groups and transactional ids, and nothing more "
                                     "(no All, no wildcard, no Create, no cluster right). Principals default to "
                                     "User:<app id>-<role>. With --apply, create the pipeline's topics and the ACLs "
                                     "through the admin API instead, as the config's [kafka] user (a super user).")
    _add_common(acl)
    acl.add_argument("--app-id", help="the workers' app id (default: <prefix>-<pipeline name>): their groups, the "
                                      "monitor's and the default principals derive from it")
    acl.add_argument("--principal", action="append", metavar="ROLE=User:NAME",
                     help="the principal of a role (worker, monitor, refit, approver, webhook), instead of "
                          "User:<app id>-<role>; repeat for several")
    acl.add_argument("--role", action="append", choices=("worker", "monitor", "refit", "approver", "webhook"),
                     help="only this role's ACLs; repeat for several (default: every role)")
    acl.add_argument("--command-config", default="admin.properties", metavar="FILE",
                     help="the admin client properties file the printed lines pass to kafka-acls.sh (default: "
                          "admin.properties; '' leaves it out)")
    acl.add_argument("--apply", action="store_true",
                     help="create the topics and the ACLs on the broker (--broker) instead of printing the lines")
    acl.set_defaults(func=_cmd_acls)

    from fairstream.streams.refit.command import add_refit_parser

    add_refit_parser(sub, broker_context=_broker, add_common=_add_common, load_config=_config)
    _add_debug(parser)
    return parser


def _add_debug(parser: argparse.ArgumentParser, top: bool = True) -> None:
    """``--debug`` on every (sub)command, so it may be written anywhere on the line."""
    parser.add_argument("--debug", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="show the full traceback of an error")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                _add_debug(sub, top=False)


def main(argv: list[str] | None = None) -> int:
    """Run the ``fairstream`` command line; returns the exit code."""
    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get("FAIRSTREAM_DEBUG", "") not in ("", "0")
    if not debug:
        _quiet_client_logs()
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"fairstream {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `fairstream artifacts list | head -1`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes at exit
        return 141
    except Exception as exc:
        refusal = None if debug else _refusal(exc, args)
        if refusal is not None:  # Kafka's authorisation said no: who may not do what, and where the ACLs are
            print(f"fairstream {args.command}: {refusal}", file=sys.stderr)
            return 1
        if debug or not isinstance(exc, _user_errors()):
            raise  # a bug, or asked for: the whole traceback
        print(f"fairstream {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
