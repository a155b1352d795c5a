"""The re-fit reads a research topic whatever compression its producers chose.

The research source reads with kafka-python, whose codecs come from their own libraries
(python-snappy, lz4, zstandard): without them one compressed batch made every re-fit fail with
``UnsupportedCodecError``. The worker's consumer (aiokafka, codecs from cramjam) has its own test in
``tests/streams/worker/test_poison_inputs.py``.
"""

import numpy as np
import pytest
from confluent_kafka import Producer

from fairstream.repair import datasets
from fairstream.streams.config import adult_config
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.refit.sources import read_research_topic
from fairstream.streams.topics import ensure_topics

pytestmark = pytest.mark.integration

CODECS = ("gzip", "snappy", "lz4", "zstd")  # every compression codec Kafka defines


def test_a_research_topic_written_in_every_codec_kafka_defines_is_read_whole(broker):
    config = adult_config().with_topics(prefix="compressed", partitions=1)
    ensure_topics(broker.bootstrap, config.topics)
    research, _ = datasets.load("adult").split(400, seed=0)
    for i, codec in enumerate(CODECS):
        rows = slice(100 * i, 100 * (i + 1))
        producer = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": codec, "linger.ms": 100})
        for key, value in record_messages(research.subset(rows), config, id_prefix=codec):
            producer.produce(config.topics.research, key=key, value=value)
        assert producer.flush(30) == 0, f"{codec}: not all sent"
    window = read_research_topic(broker.bootstrap, config, idle_seconds=5.0, timeout=60.0)
    assert window.n_invalid == 0 and len(window.X) == 400
    assert np.array_equal(np.sort(window.X, axis=0), np.sort(research.X, axis=0))
