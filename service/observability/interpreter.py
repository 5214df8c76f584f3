"""The interpreter, tuned for the stage's loop: two settings.

- **GIL switch interval 1 ms** (Python's default is 5 ms), set before the stage
  starts: commits, aborts and inits run on job threads that need the GIL for a
  moment between Kafka calls; at 5 ms they wait behind the loop thread's per-record
  work, and commit latency doubles at the same throughput
  (docs/journal/2026-11-23-hot-path-after-rebuild.md).
- **The cycle collector**, once start-up is done: with Python's defaults the stage
  spends 7-11 % of its CPU in it, mostly in full collections walking every object
  start-up made (docs/journal/2026-11-26-garbage-collector.md). Each in-flight
  output's delivery callback outlives the young collections (it lives until the
  broker answers), so the oldest generation keeps filling and is walked again and
  again. Freezing start-up's objects takes them out of every walk; collecting the
  youngest generation every 20,000 allocations instead of 700 lets most per-record
  containers die before a collection sees them. The stage's cycles are rare (its
  per-record objects are freed by reference counting): memory does not grow.
"""

from __future__ import annotations

import functools
import gc
import sys

SWITCH_INTERVAL_S = 0.001
GC_YOUNGEST_THRESHOLD = 20_000


def tune_threads() -> None:
    """Hand the GIL to waiting job threads every millisecond."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)


@functools.cache
def tune_gc() -> None:
    """Call once start-up is done: what exists now is frozen out of collections. Later
    calls do nothing: a Spark Python worker calls it for every backfill task (a slice
    keeps a transaction's outputs for a replay: the same survivors as the stage's)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNGEST_THRESHOLD, older, oldest)
