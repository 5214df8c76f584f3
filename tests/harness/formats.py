"""What the formats' integration tests share: schemas, a protobuf message class built
at import (no protoc), registry-framed input written by confluent-kafka's own
serializers, outputs read back by its own deserializers, and the stage's settings."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import fastavro
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from service import Output, Record
from service.contract.records import Transform
from service.examples import avro_orders
from service.formats import wire
from service.formats.codec import build, with_formats
from service.settings import load_settings
from tests.harness.reading import read_committed

EXAMPLES = Path(avro_orders.__file__).parent
ORDER = (EXAMPLES / "order.avsc").read_text()
PRICED = (EXAMPLES / "priced_order.avsc").read_text()
ORDER_V2 = json.dumps({**json.loads(ORDER), "fields": [
    *json.loads(ORDER)["fields"], {"name": "note", "type": "string", "default": ""}]})
ORDER_JSON_SCHEMA = json.dumps({
    "$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
    "properties": {"id": {"type": "integer"}, "amount": {"type": "number"}},
    "required": ["id", "amount"], "additionalProperties": False})


def _order_message() -> Any:
    fdp = descriptor_pb2.FileDescriptorProto(name="txstage_test_order.proto",
                                             package="txstage.test", syntax="proto3")
    message = fdp.message_type.add(name="Order")
    for number, (name, kind) in enumerate((("id", "TYPE_INT64"), ("amount", "TYPE_DOUBLE"),
                                           ("currency", "TYPE_STRING")), start=1):
        message.field.add(name=name, number=number, label=1,
                          type=getattr(descriptor_pb2.FieldDescriptorProto, kind))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("txstage.test.Order"))


Order = _order_message()


def client(url: str) -> SchemaRegistryClient:
    """A registry client whose every request is bounded: without a time-out a request
    on a connection the registry dropped waits forever (seen once in a test run)."""
    return SchemaRegistryClient({"url": url, "timeout": 10})


def produce(bootstrap: str, topic: str, values: Iterable[Any],
            serialize: Callable[[Any, SerializationContext], bytes | None], partitions: int
            ) -> int:
    """Each value serialized by ``serialize`` (a confluent-kafka serializer or raw
    bytes), key ``k<i>``, round-robin over ``partitions``."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5})
    context = SerializationContext(topic, MessageField.VALUE)
    count = 0
    for i, value in enumerate(values):
        data = value if isinstance(value, bytes) else serialize(value, context)
        producer.produce(topic, data, f"k{i}".encode(), partition=i % partitions)
        producer.poll(0)
        count += 1
    assert producer.flush(30) == 0, "inputs not delivered"
    return count


def read_values(bootstrap: str, topic: str,
                deserialize: Callable[[bytes, SerializationContext], Any]) -> list[Any]:
    """The topic's values read_committed, each through a plain deserializer."""
    context = SerializationContext(topic, MessageField.VALUE)
    return [deserialize(record.value, context) for record in read_committed(bootstrap, topic)
            if record.value is not None]


def stage_env(url: str, fmt: str, **extra: str) -> dict[str, str]:
    return {"TXSTAGE_REGISTRY_URL": url, "TXSTAGE_INPUT_VALUE_FORMAT": fmt,
            "TXSTAGE_OUTPUT_VALUE_FORMAT": fmt, **extra}


def formatted(env: dict[str, str]) -> Transform:
    """The stage's transform as the stage wraps it, for the V1-V5 verifier."""
    settings = load_settings(env)
    from service.contract.loading import load_transform

    return with_formats(load_transform(settings.transform),
                        build(settings, settings.transform), settings.output_topic)


def price_or_violate(record: Record) -> Iterator[Output]:
    """``avro_orders.price``, except that every order whose id ends in 00 gets an
    output that does not match ``priced_order.avsc`` (a string where a long goes)."""
    order: Any = record.value
    if order["id"] % 100 == 0:
        yield Output(value={"id": "not a long"})  # type: ignore[arg-type]
        return
    yield from avro_orders.price(record)


def identity(record: Record) -> Iterator[Output]:
    """The decoded value as it came (JSON Schema, protobuf)."""
    yield Output(value=record.value, key=record.key)


def framed(schema_id: int, schema: str, values: Iterable[dict[str, Any]]) -> list[bytes]:
    """Each value in the registry wire format with ``schema_id`` (fastavro, ``schema``)."""
    parsed = fastavro.parse_schema(json.loads(schema))
    encoded = []
    for value in values:
        out = io.BytesIO()
        out.write(wire.header(schema_id))
        fastavro.schemaless_writer(out, parsed, value)
        encoded.append(out.getvalue())
    return encoded
