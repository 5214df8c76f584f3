"""docs/backfill.md's commands, run as written through ``txstage`` on real Spark and a
real broker: the settings are the block's ``export`` lines (the bootstrap servers the
test broker's), the topics the commands name are created, the command line is verbatim.

Takes ≈ 13 s (2 cores; a dry run and a run of the suffix command, Spark started).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import KafkaException

from service import cli
from tests.harness.admin import create_topic
from tests.harness.doc_commands import commands, exports, sh_blocks
from tests.harness.kafka import KafkaService
from tests.harness.reading import end_offsets
from tests.harness.spark import spark_fixture  # noqa: F401  (fixture)
from tests.harness.stage import produce_inputs

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.usefixtures("spark")]


def ensure_topic(bootstrap: str, name: str, partitions: int) -> None:
    """The docs' topic names are fixed: a broker kept between runs has them already."""
    try:
        create_topic(bootstrap, name, partitions=partitions)
    except KafkaException as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc):
            raise


def test_the_docs_topic_suffix_command_runs_as_written(
        kafka: KafkaService, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    # `--topic-suffix -v2` exited 2 before anything ran: argparse took -v2 for an option
    # ("argument --topic-suffix: expected one argument").
    [block, *_] = sh_blocks("docs/backfill.md", "Commands to copy")
    [argv] = [a for a in commands(block) if a[:2] == ["txstage", "backfill"]
              and "--topic-suffix" in a]
    monkeypatch.chdir(tmp_path)  # no stray .env
    monkeypatch.delenv("TXSTAGE_OUTPUT_TOPIC", raising=False)
    monkeypatch.delenv("TXSTAGE_TRANSACTIONAL_ID_PREFIX", raising=False)
    for name, value in exports(block).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TXSTAGE_BOOTSTRAP_SERVERS", kafka.bootstrap)
    source = argv[argv.index("--source") + 1].removeprefix("kafka://").split("?")[0]
    sink = argv[argv.index("--sink") + 1].removeprefix("kafka://")
    dlq = argv[argv.index("--dlq-topic") + 1]
    for topic, partitions in ((source, 2), (sink, 2), (dlq, 1)):
        ensure_topic(kafka.bootstrap, topic, partitions)
    if not any(end_offsets(kafka.bootstrap, source).values()):
        produce_inputs(kafka.bootstrap, source, range(50), 2)

    assert cli.main([*argv[1:], "--dry-run"]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "any other topic -> <topic>-v2" in printed, printed

    assert cli.main(argv[1:]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    # (a broker kept from an earlier run of this test holds the job done: nothing to do)
    assert f"complete: kafka://{sink}" in printed or "already complete" in printed, printed
    assert sum(end_offsets(kafka.bootstrap, sink, isolation="read_uncommitted").values()) >= 50
