"""The loop's side of spanning transactions (``TXSTAGE_TRANSACTIONS=spanning``,
guarantees/spanning.py): a partition's state machine stays its own, and this part
makes the partitions that share the replica's transaction move together.

- A commit starting anywhere gathers every other active partition into it (each
  joins, empty if it has nothing open), then seals it: the replica's transaction
  carries all of their outputs, so it must carry all of their offsets.
- A partition that becomes active while that commit runs, or after its producer's
  generation ended, joins at once, empty: it writes nothing until then.
- An abort that ends the generation aborts every other member with it
  (``SpanAborted``): what they had open was in the same transaction.
- Before a healthy release (a revoke, a stop), every partition commits together:
  what a revoked partition had open cannot be committed without the others'.
- While every partition waits for the commit, the loop waits for it too, instead of
  consuming records only to hold them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from service.stage import machine as sm
from service.stage.guarantees.generation import shared_abort
from service.stage.guarantees.spanning import Spanning
from service.stage.jobs import Jobs
from service.stage.partition import Partition, TopicPartitionKey
from service.stage.runner import Runner

Dispatch = Callable[[Partition, sm.Event], None]
# While every partition waits for the commit, the loop waits WAIT_POLL_S at a time for
# it instead of consuming; it still calls consume() at least every WAIT_MAX_S.
WAIT_POLL_S, WAIT_MAX_S = 0.005, 0.1


class Span:
    def __init__(self, committer: Spanning, partitions: dict[TopicPartitionKey, Partition],
                 jobs: Jobs, dispatch: Dispatch) -> None:
        self._committer = committer
        self._partitions = partitions
        self._jobs = jobs
        self._dispatch = dispatch
        self._gathering = False

    def commit_started(self, partition: Partition, now: float) -> None:
        """After a StartCommit: gather the other active partitions, then seal."""
        if self._gathering or not self._committer.gathering:
            return  # a joiner of this commit, or one waiting for a commit under way
        self._gathering = True
        try:
            for other in list(self._partitions.values()):
                if other is not partition and other.state.phase is sm.Phase.ACTIVE:
                    self._dispatch(other, sm.CommitDue(now, join=True))
        finally:
            self._gathering = False
            self._committer.seal()

    def abort_started(self, now: float) -> None:
        """After a StartAbort (or a release that aborted): the generation's other
        members abort too."""
        spread = self._committer.take_spread()
        if not spread:
            return
        error = shared_abort("abort_transaction", self._committer.transactional_id(("", -1)),
                             "the replica's transaction was aborted for another partition")
        for key in spread:
            other = self._partitions.get(key)
            if other is not None:
                self._dispatch(other, sm.SpanAborted(error, now))

    def waited_for_commit(self, polled_at: float, runner: Runner) -> bool:
        """While every partition waits for the replica's one commit (each holds), what
        consume() returns could only be held, then taken out of the hold again: on a
        backlog, every record was. So wait for a job to finish instead (True), unless
        consume() last returned ``WAIT_MAX_S`` ago or more (its callbacks, the poll
        interval) or results are out in the runner's workers."""
        if not self._partitions or time.monotonic() - polled_at >= WAIT_MAX_S \
                or runner.waiting() \
                or not all(p.state.holding for p in self._partitions.values()):
            return False
        self._jobs.wait_finished(WAIT_POLL_S)
        return True

    def became_active(self, partition: Partition, now: float) -> None:
        if self._committer.must_wait(partition.key):
            self._dispatch(partition, sm.CommitDue(now, join=True))

    def commit_all(self, deadline: float, dispatch: Dispatch,
                   record: Callable[[BaseException], None]) -> None:
        """Before a healthy release: let what runs end, then commit every partition
        together and wait for it (until ``deadline``). ``dispatch`` and ``record`` keep
        an error for the loop thread (a rebalance callback runs this)."""
        self._settle(self._busy(), deadline, dispatch, record)
        now = time.monotonic()
        opener = next((p for p in self._partitions.values()
                       if p.state.phase is sm.Phase.ACTIVE and p.state.txn is not None
                       and not p.state.txn.empty), None)
        if opener is None:
            return
        dispatch(opener, sm.CommitDue(now, join=True))
        self._settle(self._busy(), deadline, dispatch, record)

    def _busy(self) -> list[Partition]:
        return [p for p in self._partitions.values()
                if p.state.phase in (sm.Phase.COMMITTING, sm.Phase.ABORTING)]

    def _settle(self, partitions: Iterable[Partition], deadline: float, dispatch: Dispatch,
                record: Callable[[BaseException], None]) -> None:
        for partition in partitions:
            completion = self._jobs.wait(partition, deadline)
            if completion is None:
                continue
            event, error = completion
            if error is not None:
                record(error)
            elif event is not None:
                dispatch(partition, event)  # type: ignore[arg-type]

