"""Plain confluent-kafka Avro clients for the Avro quick path (docs/formats.md): no
txstage code, what any producer or consumer of the pipeline would run.

    python -m service.examples.avro_clients produce orders 3   # Orders 1..3
    python -m service.examples.avro_clients read priced 3      # PricedOrders, as dicts

Both take ``TXSTAGE_BOOTSTRAP_SERVERS`` and ``TXSTAGE_REGISTRY_URL`` from the
environment; the writer's schema is ``order.avsc`` beside this module, looked up (not
registered) under ``<topic>-value``.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext


def produce(topic: str, count: int) -> None:
    registry = SchemaRegistryClient({"url": os.environ["TXSTAGE_REGISTRY_URL"], "timeout": 10})
    schema = (Path(__file__).parent / "order.avsc").read_text()
    serialize = AvroSerializer(registry, schema, conf={"auto.register.schemas": False})
    producer = Producer({"bootstrap.servers": os.environ["TXSTAGE_BOOTSTRAP_SERVERS"]})
    context = SerializationContext(topic, MessageField.VALUE)
    for i in range(1, count + 1):
        order = {"id": i, "amount": i * 1.25, "currency": "EUR"}
        producer.produce(topic, serialize(order, context), str(i).encode())
    if producer.flush(30):
        raise SystemExit("not every order was delivered")


def read(topic: str, count: int) -> None:
    registry = SchemaRegistryClient({"url": os.environ["TXSTAGE_REGISTRY_URL"], "timeout": 10})
    deserialize = AvroDeserializer(registry)
    consumer = Consumer({"bootstrap.servers": os.environ["TXSTAGE_BOOTSTRAP_SERVERS"],
                         "group.id": f"avro-reader-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    consumer.subscribe([topic])
    context = SerializationContext(topic, MessageField.VALUE)
    try:
        seen = 0
        while seen < count:
            message = consumer.poll(30)
            if message is None:
                raise SystemExit(f"read {seen} of {count} records in time")
            if message.error():
                continue
            print(deserialize(message.value(), context))
            seen += 1
    finally:
        consumer.close()


if __name__ == "__main__":
    command, topic, number = sys.argv[1:4]
    {"produce": produce, "read": read}[command](topic, int(number))
