"""The hot-path histogram is exported exactly as a prometheus_client Histogram is."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from service.observability.metrics import LATENCY_BUCKETS, HotHistogram

VALUES = (0.0, 0.0004, 0.001, 0.0010001, 0.003, 0.05, 0.1, 9.99, 10.0, 42.0)


def _exposition(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines()
            if "_created" not in line]


def test_it_exports_the_same_buckets_count_and_sum_as_a_histogram() -> None:
    hot_registry, reference_registry = CollectorRegistry(), CollectorRegistry()
    hot = HotHistogram("t_seconds", "doc", LATENCY_BUCKETS, hot_registry)
    reference = Histogram("t_seconds", "doc", buckets=LATENCY_BUCKETS,
                          registry=reference_registry)
    for value in VALUES:
        hot.observe(value)
        reference.observe(value)
    assert _exposition(hot_registry) == _exposition(reference_registry)


def test_a_value_on_a_bound_counts_in_that_bucket() -> None:
    registry = CollectorRegistry()
    hot = HotHistogram("t_seconds", "doc", (1.0, 2.0), registry)
    hot.observe(1.0)
    assert registry.get_sample_value("t_seconds_bucket", {"le": "1.0"}) == 1
    assert registry.get_sample_value("t_seconds_count") == 1
