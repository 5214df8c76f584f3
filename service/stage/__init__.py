"""The stage: consume → transform → produce, one transaction per input partition.

    replica.py       Stage: wires consumer, guarantee, loop, listener, watchdog
    rebalance.py     the listener: assign → init beside the loop; revoke/lost → finish
    loop.py          one iteration: consume, settle, process, tick; dispatch + actions
    batch.py         the hot path: a consumed batch through the transform (checkpoints)
    positions.py     where a partition resumes: committed offset looked up, seek landed
    reports.py       the state machine's reports as log lines and metrics
    housekeeping.py  once a second: readiness, stalled and stuck partitions, fetching
    loop_state.py    the fields and cross-part calls the loop's parts share
    machine/         a partition's state and every legal transition (pure)
    partition.py     what the loop keeps per partition beside its state
    jobs.py          the Kafka calls that wait, run beside the loop
    fetch_watch.py   a partition librdkafka left unfetched: noticed, fetched again
    shutdown.py      the shutdown budget and its watchdog
    guarantees/      what the loop needs from a guarantee, and the two guarantees
"""

from service.stage.replica import Stage

__all__ = ["Stage"]
