"""Fixtures for tests that run the stage as real processes against the real broker."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness.kafka import KafkaService
from tests.harness.stage import (
    GROUP_PROTOCOLS,
    Replica,
    StageSetup,
    build_stage,
    tear_down,
)


@pytest.fixture(autouse=True)
def no_replica_outlives_its_test() -> Iterator[None]:
    """SIGKILL whatever replica a test left running (after its fixtures' own teardown):
    a leftover once spun for the rest of a CI run against a broker long gone."""
    yield
    leftovers = Replica.kill_leftovers()
    if leftovers:
        print(f"killed replicas the test left running: {leftovers}")


@pytest.fixture(params=GROUP_PROTOCOLS)
def stage(request: pytest.FixtureRequest, kafka: KafkaService,
          unique_name: Callable[[str], str], tmp_path: Path) -> Iterator[StageSetup]:
    """A stage on the session broker: fresh topics and a factory for replicas, once
    per group protocol (test ids ``[classic]`` and ``[consumer]``).

    Every replica is SIGKILLed at teardown if still running.
    """
    setup = build_stage(kafka.bootstrap, unique_name, tmp_path, request.param)
    yield setup
    tear_down(setup)


@pytest.fixture(params=GROUP_PROTOCOLS)
def stage_on(request: pytest.FixtureRequest, unique_name: Callable[[str], str],
             tmp_path: Path) -> Iterator[Callable[[KafkaService], StageSetup]]:
    """``stage_on(cluster)``: the same, on a cluster of the test's own (to kill its
    brokers), once per group protocol."""
    setups: list[StageSetup] = []

    def make(cluster: KafkaService) -> StageSetup:
        setups.append(build_stage(cluster.bootstrap, unique_name, tmp_path, request.param))
        return setups[-1]

    yield make
    for setup in setups:
        tear_down(setup)
