"""The commit: one partition's outputs and its input position, atomically."""

from __future__ import annotations

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
    3. Surface a delivery failure a callback recorded. librdkafka fails the
       commit for it already; this only names the first failed output.

    Raises RetriableError (deadline passed), AbortableError, FencedError or
    FatalError; the caller decides what each means for the partition.
    """
    producer.send_offsets(next_offset, group_metadata)
    try:
        producer.commit()
    except Exception:
        producer.raise_delivery_failure()
        raise
