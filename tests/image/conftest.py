"""Fixtures of the image tests (``make image-test``): the images ``make image`` built,
the engine that built them, and one run of the stage image over real records.

These tests need the images and a broker; they fail (never skip) without them. The
stage and backfill tests run in a network namespace whose only interface is loopback
(deploy/images/offline.sh), so the containers (host network) reach the test broker on
127.0.0.1 and nothing else.
"""

from __future__ import annotations

import os
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.tools.verify import Report
from tests.harness.containers import Engine, EngineError, env_args
from tests.harness.kafka import KafkaService, free_ports
from tests.harness.stage import PARTITIONS, StageSetup, build_stage, produce_inputs, wait_for

TAG = os.environ.get("TXSTAGE_IMAGE_TAG", "dev")
RUNTIME_IMAGE = f"txstage:{TAG}"
BACKFILL_IMAGE = f"txstage-backfill:{TAG}"
# Records 0..1999, every 97th not a number: the dead-letter topic has 21 of them.
RECORDS = 2000
GRACE_S = 40  # docker-compose.yml's stop_grace_period; the stage's budget is 25 s


def poison(i: int) -> bytes:
    return b"not a number" if i % 97 == 0 else str(i).encode()


@pytest.fixture(scope="session")
def engine() -> Engine:
    try:
        return Engine.detect()
    except Exception as exc:  # any way of failing to get an engine fails here
        pytest.fail(f"no container engine (deploy/images/engine.sh): {exc}", pytrace=False)


def _image(engine: Engine, ref: str) -> str:
    if not engine.has_image(ref):
        pytest.fail(f"{engine.name} has no image {ref}: build it with `make image`", pytrace=False)
    return ref


@pytest.fixture(scope="session")
def runtime_image(engine: Engine) -> str:
    return _image(engine, RUNTIME_IMAGE)


@pytest.fixture(scope="session")
def backfill_image(engine: Engine) -> str:
    return _image(engine, BACKFILL_IMAGE)


@dataclass
class StreamRun:
    """What one run of the stage container over RECORDS inputs showed."""

    setup: StageSetup
    healthy: bool
    metrics: str
    stop_seconds: float
    exit_code: int
    logs: str
    report: Report


@pytest.fixture(scope="session")
def streamed(engine: Engine, runtime_image: str, kafka: KafkaService,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamRun]:
    """The stage image (read-only root, host network) over RECORDS inputs until the group
    committed them all; then its HEALTHCHECK, /metrics, a stop (SIGTERM, GRACE_S) and the
    verifier's report."""
    log_dir: Path = tmp_path_factory.mktemp("stage-image")
    setup = build_stage(kafka.bootstrap, lambda p: f"img-{p}-{uuid.uuid4().hex[:8]}", log_dir)
    produce_inputs(setup.bootstrap, setup.input_topic, range(RECORDS), PARTITIONS, value=poison)
    port = free_ports(1)[0]
    name = f"txstage-image-test-{uuid.uuid4().hex[:8]}"
    env = {**setup.env, "TXSTAGE_METRICS_PORT": str(port), "TXSTAGE_SHUTDOWN_TIMEOUT_S": "25"}
    try:
        engine("run", "--detach", "--name", name, "--network", "host", "--read-only",
               "--tmpfs", "/tmp", *env_args(env), runtime_image)
        wait_for(setup.committed, 120, "the stage container to commit every input",
                 lambda: engine.logs(name))
        healthy = engine.healthy(name)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            metrics = answer.read().decode()
        began = time.monotonic()
        engine("stop", "--time", str(GRACE_S), name, timeout=GRACE_S + 30)
        stopped = time.monotonic() - began
        exit_code = int(str(engine.state(name)["ExitCode"]))
        logs = engine.logs(name)
    except EngineError as exc:
        pytest.fail(f"{exc}\n{engine.logs(name)}", pytrace=False)
    finally:
        engine("rm", "--force", name, check=False)
    yield StreamRun(setup, healthy, metrics, stopped, exit_code, logs, setup.verify())
