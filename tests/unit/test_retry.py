"""retry_until, the one blocking retry loop, on a clock the test moves by hand."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import KafkaError

from service.errors import AbortableError, FencedError, RetriableError, Where
from service.kafka import retry
from service.kafka.retry import retry_until


class _Clock:
    """time for the retry module: sleep() only moves monotonic() on, and says so."""

    def __init__(self, events: list[str]) -> None:
        self.now = 100.0
        self.events = events
        self.pauses: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.events.append("pause")
        self.now += seconds


@pytest.fixture
def events() -> list[str]:
    return []


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch, events: list[str]) -> _Clock:
    fake = _Clock(events)
    monkeypatch.setattr(retry, "time", fake)
    return fake


def _not_now(n: int = 0) -> RetriableError:
    return RetriableError(Where("commit_transaction"), KafkaError(
        KafkaError._TIMED_OUT, f"not now {n}", retriable=True))


def _answers(events: list[str], *answers: object) -> Callable[[], object]:
    """A call that raises or returns ``answers`` in turn, noting each attempt."""
    pending: Iterator[object] = iter(answers)

    def call() -> object:
        events.append("call")
        answer = next(pending)
        if isinstance(answer, BaseException):
            raise answer
        return answer
    return call


def test_an_answer_at_the_first_attempt_is_returned_without_a_pause(
        clock: _Clock, events: list[str]) -> None:
    assert retry_until(clock.now + 10, _answers(events, "done"), pause=1.0) == "done"
    assert events == ["call"]


def test_a_retriable_error_is_retried_with_the_same_call_until_it_answers(
        clock: _Clock, events: list[str]) -> None:
    call = _answers(events, _not_now(1), _not_now(2), "done")
    assert retry_until(clock.now + 10, call, pause=0.5) == "done"
    assert events == ["call", "pause", "call", "pause", "call"]
    assert clock.pauses == [0.5, 0.5]  # fixed: no growth, no jitter


def test_a_retriable_error_is_retried_until_the_deadline_then_raised(
        clock: _Clock, events: list[str]) -> None:
    errors = [_not_now(n) for n in range(10)]
    deadline = clock.now + 1.0
    with pytest.raises(RetriableError) as raised:
        retry_until(deadline, _answers(events, *errors), pause=0.25)
    assert events.count("call") == 5  # at 0, 0.25, 0.5, 0.75 and 1.0 s
    assert raised.value is errors[4]  # the last error itself, not a new one
    assert clock.now == deadline


def test_a_deadline_already_passed_still_gets_one_attempt(
        clock: _Clock, events: list[str]) -> None:
    assert retry_until(clock.now - 1, _answers(events, "done"), pause=1.0) == "done"
    error = _not_now()
    with pytest.raises(RetriableError) as raised:
        retry_until(clock.now - 1, _answers(events, error), pause=1.0)
    assert raised.value is error
    assert "pause" not in events


@pytest.mark.parametrize("error", [
    AbortableError(Where("commit_transaction"), KafkaError(KafkaError.INVALID_RECORD, "x")),
    FencedError(Where("commit_transaction"), KafkaError(KafkaError._FENCED, "fenced")),
    LookupError("no such topic"),
])
def test_any_other_error_is_raised_at_once_never_retried(
        clock: _Clock, events: list[str], error: Exception) -> None:
    with pytest.raises(type(error)) as raised:
        retry_until(clock.now + 10, _answers(events, error, "never asked"), pause=1.0)
    assert raised.value is error
    assert events == ["call"]


def test_between_attempts_the_retry_is_reported_then_paused_then_the_client_renewed(
        clock: _Clock, events: list[str]) -> None:
    seen: list[RetriableError] = []
    first, second = _not_now(1), _not_now(2)

    def reported(error: RetriableError) -> None:
        seen.append(error)
        events.append("report")

    retry_until(clock.now + 10, _answers(events, first, second, "done"), pause=1.0,
                on_retry=reported, renew=lambda: events.append("renew"))
    assert events == ["call", "report", "pause", "renew",
                      "call", "report", "pause", "renew", "call"]
    assert seen == [first, second]


def test_the_failure_that_ends_the_wait_is_neither_reported_nor_followed_by_a_renewal(
        clock: _Clock, events: list[str]) -> None:
    with pytest.raises(RetriableError):
        retry_until(clock.now + 1.0, _answers(events, *[_not_now(n) for n in range(3)]),
                    pause=1.0, on_retry=lambda _: events.append("report"),
                    renew=lambda: events.append("renew"))
    assert events == ["call", "report", "pause", "renew", "call"]

