"""Backfills from and to files (Parquet, JSON lines) on real Spark, and the spark-submit entry.

The round trips are checked against the real stage's outputs by lineage: the JSON
enrichment transform must give the stream's bytes from Kafka → Parquet and from the
"lake" (the input topic dumped to Parquet) → Kafka.

Takes ≈ 64 s (2 cores; make test, 2026-11-28).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from service import Record
from service.backfill import main, parity
from service.examples.square import square
from service.kafka.reading import read_topics
from service.tools.verify import expected_outputs
from tests.harness.spark import (  # noqa: F401  (fixtures)
    REPO_ROOT,
    Backfill,
    backfill_fixture,
    spark_fixture,
)
from tests.harness.stage import PARTITIONS, StageSetup, one_protocol, produce_inputs
from tests.integration.test_backfill_kafka import run_stream

pytestmark = [pytest.mark.spark, pytest.mark.usefixtures("spark")]

NewTopic = Callable[..., str]
LAKE_SCHEMA = pa.schema([
    ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
    ("timestamp", pa.int64()), ("key", pa.binary()), ("value", pa.binary()),
    ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
])


def lake_rows(records: list[Record]) -> list[dict[str, object]]:
    return [{"topic": r.topic, "partition": r.partition, "offset": r.offset,
             "timestamp": r.timestamp, "key": r.key, "value": r.value,
             "headers": [{"key": k, "value": v} for k, v in r.headers]} for r in records]


def write_lake(path: Path, records: list[Record], files: int = 3) -> None:
    """The input as a data lake holds it: several Parquet files, rows in no useful order."""
    path.mkdir(parents=True)
    rows = lake_rows(records)[::-1]
    for n in range(files):
        pq.write_table(pa.Table.from_pylist(rows[n::files], schema=LAKE_SCHEMA),
                       path / f"part-{n}.parquet")


def document(i: int) -> bytes:
    if i % 50 == 7:
        return b"[not an object]"
    return json.dumps({"id": i, "amount": i / 8, "note": "ünïcode"}).encode()


@pytest.mark.kafka
@one_protocol("consumer")
def test_enrich_gives_the_streams_bytes_kafka_to_parquet_and_parquet_to_kafka(
        stage: StageSetup, new_topic: NewTopic, backfill: Backfill, tmp_path: Path) -> None:
    enrich = "service.examples.enrich:enrich"
    produce_inputs(stage.bootstrap, stage.input_topic, range(1200), PARTITIONS, value=document)
    run_stream(stage, enrich)
    stream = [stage.output_topic, stage.dlq_topic]

    code, _, err = backfill("--source", f"kafka://{stage.input_topic}",
                            "--sink", f"parquet://{tmp_path}/out", "--transform", enrich,
                            "--output-topic", stage.output_topic, "--dlq-topic", stage.dlq_topic)
    assert code == 0, err
    report = parity.compare(parity.from_topics(stage.bootstrap, stream),
                            parity.from_parquet(str(tmp_path / "out")))
    assert report.ok, report.problems()
    assert report.actual == 1200

    write_lake(tmp_path / "lake", read_topics(stage.bootstrap, [stage.input_topic]))
    out, dlq = new_topic(partitions=2, prefix="bf-out"), new_topic(partitions=1, prefix="bf-dlq")
    code, printed, err = backfill("--source", f"parquet://{tmp_path}/lake", "--sink",
                                  f"kafka://{out}", "--dlq-topic", dlq, "--transform", enrich,
                                  "--slice-records", "100")
    assert code == 0, err
    assert "1200 input records" in printed
    report = parity.compare(parity.from_topics(stage.bootstrap, stream),
                            parity.from_topics(stage.bootstrap, [out, dlq]),
                            rename={stage.output_topic: out, stage.dlq_topic: dlq})
    assert report.ok, report.problems()
    assert report.actual == 1200


def jsonl_records(topic: str = "events") -> list[Record]:
    return [Record(topic, i % 2, 100 + i // 2, 1_700_000_000_000 + i, f"k{i}".encode(),
                   str(i).encode() if i != 13 else b"\xff\xfe binary",
                   (("trace", b"t%d" % i), ("empty", b""))) for i in range(40)]


def write_jsonl(path: Path, records: list[Record], encode: Callable[[bytes], str]) -> None:
    with path.open("w") as out:
        for r in records:
            headers = [{"key": k, "value": encode(v) if v else None} for k, v in r.headers]
            out.write(json.dumps({"topic": r.topic, "partition": r.partition,
                                  "offset": r.offset, "timestamp": r.timestamp,
                                  "key": encode(r.key or b""), "value": encode(r.value or b""),
                                  "headers": headers}) + "\n")


def expected(records: list[Record]) -> Iterator[parity.Output]:
    for p in expected_outputs(records, square, default_topic="squares",
                              dlq_topic="dead").values():
        yield parity.Output(p.topic, p.key, p.value, tuple(p.headers))


def test_jsonl_to_parquet_needs_no_kafka(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TXSTAGE_BOOTSTRAP_SERVERS", raising=False)
    records = jsonl_records()
    write_jsonl(tmp_path / "in.jsonl", records, lambda b: base64.b64encode(b).decode())
    code = main(["--source", f"jsonl://{tmp_path}/in.jsonl?encoding=base64",
                 "--sink", f"parquet://{tmp_path}/out", "--transform",
                 "service.examples.square:square", "--output-topic", "squares",
                 "--dlq-topic", "dead", "--progress-interval", "0"])
    assert code == 0, capsys.readouterr().err
    report = parity.compare(expected(records), parity.from_parquet(str(tmp_path / "out")))
    assert report.ok, report.problems()
    assert "dead-lettered   1" in capsys.readouterr().out


def test_duplicate_input_offsets_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    records = jsonl_records()
    write_jsonl(tmp_path / "in.jsonl", [*records, records[5]], lambda b: b.decode("latin-1"))
    code = main(["--source", f"jsonl://{tmp_path}/in.jsonl", "--sink", f"parquet://{tmp_path}/o",
                 "--transform", "service.examples.square:square", "--output-topic", "x"])
    assert code == 2
    assert "the input files hold the same (topic, partition, offset) more than once" in \
        capsys.readouterr().err


def test_an_existing_parquet_sink_is_kept_unless_overwrite_is_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    write_lake(tmp_path / "lake", jsonl_records()[:10], files=1)
    (tmp_path / "out").mkdir()
    argv = ["--source", f"parquet://{tmp_path}/lake", "--sink", f"parquet://{tmp_path}/out",
            "--transform", "service.examples.square:square", "--output-topic", "squares",
            "--progress-interval", "0"]
    assert main(argv) == 2
    assert "the path exists; pass --overwrite" in capsys.readouterr().err
    assert main([*argv, "--overwrite"]) == 0
    assert len(list(parity.from_parquet(str(tmp_path / "out")))) == 10


def test_spark_submit_runs_the_entry_file(tmp_path: Path) -> None:
    """The same job through spark-submit, as on a cluster (here local[2], no Kafka)."""
    records = jsonl_records()
    write_jsonl(tmp_path / "in.jsonl", records, lambda b: b.decode("latin-1"))
    spark_submit = Path(sys.executable).with_name("spark-submit")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TXSTAGE_")},
           "PYSPARK_PYTHON": sys.executable, "TXSTAGE_TRANSFORM": "service.examples.square:square",
           "TXSTAGE_OUTPUT_TOPIC": "squares", "TXSTAGE_DLQ_TOPIC": "dead"}
    result = subprocess.run(
        [str(spark_submit), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
         "service/backfill/__main__.py",
         "--source", f"jsonl://{tmp_path}/in.jsonl", "--sink", f"parquet://{tmp_path}/out",
         "--progress-interval", "0"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "complete: parquet:" in result.stdout
    assert "master local[2]," in result.stdout  # spark-submit's, not the CLI's default
    # latin-1 text round-trips every byte except through UTF-8: the binary value differs.
    report = parity.compare(expected(records), parity.from_parquet(str(tmp_path / "out")))
    assert [key for key, _ in report.different] == [("events/1/106", 0)]


def test_a_backfill_started_from_the_cli_prints_no_spark_boilerplate(tmp_path: Path) -> None:
    """Spark's default log profile printed five lines of start-up boilerplate before
    every backfill; txstage's own profile keeps warnings and errors only."""
    records = jsonl_records()
    write_jsonl(tmp_path / "in.jsonl", records, lambda b: b.decode("latin-1"))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TXSTAGE_")},
           "TXSTAGE_TRANSFORM": "service.examples.square:square",
           "TXSTAGE_OUTPUT_TOPIC": "squares", "TXSTAGE_DLQ_TOPIC": "dead"}
    result = subprocess.run(
        [sys.executable, "-m", "service", "backfill", "--master", "local[2]",
         "--source", f"jsonl://{tmp_path}/in.jsonl", "--sink", f"parquet://{tmp_path}/out",
         "--progress-interval", "0"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "complete: parquet:" in result.stdout
    for boilerplate in ("Using Spark's default log4j profile", "Setting default log level",
                        "To adjust logging level", "NativeCodeLoader"):
        assert boilerplate not in result.stderr, result.stderr
