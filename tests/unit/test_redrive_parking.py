"""Issue 29: redrive parks the hopeless. A letter the transform still fails on at its
``--max-attempts``-th redrive goes to the parking topic, with its progress mark in the
same transaction, instead of back to the DLQ: a scheduled redrive re-dead-lettered it on
every run, so the DLQ grew without bound. Written without a broker, as
test_redrive_writer.py does; the real-broker case is in
tests/integration/test_redrive.py."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
from confluent_kafka import KafkaError, KafkaException

from service.contract import letters
from service.contract.processing import Produced
from service.contract.records import Output, Record
from service.exit_codes import ExitCode
from service.kafka.cluster import UnknownTopicError
from service.kafka.producer import PinnedProducer
from service.tools.common import run_tool
from service.tools.redrive import cli, run
from service.tools.redrive.run import RedriveReport, _Writer
from tests.unit.test_redrive_writer import MARKS, RefusingProducer, copy

ATTEMPT = "txstage.redrive.attempt"
PARKED = "txstage.redrive.parked"
ORIGINAL = Record("in", 0, 100, 1000, b"k", b"v", (("trace", b"t"),))


def still_broken(record: Record) -> list[Output]:
    raise ValueError("still broken")


def headers_of(attempt: int, *, parked: bool = False) -> list[tuple[str, bytes | None]]:
    """A letter's headers for ORIGINAL as its ``attempt``-th redrive wrote it (0: as the
    stage did)."""
    headers: list[tuple[str, bytes | None]] = [
        *ORIGINAL.headers, ("txstage.error.class", b"ValueError"),
        ("txstage.error.message", b"x"), ("txstage.error.topic", b"in"),
        ("txstage.error.partition", b"0"), ("txstage.error.offset", b"100"),
        ("txstage.src", b"in/0/100"), ("txstage.idx", b"0")]
    if attempt:
        headers.append((ATTEMPT, str(attempt).encode()))
    if parked:
        headers.append((PARKED, b"1"))
    return headers


def letter(attempt: int, dlq_offset: int = 5, value: bytes = b"v") -> letters.Letter:
    """A letter of ORIGINAL (``value`` in place of its value) in the DLQ."""
    parsed = letters.parse("dlq", 0, dlq_offset, 1000, b"k", value, headers_of(attempt))
    assert parsed is not None
    return parsed


def written(producer: RefusingProducer) -> list[Produced]:
    """What the one committed transaction holds, progress marks left out."""
    [transaction] = producer.committed
    return [out for out, _ in transaction if out.topic != MARKS]


def test_a_letter_that_fails_its_third_redrive_is_parked_with_its_mark_not_dead_lettered(
        ) -> None:
    producer = RefusingProducer()
    report = RedriveReport()
    writer = _Writer(cast(PinnedProducer, producer), MARKS, still_broken, "out", "dlq",
                     lambda topic: 1 << 20, report, 10)  # --max-attempts 3, the default
    writer.add(letter(2))  # written by the second redrive: this one is its third
    writer.flush()

    [parked] = written(producer)
    assert parked.topic == "dlq.parked"
    assert dict(parked.headers)[ATTEMPT] == b"3" and dict(parked.headers)[PARKED] == b"1"
    [transaction] = producer.committed  # the letter and its mark: together or neither
    assert [out.key for out, _ in transaction if out.topic == MARKS] == [b"dlq/0/5"]
    assert (report.parked, report.failed_again, report.redriven) == (1, 0, 0), report


def test_a_parked_letter_has_the_headers_it_would_have_had_in_the_dlq_plus_parked(
        ) -> None:
    def write(max_attempts: int) -> Produced:
        producer = RefusingProducer()
        writer = _Writer(cast(PinnedProducer, producer), MARKS, still_broken, "out", "dlq",
                         lambda topic: 1 << 20, RedriveReport(), 10,
                         max_attempts=max_attempts, parking_topic="hopeless")
        writer.add(letter(1))
        writer.flush()
        [out] = written(producer)
        return out

    parked, again = write(2), write(3)
    assert (parked.topic, again.topic) == ("hopeless", "dlq")
    assert parked.headers == [*again.headers, (PARKED, b"1")]
    assert (parked.key, parked.value) == (again.key, again.value)


def test_below_its_last_attempt_a_letter_that_fails_goes_back_to_the_dlq() -> None:
    producer = RefusingProducer()
    report = RedriveReport()
    writer = _Writer(cast(PinnedProducer, producer), MARKS, still_broken, "out", "dlq",
                     lambda topic: 1 << 20, report, 10)
    writer.add(letter(0, dlq_offset=5))
    writer.add(letter(1, dlq_offset=6))
    writer.flush()

    outputs = written(producer)
    assert [(out.topic, dict(out.headers)[ATTEMPT]) for out in outputs] == [
        ("dlq", b"1"), ("dlq", b"2")]
    assert not any(PARKED in dict(out.headers) for out in outputs)
    assert (report.failed_again, report.parked) == (2, 0), report


def test_a_letter_whose_output_is_refused_at_its_last_attempt_is_parked() -> None:
    producer = RefusingProducer()  # refuses the copy of b"poison" at the first commit
    report = RedriveReport()
    writer = _Writer(cast(PinnedProducer, producer), MARKS, copy, "out", "dlq",
                     lambda topic: 1 << 20, report, 10)
    writer.add(letter(2, value=b"poison"))
    writer.flush()

    [parked] = written(producer)
    headers = dict(parked.headers)
    assert parked.topic == "dlq.parked" and parked.value == b"poison"
    assert headers["txstage.error.class"] == b"OutputRefusedError"
    assert (headers[ATTEMPT], headers[PARKED]) == (b"3", b"1")
    assert (report.parked, report.failed_again, report.redriven) == (1, 0, 0), report


def test_a_dry_run_counts_what_it_would_park_before_the_parking_topic_exists() -> None:
    def max_bytes(topic: str) -> int:
        if topic == "dlq.parked":  # a dry run creates nothing
            raise UnknownTopicError(f"topic {topic!r} does not exist")
        return 1 << 20

    report = RedriveReport(dry_run=True)
    writer = _Writer(None, MARKS, still_broken, "out", "dlq", max_bytes, report, 10)
    writer.add(letter(2, dlq_offset=5))
    writer.add(letter(1, dlq_offset=6))
    writer.flush()

    assert "parked in dlq.parked (attempt 3)" in report.examples[0]
    assert (report.parked, report.failed_again, report.transactions) == (1, 1, 0), report


def test_parse_reads_a_parked_letter_as_the_letter_of_its_original() -> None:
    read = letters.parse("dlq.parked", 1, 9, 3000, b"k", b"v", headers_of(3, parked=True))
    assert read is not None, "a parked letter is not read as a letter"
    assert (read.attempt, read.parked, read.error_class) == (3, True, "ValueError")
    assert read.original == Record("in", 0, 100, 3000, b"k", b"v", ORIGINAL.headers)


def test_parse_reads_what_the_writer_parks() -> None:
    producer = RefusingProducer()
    writer = _Writer(cast(PinnedProducer, producer), MARKS, still_broken, "out", "dlq",
                     lambda topic: 1 << 20, RedriveReport(), 10)
    before = letter(2)
    writer.add(before)
    writer.flush()
    [out] = written(producer)

    parked = letters.parse(out.topic, 1, 9, 3000, out.key, out.value, out.headers)
    assert parked is not None, "a parked letter is not read as a letter"
    assert (parked.coordinates, parked.attempt, parked.parked) == ("dlq.parked/1/9", 3, True)
    assert parked.original == Record("in", 0, 100, 3000, b"k", b"v", ORIGINAL.headers)
    assert parked.error_class == "ValueError" and not parked.dropped
    assert not before.parked


def test_once_fixed_a_parked_letter_is_redriven_from_the_parking_topic() -> None:
    """The way back: the parking topic named as the dead-letter topic."""
    parked = letters.parse("dlq.parked", 0, 5, 3000, b"k", b"v", headers_of(3, parked=True))
    assert parked is not None
    producer = RefusingProducer()
    report = RedriveReport()
    writer = _Writer(cast(PinnedProducer, producer), MARKS, copy, "out", "dlq.parked",
                     lambda topic: 1 << 20, report, 10)
    writer.add(parked)
    writer.flush()

    [out] = written(producer)
    assert (out.topic, out.value) == ("out", b"v")
    assert dict(out.headers)["txstage.redriven"] == b"dlq.parked/0/5"
    assert dict(out.headers)["txstage.src"] == b"in/0/100"
    assert (report.redriven, report.parked) == (1, 0), report


def test_the_parking_topic_of_a_parking_topic_is_itself() -> None:
    """Redriving ``<dlq>.parked`` re-parked into a new ``<dlq>.parked.parked``, each round
    nesting another, where the audit did not look. Parking is one place."""
    assert letters.parking_topic_of("dlq") == "dlq.parked"
    assert letters.parking_topic_of("dlq.parked") == "dlq.parked"
    assert run.parking_topic_of("dlq.parked") == "dlq.parked"
    nested = {"dlq.parked", "dlq.parked.parked"}  # left by redrives before parking in place
    assert letters.parking_topics("dlq", nested.__contains__) == sorted(nested)
    assert letters.parking_topics("dlq", set().__contains__) == []


def test_a_parked_letter_that_fails_again_stays_where_it_is_and_gets_no_mark() -> None:
    """Redriving the parking topic while the cause is not fixed writes nothing for the
    parked letters (no copy anywhere, no progress mark): they stay parked, in place, and
    the next redrive of the parking topic tries them again. A letter of the parking
    topic not parked yet parks in that same topic."""
    parked = letters.parse("dlq.parked", 0, 5, 3000, b"k", b"v", headers_of(3, parked=True))
    fresh = letters.parse("dlq.parked", 0, 6, 3000, b"k", b"v", headers_of(2))
    assert parked is not None and fresh is not None
    producer = RefusingProducer()
    report = RedriveReport(parking_topic="dlq.parked")
    writer = _Writer(cast(PinnedProducer, producer), MARKS, still_broken, "out",
                     "dlq.parked", lambda topic: 1 << 20, report, 10)
    writer.add(parked)
    writer.add(fresh)
    writer.flush()

    [transaction] = producer.committed
    assert [(out.topic, out.key) for out, _ in transaction] == [
        ("dlq.parked", b"k"), (MARKS, b"dlq.parked/0/6")], transaction
    assert dict(transaction[0][0].headers)[PARKED] == b"1"
    assert (report.left_parked, report.parked, report.failed_again) == (1, 1, 0), report
    assert "stays parked in dlq.parked" in report.examples[0]
    assert "1 parked letters failed again: left parked in dlq.parked" in report.summary()

    producer = RefusingProducer()
    writer = _Writer(cast(PinnedProducer, producer), MARKS, still_broken, "out",
                     "dlq.parked", lambda topic: 1 << 20, RedriveReport(), 10)
    writer.add(parked)
    writer.flush()
    assert producer.committed == [], "a batch of letters left parked opened a transaction"


def test_an_input_read_from_a_parking_topic_keeps_its_marks_as_its_own_headers() -> None:
    """A stage whose input is a parking topic: its letter ends with the stage's suffix;
    the parked marks before it are the original's headers, not this letter's."""
    upstream = (("txstage.src", b"up/0/1"), ("txstage.idx", b"0"), (ATTEMPT, b"3"),
                (PARKED, b"1"))
    headers = [*upstream, ("txstage.error.class", b"ValueError"),
               ("txstage.error.message", b"x"), ("txstage.error.topic", b"in"),
               ("txstage.error.partition", b"0"), ("txstage.error.offset", b"7"),
               ("txstage.src", b"in/0/7"), ("txstage.idx", b"0")]
    parsed = letters.parse("dlq", 0, 1, 1000, b"k", b"v", headers)
    assert parsed is not None
    assert (parsed.attempt, parsed.parked, parsed.original.headers) == (0, False, upstream)


def test_the_report_counts_parked_letters() -> None:
    report = RedriveReport(letters=100, redriven=85, outputs=85, failed_again=10, parked=5,
                           seconds=2.0)
    assert report.as_dict()["parked"] == 5
    assert report.as_dict()["max_attempts"] == 3
    assert report.as_dict()["letters_per_second"] == 50
    assert "dead-lettered 10 again and parked 5 (failed 3 times)" in report.summary()
    dry = RedriveReport(parked=5, max_attempts=2, dry_run=True)
    assert "would park 5 (failed 2 times)" in dry.summary()


SETTINGS = {"TXSTAGE_BOOTSTRAP_SERVERS": "127.0.0.1:1", "TXSTAGE_GROUP_ID": "g",
            "TXSTAGE_INPUT_TOPICS": "in", "TXSTAGE_OUTPUT_TOPIC": "out",
            "TXSTAGE_DLQ_TOPIC": "dlq", "TXSTAGE_TRANSFORM": "service.examples.square:square"}


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # no .env
    for name, value in SETTINGS.items():
        monkeypatch.setenv(name, value)


@pytest.mark.usefixtures("settings")
def test_parking_in_the_dead_letter_topic_itself_exits_2(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--parking-topic", "dlq"]) == 2
    assert "--parking-topic: dlq is the dead-letter topic" in capsys.readouterr().err


@pytest.mark.usefixtures("settings")
def test_a_parking_topic_redriven_may_name_itself_as_its_parking_topic(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What the default is for a DLQ named ``*.parked``, said explicitly, is no error."""
    monkeypatch.setenv("TXSTAGE_DLQ_TOPIC", "dlq.parked")
    taken: dict[str, object] = {}
    monkeypatch.setattr(cli, "redrive", lambda **kwargs: taken.update(kwargs) or
                        RedriveReport())
    monkeypatch.setattr(cli, "OutputLimits", lambda *args: type(
        "L", (), {"lookup": None, "producer_max_bytes": 1_000_000}))
    monkeypatch.setattr(cli, "Cluster", lambda *args: None)
    monkeypatch.setattr(cli, "sized_max_bytes", lambda *args: 1_000_000)
    monkeypatch.setattr(cli, "load_formatted", lambda name, settings: copy)
    assert cli.main(["--parking-topic", "dlq.parked"]) == 0
    assert taken["parking_topic"] == taken["dlq_topic"] == "dlq.parked"


def test_max_attempts_is_3_unless_given_and_at_least_1(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.parser().parse_args([]).max_attempts == 3
    assert cli.parser().parse_args(["--max-attempts", "1"]).max_attempts == 1
    with pytest.raises(SystemExit) as exited:
        cli.parser().parse_args(["--max-attempts", "0"])
    assert exited.value.code == 2
    assert "--max-attempts: '0': must be a whole number, 1 or more" in capsys.readouterr().err


class DeniedAdmin:
    """An admin client of a principal without CREATE on the topic it asks for."""

    def __init__(self, config: dict[str, object]) -> None:
        pass

    def create_topics(self, topics: list[object], request_timeout: float
                      ) -> dict[str, DeniedAdmin]:
        return {"dlq.parked": self}

    def result(self, timeout: float) -> None:
        raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied"))


def test_a_missing_create_on_the_parking_topic_exits_2_naming_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Redrive needs CREATE on the parking topic it makes: its absence is a grant to add
    (exit 2), not "could not finish, a rerun resumes" (4)."""
    monkeypatch.setattr(run, "AdminClient", DeniedAdmin)

    def body() -> int:
        run._ensure_topic({}, "dlq.parked", partitions=1, config={})
        return 0

    assert run_tool("redrive", body) == ExitCode.CONFIG
    assert "missing permission: CREATE on topic `dlq.parked`" in capsys.readouterr().err
