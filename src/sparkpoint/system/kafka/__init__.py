"""The Kafka system (``systems.<s>.factory: kafka``) on confluent-kafka; see :mod:`.system`."""

from sparkpoint.system.kafka.system import KafkaSystemFactory

__all__ = ["KafkaSystemFactory"]
