"""Slices, job ids and transactional ids: fixed by the input, whatever runs them."""

import pytest

from service.backfill.plan import (
    PartitionRange,
    Plan,
    Slice,
    check_job_id,
    default_job_id,
    fingerprint,
    slice_ranges,
    transactional_id,
)
from service.errors import ConfigError


def test_partitions_are_cut_at_multiples_of_slice_records() -> None:
    slices = slice_ranges([PartitionRange("in", 1, 250, 1030), PartitionRange("in", 0, 0, 300)],
                          500)
    assert [(s.index, s.partition, s.start, s.end) for s in slices] == [
        (0, 0, 0, 300), (1, 1, 250, 500), (2, 1, 500, 1000), (3, 1, 1000, 1030)]


def test_a_resumed_range_cuts_at_the_same_boundaries() -> None:
    whole = slice_ranges([PartitionRange("in", 0, 0, 1000)], 300)
    later = slice_ranges([PartitionRange("in", 0, 450, 1000)], 300)
    assert [(s.start, s.end) for s in later] == [(450, 600), (600, 900), (900, 1000)]
    assert {s.end for s in later} <= {s.end for s in whole}


def test_empty_ranges_make_no_slice() -> None:
    assert slice_ranges([PartitionRange("in", 0, 7, 7)], 100) == ()
    assert slice_ranges([PartitionRange("in", 0, 0, 9, records=0)], 100) == ()


def test_counted_ranges_are_kept_with_their_counts() -> None:
    (piece,) = slice_ranges([PartitionRange("in", 2, 100, 180, records=42)], 100)
    assert piece == Slice(0, "in", 2, 100, 180, 42)


def test_plan_survives_json() -> None:
    plan = Plan("job-1", "abc", 100, slice_ranges([PartitionRange("in", 0, 0, 250)], 100))
    assert Plan.from_json(plan.to_json()) == plan
    assert plan.max_records == 250


def test_the_same_definition_gives_the_same_job_id() -> None:
    a = {"source": "kafka://in?from=earliest&to=latest", "sink": "kafka", "slice_records": 5}
    b = dict(reversed(list(a.items())))
    assert default_job_id(fingerprint(a)) == default_job_id(fingerprint(b))
    assert default_job_id(fingerprint(a)) != default_job_id(fingerprint({**a, "sink": "x"}))
    assert default_job_id(fingerprint(a)).startswith("bf-")


def test_transactional_ids_name_prefix_job_and_slice() -> None:
    assert transactional_id("orders", "bf-1", 7) == "orders.backfill.bf-1.7"


@pytest.mark.parametrize("job_id", ["", "-x", "a b", "x" * 101, "a/b"])
def test_bad_job_ids_are_config_errors(job_id: str) -> None:
    with pytest.raises(ConfigError):
        check_job_id(job_id)
