"""``txstage topics`` against a real broker: the stage's topics made from its settings,
once (a second run leaves them as they are); lines produced into one and read back.

Takes ≈ 3 s (2 cores; make test, 2026-11-28)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from tests.conftest import UniqueName
from tests.harness.kafka import KafkaService
from tests.harness.stage import REPO_ROOT

pytestmark = pytest.mark.kafka


def topics(env: dict[str, str], *args: str, stdin: str = "",
           action: str = "create") -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TXSTAGE_")}
    return subprocess.run([sys.executable, "-m", "service", "topics", action, *args],
                          cwd=REPO_ROOT, env={**clean, **env}, capture_output=True, text=True,
                          input=stdin, timeout=120, check=False)


def test_the_stages_topics_are_created_from_its_settings_and_left_alone_after(
        kafka: KafkaService, unique_name: UniqueName) -> None:
    names = {key: unique_name(key) for key in ("in", "out", "dlq", "side")}
    env = {"TXSTAGE_BOOTSTRAP_SERVERS": kafka.bootstrap, "TXSTAGE_GROUP_ID": unique_name("g"),
           "TXSTAGE_INPUT_TOPICS": names["in"], "TXSTAGE_OUTPUT_TOPIC": names["out"],
           "TXSTAGE_DLQ_TOPIC": names["dlq"],
           "TXSTAGE_TRANSFORM": "service.examples.square:square"}
    first = topics(env, "--partitions", "3", "--topic", names["side"],
                   "--config", "retention.ms=3600000")
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [
        f"created {names[k]} (3 partitions)" for k in ("in", "out", "dlq", "side")]
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    listed = admin.list_topics(timeout=30).topics
    assert all(len(listed[name].partitions) == 3 for name in names.values())
    resource = ConfigResource(ConfigResource.Type.TOPIC, names["in"])
    [described] = admin.describe_configs([resource]).values()
    assert described.result(30)["retention.ms"].value == "3600000"

    again = topics(env, "--partitions", "5")
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [
        f"exists  {names[k]} (left as it is)" for k in ("in", "out", "dlq")]
    assert len(admin.list_topics(timeout=30).topics[names["in"]].partitions) == 3

    fed = topics(env, names["in"], stdin="1\n2\n3\n", action="produce")
    assert fed.returncode == 0, fed.stderr
    read = topics(env, names["in"], "--max", "3", "--timeout", "20", action="read")
    assert read.returncode == 0, read.stderr
    assert sorted(read.stdout.split()) == ["1", "2", "3"]
