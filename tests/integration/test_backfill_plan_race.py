"""Issue 12, defect 3: two drivers of one backfill job racing to store its plan.

No Spark: the plan is settled before Spark starts (service.backfill.job._settle), and
the race is set up exactly by letting driver B settle completely between driver A's
read of the progress topic and A's write.

Takes ≈ 1 s (2 cores; make test, 2026-11-27).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from service.backfill import config, job, kafka_clients
from service.backfill.plan import Slice
from service.backfill.specs import parse_sink, parse_source
from tests.harness.kafka import KafkaService

pytestmark = pytest.mark.kafka

NewTopic = Callable[..., str]


def test_two_drivers_racing_to_store_a_plan_run_the_same_plan(
        kafka: KafkaService, new_topic: NewTopic, unique_name: Callable[[str], str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Both drivers run the same job (same id, same arguments, to=latest) but resolved
    # "latest" at different moments: A saw 100 records, B 150. The old driver read the
    # progress topic, found no plan and wrote its own with a plain producer: A and B
    # each ran their own plan, slicing one range two ways (slice 1 = offsets 50..100
    # for A, 50..150 for B): the same inputs under two transactional ids.
    source, out = new_topic(partitions=1, prefix="in"), new_topic(partitions=1, prefix="out")
    progress_topic = new_topic(partitions=1, config={"cleanup.policy": "compact"},
                               prefix="progress")  # as after an earlier job
    flags = config.Flags(source=parse_source(f"kafka://{source}"),
                         sink=parse_sink(f"kafka://{out}"), job_id=unique_name("race"),
                         transform="service.examples.square:square",
                         bootstrap_servers=kafka.bootstrap, dlq_topic="",
                         progress_topic=progress_topic, slice_records=50)
    driver = config.build(flags, {})
    admin = kafka_clients.admin(driver.kafka())
    plan_a = job._plan(driver, (Slice(0, source, 0, 0, 50), Slice(1, source, 0, 50, 100)))
    plan_b = job._plan(driver, (Slice(0, source, 0, 0, 50), Slice(1, source, 0, 50, 150)))

    read_job = kafka_clients.read_job
    b_runs: list[job.Run] = []

    def a_reads_then_b_settles(*args: str) -> object:
        state = read_job(*args)
        if not b_runs:  # once: B's whole settle between A's read and A's write
            b_runs.append(job.Run(driver, plan_b, None, 0.0))  # placeholder: no recursion
            b_runs[0] = job._settle(driver, admin, plan_b, 0.0)
        return state

    monkeypatch.setattr(kafka_clients, "read_job", a_reads_then_b_settles)
    run_a = job._settle(driver, admin, plan_a, 0.0)
    monkeypatch.undo()

    [run_b] = b_runs
    stored = kafka_clients.read_job(driver.kafka(), driver.progress_topic, driver.job_id)
    assert run_b.plan == plan_b
    assert run_a.plan == run_b.plan == stored.plan, (
        f"driver A runs {run_a.plan.slices}, driver B {run_b.plan.slices}, "
        f"stored {stored.plan.slices if stored.plan else None}")
