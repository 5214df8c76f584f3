"""The shutdown budget (``TXSTAGE_SHUTDOWN_TIMEOUT_S``): a stop must end in time even
when Kafka does not answer or the transform never returns.

Within the budget the stage commits what it can and leaves the group. When the
budget runs out the watchdog leaves the group itself if nobody has yet (so the
partitions move at once rather than after a session time-out), then ends the
process. Whatever was still open is aborted by the next owner's init_transactions.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

import structlog

log = structlog.get_logger(__name__)

_LEAVE_GROUP_S = 3.0


class Watchdog:
    def __init__(self, leave_group: Callable[[], None]) -> None:
        self._leave_group = leave_group
        self._timer: threading.Timer | None = None
        self.left = threading.Event()  # the group was left (by the stage or by us)

    def arm(self, seconds: float, exit_code: int) -> None:
        if self._timer is None:
            self._timer = threading.Timer(max(seconds, 0.0), self._expire, (seconds, exit_code))
            self._timer.daemon = True
            self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _expire(self, budget: float, exit_code: int) -> None:
        log.error("stage.shutdown_budget_exceeded", budget_s=round(budget, 3),
                  left_group=self.left.is_set(), exit_code=exit_code)
        self.leave_and_exit(exit_code)

    def leave_and_exit(self, exit_code: int) -> NoReturn:
        """From any thread but the loop's, which may be stuck: leave the group if nobody
        has (bounded: the partitions move at once, not a session time-out later), exit."""
        if not self.left.is_set():
            leaving = threading.Thread(target=self._leave_quietly, daemon=True)
            leaving.start()
            leaving.join(_LEAVE_GROUP_S)
        sys.stdout.flush()  # the last log lines, before an exit that flushes nothing
        sys.stderr.flush()
        os._exit(exit_code)

    def _leave_quietly(self) -> None:
        try:
            self._leave_group()
        except Exception as exc:
            log.warning("consumer.close_failed", error=str(exc))
