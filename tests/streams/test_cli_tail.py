"""``fairstream tail`` and ``fairstream replay --research``, as a user runs them, against Apache Kafka."""

import json
import threading
import time
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer

from fairstream.repair import datasets
from fairstream.streams.cli import main
from fairstream.streams.config import adult_config
from fairstream.streams.demo.collect import TopicReader
from fairstream.streams.kafka import KAFKA_API_VERSION
from fairstream.streams.topics import ensure_topics

UNREACHABLE = "kafka://127.0.0.1:1"


def run_main(args, capsys) -> tuple[int, str, str]:
    code = main([str(arg) for arg in args])
    out, err = capsys.readouterr()
    return code, out, err


def pipeline(tmp_path: Path, prefix: str, bootstrap: str | None = None):
    """A pipeline TOML with its own topic prefix (and its topics, given a broker)."""
    config = adult_config(artifact_dir=str(tmp_path / "artifacts")).with_topics(prefix=prefix)
    path = tmp_path / f"{prefix}.toml"
    path.write_text(config.to_toml())
    if bootstrap:
        ensure_topics(bootstrap, config.topics)
    return path, config


def send(bootstrap: str, topic: str, values: list[dict], partitions: int = 4, first_ms: int = 1_700_000_000_000):
    """``values`` round-robin over the partitions, the i-th stamped ``first_ms + i``."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, api_version=KAFKA_API_VERSION)
    try:
        for i, value in enumerate(values):
            producer.send(topic, value=json.dumps(value).encode(), partition=i % partitions, timestamp_ms=first_ms + i)
        producer.flush()
    finally:
        producer.close()


@pytest.mark.integration
def test_tail_prints_the_last_n_records_oldest_first_over_all_partitions(broker, tmp_path, capsys):
    toml, config = pipeline(tmp_path, "tail-last", broker.bootstrap)
    send(broker.bootstrap, config.topics.records_repaired, [{"n": i} for i in range(10)])
    code, out, err = run_main(["tail", "records.repaired", "-n", 3, "--broker", broker.url, "--config", toml], capsys)
    assert (code, err) == (0, "")
    assert [json.loads(line) for line in out.splitlines()] == [{"n": 7}, {"n": 8}, {"n": 9}]
    code, out, _ = run_main(["tail", config.topics.records_repaired, "-n", 1, "--broker", broker.url,
                             "--config", toml], capsys)  # the full name works too
    assert (code, out) == (0, '{"n": 9}\n')


@pytest.mark.integration
def test_tail_waits_for_records_up_to_its_timeout(broker, tmp_path, capsys):
    toml, config = pipeline(tmp_path, "tail-wait", broker.bootstrap)
    later = threading.Timer(1.0, send, args=(broker.bootstrap, config.topics.dlq, [{"n": 0}, {"n": 1}]))
    later.start()
    try:
        code, out, err = run_main(["tail", "dlq", "-n", 2, "--timeout", 60, "--broker", broker.url,
                                   "--config", toml], capsys)
    finally:
        later.join()
    assert (code, err) == (0, "") and [json.loads(line) for line in out.splitlines()] == [{"n": 0}, {"n": 1}]
    started = time.monotonic()
    code, out, err = run_main(["tail", "dlq", "-n", 5, "--timeout", 0.5, "--broker", broker.url, "--config", toml],
                              capsys)
    assert time.monotonic() - started < 30
    assert (code, out.count("\n")) == (1, 2)  # what there is, then one line saying it is short
    assert err == "fairstream tail: only 2 of 5 records on tail-wait.dlq within 0.5 s\n"


@pytest.mark.integration
def test_tail_says_when_the_broker_went_away_while_it_waited(broker, tmp_path, capsys, monkeypatch):
    from fairstream.streams.ops import broker as broker_module

    toml, _ = pipeline(tmp_path, "tail-gone", broker.bootstrap)
    monkeypatch.setattr(broker_module, "is_kafka_ready", lambda host, port, timeout=1.0: False)  # killed meanwhile
    code, _, err = run_main(["tail", "dlq", "-n", 1, "--timeout", 0.3, "--broker", broker.url, "--config", toml], capsys)
    assert code == 1 and err.endswith(f"(the broker at {broker.url} does not answer any more)\n"), err


@pytest.mark.integration
def test_tail_of_an_unknown_topic_is_one_line_and_creates_nothing(broker, tmp_path, capsys):
    toml, _ = pipeline(tmp_path, "tail-unknown", broker.bootstrap)
    code, out, err = run_main(["tail", "records.repiared", "--broker", broker.url, "--config", toml], capsys)
    assert (code, out) == (1, "")
    assert err == (f"fairstream tail: error: no topic 'records.repiared' on {broker.url}; the pipeline's topics "
                   "(under the prefix 'tail-unknown'): control, dlq, embeddings.in, embeddings.repaired, records.in, "
                   "records.repaired, refit.requests, research, stats\n")
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, api_version=KAFKA_API_VERSION)
    try:
        assert "records.repiared" not in consumer.topics()  # asking did not auto-create it
    finally:
        consumer.close()


def test_tail_needs_a_broker_and_a_positive_count(tmp_path, capsys):
    code, out, err = run_main(["tail", "dlq", "--broker", UNREACHABLE], capsys)
    assert (code, out) == (1, "") and err.startswith("fairstream tail: error: ") and err.count("\n") == 1
    with pytest.raises(SystemExit):
        main(["tail", "dlq", "-n", "0"])
    assert "expected a whole number >= 1, got '0'" in capsys.readouterr().err


@pytest.mark.integration
def test_replay_research_sends_the_labelled_research_split_to_the_research_topic(broker, tmp_path, capsys):
    toml, config = pipeline(tmp_path, "replay-research")
    code, out, err = run_main(["replay", "--research", "--limit", 40, "--quiet", "--broker", broker.url,
                               "--config", toml], capsys)
    assert (code, out) == (0, "sent 40 of 40 records to replay-research.research\n"), err
    research = datasets.load("adult").split(10_000, seed=0)[0]  # the split a re-fit and `repair` fit on
    with TopicReader(broker.bootstrap, config.topics.research) as reader:
        deadline, records = time.monotonic() + 60, []
        while len(records) < 40 and time.monotonic() < deadline:
            records += [json.loads(m.value) for m in reader.poll()]
    by_id = {record["id"]: record for record in records}
    assert sorted(by_id) == sorted(f"adult-research-{i}" for i in range(40))
    for i in range(40):
        record = by_id[f"adult-research-{i}"]
        assert list(record["features"].values()) == research.X[i].tolist()
        assert (record["s"], record["u"], record["y"]) == (research.s[i], research.u[i], research.y[i])


@pytest.mark.parametrize("args, message", [
    (["--research", "--bad", "5"], "--bad mixes invalid records into records.in; --research sends only the labelled "
                                   "research split"),
    (["--research", "--n-research", "0"], "--dataset adult: --research sends the research split, but --n-research "
                                          "is 0"),
    (["--n-research", "50000"], "--dataset adult: --n-research 50000 must be at least 0 and leave an archive: adult "
                                "has 45222 rows"),
], ids=["research with bad records", "no research split", "no archive"])
def test_replay_refuses_a_split_it_cannot_send_in_one_line_before_connecting(args, message, capsys):
    code, out, err = run_main(["replay", "--broker", UNREACHABLE, *args], capsys)
    assert (code, out, err) == (1, "", f"fairstream replay: error: {message}\n")


def test_replay_defaults_to_a_research_split_that_fits_the_data_set():
    from fairstream.streams.demo.replay import replay_part

    compas = datasets.load("compas")
    assert len(replay_part(compas, None, seed=0)) == len(compas) - 3083  # half of COMPAS's 6,167 rows is research
    assert len(replay_part(compas, None, seed=0, research=True)) == 3083
    assert len(replay_part(compas, 0, seed=0)) == len(compas)  # 0: every row


@pytest.mark.integration
def test_tail_skips_to_the_end_of_a_long_topic_instead_of_reading_all_of_it(broker, tmp_path):
    from fairstream.streams.demo.collect import last_messages

    _, config = pipeline(tmp_path, "tail-long", broker.bootstrap)
    padding = "x" * 1000
    send(broker.bootstrap, config.topics.records_in, [{"n": i, "pad": padding} for i in range(12_000)], partitions=1)
    with TopicReader(broker.bootstrap, config.topics.records_in, must_exist=True) as reader:
        returned, poll = [], reader.poll

        def counted_poll(**kwargs):
            messages = poll(**kwargs)
            returned.extend(messages)
            return messages

        reader.poll = counted_poll
        messages = last_messages(reader, 3, timeout=60)
    assert [json.loads(m.value)["n"] for m in messages] == [11_997, 11_998, 11_999]
    assert len(returned) < 12_000  # one fetch (at most 8 MiB) from the start, then the last three
