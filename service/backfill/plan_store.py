"""A job's plan, stored once however many drivers race to store it (compare-and-set).

Two drivers started for the same job id could each find no plan, each compute one (a
``to=latest`` range resolved at different moments) and each store and run its own:
one input range sliced two ways, written under two transactional ids. So the plan is
written in a transaction of the job's own transactional id
``<prefix>.backfill.<job_id>.plan``:

1. ``init_transactions`` fences any other driver storing this job's plan, and
   completes or aborts what that driver had open;
2. the progress partition is read (read_committed, up to its end): a plan anyone
   committed before step 1 is seen here, and is the plan;
3. else ours is written and committed. A driver that fenced us between steps 1 and 3
   makes the commit fail (``_FENCED``): start again at step 1, which finds its plan.

The id is covered by the same ACL prefix as the slices' (``<prefix>.``).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping
from typing import Any

from service.backfill import kafka_clients, progress
from service.backfill.plan import Plan
from service.backfill.progress import JobState
from service.contract.processing import Produced
from service.errors import FencedError
from service.kafka.config import producer_config
from service.kafka.producer import PinnedProducer
from service.settings import Settings

log = logging.getLogger(__name__)

ATTEMPTS = 8


def plan_transactional_id(prefix: str, job_id: str) -> str:
    return f"{prefix}.backfill.{job_id}.plan"


def settle(settings: Settings, topic: str, prefix: str, fresh: Plan,
           definition: Mapping[str, Any]) -> tuple[JobState, bool]:
    """The job's plan and progress as stored, storing ``fresh`` if there was no plan.
    Returns (state, stored): ``stored`` when ``fresh`` is the plan because this call
    stored it (``state.plan`` is then ``fresh``)."""
    job_id = fresh.job_id
    tid = plan_transactional_id(prefix, job_id)
    for attempt in range(1, ATTEMPTS + 1):
        producer = PinnedProducer(producer_config(settings, tid), topic, progress.PARTITION,
                                  deadline_s=settings.transaction_timeout_ms / 1000 + 30)
        try:
            producer.init()  # from here on, no other driver can commit a plan...
            state = kafka_clients.read_job(settings, topic, job_id)  # ...sees every plan
            if state.plan is not None:
                return state, False
            now_ms = int(time.time() * 1000)
            producer.begin()
            producer.produce(Produced(topic, progress.plan_key(job_id),
                                      progress.encode_plan(fresh, dict(definition), now_ms), []),
                             0, partition=progress.PARTITION)
            producer.commit()  # fails with _FENCED if another driver came in meanwhile
            state.plan, state.definition, state.planned_at_ms = fresh, dict(definition), now_ms
            return state, True
        except FencedError:
            log.info("job %s: another driver is storing its plan (attempt %d of %d); "
                     "reading again", job_id, attempt, ATTEMPTS)
            time.sleep(random.uniform(0.05, 0.5) * attempt)  # two drivers: do not lockstep
        finally:
            producer.close()
    raise RuntimeError(f"job {job_id}: could not store or read its plan in {topic} after "
                       f"{ATTEMPTS} attempts: other drivers of the same job kept fencing this "
                       f"one (stop all but one)")
