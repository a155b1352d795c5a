"""Former name of :mod:`fairstream.repair.validation`; kept only until every importer has moved.

Product code must import ``fairstream.repair.validation`` (tests/test_private_names.py checks it).
"""

from .validation import (  # noqa: F401
    RepairInputError,
    as_2d,
    as_labels,
    as_scores,
    check_finite,
    column_names,
    encode,
    encode_mask,
    normalise_labels,
)
