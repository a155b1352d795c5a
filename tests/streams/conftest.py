"""Fixtures shared by the stream tests."""

import pytest

from fairstream.streams.ops.broker import EmbeddedBroker


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """A real embedded broker, one per test module (group joins and topics stay apart)."""
    with EmbeddedBroker(tmp_path_factory.mktemp("broker")) as running:
        yield running
