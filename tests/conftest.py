"""Test-wide settings."""

import pytest
from hypothesis import settings

# No per-example deadline: on a shared 2-core machine one example can take seconds (the first call
# of a lazily imported library, a busy neighbour), and a timing failure there says nothing about
# the property under test. Slowness is measured in benchmarks/, never asserted in tests.
settings.register_profile("fairstream", deadline=None)
settings.load_profile("fairstream")


@pytest.fixture(scope="session", autouse=True)
def private_runtime_dir(tmp_path_factory):
    """A runtime directory of the test session's own: no test finds (or stops) a developer's running broker.

    Commands run in a subprocess inherit it. ``$FAIRSTREAM_BROKER`` of the developer's shell is dropped too.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FAIRSTREAM_RUNTIME_DIR", str(tmp_path_factory.mktemp("runtime")))
        patch.delenv("FAIRSTREAM_BROKER", raising=False)
        yield


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory):
    """One single-node Apache Kafka (KRaft) for the test session (one per pytest-xdist worker).

    Modules share it; the ``broker`` fixture clears what the module before left (topics, groups).
    """
    from fairstream.streams.ops.kafka_cluster import KafkaCluster

    with KafkaCluster(tmp_path_factory.mktemp("kafka")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory):
    """One Apicurio Registry (in-memory storage) for the test session (one per pytest-xdist worker), started on
    first use: the Avro tests share it, each on subjects of its own topics."""
    from fairstream.streams.ops.schema_registry import SchemaRegistry

    with SchemaRegistry(tmp_path_factory.mktemp("schema-registry")) as registry:
        yield registry
