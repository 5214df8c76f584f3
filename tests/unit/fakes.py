"""The fakes the loop's unit tests share: a consumer scripted from librdkafka's
behaviours (rdkafka_partition.c: a seek before the fetcher started is refused with
_STATE and leaves the "application position" as it was; a later pause moves the
fetcher there), committers that record what the loop asks of them, and a loop
built on them. Not a Kafka: the loop's side of the bargain is what the tests pin
down; the same paths run against a real broker in tests/integration."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import cast

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from prometheus_client import CollectorRegistry

from service.contract.processing import Processed, Produced
from service.errors import AbortableError, Where
from service.examples.square import square
from service.kafka.cluster import OutputLimits
from service.observability.health import Health
from service.observability.metrics import Metrics
from service.settings import load_settings
from service.stage import machine as sm
from service.stage.guarantees.guarantee import Guarantee
from service.stage.loop import Loop
from service.stage.partition import Partition, TopicPartitionKey
from service.stage.workers import WorkerPool

TOPIC = "in"
POLICY = sm.Policy(commit_interval_s=60.0, commit_max_records=1000, max_abort_streak=4,
                   retry_backoff_s=1.0, max_backoff_s=30.0, max_record_attempts=3,
                   reclaim_after_s=6.0, transaction_timeout_s=2.0)


@dataclass
class ScriptedConsumer:
    refuse_seeks: int = 0               # seeks refused with _STATE (not fetching yet)
    calls: list[tuple[str, int]] = field(default_factory=list)
    batches: list[list[Message]] = field(default_factory=list)
    high: int = -1                      # the cached high watermark

    def seek(self, tp: TopicPartition) -> None:
        if self.refuse_seeks:
            self.refuse_seeks -= 1
            self.calls.append(("seek refused", tp.offset))
            raise KafkaException(KafkaError(KafkaError._STATE, "Erroneous state"))
        self.calls.append(("seek", tp.offset))

    def pause(self, tps: list[TopicPartition]) -> None:
        self.calls.append(("pause", tps[0].partition))

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        self.calls.extend(("unassign", tp.partition) for tp in tps)

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        self.refuse_seeks = 0  # a fresh assignment at an offset: the fetcher starts there
        self.calls.extend(("assign at", tp.offset) for tp in tps)

    def resume(self, tps: list[TopicPartition]) -> None:
        self.calls.append(("resume", tps[0].partition))

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool) -> tuple[int, int]:
        return 0, self.high

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        return self.batches.pop(0) if self.batches else []


@dataclass
class RecordingCommitter:
    written: list[int] = field(default_factory=list)
    named: list[int] = field(default_factory=list)  # written asking reports to name them

    def write(self, key: TopicPartitionKey, offset: int, outputs: list[Produced]) -> None:
        self.written.append(offset)
        self.named.append(offset)

    def write_run(self, key: TopicPartitionKey, run: list[Processed]) -> None:
        self.written.extend(record.offset for record, _ in run)

    def poll(self, now: float) -> list[tuple[TopicPartitionKey, sm.Event]]:
        return []


def message(offset: int) -> Message:
    return Message(topic=TOPIC, partition=0, offset=offset, key=b"k", value=str(offset).encode(),
                   headers=None, error=None, timestamp=(1, 1_700_000_000_000))


def batch(first: int, last: int) -> list[Message]:
    return [message(offset) for offset in range(first, last + 1)]


def make_loop(consumer: ScriptedConsumer, pool: WorkerPool | None = None,
              **env: str) -> tuple[Loop, RecordingCommitter, Partition]:
    settings = load_settings({"TXSTAGE_BOOTSTRAP_SERVERS": "127.0.0.1:9", "TXSTAGE_GROUP_ID": "g",
                              "TXSTAGE_INPUT_TOPICS": TOPIC, "TXSTAGE_OUTPUT_TOPIC": "out",
                              "TXSTAGE_TRANSFORM": "service.examples.square:square", **env})
    committer = RecordingCommitter()
    limits = cast(OutputLimits,
                  SimpleNamespace(lookup=lambda topic: 1_000_000, forget=lambda: None))
    loop = Loop(settings, square, Metrics(CollectorRegistry()), Health(), limits,
                cast("object", consumer), cast(Guarantee, committer), POLICY,  # type: ignore[arg-type]
                pool)
    partition = Partition(TOPIC, 0)
    loop.partitions[partition.key] = partition
    partition.state = sm.PartitionState(sm.Phase.POSITIONING)
    return loop, committer, partition


def positioned(loop: Loop, partition: Partition, offset: int) -> None:
    loop.dispatch(partition, sm.Positioned(offset, 0.0))


@dataclass
class OrderedCommitter(RecordingCommitter):
    """Records writes, commits and aborts in the order asked; a write of
    ``fail_at`` fails as librdkafka's produce() in an abortable transaction does."""

    fail_at: int | None = None
    calls: list[tuple[str, int]] = field(default_factory=list)
    txns: list[sm.Txn] = field(default_factory=list)

    def write(self, key: TopicPartitionKey, offset: int, outputs: list[Produced]) -> None:
        super().write(key, offset, outputs)
        self.calls.append(("write", offset))

    def write_run(self, key: TopicPartitionKey, run: list[Processed]) -> None:
        for record, _ in run:
            if record.offset == self.fail_at:
                raise AbortableError(Where("produce", None, *key, record.offset),
                                     KafkaError(KafkaError._STATE, "Erroneous state"))
            self.written.append(record.offset)
            self.calls.append(("write", record.offset))

    def transactional_id(self, key: TopicPartitionKey) -> str:
        return f"g.{key[0]}.{key[1]}"

    def commit(self, key: TopicPartitionKey, txn: sm.Txn, group_metadata: object) -> object:
        self.calls.append(("commit", txn.next))
        self.txns.append(txn)
        return lambda: None  # still committing: the test looks at what was asked

    def abort(self, key: TopicPartitionKey, txn: sm.Txn | None) -> object:
        assert txn is not None
        self.calls.append(("abort", txn.next))
        self.txns.append(txn)
        return lambda: None


@dataclass
class GroupConsumer(ScriptedConsumer):
    def consumer_group_metadata(self) -> object:
        return "metadata"


def loop_with(committer: OrderedCommitter, batches: list[list[Message]]
              ) -> tuple[Loop, Partition]:
    loop, _, partition = make_loop(GroupConsumer(batches=batches))
    loop.committer = committer  # type: ignore[assignment]
    positioned(loop, partition, 2810)
    return loop, partition
