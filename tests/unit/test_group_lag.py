"""txstage_group_lag's arithmetic: the high watermark minus the group's committed offset,
as kafka-consumer-groups.sh and KEDA's Kafka scaler reckon it."""

from __future__ import annotations

from service.observability.group_lag import group_lag


def test_lag_is_the_end_minus_the_committed_offset_never_below_0() -> None:
    ends = {("in", 0): 520, ("in", 1): 100, ("in", 2): 7}
    committed = {("in", 0): 519, ("in", 1): 100, ("in", 2): 9}
    assert group_lag(ends, committed, {}) == {("in", 0): 1, ("in", 1): 0, ("in", 2): 0}


def test_a_partition_with_nothing_committed_counts_from_where_it_would_start() -> None:
    ends = {("in", 0): 500, ("in", 1): 500}
    committed = {("in", 0): -1001}
    assert group_lag(ends, committed, {("in", 0): 100, ("in", 1): 0}) == \
        {("in", 0): 400, ("in", 1): 500}
    # auto.offset.reset=latest: no start asked, it starts at the end
    assert group_lag(ends, committed, {}) == {("in", 0): 0, ("in", 1): 0}
