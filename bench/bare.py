"""The ceiling for the benchmark: a bare consume → transform → produce loop, no transactions.

``python -m bench.bare`` reads the same ``TXSTAGE_*`` settings as a replica and uses the
same client configurations (``service.kafka.config``: the at-least-once mode's shared
idempotent producer, the read_committed consumer), the same batch size and the same
transform, and stamps the same lineage headers so its output can be verified. What it
leaves out is the stage: no transactions, no per-partition tasks, no dead letters or
size checks, no metrics. Consumed offsets are stored after their outputs are queued and
committed asynchronously every ``TXSTAGE_COMMIT_INTERVAL_MS`` (without waiting for
delivery: fine for a clean benchmark, not for production). SIGTERM/SIGINT: flush,
commit synchronously, exit 0.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from types import FrameType

from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition

from service.contract import lineage
from service.contract.loading import load_transform
from service.contract.records import Transform
from service.kafka.config import consumer_config, producer_config
from service.kafka.messages import to_record
from service.settings import Settings, load_settings

ASSIGNED_LINE = "bare.assigned"


def main() -> int:
    settings = load_settings()
    transform = load_transform(settings.transform)
    stop = threading.Event()

    def handle(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    consumer = Consumer(consumer_config(settings))
    producer = Producer(producer_config(settings, None))
    consumer.subscribe(list(settings.input_topics),
                       on_assign=lambda c, tps: print(ASSIGNED_LINE, len(tps), flush=True))
    run(settings, transform, consumer, producer, stop)
    producer.flush()
    try:
        consumer.commit(asynchronous=False)
    except KafkaException as exc:  # nothing stored since the last commit
        print(f"bare.final_commit: {exc}", file=sys.stderr)
    consumer.close()
    return 0


def run(settings: Settings, transform: Transform, consumer: Consumer, producer: Producer,
        stop: threading.Event) -> None:
    interval = settings.commit_interval_ms / 1000
    next_commit = time.monotonic() + interval
    while not stop.is_set():
        messages = consumer.consume(settings.batch_size, settings.poll_timeout_ms / 1000)
        positions = process(messages, transform, producer, settings.output_topic)
        if positions:
            consumer.store_offsets(offsets=[TopicPartition(t, p, o)
                                            for (t, p), o in positions.items()])
        producer.poll(0)
        if time.monotonic() >= next_commit:
            next_commit = time.monotonic() + interval
            with contextlib.suppress(KafkaException):  # _NO_OFFSET: nothing new
                consumer.commit(asynchronous=True)


def process(messages: list[Message], transform: Transform, producer: Producer,
            default_topic: str) -> dict[tuple[str, int], int]:
    """Transform and produce a batch; the next offset per partition."""
    positions: dict[tuple[str, int], int] = {}
    for msg in messages:
        if msg.error() is not None:
            continue
        record = to_record(msg)  # as the stage makes it: the same cost in both
        topic, partition, offset = record.topic, record.partition, record.offset
        src = lineage.source_of(topic, partition, offset)
        for index, out in enumerate(transform(record)):
            headers = lineage.stamp(out.headers, src, index)
            while True:
                try:
                    producer.produce(out.topic or default_topic, out.value, out.key,
                                     headers=headers)  # type: ignore[arg-type]
                    break
                except BufferError:
                    producer.poll(0.05)
        positions[(topic, partition)] = offset + 1
    return positions


if __name__ == "__main__":
    sys.exit(main())
