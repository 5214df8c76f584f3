"""``txstage topics create`` without a broker: a missing CREATE permission exits 2
naming it; bad arguments exit 2."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from confluent_kafka import KafkaError, KafkaException

from service.exit_codes import ExitCode
from service.tools import topics

SETTINGS = {"TXSTAGE_BOOTSTRAP_SERVERS": "127.0.0.1:1", "TXSTAGE_GROUP_ID": "g",
            "TXSTAGE_INPUT_TOPICS": "in", "TXSTAGE_OUTPUT_TOPIC": "out",
            "TXSTAGE_TRANSFORM": "service.examples.square:square"}


class DeniedAdmin:
    def __init__(self, config: object) -> None:
        pass

    def create_topics(self, new: list[object], **kwargs: object) -> dict[str, Future[None]]:
        future: Future[None] = Future()
        future.set_exception(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)))
        return {"in": future}


def test_a_missing_create_permission_exits_2_naming_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for key, value in SETTINGS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(topics, "AdminClient", DeniedAdmin)
    assert topics.main(["create"]) == ExitCode.CONFIG
    assert "CREATE on topic `in`" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["create", "--partitions", "0"], ["delete"],
                                  ["create", "--config", "no-equals-sign"]])
def test_bad_arguments_exit_2(args: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        topics.main(args)
    assert exited.value.code == 2


@pytest.mark.parametrize("args", [["create", "numbers"], ["read"], ["produce"]])
def test_a_topic_is_named_for_produce_and_read_only(
        args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert topics.main(args) == ExitCode.CONFIG
    assert "TOPIC" in capsys.readouterr().err
