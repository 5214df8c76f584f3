"""retry_until: the one blocking retry loop for a Kafka call that may say "not now"."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from service.errors import RetriableError

T = TypeVar("T")


def retry_until(deadline: float, call: Callable[[], T], *, pause: float,
                on_retry: Callable[[RetriableError], None] | None = None,
                renew: Callable[[], None] | None = None) -> T:
    """Return ``call()``, calling it again, unchanged, while it raises RetriableError.

    Only RetriableError is retried; any other exception propagates at once. Once
    ``deadline`` (``time.monotonic()``) has passed, the last RetriableError is
    re-raised as it is. Before each new attempt: ``on_retry(error)`` (a log line),
    a fixed ``pause`` (no growth, no jitter), then ``renew()`` (a fresh client).
    Nothing else is ever called between attempts: no abort after a commit time-out."""
    while True:
        try:
            return call()
        except RetriableError as exc:
            if time.monotonic() >= deadline:
                raise
            if on_retry is not None:
                on_retry(exc)
            time.sleep(pause)
            if renew is not None:
                renew()
