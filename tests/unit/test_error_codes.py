"""service/error_codes.py names librdkafka's codes as numbers: each equals confluent_kafka's."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from service import error_codes

LOCAL = {"LOCAL_AUTHENTICATION": "_AUTHENTICATION", "LOCAL_TIMED_OUT": "_TIMED_OUT",
         "LOCAL_UNKNOWN_TOPIC": "_UNKNOWN_TOPIC", "LOCAL_MSG_TIMED_OUT": "_MSG_TIMED_OUT"}
NAMES = [n for n in vars(error_codes) if n.isupper() and isinstance(getattr(error_codes, n), int)]


@pytest.mark.parametrize("name", NAMES)
def test_each_code_is_librdkafkas(name: str) -> None:
    assert getattr(error_codes, name) == getattr(KafkaError, LOCAL.get(name, name))


def test_every_code_is_checked() -> None:
    assert len(NAMES) == 15
