"""The stage: consume → transform → produce, one transaction per input partition.

    replica.py       Stage: wires consumer, guarantee, loop, listener, watchdog
    rebalance.py     the listener: assign → init beside the loop; revoke/lost → finish
    loop.py          one iteration: consume, settle, process, tick; dispatch + actions
    batch.py         the hot path: a consumed batch through the transform (checkpoints)
    holding.py       records consumed, not processed yet: held in order, bounded, drained
    offload.py       TXSTAGE_WORKERS: chunks to worker processes, results back in order
    positions.py     where a partition resumes: committed offset looked up, seek landed
    reports.py       the state machine's reports as log lines and metrics
    housekeeping.py  once a second: readiness, stalled and stuck partitions, fetching
    loop_state.py    the fields and cross-part calls the loop's parts share
    machine/         a partition's state and every legal transition (pure)
    partition.py     what the loop keeps per partition beside its state
    jobs.py          the Kafka calls that wait, run beside the loop
    fetch_watch.py   a partition librdkafka left unfetched: noticed, fetched again
    shutdown.py      the shutdown budget and its watchdog
    transform_watch.py  a transform call past TXSTAGE_TRANSFORM_TIMEOUT_MS: noticed
    overruns.py      such calls recorded where the partition's next owner reads them
    guarantees/      what the loop needs from a guarantee, and the two guarantees
    workers/         the worker processes that run the transform, and their pool

Nothing is re-exported: ``import service.stage.machine`` (pure) loads no Kafka client;
the replica is ``service.stage.replica.Stage``.
"""
