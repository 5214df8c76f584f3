"""The stage: consume → transform → produce, one transaction per input partition
(or, with TXSTAGE_TRANSACTIONS=spanning, one for all of a replica's).

    replica.py       Stage: wires consumer, guarantee, loop, listener, watchdog
    rebalance.py     the listener: assign → init beside the loop; revoke/lost → finish
    loop.py          one iteration: consume, settle, run, tick; dispatch + actions
    runner.py        the seam where consumed records become results (Runner)
    in_process.py    the first runner and the hot path: the transform in the loop's thread
    holding.py       a runner's state; records consumed, not processed yet, held in order
    offload.py       TXSTAGE_WORKERS: the runner whose transform runs in worker processes
    positioning.py   one partition's seek, until its first record is checked (pure)
    positions.py     where a partition resumes: committed offset looked up, seek landed
    topic_lookups.py output topics a record waits for, looked up beside the loop
    reports.py       the Reporter: reports as log lines and metrics (Metrics.count_*)
    housekeeping.py  once a second: readiness, stalled and stuck partitions, fetching
    machine/         a partition's state and every legal transition (pure)
    partition.py     what the loop keeps per partition beside its state
    jobs.py          the Kafka calls that wait, run beside the loop
    fetch_watch.py   a partition librdkafka left unfetched: noticed, fetched again
    shutdown.py      the shutdown budget and its watchdog
    transform_watch.py  a transform call past TXSTAGE_TRANSFORM_TIMEOUT_MS: noticed
    overruns.py      such calls recorded where the partition's next owner reads them
    span.py          TXSTAGE_TRANSACTIONS=spanning: partitions of one transaction move together
    guarantees/      what the loop needs from a guarantee, and the guarantees
    workers/         the worker processes that run the transform, and their pool

Nothing is re-exported: ``import service.stage.machine`` (pure) loads no Kafka client;
the replica is ``service.stage.replica.Stage``.
"""
