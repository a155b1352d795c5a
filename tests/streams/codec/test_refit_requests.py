"""Re-fit requests: a message that cannot be used is refused with a reason, never raised on."""

from __future__ import annotations

import pytest

from fairstream.streams.codec.refit_requests import RefitRequestError, parse_request


@pytest.mark.parametrize("ts", ["1" + "0" * 400, "-" + "9" * 400])
def test_a_refit_request_with_an_integer_beyond_the_float_range_is_refused_not_raised(ts):
    value = ('{"request_id": "r", "kind": "plan", "reason": "drift", "ts": %s}' % ts).encode()
    with pytest.raises(RefitRequestError, match="'ts' must be a finite number"):
        parse_request(value)
