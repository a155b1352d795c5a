"""What tests do to an Apache Kafka cluster through its admin API: clear it, look at its groups."""

from __future__ import annotations

import time

from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType


def clear_cluster(bootstrap: str, timeout: float = 60.0) -> None:
    """Delete every topic but Kafka's own and every consumer group, and wait until they are gone."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [name for name in admin.list_topics(timeout=10).topics if not name.startswith("__")]
    if topics:
        for future in admin.delete_topics(topics, operation_timeout=30).values():
            future.result()
    groups = [g.group_id for g in admin.list_consumer_groups(request_timeout=10).result().valid]
    if groups:
        for future in admin.delete_consumer_groups(groups, request_timeout=30).values():
            future.exception()  # a group with members left (a worker killed by its test) empties by itself
    deadline = time.monotonic() + timeout
    while set(topics) & set(admin.list_topics(timeout=10).topics):
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics still listed {timeout:g} s after their deletion")
        time.sleep(0.1)


def allow_messages_of(bootstrap: str, topic: str, size: int) -> None:
    """Raise ``topic``'s ``max.message.bytes`` to ``size`` (Kafka's default refuses records over about 1 MB)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic,
                              incremental_configs=[ConfigEntry("max.message.bytes", str(size),
                                                               incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
