"""Fixtures shared by the stream tests."""

import pytest

from fairstream.streams.ops.broker import EmbeddedBroker
from tests.kafka_admin import clear_cluster


@pytest.fixture(scope="module")
def broker(kafka_cluster):
    """Apache Kafka for one test module: the session's cluster, cleared of the topics and groups of the module
    before, so group joins and topics stay apart as on a broker of its own."""
    clear_cluster(kafka_cluster.bootstrap)
    yield kafka_cluster


@pytest.fixture(scope="module")
def embedded_broker(tmp_path_factory):
    """The embedded Tansu broker, for the tests of its own quirks and of the commands that start it."""
    with EmbeddedBroker(tmp_path_factory.mktemp("broker")) as running:
        yield running
