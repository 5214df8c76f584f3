"""The rebalance listener's account of a stop: one ``partitions.released`` line, no
rebalance counted, and nothing again when ``consumer.close()`` calls back (it logged
``partitions.revoked`` twice at every stop, ``partitions.lost`` on a poison exit)."""

from __future__ import annotations

from typing import Any, cast

import pytest
from confluent_kafka import TopicPartition
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from service.observability.health import Health
from service.observability.metrics import Metrics
from service.stage.loop import Loop
from service.stage.rebalance import RebalanceListener


class _Loop:
    def __init__(self) -> None:
        self.partitions: dict[tuple[str, int], object] = {("in", 0): object(), ("in", 1): object()}
        self.released: list[tuple[list[tuple[str, int]], bool, str]] = []

    def release(self, keys: list[tuple[str, int]], *, lost: bool, reason: str,
                deadline: float) -> None:
        self.released.append((keys, lost, reason))
        for key in keys:
            self.partitions.pop(key, None)

    def record(self, exc: BaseException, where: str) -> None:
        raise AssertionError(f"{where}: {exc!r}")


def _listener() -> tuple[RebalanceListener, _Loop, CollectorRegistry]:
    loop, registry = _Loop(), CollectorRegistry()
    listener = RebalanceListener(cast(Loop, loop), Metrics(registry), Health(), 10.0)
    return listener, loop, registry


def _rebalances(registry: CollectorRegistry, kind: str) -> float:
    return registry.get_sample_value("txstage_rebalances_total", {"kind": kind}) or 0.0


def _stop(listener: RebalanceListener, *, dirty: bool) -> list[dict[str, Any]]:
    partitions = [TopicPartition("in", 0), TopicPartition("in", 1)]
    with capture_logs() as logs:
        listener.release(partitions, lost=dirty, reason="shutdown", deadline=0.0)
        listener.abandoning = True  # what Stage._leave_group sets before consumer.close()
        listener.on_revoke(cast(Any, None), partitions)  # consumer.close() calls back
    return [entry for entry in logs if entry["log_level"] != "debug"]


@pytest.mark.parametrize(("dirty", "outcome", "kind"), [
    (False, "committed", "revoked"),  # a clean stop
    (True, "aborted", "lost"),        # a failing stop: released as aborted, not lost
], ids=["clean", "failing"])
def test_a_stop_is_one_released_line_and_no_rebalance(dirty: bool, outcome: str,
                                                       kind: str) -> None:
    listener, loop, registry = _listener()
    logs = _stop(listener, dirty=dirty)
    assert [(e["event"], e["outcome"]) for e in logs] == [("partitions.released", outcome)]
    assert loop.released == [([("in", 0), ("in", 1)], dirty, "shutdown")]
    assert _rebalances(registry, kind) == 0


def test_a_rebalance_revoke_is_logged_and_counted() -> None:
    listener, loop, registry = _listener()
    with capture_logs() as logs:
        listener.on_revoke(cast(Any, None), [TopicPartition("in", 1)])
    assert [e["event"] for e in logs] == ["partitions.revoked"]
    assert loop.released[0][1:] == (False, "revoked")
    assert _rebalances(registry, "revoked") == 1
