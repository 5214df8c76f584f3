"""Health state semantics and the HTTP endpoint, with a fake clock and a real socket."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from service.observability.health import Health, Server, publish_readiness, serve
from service.observability.metrics import Metrics


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def health(clock: FakeClock) -> Health:
    return Health(stale_after=30, clock=clock)


def ready_health(health: Health, assigned: int = 4) -> Health:
    health.joined(True)
    health.partitions(assigned=assigned, ready=assigned)
    return health


def test_new_replica_is_live_for_stale_after_seconds(health: Health, clock: FakeClock) -> None:
    clock.now += 29.9
    assert health.liveness()[0] is True
    clock.now += 0.1
    assert health.liveness()[0] is False


def test_stale_loop_is_not_live_and_says_how_stale(health: Health, clock: FakeClock) -> None:
    health.beat()
    clock.now += 42.1
    ok, detail = health.liveness()
    assert not ok
    assert detail == {"status": "stale", "last_beat_seconds_ago": 42.1, "stale_after": 30}


def test_beat_keeps_the_replica_live(health: Health, clock: FakeClock) -> None:
    for _ in range(10):
        clock.now += 20
        health.beat()
    ok, detail = health.liveness()
    assert ok
    assert detail["status"] == "ok"
    assert detail["last_beat_seconds_ago"] == 0


def test_fatal_is_not_live_even_while_beating_and_keeps_first_reason(health: Health) -> None:
    health.fatal("producer for t.0 hit a fatal error")
    health.fatal("later consequence")
    health.beat()
    assert health.liveness() == (
        False, {"status": "fatal", "reason": "producer for t.0 hit a fatal error"},
    )


def test_not_ready_until_joined(health: Health) -> None:
    ok, detail = health.readiness()
    assert not ok
    assert detail["status"] == "not_joined"


def test_not_ready_after_join_until_assignment_is_known(health: Health) -> None:
    health.joined(True)
    ok, detail = health.readiness()
    assert not ok
    assert detail == {"status": "awaiting_assignment", "joined": True, "assigned": None, "ready": 0}


def test_not_ready_while_producers_initialize(health: Health) -> None:
    health.joined(True)
    health.partitions(assigned=8, ready=5)
    assert health.readiness() == (
        False, {"status": "initializing_producers", "joined": True, "assigned": 8, "ready": 5},
    )


def test_ready_when_every_assigned_partition_has_a_producer(health: Health) -> None:
    ready_health(health, assigned=8)
    assert health.readiness() == (
        True, {"status": "ok", "joined": True, "assigned": 8, "ready": 8},
    )


def test_replica_with_zero_partitions_after_join_is_ready(health: Health) -> None:
    health.joined(True)
    health.partitions(assigned=0, ready=0)
    assert health.readiness()[0] is True


def test_leaving_the_group_makes_replica_unready(health: Health) -> None:
    ready_health(health)
    health.joined(False)
    assert health.readiness()[1]["status"] == "not_joined"


def test_not_live_means_not_ready_and_says_why(health: Health, clock: FakeClock) -> None:
    ready_health(health)
    clock.now += 31
    ok, detail = health.readiness()
    assert not ok
    assert detail["status"] == "not_live"
    assert detail["liveness"] == {
        "status": "stale", "last_beat_seconds_ago": 31.0, "stale_after": 30,
    }


@pytest.mark.parametrize(("assigned", "ready"), [(-1, 0), (2, 3), (2, -1)])
def test_impossible_partition_counts_are_rejected(
    health: Health, assigned: int, ready: int,
) -> None:
    with pytest.raises(ValueError, match="ready <= assigned"):
        health.partitions(assigned=assigned, ready=ready)


def test_stale_after_must_be_positive() -> None:
    with pytest.raises(ValueError, match="stale_after"):
        Health(stale_after=0)


def test_details_are_json_serializable(health: Health, clock: FakeClock) -> None:
    health.fatal("boom")
    clock.now += 100
    for _, detail in (health.liveness(), health.readiness()):
        assert json.loads(json.dumps(detail)) == detail


def test_concurrent_updates_never_expose_a_torn_snapshot(health: Health) -> None:
    """A reader must never see ``ready`` from one update and ``assigned`` from another."""
    health.joined(True)
    stop = threading.Event()
    torn: list[dict[str, object]] = []

    def write() -> None:
        while not stop.is_set():
            health.partitions(assigned=10, ready=10)
            health.partitions(assigned=3, ready=0)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for _ in range(20_000):
            _, detail = health.readiness()
            if (detail["assigned"], detail["ready"]) not in {(10, 10), (3, 0)}:
                torn.append(detail)
    finally:
        stop.set()
        writer.join()
    assert torn == []


def test_ready_gauge_follows_readiness(health: Health) -> None:
    metrics = Metrics(CollectorRegistry())
    publish_readiness(health, metrics)
    assert metrics.registry.get_sample_value("txstage_ready") == 0.0
    ready_health(health)
    assert metrics.registry.get_sample_value("txstage_ready") == 1.0


# --- the HTTP endpoint -------------------------------------------------------


@pytest.fixture
def server(health: Health) -> Iterator[tuple[Server, Metrics]]:
    metrics = Metrics(CollectorRegistry())
    srv = serve(0, metrics.registry, health, host="127.0.0.1")
    try:
        yield srv, metrics
    finally:
        srv.close()


def get(srv: Server, path: str) -> tuple[int, str, bytes]:
    """GET ``path``; returns (status, content type, body) for 2xx and error statuses alike."""
    url = f"http://127.0.0.1:{srv.port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.headers["Content-Type"], err.read()


def test_port_zero_binds_a_free_port(server: tuple[Server, Metrics]) -> None:
    assert server[0].port > 0


def test_metrics_endpoint_serves_the_registry(server: tuple[Server, Metrics]) -> None:
    srv, metrics = server
    metrics.committed.inc(3)
    status, content_type, body = get(srv, "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain")
    assert b"txstage_transactions_committed_total 3.0" in body


def test_metrics_endpoint_negotiates_openmetrics(server: tuple[Server, Metrics]) -> None:
    srv, _ = server
    url = f"http://127.0.0.1:{srv.port}/metrics"
    req = urllib.request.Request(url, headers={"Accept": "application/openmetrics-text"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        assert resp.read().endswith(b"# EOF\n")


def test_healthz_is_200_when_live_and_503_when_stale(
    server: tuple[Server, Metrics], clock: FakeClock,
) -> None:
    srv, _ = server
    status, content_type, body = get(srv, "/healthz")
    assert (status, content_type) == (200, "application/json")
    assert json.loads(body)["status"] == "ok"
    clock.now += 60
    status, _, body = get(srv, "/healthz")
    assert status == 503
    assert json.loads(body) == {"status": "stale", "last_beat_seconds_ago": 60.0, "stale_after": 30}


def test_readyz_is_503_until_ready_then_200(server: tuple[Server, Metrics], health: Health) -> None:
    srv, _ = server
    status, _, body = get(srv, "/readyz")
    assert status == 503
    assert json.loads(body)["status"] == "not_joined"
    ready_health(health)
    status, _, body = get(srv, "/readyz")
    assert status == 200
    assert json.loads(body)["status"] == "ok"


def test_query_string_is_ignored(server: tuple[Server, Metrics]) -> None:
    assert get(server[0], "/healthz?verbose=1")[0] == 200


@pytest.mark.parametrize("path", ["/", "/health", "/metrics/extra", "/readyz/"])
def test_unknown_paths_are_404(server: tuple[Server, Metrics], path: str) -> None:
    assert get(server[0], path)[0] == 404


def test_requests_are_not_logged_to_stderr(
    server: tuple[Server, Metrics], capfd: pytest.CaptureFixture[str],
) -> None:
    get(server[0], "/healthz")
    get(server[0], "/nope")
    assert capfd.readouterr().err == ""


def test_close_frees_the_port(health: Health) -> None:
    srv = serve(0, CollectorRegistry(), health, host="127.0.0.1")
    port = srv.port
    assert get(srv, "/healthz")[0] == 200
    srv.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
    again = serve(port, CollectorRegistry(), health, host="127.0.0.1")
    again.close()


def test_records_waiting_for_a_service_make_the_replica_not_ready() -> None:
    health = Health()
    health.joined(True)
    health.partitions(assigned=2, ready=2)
    assert health.readiness()[0]
    health.waiting_for("schema registry")
    ready, detail = health.readiness()
    assert not ready and detail["status"] == "waiting" and detail["for"] == "schema registry"
    health.waiting_for(None)
    assert health.readiness()[0]
