"""Liveness and readiness of one replica, and the HTTP endpoint that serves them.

``Health`` is written by the consumer loop and the rebalance callbacks and read by
the HTTP server's threads, so it is the one place where the two meet:

- **live** (``/healthz``): no fatal error was reported and the loop iterated in
  the last ``stale_after`` seconds. A replica that is not live should be
  restarted: it is stuck (a hung transform, a deadlocked call) or broken.
- **ready** (``/readyz``): live, joined to the group, its assignment is known and
  every assigned partition has an initialized transactional producer. A replica
  that joined and got no partitions is ready: it is a correct standby, and
  treating it as unready would stall rolling updates whenever there are more
  replicas than input partitions.

``serve`` exposes both, plus ``/metrics``, on one port in a daemon thread (``listen``
binds the port first, before the replica's slow start-up, so a taken port is said at once).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

if TYPE_CHECKING:
    from service.observability.metrics import Metrics

Detail = dict[str, object]
"""Why a check is (not) OK, as a JSON-serializable dict."""

log = structlog.get_logger(__name__)

# How often the serving thread checks for close(): the bound on how long close() waits.
_SHUTDOWN_POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class _Group:
    """A consistent snapshot of the group-membership half of the state."""

    fatal_reason: str | None
    joined: bool
    assigned: int | None
    ready: int


class Health:
    """Thread-safe health state of one replica.

    ``beat()`` is called on every loop iteration, so it takes no lock: storing
    one float is atomic under the GIL, and a reader seeing the previous beat is
    harmless. Everything else changes rarely and is guarded by a lock so a
    reader never sees ``assigned`` from one rebalance and ``ready`` from another.

    The construction time counts as the first beat: a replica gets
    ``stale_after`` seconds to start its loop before it is reported stale.
    """

    def __init__(
        self, stale_after: float = 30.0, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if stale_after <= 0:
            raise ValueError(f"stale_after must be positive, got {stale_after}")
        self._stale_after = stale_after
        self._clock = clock
        self._last_beat = clock()
        self._lock = threading.Lock()
        self._group = _Group(fatal_reason=None, joined=False, assigned=None, ready=0)
        # TXSTAGE_WORKERS: how many transform workers are alive (None: in-process).
        self.workers_alive: Callable[[], int] | None = None
        self._waiting_for: str | None = None  # a service the records wait for (a registry)

    def waiting_for(self, service: str | None) -> None:
        """Records wait for ``service`` (None: no longer): not ready meanwhile."""
        self._waiting_for = service

    def beat(self) -> None:
        """Record that the consumer loop iterated (cheap: one time store)."""
        self._last_beat = self._clock()

    def fatal(self, reason: str) -> None:
        """Mark the replica as fatally broken; the first reason is kept (the cause)."""
        with self._lock:
            if self._group.fatal_reason is None:
                self._group = replace(self._group, fatal_reason=reason)

    def joined(self, flag: bool) -> None:
        """Record whether the consumer is currently a member of its group."""
        with self._lock:
            self._group = replace(self._group, joined=flag)

    def partitions(self, assigned: int, ready: int) -> None:
        """Record how many partitions are assigned and how many have a ready producer."""
        if assigned < 0 or not 0 <= ready <= assigned:
            raise ValueError(f"need 0 <= ready <= assigned, got {ready=} {assigned=}")
        with self._lock:
            self._group = replace(self._group, assigned=assigned, ready=ready)

    def liveness(self) -> tuple[bool, Detail]:
        """``(ok, why)``: ok iff no fatal error and the last beat is recent enough."""
        with self._lock:
            reason = self._group.fatal_reason
        if reason is not None:
            return False, {"status": "fatal", "reason": reason}
        age = self._clock() - self._last_beat
        detail: Detail = {
            "last_beat_seconds_ago": round(age, 3), "stale_after": self._stale_after,
        }
        if age >= self._stale_after:
            return False, {"status": "stale", **detail}
        return True, {"status": "ok", **detail}

    def readiness(self) -> tuple[bool, Detail]:
        """``(ok, why)``: ok iff live, joined and every assigned partition is ready."""
        live, live_detail = self.liveness()
        with self._lock:
            group = self._group
        counts: Detail = {"joined": group.joined, "assigned": group.assigned, "ready": group.ready}
        if not live:
            return False, {"status": "not_live", "liveness": live_detail, **counts}
        if not group.joined:
            return False, {"status": "not_joined", **counts}
        if group.assigned is None:
            return False, {"status": "awaiting_assignment", **counts}
        if group.ready != group.assigned:
            return False, {"status": "initializing_producers", **counts}
        if self.workers_alive is not None and not self.workers_alive():
            return False, {"status": "no_transform_worker", **counts}
        if self._waiting_for is not None:
            return False, {"status": "waiting", "for": self._waiting_for, **counts}
        return True, {"status": "ok", **counts}


def publish_readiness(health: Health, metrics: Metrics) -> None:
    """Make ``txstage_ready`` report ``health.readiness()`` at every scrape.

    Evaluated lazily so the gauge can never disagree with ``/readyz``, and so
    alerting on readiness works where no orchestrator probes the replica.
    """
    metrics.ready.set_function(lambda: 1.0 if health.readiness()[0] else 0.0)


class Server:
    """A health/metrics HTTP server: bound by ``listen``, serving after ``serve``;
    ``close()`` stops it and frees the port."""

    def __init__(self, httpd: ThreadingHTTPServer) -> None:
        self._httpd = httpd
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port actually bound (differs from the one asked for when that was 0)."""
        return int(self._httpd.server_address[1])

    def serve(self, registry: CollectorRegistry, health: Health) -> Server:
        """Answer ``/metrics``, ``/healthz`` and ``/readyz`` from now on, in a daemon
        thread: a replica that is exiting is never held up by a scrape in flight."""
        self._httpd.RequestHandlerClass = type(
            "Handler", (_Handler,), {"registry": registry, "health": health})
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        args=(_SHUTDOWN_POLL_S,), name="txstage-http",
                                        daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving, close the socket and wait for the serving thread."""
        if self._thread is not None:  # shutdown() waits for a serve_forever that ran
            self._httpd.shutdown()
            self._thread.join()
        self._httpd.server_close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def listen(port: int, host: str = "0.0.0.0") -> Server:
    """Bind ``host:port`` now (an OSError if it is taken); requests wait in the
    socket's backlog until ``Server.serve``."""
    return Server(_QuietServer((host, port), _Handler))


def serve(
    port: int, registry: CollectorRegistry, health: Health, host: str = "0.0.0.0",
) -> Server:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``host:port`` at once."""
    return listen(port, host).serve(registry, health)


class _QuietServer(ThreadingHTTPServer):
    """A server whose handler errors (mostly scrapers hanging up) go to the log, not stderr."""

    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        log.debug("http_handler_error", client=str(client_address), exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    registry: CollectorRegistry
    health: Health

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/metrics":
            self._send_metrics()
        elif path == "/healthz":
            self._send_check(*self.health.liveness())
        elif path == "/readyz":
            self._send_check(*self.health.readiness())
        else:
            self._send(404, "application/json", b'{"status": "not_found"}')

    def log_message(self, format: str, *args: object) -> None:
        """Silenced: probes and scrapes every few seconds would drown the real logs."""

    def _send_metrics(self) -> None:
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        self._send(200, content_type, encoder(self.registry))

    def _send_check(self, ok: bool, detail: Detail) -> None:
        body = json.dumps(detail, sort_keys=True).encode()
        self._send(200 if ok else 503, "application/json", body)

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)
