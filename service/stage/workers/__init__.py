"""The transform in worker processes (``TXSTAGE_WORKERS=N``): only the main process
touches Kafka; workers get plain tuples and send back what the transform yielded.

    wire.py    records and results as plain tuples; a failure rebuilt in the main process
    worker.py  one worker process: import the transform once, run chunks of records
    pool.py    the main process's side: spawn, schedule, collect in order, restart
"""

from service.stage.workers.pool import Chunk, WorkerPool

__all__ = ["Chunk", "WorkerPool"]
