"""The commit: one partition's outputs and its input position, atomically."""

from __future__ import annotations

from collections.abc import Callable

from service.kafka.producer import PinnedProducer


def commit(producer: PinnedProducer, next_offset: int,
           group_metadata: Callable[[], object]) -> None:
    """Commit the open transaction of ``producer``'s input partition.

    1. Take the consumer's group metadata *now* (member id and generation or
       member epoch): the coordinator refuses offsets from a zombie of an older
       generation (KIP-447), so it must be the freshest the consumer has.
    2. ``send_offsets_to_transaction([tp @ next_offset], metadata)``: the input
       position (last processed offset + 1) joins the transaction, for this
       partition only; a retriable failure retries with identical offsets.
    3. ``commit_transaction()``: flushes the outputs, then the coordinator writes
       the commit markers. A time-out is retried with the same call: aborting
       after a commit time-out could abort a commit that succeeded.

    Raises RetriableError (deadline passed), AbortableError, FencedError or
    FatalError; the failed outputs that caused it are in
    ``producer.take_failures()``. The caller decides what each means.
    """
    producer.send_offsets(next_offset, group_metadata())
    producer.commit()
