"""A pipeline's input records, in whatever format it reads them: one decoder for the worker and the re-fits.

A pipeline without a ``[mapping]`` reads fairstream's envelope (:mod:`~fairstream.streams.codec.records`); one with a
mapping reads a team's own records (:mod:`~fairstream.streams.codec.mapped`), as JSON or, with ``[topics] format =
"avro"``, as Avro in the Confluent wire format (:mod:`~fairstream.streams.codec.avro`). The worker's input topic and the
pipeline's ``research`` topic carry the same records, so both are read through :class:`InputDecoder`: a re-fit
accepts exactly what a worker accepts, and refuses the rest with the same reasons.

>>> from fairstream.streams.config import PipelineConfig
>>> config = PipelineConfig.from_dict({"pipeline": {"name": "loans", "features": ["age"], "groups": ["F", "M"],
...     "strata": ["north"], "label": True}, "mapping": {"id": "$key", "s": "applicant.sex",
...     "u": {"path": "branch", "default": "north"}, "y": "outcome", "features": {"age": "applicant.age"}}})
>>> decoded = InputDecoder.for_config(config).decode(
...     [b'{"applicant": {"age": 37, "sex": "F"}, "outcome": 1}', b'{"applicant": {"sex": "M"}}'], [b"A-1", b"A-2"])
>>> decoded.X.tolist(), decoded.keys.tolist(), decoded.batch().y.tolist(), decoded.errors
([[37.0]], ['A-1'], [1], [(1, 'missing field applicant.age (mapping.features.age)')])
"""

from __future__ import annotations

from typing import Sequence

from fairstream.streams.config import PipelineConfig
from fairstream.streams.topics import FORMATS

from .avro import AvroFormat
from .mapped import MappedRecords
from .records import DecodedRecords, decode_records

class InputDecoder:
    """Decodes a pipeline's input records: the envelope, mapped JSON or mapped Avro.

    Parameters
    ----------
    config : PipelineConfig
        The pipeline; its ``mapping`` (None: the envelope) says how a record is read.
    mapped : MappedRecords, optional
        The mapping's codec (required with a mapping).
    avro : AvroFormat, optional
        The Avro format the values are in, deserialized before the mapping reads them (None: JSON).
    """

    def __init__(self, config: PipelineConfig, mapped: MappedRecords | None = None, avro: AvroFormat | None = None):
        if (mapped is None) != (config.mapping is None):
            raise ValueError("an InputDecoder has a MappedRecords exactly when its pipeline has a [mapping]")
        if avro is not None and mapped is None:
            raise ValueError("Avro records are read through a [mapping]: the envelope is JSON only")
        self.config, self.mapped, self.avro = config, mapped, avro

    @classmethod
    def for_config(cls, config: PipelineConfig, format: str | None = None) -> "InputDecoder":
        """The decoder of ``config``'s records.

        Parameters
        ----------
        config : PipelineConfig
            The pipeline.
        format : {"json", "avro"}, optional
            The format the values are in; default the topics' (``[topics] format``). A file of JSON lines is
            ``"json"`` whatever the topics carry.

        Returns
        -------
        InputDecoder
            The decoder (on Avro, its registry client is created, nothing is asked yet).
        """
        format = config.topics.format if format is None else format
        if format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
        if config.mapping is None:
            return cls(config)
        avro = AvroFormat.for_config(config) if format == "avro" else None
        return cls(config, MappedRecords.for_config(config), avro)

    def decode(self, values: Sequence[bytes | None], keys: Sequence[bytes | None]) -> DecodedRecords:
        """Decode a batch of messages into arrays, and a reason for every unusable one.

        Parameters
        ----------
        values : sequence of bytes or None
            The messages' values.
        keys : sequence of bytes or None
            Their Kafka keys (a mapped id may be ``"$key"``; the envelope carries its own id and ignores them).

        Returns
        -------
        DecodedRecords
            The usable records and ``errors``: (position, reason). On Avro, a message that is not in the framing or
            names a schema the registry does not know carries its reason into the decoding.

        Raises
        ------
        RegistryUnavailable
            On Avro, when the schema registry cannot be asked (nothing is refused for an outage).
        """
        if self.mapped is None:
            return decode_records(values, self.config)
        if self.avro is not None:
            return self.mapped.decode_objects(self.avro.deserialize(values), keys, values)
        return self.mapped.decode(values, keys)
