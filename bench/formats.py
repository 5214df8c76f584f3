"""Avro in and out against bytes: the formats' cost on the stage (docs/benchmarks.md,
"Formats"). One run, one broker, one registry: the same records (1 KB values, the
identity transform) through the exactly-once stage twice, as bytes and as Avro (a
``Blob {id: long, body: string}`` decoded before the transform and encoded after it,
with the registry's id, through a real Apicurio Registry). Prints records/s of each,
the ratio and the µs a record Avro adds (``--repeat N``: N interleaved rounds, medians)::

    python -m bench.formats --records 200000 --repeat 3
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from statistics import median

import fastavro
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from bench.common import ensure_topics, offset_probe, partitions_of
from bench.throughput import (
    VARIANT,
    Workload,
    broker,
    measure,
    start_run,
    warm_up,
    with_broker_idle_rate,
    workload,
)
from service.formats import wire
from service.local_registry.process import Registry

BLOB = {"type": "record", "name": "Blob", "namespace": "txstage.bench",
        "fields": [{"name": "id", "type": "long"}, {"name": "body", "type": "string"}]}


def avro_workload(plain: Workload, registry_url: str) -> Workload:
    """``plain``'s records as Avro ``Blob`` values of the same size, in a topic of their own."""
    topic = plain.topic + "-avro"
    ensure_topics(plain.bootstrap, {topic: plain.partitions})
    client = SchemaRegistryClient({"url": registry_url, "timeout": 10})
    schema_id = client.register_schema(f"{topic}-value", Schema(json.dumps(BLOB), "AVRO"))
    parsed = fastavro.parse_schema(BLOB)
    producer = Producer({"bootstrap.servers": plain.bootstrap, "enable.idempotence": True,
                         "linger.ms": 20})
    filler = "." * plain.value_bytes
    header = wire.header(schema_id)
    for i in range(plain.records):
        out = io.BytesIO()
        out.write(header)
        # 5 header bytes, ~3 for the id, 2 for the string's length: the rest is the body.
        fastavro.schemaless_writer(out, parsed, {"id": i, "body": filler[:plain.value_bytes
                                                                          - 10]})
        while True:
            try:
                producer.produce(topic, out.getvalue(), b"k%d" % i, partition=i % plain.partitions)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120) != 0:
        raise RuntimeError(f"prefill of {topic} not delivered")
    with offset_probe(plain.bootstrap) as probe:
        ends = probe.end_offsets(partitions_of(plain.bootstrap, topic))
    schema_file = plain.log_dir / "blob.avsc"
    schema_file.write_text(json.dumps(BLOB))
    return replace(plain, topic=topic, ends=ends, variant=(
        ("TXSTAGE_REGISTRY_URL", registry_url), ("TXSTAGE_INPUT_VALUE_FORMAT", "avro"),
        ("TXSTAGE_OUTPUT_VALUE_FORMAT", "avro"), ("TXSTAGE_OUTPUT_VALUE_SCHEMA", str(schema_file)),
        ("TXSTAGE_REGISTRY_AUTO_REGISTER", "true")))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.formats", description=__doc__)
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--value-bytes", type=int, default=1024)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--commit-interval-ms", type=int, default=100)
    p.add_argument("--warm-up", type=int, default=50_000)
    p.add_argument("--bootstrap", help="an existing broker (default: a private one)")
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds of bytes then Avro, interleaved; the medians are reported")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    say, run_id, log_dir, info = start_run("txstage-bench-formats", json_output=False)
    say(f"formats bench {run_id}: {args.records:,} records x {args.value_bytes} B, "
        f"{args.partitions} partitions, {info['cpus']} CPUs, load {info['loadavg_at_start']}")
    with broker(args.bootstrap, say) as bootstrap, \
            Registry(Path(tempfile.mkdtemp(prefix="bench-registry-"))).start() as registry:
        say(f"registry at {registry.url} (ready in {registry.startup_seconds:.1f} s)")
        plain = workload(bootstrap, run_id, log_dir, args, args.partitions)
        avro = avro_workload(plain, registry.url)
        warm_up(plain, args.warm_up, say)
        plain = with_broker_idle_rate(plain)
        rounds = []
        for n in range(args.repeat):
            tag = f"-r{n}" if args.repeat > 1 else ""
            bytes_, avro_ = measure(plain, "exactly_once", tag=tag), measure(
                replace(avro, broker_idle_cpu_per_s=plain.broker_idle_cpu_per_s),
                VARIANT, tag=f"-avro{tag}")
            rounds.append((bytes_, avro_))
            for name, result in (("bytes", bytes_), ("avro", avro_)):
                say(f"{name:5}  {result.records_per_s:>10,.0f} records/s  "
                    f"verified={result.verified} cpu {result.cpu_s_per_100k} s/100k  "
                    f"{'; '.join(result.problems[:2])}")
            say(f"round {n + 1}: avro / bytes = "
                f"{avro_.records_per_s / bytes_.records_per_s:.3f}")
    ratio = median(a.records_per_s / b.records_per_s for b, a in rounds)
    b_rate, a_rate = (median(pair[i].records_per_s for pair in rounds) for i in (0, 1))
    b_cpu, a_cpu = (median(pair[i].cpu_s_per_100k or 0.0 for pair in rounds) for i in (0, 1))
    say(f"avro / bytes = {ratio:.3f} (median of {len(rounds)}); avro adds "
        f"{1e6 / a_rate - 1e6 / b_rate:.2f} µs a record, {(a_cpu - b_cpu) * 10:.2f} µs of "
        f"stage CPU (medians: {a_cpu} vs {b_cpu} CPU-s per 100k records)")
    return 0 if all(r.verified for pair in rounds for r in pair) else 1


if __name__ == "__main__":
    raise SystemExit(main())
