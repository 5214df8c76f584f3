"""The stage image (``txstage:dev``, Dockerfile target ``runtime``) as users run it:
a non-root user, a read-only root filesystem, the settings check, and real records
processed exactly once against a real broker."""

from __future__ import annotations

import pytest

from tests.harness.containers import Engine, env_args
from tests.harness.kafka import KafkaService
from tests.image.conftest import GRACE_S, RECORDS, StreamRun

pytestmark = pytest.mark.image

# The stage layers add ~55 MB to a ~130 MB python:3.11-slim (or the ~185 MB test base),
# and the formats' libraries (the schemas extra: fastavro, protobuf, the registry
# client and its cryptography) about 50 MB more (their installed size in a venv).
MAX_RUNTIME_MB = 350


def test_the_stage_image_runs_as_uid_10001_on_a_read_only_root(
        engine: Engine, runtime_image: str) -> None:
    config = engine.image(runtime_image)["Config"]
    assert isinstance(config, dict) and config["User"] == "10001:10001"
    probe = engine("run", "--rm", "--read-only", "--entrypoint", "sh", runtime_image, "-c",
                   "id -u; id -g; touch /probe 2>/dev/null && echo writable || echo read-only")
    assert probe.stdout.split() == ["10001", "10001", "read-only"]


def test_the_stage_image_keeps_its_healthcheck_and_stays_small(
        engine: Engine, runtime_image: str) -> None:
    assert "/healthz" in " ".join(engine.healthcheck(runtime_image)), \
        "no HEALTHCHECK: podman builds need --format docker"
    size_mb = int(str(engine.image(runtime_image)["Size"])) / 1e6
    print(f"{runtime_image}: {size_mb:.0f} MB")
    assert size_mb < MAX_RUNTIME_MB


def test_help_answers_and_check_config_without_settings_exits_2_naming_them(
        engine: Engine, runtime_image: str) -> None:
    assert engine("run", "--rm", "--read-only", runtime_image, "--help").returncode == 0
    check = engine("run", "--rm", "--read-only", runtime_image, "check-config", check=False)
    assert check.returncode == 2, check.stdout + check.stderr
    assert "TXSTAGE_BOOTSTRAP_SERVERS: Field required" in check.stderr


def test_check_config_against_the_local_broker_exits_0(
        engine: Engine, runtime_image: str, streamed: StreamRun, kafka: KafkaService) -> None:
    check = engine("run", "--rm", "--read-only", "--network", "host",
                   *env_args(streamed.setup.env), runtime_image, "check-config", check=False)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_stage_container_processes_real_records_exactly_once(streamed: StreamRun) -> None:
    report = streamed.report
    assert report.ok, "\n".join(report.problems()) + "\n" + streamed.logs[-5000:]
    assert report.found == report.expected == RECORDS


def test_the_healthcheck_passes_and_metrics_scrape(streamed: StreamRun) -> None:
    assert streamed.healthy, streamed.logs[-3000:]
    assert "txstage_transactions_committed_total" in streamed.metrics
    consumed = [line for line in streamed.metrics.splitlines()
                if line.startswith("txstage_records_consumed_total")]
    assert consumed and float(consumed[0].split()[-1]) >= RECORDS


def test_sigterm_exits_0_within_the_grace_period(streamed: StreamRun) -> None:
    assert streamed.exit_code == 0, streamed.logs[-3000:]
    assert streamed.stop_seconds < GRACE_S
