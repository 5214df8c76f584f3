"""The commit: one partition's outputs and its input position, atomically."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from service.errors import KafkaOperationError
from service.producer import PinnedProducer


def commit(producer: PinnedProducer, next_offset: int, group_metadata: object) -> None:
    """Commit the open transaction of ``producer``'s input partition.

    1. ``send_offsets_to_transaction([tp @ next_offset], group metadata)``: the
       input position (last processed offset + 1) joins the transaction, for
       this partition only; a retriable failure retries with identical offsets.
       The group metadata carries the generation, so a zombie from an older
       generation is refused here (KIP-447).
    2. ``commit_transaction()``: flushes the outputs, then the coordinator
       writes the commit markers. A time-out is retried with the same call:
       aborting after a commit time-out could abort a commit that succeeded.
    3. On failure, name the first failed output (see ``naming_failed_output``).

    Raises RetriableError (deadline passed), AbortableError, FencedError or
    FatalError; the caller decides what each means for the partition.
    """
    with naming_failed_output(producer):
        producer.send_offsets(next_offset, group_metadata)
        producer.commit()


@contextmanager
def naming_failed_output(producer: PinnedProducer) -> Iterator[None]:
    """Add the first failed output a delivery callback recorded to a failed
    commit's error. The commit's own error stays the one acted on: it carries
    librdkafka's transaction flags, a delivery report does not."""
    try:
        yield
    except KafkaOperationError as exc:
        failed = producer.deliveries.take()
        if failed is not None:
            exc.add_note(f"first failed output: {failed.name()}: {failed.str()}")
        raise
