"""The batch codec: one module per message the agents exchange; import from the message's module.

- :mod:`~fairstream.streams.codec.records`: input records (``records.in``), decoded and validated into arrays.
- :mod:`~fairstream.streams.codec.embeddings`: input embeddings (``embeddings.in``), decoded into vectors.
- :mod:`~fairstream.streams.codec.repaired`: repaired records and embeddings with provenance, and their reader.
- :mod:`~fairstream.streams.codec.dead_letters`: dead letters and the output budget every output fits under.
- :mod:`~fairstream.streams.codec.refit_requests`: re-fit requests (``refit.requests``).
- :mod:`~fairstream.streams.codec.json_text`: how a refusal reason shows a JSON value of the wrong type.
"""
