"""The local Kafka runner (service.local_kafka) without a broker: node configuration, ids,
ports, the atomic, idempotent jar install (driven through a fake ``mvn``), and the CLI."""

from __future__ import annotations

import base64
import os
import socket
import stat
from pathlib import Path

import pytest

from service.local_kafka import cli as local_cli
from service.local_kafka import jars
from service.local_kafka.cache import cache_root
from service.local_kafka.errors import LocalKafkaError
from service.local_kafka.node import free_ports
from service.local_kafka.properties import broker_properties, kafka_uuid
from tests.harness.reading import ReadRecord


def node_config(nodes: int, node_id: int = 0, **overrides: str | int) -> dict[str, str]:
    return broker_properties(
        node_id=node_id,
        broker_port=9000 + node_id,
        controller_port=9100 + node_id,
        controller_ports={i: 9100 + i for i in range(nodes)},
        log_dir=Path("/data"),
        overrides=overrides,
    )


def test_single_node_is_a_combined_kraft_node_that_serves_transactions() -> None:
    props = node_config(1)
    assert props["process.roles"] == "broker,controller"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9000,CONTROLLER://127.0.0.1:9100"
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:9100"
    assert props["transaction.state.log.replication.factor"] == "1"
    assert props["transaction.state.log.min.isr"] == "1"
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["auto.create.topics.enable"] == "false"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["group.min.session.timeout.ms"] == "1000"
    assert props["transaction.abort.timed.out.transaction.cleanup.interval.ms"] == "1000"


def test_next_generation_groups_fail_over_as_fast_as_classic_ones() -> None:
    # KIP-848: the broker, not the client, sets the session of group.protocol=consumer.
    props = node_config(1)
    assert props["group.consumer.session.timeout.ms"] == "6000"
    assert props["group.consumer.heartbeat.interval.ms"] == "500"
    assert props["group.consumer.min.session.timeout.ms"] == "1000"
    assert props["group.consumer.min.heartbeat.interval.ms"] == "500"


def test_three_nodes_replicate_internal_topics_three_times_with_min_isr_two() -> None:
    props = node_config(3, node_id=2)
    assert props["node.id"] == "2"
    assert props["controller.quorum.bootstrap.servers"] == (
        "127.0.0.1:9100,127.0.0.1:9101,127.0.0.1:9102"
    )
    for key in (
        "default.replication.factor",
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
    ):
        assert props[key] == "3", key
    assert props["transaction.state.log.min.isr"] == "2"
    assert props["min.insync.replicas"] == "2"


def test_overrides_replace_defaults() -> None:
    props = node_config(1, **{"num.partitions": 6, "log.retention.ms": 1000})
    assert props["num.partitions"] == "6"
    assert props["log.retention.ms"] == "1000"


def test_kafka_uuids_are_22_char_base64_of_16_bytes_never_looking_like_a_flag() -> None:
    ids = {kafka_uuid() for _ in range(2000)}
    assert len(ids) == 2000
    for text in ids:
        assert len(text) == 22
        assert not text.startswith("-")
        assert len(base64.urlsafe_b64decode(text + "==")) == 16


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(6)
    assert len(set(ports)) == 6
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_read_record_header_returns_the_last_value() -> None:
    record = ReadRecord("t", 0, 1, None, b"v", [("a", b"1"), ("b", b"2"), ("a", b"3")], 0)
    assert record.header("a") == b"3"
    assert record.header("missing") is None


# --------------------------------------------------------------------------- install

FAKE_MVN = """#!/bin/sh
echo run >> "{calls}"
[ -n "$FAIL" ] && {{ echo "resolution failed" >&2; exit 1; }}
for arg in "$@"; do
  case "$arg" in -DoutputDirectory=*) out="${{arg#-DoutputDirectory=}}";; esac
done
mkdir -p "$out" && touch "$out/kafka_2.13-4.1.1.jar" "$out/kafka-clients-4.1.1.jar"
"""


@pytest.fixture
def fake_mvn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    script = bin_dir / "mvn"
    script.write_text(FAKE_MVN.format(calls=calls))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("TXSTAGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FAIL", raising=False)
    return calls


def test_install_resolves_once_then_reuses_the_marked_install(fake_mvn: Path) -> None:
    libs = jars.install()
    assert libs == cache_root() / "kafka-4.1.1" / "libs"
    assert (libs / "kafka_2.13-4.1.1.jar").is_file()
    assert (libs.parent / "log4j2.properties").is_file()
    assert jars.install() == libs
    assert fake_mvn.read_text().splitlines() == ["run"]
    assert sorted(p.name for p in cache_root().iterdir()) == [
        ".kafka-4.1.1.lock",
        "kafka-4.1.1",
    ]


def test_failed_install_leaves_nothing_behind(
    fake_mvn: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAIL", "1")
    with pytest.raises(LocalKafkaError, match="resolution failed"):
        jars.install()
    assert [p.name for p in cache_root().iterdir()] == [".kafka-4.1.1.lock"]


def test_install_without_marker_is_redone(fake_mvn: Path) -> None:
    libs = jars.install()
    (libs.parent / ".complete").unlink()  # e.g. an install interrupted by hand
    assert jars.install() == libs
    assert fake_mvn.read_text().splitlines() == ["run", "run"]
    assert (libs.parent / ".complete").is_file()


def test_the_pom_and_log_config_ship_inside_the_package() -> None:
    package = Path(local_cli.__file__).parent
    assert (jars.POM.parent, jars.POM.name) == (package, "pom.xml")
    assert (jars.LOG4J_CONFIG.parent, jars.LOG4J_CONFIG.name) == (package, "log4j2.properties")
    assert jars.POM.is_file() and jars.LOG4J_CONFIG.is_file()
    assert f"<kafka.version>{jars.KAFKA_VERSION}</kafka.version>" in jars.POM.read_text()


# ------------------------------------------------------------------------------- CLI


def test_status_exits_3_and_down_0_when_the_local_broker_is_not_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TXSTAGE_CACHE_DIR", str(tmp_path))
    assert local_cli.main(["status"]) == 3
    assert local_cli.main(["down"]) == 0
    assert capsys.readouterr().out.splitlines() == ["local Kafka is not running"] * 2


def test_install_failure_exits_1(
    fake_mvn: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAIL", "1")
    assert local_cli.main(["install"]) == 1
    assert "resolution failed" in capsys.readouterr().err


def test_unknown_commands_exit_2() -> None:
    with pytest.raises(SystemExit) as exited:
        local_cli.main(["start"])
    assert exited.value.code == 2


def test_txstage_kafka_is_the_local_broker_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from service import cli  # the whole service: only this test needs it

    monkeypatch.setenv("TXSTAGE_CACHE_DIR", str(tmp_path))
    assert cli.main(["kafka", "status"]) == 3
    assert capsys.readouterr().out == "local Kafka is not running\n"
