"""The formats' codecs on confluent-kafka's ``mock://`` registry (units only; the real
registry's tests are tests/integration/test_formats_*.py): decoded values in, encoded
outputs out, each failure sorted as the record's (dead letter) or the registry's (wait)."""

from __future__ import annotations

import io
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro
import httpx2
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from service import examples
from service.contract.processing import TopicLimitPending, process
from service.contract.records import Output, Record
from service.errors import ConfigError
from service.formats import wire
from service.formats.codec import build, with_formats
from service.formats.errors import OutputSchemaError, RegistryUnavailable, UndecodableError
from service.formats.registry import Registry, unavailable
from service.settings import Settings, load_settings

_ORDER = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "amount", "type": "double"},
    {"name": "currency", "type": "string"}]}


def _settings(**extra: str) -> Settings:
    return load_settings({
        "TXSTAGE_BOOTSTRAP_SERVERS": "k:9092", "TXSTAGE_GROUP_ID": "g",
        "TXSTAGE_INPUT_TOPICS": "orders", "TXSTAGE_OUTPUT_TOPIC": "priced",
        "TXSTAGE_DLQ_TOPIC": "dlq", "TXSTAGE_TRANSFORM": "service.examples.avro_orders:price",
        "TXSTAGE_REGISTRY_URL": f"mock://{uuid.uuid4().hex}", **extra})


def _avro_settings() -> Settings:
    return _settings(TXSTAGE_INPUT_VALUE_FORMAT="avro", TXSTAGE_OUTPUT_VALUE_FORMAT="avro",
                     TXSTAGE_OUTPUT_VALUE_SCHEMA="priced_order.avsc")


def _avro(schema_id: int, value: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    out.write(wire.header(schema_id))
    fastavro.schemaless_writer(out, fastavro.parse_schema(_ORDER), value)
    return out.getvalue()


def _record(value: bytes | None, offset: int = 0) -> Record:
    return Record("orders", 0, offset, 0, b"k", value)


@pytest.fixture
def avro() -> Iterator[tuple[Settings, SchemaRegistryClient, int]]:
    settings = _avro_settings()
    client = SchemaRegistryClient.new_client({"url": settings.registry_url})
    order_id = client.register_schema("orders-value", Schema(json.dumps(_ORDER), "AVRO"))
    text = (Path(examples.__file__).parent / "priced_order.avsc").read_text()
    client.register_schema("priced-value", Schema(text, "AVRO"))
    yield settings, client, order_id


def _run(settings: Settings, client: SchemaRegistryClient, record: Record,
         transform: Any = None) -> Any:
    from service.examples.avro_orders import price

    codecs = build(settings, settings.transform, Registry(settings, client=client))
    wrapped = with_formats(transform or price, codecs, settings.output_topic)
    return process(wrapped, record, default_topic="priced", dlq_topic="dlq",
                   max_bytes=lambda topic: 1_000_000)


def test_avro_in_avro_out(avro: tuple[Settings, SchemaRegistryClient, int]) -> None:
    settings, client, order_id = avro
    result = _run(settings, client, _record(_avro(order_id, {"id": 7, "amount": 1.5,
                                                             "currency": "EUR"})))
    assert result.error is None
    (out,) = result.outputs
    schema_id, payload = wire.split(out.value)
    written = json.loads(client.get_schema(schema_id).schema_str)
    assert fastavro.schemaless_reader(io.BytesIO(payload), fastavro.parse_schema(written),
                                      None) == {"id": 7, "amount_cents": 150,
                                                "currency": "EUR", "source": "orders/0/0"}


@pytest.mark.parametrize(("case", "cause"), [
    ("plain", "not in the schema registry wire format"),
    ("unknown id", "unknown schema id 4242"),
    ("cut short", "does not decode as avro with schema"),
])
def test_bad_input_is_dead_lettered_with_its_cause(
        avro: tuple[Settings, SchemaRegistryClient, int], case: str, cause: str) -> None:
    settings, client, order_id = avro
    value = {"plain": b"plain text", "unknown id": wire.header(4242) + b"\x02",
             "cut short": wire.header(order_id) + b"\x02"}[case]
    result = _run(settings, client, _record(value))
    assert isinstance(result.error, UndecodableError)
    assert cause in str(result.error)
    (letter,) = result.outputs
    assert letter.topic == "dlq" and letter.value == value
    assert dict(letter.headers)["txstage.error.class"] == b"UndecodableError"


def test_an_output_off_its_schema_dead_letters_the_input(
        avro: tuple[Settings, SchemaRegistryClient, int]) -> None:
    settings, client, order_id = avro
    record = _record(_avro(order_id, {"id": 1, "amount": 2.0, "currency": "EUR"}))
    result = _run(settings, client, record, lambda r: [Output({"id": "not a long"})])
    assert isinstance(result.error, OutputSchemaError)
    assert "priced-value" in str(result.error)
    assert result.outputs[0].topic == "dlq" and result.outputs[0].value == record.value


class _Down(SchemaRegistryClient):  # type: ignore[misc]
    """A registry that does not answer (a unit's stand-in for a connection refused)."""

    calls = 0

    def get_schema(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        raise httpx2.ConnectError("connection refused")


def test_a_registry_that_does_not_answer_holds_the_record(
        avro: tuple[Settings, SchemaRegistryClient, int]) -> None:
    settings, _, order_id = avro
    states: list[bool] = []
    down = _Down({"url": settings.registry_url})
    registry = Registry(settings, client=down, on_state=states.append)
    wrapped = with_formats(lambda r: [], build(settings, settings.transform, registry),
                           "priced")
    record = _record(_avro(order_id, {"id": 1, "amount": 2.0, "currency": "EUR"}))
    with pytest.raises(TopicLimitPending) as caught:
        process(wrapped, record, default_topic="priced", dlq_topic="dlq",
                max_bytes=lambda topic: 1_000_000)
    assert isinstance(caught.value, RegistryUnavailable) and caught.value.lookup is not None
    assert states == [False]
    # Known down: the loop does not ask (and wait) again; the lookup beside it does.
    with pytest.raises(RegistryUnavailable):
        process(wrapped, record, default_topic="priced", dlq_topic="dlq",
                max_bytes=lambda topic: 1_000_000)
    assert down.calls == 1
    assert registry.wait_for(("id", order_id), lambda: down.get_schema(order_id),
                             window_s=0.3) is False


def test_bytes_everywhere_is_the_transform_itself() -> None:
    settings = _settings()

    def transform(record: Record) -> list[Output]:
        return []

    assert with_formats(transform, build(settings, settings.transform), "priced") is transform


def test_json_values_round_trip() -> None:
    settings = _settings(TXSTAGE_INPUT_VALUE_FORMAT="json", TXSTAGE_OUTPUT_VALUE_FORMAT="json")
    wrapped = with_formats(lambda r: [Output({**r.value, "seen": True})],  # type: ignore[dict-item]
                           build(settings, settings.transform), "priced")
    (out,) = wrapped(_record(b'{"a": 1}'))
    assert out.value == b'{"a":1,"seen":true}'
    with pytest.raises(UndecodableError, match="not JSON"):
        wrapped(_record(b"{"))


@pytest.mark.parametrize(("extra", "problem"), [
    ({"TXSTAGE_INPUT_VALUE_FORMAT": "avro", "TXSTAGE_REGISTRY_URL": ""},
     "TXSTAGE_REGISTRY_URL: needed by TXSTAGE_INPUT_VALUE_FORMAT"),
    ({"TXSTAGE_OUTPUT_VALUE_FORMAT": "protobuf"},
     "TXSTAGE_OUTPUT_VALUE_SCHEMA: protobuf needs the message class as module:Class"),
    ({"TXSTAGE_INPUT_VALUE_SCHEMA": "x.avsc"},
     "TXSTAGE_INPUT_VALUE_SCHEMA: not used with TXSTAGE_INPUT_VALUE_FORMAT=bytes"),
    ({"TXSTAGE_OUTPUT_KEY_FORMAT": "xml"}, "TXSTAGE_OUTPUT_KEY_FORMAT: Input should be"),
])
def test_format_settings_say_what_is_wrong(extra: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _settings(**extra)
    assert any(line.startswith(problem) for line in caught.value.problems), caught.value.problems


def test_a_missing_schema_file_is_a_config_error() -> None:
    settings = _settings(TXSTAGE_OUTPUT_VALUE_FORMAT="avro",
                         TXSTAGE_OUTPUT_VALUE_SCHEMA="nowhere.avsc")
    with pytest.raises(ConfigError, match=r"_SCHEMA=nowhere\.avsc: no such file"):
        build(settings, settings.transform)


def test_check_config_names_a_registry_that_does_not_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from service.formats import check
    from service.local_kafka.node import free_ports

    monkeypatch.setattr(check, "_REACH_S", 0.3)
    url = f"http://127.0.0.1:{free_ports(1)[0]}/apis/ccompat/v7"
    settings = _settings(TXSTAGE_OUTPUT_VALUE_FORMAT="avro", TXSTAGE_REGISTRY_URL=url)
    with pytest.raises(ConfigError, match=re.escape(f"REGISTRY_URL={url}: does not answer")):
        check.check_formats(settings)


def test_records_of_an_older_version_decode_into_the_readers_view(tmp_path: Path) -> None:
    v2 = {**_ORDER, "fields": [*_ORDER["fields"],
                               {"name": "note", "type": "string", "default": "none"}]}
    reader = tmp_path / "order_v2.avsc"
    reader.write_text(json.dumps(v2))
    settings = _settings(TXSTAGE_INPUT_VALUE_FORMAT="avro",
                         TXSTAGE_INPUT_VALUE_SCHEMA=str(reader))
    client = SchemaRegistryClient.new_client({"url": settings.registry_url})
    v1_id = client.register_schema("orders-value", Schema(json.dumps(_ORDER), "AVRO"))
    seen: list[object] = []
    wrapped = with_formats(lambda r: seen.append(r.value) or [],  # type: ignore[func-returns-value]
                           build(settings, settings.transform, Registry(settings, client=client)),
                           "priced")
    wrapped(_record(_avro(v1_id, {"id": 1, "amount": 2.0, "currency": "EUR"})))
    assert seen == [{"id": 1, "amount": 2.0, "currency": "EUR", "note": "none"}]


@pytest.mark.parametrize(("strategy", "subject"), [
    ("topic", "priced-value"), ("record", "txstage.examples.PricedOrder"),
    ("topic_record", "priced-txstage.examples.PricedOrder")])
def test_subject_name_strategies(strategy: str, subject: str) -> None:
    settings = _settings(TXSTAGE_OUTPUT_VALUE_FORMAT="avro",
                         TXSTAGE_OUTPUT_VALUE_SCHEMA="priced_order.avsc",
                         TXSTAGE_SUBJECT_NAME_STRATEGY=strategy)
    assert build(settings, settings.transform).encoders["output_value"].subject("priced") == \
        subject


def test_keys_have_formats_of_their_own() -> None:
    settings = _settings(TXSTAGE_INPUT_KEY_FORMAT="json", TXSTAGE_OUTPUT_KEY_FORMAT="json")
    wrapped = with_formats(lambda r: [Output(r.value, key={"was": r.key})],  # type: ignore[arg-type]
                           build(settings, settings.transform), "priced")
    (out,) = wrapped(Record("orders", 0, 0, 0, b'"k1"', b"raw"))
    assert (out.key, out.value) == (b'{"was":"k1"}', b"raw")


def test_an_output_subject_registered_late_is_found_then() -> None:
    settings = _avro_settings()
    client = SchemaRegistryClient.new_client({"url": settings.registry_url})
    order_id = client.register_schema("orders-value", Schema(json.dumps(_ORDER), "AVRO"))
    record = _record(_avro(order_id, {"id": 7, "amount": 1.5, "currency": "EUR"}))
    codecs = build(settings, settings.transform, Registry(settings, client=client))
    from service.examples.avro_orders import price

    wrapped = with_formats(price, codecs, "priced")
    with pytest.raises(OutputSchemaError, match="subject 'priced-value' has no schema"):
        wrapped(record)
    text = (Path(examples.__file__).parent / "priced_order.avsc").read_text()
    client.register_schema("priced-value", Schema(text, "AVRO"))
    (out,) = wrapped(record)
    assert out.value is not None and out.value[:1] == b"\x00"


@pytest.mark.parametrize("error", [
    SchemaRegistryError(503, 50301, "unavailable"), SchemaRegistryError(401, 40101, "who?"),
    json.JSONDecodeError("not the registry's answer", "<html>", 0)])
def test_registry_trouble_is_never_the_records_fault(error: Exception) -> None:
    assert unavailable(error)
    assert not unavailable(SchemaRegistryError(404, 40403, "schema not found"))


def test_a_format_without_its_libraries_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from service.formats import load

    monkeypatch.setitem(sys.modules, "service.formats.codec", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"needs the schemas extra \(pip install"):
        load.load_formatted("service.examples.avro_orders:price",
                            _settings(TXSTAGE_INPUT_VALUE_FORMAT="json"))
