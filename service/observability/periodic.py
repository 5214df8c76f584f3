"""A check run every few seconds on a thread beside the loop (the watches of
lso_watch.py and group_lag.py): a failure is logged and the next round tries again."""

from __future__ import annotations

import threading

import structlog

log = structlog.get_logger(__name__)


class Periodic:
    """``check()`` every ``interval_s`` on a daemon thread named ``name``."""

    def __init__(self, name: str, interval_s: float) -> None:
        self._name, self._interval_s = name, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def check(self) -> None:
        raise NotImplementedError

    def start(self) -> Periodic:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        failures = 0
        while not self._stop.wait(self._interval_s):
            try:
                self.check()
                failures = 0
            except Exception as exc:  # a thread that dies says nothing more: keep trying
                failures += 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning(f"{self._name.replace('-', '_')}.failed", error=str(exc),
                                in_a_row=failures)
