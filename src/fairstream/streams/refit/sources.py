"""Research windows: the labelled records a re-fit fits on, read from the ``research`` topic or a file.

The research topic carries the pipeline's own records, in its own format: fairstream's envelope, or, with a
``[mapping]``, a team's own records (JSON or Avro, ``y`` mapped), read by the worker's decoder
(:class:`~fairstream.streams.codec.inputs.InputDecoder`), so a window accepts what a worker accepts.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import math
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence, Union

import numpy as np

from fairstream.streams.codec.inputs import InputDecoder
from fairstream.streams.codec.records import decode_records
from fairstream.streams.kafka import KAFKA_API_VERSION, kafka_python_options

if TYPE_CHECKING:
    from fairstream.streams.codec.records import DecodedRecords
    from fairstream.streams.config import PipelineConfig

log = logging.getLogger(__name__)
# =============================================================================== research windows


@dataclass(frozen=True, eq=False)
class ResearchWindow:
    """Labelled research records as arrays; unpacks as ``X, s, u = window``.

    ``y`` holds the outcome labels when every record carries one (flows and scorers train on
    them), else None. ``n_invalid`` counts the records that were skipped, ``invalid_examples`` holds a few of their
    reasons (the codec's dead-letter reasons), ``source`` says where the window came from.
    """

    X: np.ndarray
    s: np.ndarray
    u: np.ndarray
    keys: np.ndarray
    n_invalid: int = 0
    invalid_examples: tuple[str, ...] = ()
    source: str = "arrays"
    y: np.ndarray | None = None
    identity: np.ndarray | None = None  # embeddings: who each vector shows
    cut_short: bool = False  # a topic read stopped at its deadline before the end of every partition

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter((self.X, self.s, self.u))

    def __len__(self) -> int:
        return len(self.X)

    @classmethod
    def of(cls, X, s, u, keys=None, source: str = "arrays", y=None) -> "ResearchWindow":
        """A window from arrays (a notebook, a test); keys default to the row positions."""
        X = np.asarray(X, dtype=np.float64)
        keys = np.arange(len(X)).astype(str) if keys is None else np.asarray(keys).astype(str)
        return cls(X=X, s=np.asarray(s), u=np.asarray(u), keys=keys, source=source,
                   y=None if y is None else np.asarray(y, dtype=np.int64))

    def in_key_order(self) -> "ResearchWindow":
        """The same records sorted by key: a re-fit then depends on which records the window holds, not on the
        order in which a read interleaved the topic's partitions (two reads of one topic can differ)."""
        order = np.argsort(self.keys, kind="stable")
        return dataclasses.replace(self.subset(order), n_invalid=self.n_invalid, invalid_examples=self.invalid_examples)

    def subset(self, rows: np.ndarray) -> "ResearchWindow":
        """The window's rows at ``rows``."""
        pick = (lambda a: None if a is None else a[rows])
        return ResearchWindow(self.X[rows], self.s[rows], self.u[rows], self.keys[rows], source=self.source,
                              y=pick(self.y), identity=pick(self.identity))


def _window_from_decoded(decoded: "DecodedRecords", source: str, n_invalid: int = 0,
                         examples: Sequence[str] = ()) -> ResearchWindow:
    """The window of records a codec decoded; its refused ones are counted with the codec's reasons."""
    examples = (list(examples) + [reason for _, reason in decoded.errors])[:5]
    n_invalid += len(decoded.errors)
    if n_invalid:
        log.warning("%s: skipped %d invalid research record(s), e.g. %s", source, n_invalid, examples[:3])
    return ResearchWindow(decoded.X, decoded.s, decoded.u, decoded.keys, n_invalid, tuple(examples), source,
                          y=decoded.batch().y)


def read_research_topic(bootstrap: str, config: "PipelineConfig", last_n: int | None = None,
                        idle_seconds: float = 2.0, timeout: float = 300.0, tail: bool = False) -> ResearchWindow:
    """The latest ``last_n`` valid records on the research topic (all of them when ``last_n`` is None).

    Reads every partition from the beginning without a consumer group; with ``tail`` (and ``last_n``), only the
    last ``last_n`` records of each partition (fewer valid ones if some of them are invalid), so a big topic
    is read in a bounded time. A read stopped at ``timeout`` says so (``cut_short``). A partition is read up to
    now once the consumer's fetch highwater is reached or a record stamped after the start shows
    up; ``end_offsets()`` is not used because the embedded broker (Tansu) reports wrong ones.
    Partitions the fetcher never reports on end the read after ``idle_seconds`` without data.
    "Latest" is by the records' Kafka timestamps across partitions; only ``last_n`` values per
    partition are kept in memory.
    """
    from kafka import KafkaConsumer, TopicPartition

    if last_n is not None and last_n < 1:
        raise ValueError(f"last_n must be a positive number of records or None (all), got {last_n!r}")
    topic = config.topics.research
    decoder = InputDecoder.for_config(config)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, api_version=KAFKA_API_VERSION, group_id=None,
                             enable_auto_commit=False, fetch_max_wait_ms=100,
                             max_partition_fetch_bytes=8 * 1024 * 1024, auto_offset_reset="earliest",
                             **kafka_python_options())
    try:
        partitions = sorted(consumer.partitions_for_topic(topic) or ())
        if not partitions:
            log.warning("research topic %s does not exist: the window is empty", topic)
            return _window_from_decoded(decoder.decode([], []), f"topic {topic}")
        assigned = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(assigned)
        consumer.seek_to_beginning()
        if tail and last_n is not None:
            _seek_to_tails(consumer, assigned, last_n, min(timeout, 10.0))
        tails, n_invalid, examples, cut_short = _read_tails(consumer, assigned, decoder, last_n, idle_seconds, timeout)
    finally:
        consumer.close()
    latest = sorted((entry for tail in tails.values() for entry in tail), key=lambda entry: entry[:3])
    chosen = latest[-last_n:] if last_n else latest
    decoded = decoder.decode([entry[3] for entry in chosen], [entry[4] for entry in chosen])
    window = _window_from_decoded(decoded, f"topic {topic}", n_invalid, examples)
    return dataclasses.replace(window, cut_short=True) if cut_short else window


def _seek_to_tails(consumer, assigned: list, last_n: int, timeout: float) -> None:
    """Start each partition ``last_n`` records before its end. The end is the fetch highwater (ListOffsets is wrong on
    Tansu), known once the partition's first fetch response is parsed: the partition then moves to its tail at once,
    which drops what was fetched from its beginning. One without a highwater within ``timeout`` is read whole."""
    starts: dict = {}
    deadline = time.monotonic() + timeout
    while len(starts) < len(assigned) and time.monotonic() < deadline:
        consumer.poll(timeout_ms=200, max_records=1)  # one record at most: read again after the last seek
        for tp in assigned:
            if tp not in starts and consumer.highwater(tp) is not None:
                starts[tp] = max(0, consumer.highwater(tp) - last_n)
                consumer.seek(tp, starts[tp])
    for tp in assigned:
        if tp in starts:
            consumer.seek(tp, starts[tp])
        else:
            consumer.seek_to_beginning(tp)


def _read_tails(consumer, assigned: list, decoder: InputDecoder, last_n: int | None, idle_seconds: float,
                timeout: float) -> tuple[dict, int, list[str], bool]:
    """Per partition, the last ``last_n`` valid messages as (timestamp, partition, offset, value, key); the invalid
    ones (count, a few reasons) and whether the read stopped at ``timeout`` before the end."""
    started_ms = time.time() * 1000.0
    tails = {tp: deque(maxlen=last_n) for tp in assigned}
    caught_up: set = set()
    n_invalid, examples = 0, []
    deadline = time.monotonic() + timeout
    last_data = time.monotonic()
    while len(caught_up) < len(assigned):
        if time.monotonic() >= deadline:
            log.warning("stopped reading %s after %.0fs before reaching its end", assigned[0].topic, timeout)
            return tails, n_invalid, examples, True
        batches = consumer.poll(timeout_ms=200, max_records=50_000)
        for tp, messages in batches.items():
            decoded = decoder.decode([m.value for m in messages], [m.key for m in messages])
            n_invalid += len(decoded.errors)
            examples.extend(reason for _, reason in decoded.errors[: max(0, 5 - len(examples))])
            tails[tp].extend((messages[i].timestamp, tp.partition, messages[i].offset, messages[i].value,
                              messages[i].key) for i in decoded.index.tolist())
            if any(m.timestamp >= started_ms for m in messages):
                caught_up.add(tp)
            last_data = time.monotonic()
        caught_up.update(tp for tp in assigned if _at_highwater(consumer, tp))
        if time.monotonic() - last_data >= idle_seconds:
            break
    return tails, n_invalid, examples, False


def _at_highwater(consumer, tp) -> bool:
    # The highwater comes with each fetch response (None before the first one) and, unlike
    # ListOffsets on Tansu, is right.
    highwater = consumer.highwater(tp)
    return highwater is not None and consumer.position(tp) >= highwater


class ResearchFileError(ValueError):
    """A research source that cannot be used as given; the message names the file and the column."""


def read_research_file(path: str | Path, config: "PipelineConfig") -> ResearchWindow:
    """A research window from a file: JSON lines of the pipeline's own records, or CSV.

    A JSON-lines file holds the records the pipeline reads, one a line: fairstream's envelope, or with a
    ``[mapping]`` a team's own records (JSON, whatever the topics carry), decoded as a worker decodes them. A file has
    no Kafka keys: a line's number is its key (for ``mapping.id = "$key"``). CSV files have a header with the feature
    columns and ``s`` and ``u`` (or the pipeline's ``s_name``/``u_name``), optionally ``id`` and the label ``y``; other
    columns are ignored; each row becomes an envelope record, whatever the mapping. Either way every row goes through
    the stream's codec, so invalid rows are skipped and counted with the same reasons. ``.csv`` files are read as CSV,
    ``.jsonl``/``.ndjson``/``.json`` as JSON lines, anything else by its first character.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ResearchFileError(f"--source {path}: not a UTF-8 text file (byte {exc.start}); research files are CSV "
                                "or JSON lines") from None
    if _looks_like_csv(path, text):
        decoded = decode_records(_csv_values(text, config, path), config)
    else:
        lines = [(number, line.strip()) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
        decoded = InputDecoder.for_config(config, format="json").decode(
            [line.encode("utf-8") for _, line in lines], [str(number).encode() for number, _ in lines])
    window = _window_from_decoded(decoded, f"file {path}")
    if not len(window):  # a file is chosen by hand: nothing usable in it is a mistake, not an empty window
        examples = f", e.g. {window.invalid_examples[0]}" if window.invalid_examples else ""
        raise ResearchFileError(f"--source {path}: no valid research record ({window.n_invalid} invalid{examples})")
    return window


def _looks_like_csv(path: Path, text: str) -> bool:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return True
    if suffix in (".jsonl", ".ndjson", ".json"):
        return False
    return not text.lstrip().startswith("{")


def _csv_values(text: str, config: "PipelineConfig", path: Path) -> list[bytes]:
    """CSV rows as records.in JSON, so the codec validates them like any stream record."""
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    s_column = _label_column(header, "s", config.s_name, path)
    u_column = _label_column(header, "u", config.u_name, path)
    missing = [name for name in config.features if name not in header]
    if missing:
        raise ResearchFileError(f"{path}: CSV header {header} lacks feature column(s) {missing}")
    groups = {str(g): g for g in config.groups}
    strata = {str(a): a for a in config.strata}
    values = []
    for line, row in enumerate(reader, start=2):
        record = {
            "id": row.get("id") or line,
            "features": {name: _number_or_text(row[name]) for name in config.features},
            "s": groups.get(row[s_column], row[s_column]),
            "u": strata.get(row[u_column], row[u_column]),
        }
        if row.get("y") not in (None, ""):
            y = _number_or_text(row["y"])  # "1" and "1.0" are the label 1; anything else the codec refuses
            record["y"] = int(y) if isinstance(y, float) and y.is_integer() else y
        values.append(json.dumps(record).encode("utf-8"))
    return values


def _label_column(header: list[str], short: str, long: str, path: Path) -> str:
    for name in (short, long):
        if name in header:
            return name
    raise ResearchFileError(f"{path}: CSV header {header} has no {short!r} (or {long!r}) column")


def _number_or_text(text: str | None):
    # Unparsable text stays text, so the codec rejects the row with its usual reason.
    try:
        number = float(text)
    except (TypeError, ValueError):
        return text
    return number if math.isfinite(number) else text


def stratified_split(s: np.ndarray, u: np.ndarray, holdout: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (fit, holdout), holding out ``holdout`` of every (u, s) cell at random.

    Stratified so that small cells are represented in both parts in proportion, whatever the draw.
    """
    rng = np.random.default_rng(seed)
    cells = np.unique(np.column_stack([hashable_labels(u), hashable_labels(s)]), axis=0, return_inverse=True)[1].ravel()
    held = []
    for cell in range(cells.max() + 1 if len(cells) else 0):
        rows = rng.permutation(np.flatnonzero(cells == cell))
        held.append(rows[: int(round(holdout * len(rows)))])
    holdout_rows = np.sort(np.concatenate(held)) if held else np.array([], dtype=np.intp)
    fit_rows = np.setdiff1d(np.arange(len(s)), holdout_rows)
    return fit_rows, holdout_rows


def hashable_labels(labels: np.ndarray) -> np.ndarray:
    """Labels as a fixed-width array: the codec gives object arrays for string labels, and
    fingerprints and np.unique refuse or mis-order objects. JSON text keeps 1 and "1" apart."""
    labels = np.asarray(labels)
    if labels.dtype.kind != "O":
        return labels
    return np.array([json.dumps(value) for value in labels.tolist()], dtype=str)



@dataclass(frozen=True)
class TopicSource:
    """The latest ``last_n`` records of the pipeline's research topic, read anew on every call."""

    bootstrap: str
    config: "PipelineConfig"
    last_n: int | None = 10_000

    def __call__(self) -> ResearchWindow:
        return read_research_topic(self.bootstrap, self.config, self.last_n)

    def __str__(self) -> str:
        return f"topic {self.config.topics.research} (last {self.last_n or 'all'} records)"


@dataclass(frozen=True)
class FileSource:
    """A JSON-lines or CSV research file, read anew on every call."""

    path: Path
    config: "PipelineConfig"

    def __call__(self) -> ResearchWindow:
        return read_research_file(self.path, self.config)

    def __str__(self) -> str:
        return f"file {self.path}"


@dataclass(frozen=True)
class EmbeddingFileSource:
    """A file of labelled embeddings (``.npz``, structured ``.npy`` or ``.parquet`` with vector, identity and group
    columns), read anew on every call: the window of an embedding re-fit (one stratum)."""

    path: Path

    def __call__(self) -> ResearchWindow:
        from fairstream.repair.embedding_datasets import load_embeddings

        data = load_embeddings(self.path)
        n = len(data)
        return ResearchWindow(X=data.vectors, s=np.asarray(data.groups), u=np.zeros(n, dtype=np.int64),
                              keys=np.arange(n).astype(str), source=f"file {self.path}",
                              identity=np.asarray(data.identities))

    def __str__(self) -> str:
        return f"embeddings file {self.path}"


Source = Union[Callable[[], ResearchWindow], ResearchWindow, tuple]


def research_source(option: str, bootstrap: str, config: "PipelineConfig", last_n: int | None,
                    kind: str | None = None) -> TopicSource | FileSource | EmbeddingFileSource:
    """``--source``: ``topic`` for the research topic, anything else is a file path (embeddings: a file only).

    ``kind`` (default: the config's ``refit_kind``) is the kind re-fitted: one applied to embeddings reads a file.
    """
    from fairstream.models.kinds import capabilities

    embeddings = capabilities(kind or config.refit_kind).agent == "embeddings"
    if option == "topic":
        if embeddings:
            raise ResearchFileError("an embedding re-fit reads labelled embeddings from a file: --source PATH "
                                    "(.npz, .npy or .parquet with vector, identity and group columns)")
        return TopicSource(bootstrap, config, last_n)
    path = Path(option)
    if path.is_dir():
        raise ResearchFileError(f"--source {option}: a directory; give a research file (CSV or JSON lines) or 'topic'")
    if not path.is_file():
        raise ResearchFileError(f"--source {option}: no such file (a research file, CSV or JSON lines, or 'topic')")
    return EmbeddingFileSource(path) if embeddings else FileSource(path, config)


def resolve_source(source: Source) -> ResearchWindow:
    """A window from a source: a window itself, a callable returning one, or a bare ``(X, s, u)`` / ``(X, s, u, keys)``."""
    window = source() if callable(source) else source
    if isinstance(window, tuple):
        window = ResearchWindow.of(*window)
    if not isinstance(window, ResearchWindow):
        raise TypeError(f"a research source gives a ResearchWindow or (X, s, u), got {type(window).__name__}")
    return window
