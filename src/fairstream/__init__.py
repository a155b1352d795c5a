"""fairstream: repair and monitor unfairness in data while it streams.

Three rooms, imports pointing down only: :mod:`fairstream.repair` (the math, measurement, the artifact format,
data sets) <- :mod:`fairstream.models` (the artifact kinds) <- :mod:`fairstream.streams` (Kafka clients, workers,
monitor, control, re-fit, ops).
"""
