"""How a refusal reason shows a JSON value of the wrong type (the readers of every message word it alike)."""

from __future__ import annotations

import json


def describe(value) -> str:
    """A value of the wrong type, for a reason: containers by kind (printing a 900-deep array recurses)."""
    if isinstance(value, (list, dict)):
        return "a JSON array" if isinstance(value, list) else "a JSON object"
    return json.dumps(value) if isinstance(value, bool) else repr(value)  # a float: 1.5, nan, inf
