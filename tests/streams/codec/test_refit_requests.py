"""Re-fit requests: a message that cannot be used is refused with a reason, never raised on; the optional version
reads back whole."""

from __future__ import annotations

import json

import pytest

from fairstream.streams.codec.refit_requests import RefitRequest, RefitRequestError, parse_request


@pytest.mark.parametrize("ts", ["1" + "0" * 400, "-" + "9" * 400])
def test_a_refit_request_with_an_integer_beyond_the_float_range_is_refused_not_raised(ts):
    value = ('{"request_id": "r", "kind": "plan", "reason": "drift", "ts": %s}' % ts).encode()
    with pytest.raises(RefitRequestError, match="'ts' must be a finite number"):
        parse_request(value)


def request_json(**fields) -> bytes:
    return json.dumps({"request_id": "r", "kind": "plan", "reason": "drift", "ts": 1.0, **fields}).encode()


def test_a_request_names_the_version_it_is_about_and_reads_back_whole():
    request = RefitRequest.new("drift of dependence_e", statistic="dependence_e", value=0.12, source="a.monitor@h:1",
                               version=3)
    assert json.loads(request.to_json())["version"] == 3
    assert parse_request(request.to_json()) == request and parse_request(request_json(version=0)).version == 0
    assert parse_request(request_json(version=2**63 - 1)).version == 2**63 - 1


def test_a_request_without_a_version_is_written_and_read_as_before():
    request = RefitRequest.new("drift")
    assert request.version is None and "version" not in json.loads(request.to_json())
    assert parse_request(request_json()).version is None and parse_request(request_json(version=None)).version is None


@pytest.mark.parametrize("version", [True, False, -1, 2**63, 3.0, "3", [3]])
def test_a_version_that_is_not_a_count_within_63_bits_is_refused(version):
    with pytest.raises(RefitRequestError, match=r"'version' must be an integer from 0 to 9223372036854775807, got "):
        parse_request(request_json(version=version))
    with pytest.raises(RefitRequestError, match="'version' must be an integer"):
        RefitRequest.new("drift", version=version)
