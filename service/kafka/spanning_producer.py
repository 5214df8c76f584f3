"""SpanningProducer: the transactional producer every input partition of a replica
shares when its transactions span them (TXSTAGE_TRANSACTIONS=spanning)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from service.contract.processing import Processed, Produced
from service.errors import Failure
from service.kafka.config import Config
from service.kafka.delivery import DeliveryFailures
from service.kafka.producer import PinnedProducer, produce


class SpanningProducer(PinnedProducer):
    """A transactional producer every input partition of a replica shares
    (TXSTAGE_TRANSACTIONS=spanning): one transaction carries their outputs and all
    their offsets. Failed outputs are kept per input partition, so that a refusal is
    blamed on a record of its own partition."""

    def __init__(self, config: Config, topic: str, *, deadline_s: float,
                 on_error: Callable[[KafkaError], None] | None = None,
                 connect_first: bool = False) -> None:
        super().__init__(config, topic, -1, deadline_s=deadline_s, on_error=on_error,
                         connect_first=connect_first)
        self._by_partition: dict[tuple[str, int], DeliveryFailures] = {}

    def deliveries_of(self, key: tuple[str, int]) -> DeliveryFailures:
        found = self._by_partition.get(key)
        if found is None:
            found = self._by_partition[key] = DeliveryFailures()
        return found

    def begin(self) -> None:
        for deliveries in list(self._by_partition.values()):
            deliveries.take()  # an earlier, aborted transaction's
        super().begin()

    def produce_for(self, key: tuple[str, int], outputs: list[Produced], offset: int) -> None:
        self.produce_all(outputs, offset, self.deliveries_of(key))

    def produce_run_for(self, key: tuple[str, int], run: Sequence[Processed]) -> None:
        """``produce_run`` with the partition's own delivery callback (one object per
        partition, none per record): an unnamed failure still names its partition."""
        send, report = self._producer.produce, self.deliveries_of(key)
        for record, outputs in run:
            for out in outputs:
                try:
                    send(out.topic, out.value, out.key, headers=out.headers,  # type: ignore[arg-type]
                         on_delivery=report)
                except BufferError:
                    with self._translated("produce", record.offset):
                        produce(self._producer, out, report)
                except KafkaException as exc:
                    raise self._translate(exc, "produce", record.offset) from exc

    def send_offsets_of(self, offsets: Mapping[tuple[str, int], int],
                        group_metadata: object) -> None:
        """Every partition's next offset, in one send_offsets_to_transaction."""
        positions = [TopicPartition(topic, partition, offset)
                     for (topic, partition), offset in offsets.items()]
        self._retrying("send_offsets_to_transaction",
                       lambda timeout: self._producer.send_offsets_to_transaction(
                           positions, group_metadata, timeout))

    def take_failures_of(self, key: tuple[str, int]) -> tuple[Failure, ...]:
        """The partition's failed outputs (and any nobody's), delivery reports served
        first; never raises."""
        self.poll()
        return self.deliveries_of(key).take() + self.deliveries.take()
