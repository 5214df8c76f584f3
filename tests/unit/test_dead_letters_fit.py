"""A dead letter is built to fit its topic: no record's bytes can make the stage exit.

A record near the producer's message.max.bytes that the transform rejects got a dead
letter of its value plus the error headers, which produce() refused synchronously
(MSG_SIZE_TOO_LARGE), classified fatal: exit 1, and every next owner the same.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from service import Record
from service.contract.deadletter import DROPPED, dropped_parts
from service.contract.letters import parse
from service.contract.processing import FRAMING_BYTES, OutputRefusedError, process, refused, size_of
from service.contract.records import Output
from service.errors import AbortableError, FatalError, Where
from service.examples.square import square
from service.kafka.errors import translate
from service.tools.verify import _same

LIMIT = 1_000_000
BIG = Record("in", 0, 7, 1_700_000_000_000, b"k" * 20, b"x" * 999_700, (("trace", b"t" * 64),))


def limits(topic: str) -> int:
    return LIMIT


def test_the_letter_of_a_near_limit_record_leaves_out_its_value_and_says_so() -> None:
    [letter] = process(square, BIG, default_topic="out", dlq_topic="dlq",
                       max_bytes=limits).outputs
    assert letter.topic == "dlq" and letter.value is None
    assert size_of(letter.key, letter.value, letter.headers) <= LIMIT
    headers = dict(letter.headers)
    assert headers[DROPPED] == b"value=999700"
    assert headers["txstage.error.offset"] == b"7" and headers["txstage.error.class"]
    assert headers["trace"] == b"t" * 64 and letter.key == b"k" * 20  # kept: they fit


def test_a_letter_that_fits_is_unchanged() -> None:
    small = Record("in", 0, 7, 0, b"k", b"not a number")
    [letter] = process(square, small, default_topic="out", dlq_topic="dlq",
                       max_bytes=limits).outputs
    assert letter.value == b"not a number" and DROPPED not in dict(letter.headers)


def test_a_tiny_dead_letter_topic_gets_the_key_headers_and_message_cut_too() -> None:
    def tiny(topic: str) -> int:
        return FRAMING_BYTES + 400 if topic == "dlq" else LIMIT

    [letter] = refused(BIG, OutputRefusedError("no " * 3000), "dlq", tiny).outputs
    assert size_of(letter.key, letter.value, letter.headers) <= FRAMING_BYTES + 400
    assert (letter.key, letter.value) == (None, None)
    assert dropped_parts(letter.headers) == {"value", "key", "headers", "message"}


def test_redrive_reads_a_cut_letter_and_knows_its_original_is_not_all_there() -> None:
    [letter] = process(square, BIG, default_topic="out", dlq_topic="dlq",
                       max_bytes=limits).outputs
    parsed = parse("dlq", 0, 3, 0, letter.key, letter.value, letter.headers)
    assert parsed is not None and parsed.dropped == {"value"}
    assert parsed.original.offset == 7 and parsed.original.headers == (("trace", b"t" * 64),)


def test_verify_compares_a_cut_letter_without_what_it_left_out() -> None:
    [whole] = process(square, BIG, default_topic="out", dlq_topic="dlq",
                      max_bytes=lambda topic: 1 << 62).outputs
    [cut] = process(square, BIG, default_topic="out", dlq_topic="dlq",
                    max_bytes=limits).outputs
    found = Record("dlq", 0, 3, 0, cut.key, cut.value, tuple(cut.headers))
    assert _same(whole, found)
    assert not _same(whole, Record("dlq", 0, 3, 0, cut.key, b"other", tuple(cut.headers)))


def test_a_refusal_by_produce_itself_is_the_records_not_fatal() -> None:
    where = Where("produce", "tid", "in", 0, 7)
    for code in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError._UNKNOWN_TOPIC):
        error = translate(KafkaException(KafkaError(code)), where)
        assert isinstance(error, AbortableError) and error.where.offset == 7, error
    other = translate(KafkaException(KafkaError(KafkaError._INVALID_ARG)), where)
    assert isinstance(other, FatalError)


def test_an_output_is_still_checked_against_its_own_topic() -> None:
    def big(record: Record) -> list[Output]:
        return [Output(b"y" * (LIMIT + 1))]

    small = Record("in", 0, 1, 0, b"k", b"v")
    [letter] = process(big, small, default_topic="out", dlq_topic="dlq",
                       max_bytes=limits).outputs
    assert letter.topic == "dlq" and letter.value == b"v"
