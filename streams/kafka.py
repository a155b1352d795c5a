"""Settings shared by every Kafka client the product opens (kafka-python and aiokafka alike)."""

KAFKA_API_VERSION = (2, 5, 0)
"""kafka-python's protocol version: what the embedded broker (Tansu) answers correctly with consumer
groups (auto-detection picks one it mis-answers); Apache Kafka accepts it too."""
