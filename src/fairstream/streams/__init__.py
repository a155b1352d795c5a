"""fairstream.streams: the Faust/Kafka pipeline, monitor, Prometheus exporter, artifact registry and CLI."""
