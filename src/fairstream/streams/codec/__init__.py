"""The batch codec: one module per message the agents exchange; import from the message's module.

- :mod:`~fairstream.streams.codec.records`: input records (``records.in``), decoded and validated into arrays.
- :mod:`~fairstream.streams.codec.mapped`: a team's own records (``[mapping]``), decoded by field paths, passed through.
- :mod:`~fairstream.streams.codec.avro`: Avro records in the Confluent wire format, with a schema registry.
- :mod:`~fairstream.streams.codec.inputs`: a pipeline's input decoder (envelope, mapped JSON or mapped Avro).
- :mod:`~fairstream.streams.codec.embeddings`: input embeddings (``embeddings.in``), decoded into vectors.
- :mod:`~fairstream.streams.codec.repaired`: repaired records and embeddings with provenance, and their reader.
- :mod:`~fairstream.streams.codec.dead_letters`: dead letters and the output budget every output fits under.
- :mod:`~fairstream.streams.codec.refit_requests`: re-fit requests (``refit.requests``).
- :mod:`~fairstream.streams.codec.json_text`: how a refusal reason shows a JSON value of the wrong type.
"""
