"""``txstage backfill``: the stream's transform over history, on PySpark.

Modules, in the order a job meets them:

    cli.py           arguments → exit code (0 ok, 1 job failed, 2 bad arguments)
    specs.py         source and sink URIs (kafka://, parquet:, jsonl:)
    config.py        flags over TXSTAGE_* settings; the stage's Settings, reused
    offsets.py       a Kafka range → fixed offsets per partition (driver, before Spark)
    plan.py          slices, job id, transactional ids
    progress.py      the plan and per-slice progress in a compacted topic
    job.py           the driver: check, plan, run, report
    session.py       the SparkSession
    sources.py       input DataFrames, one Spark partition per slice
    tasks.py         what Spark tasks run: reading, the transform, the Kafka slice writes
    slice_reader.py  one slice's Kafka input, read in its task with librdkafka
    slice_writer.py  the exactly-once unit: one slice, one transactional producer
    rows.py          Spark rows ↔ Record / Produced
    report.py        the plan, progress lines, the summary
    parity.py        compare two outputs by lineage (``txstage backfill verify``)

Only ``cli`` is imported here: ``txstage run`` never loads PySpark.
"""

from service.backfill.cli import main

__all__ = ["main"]
