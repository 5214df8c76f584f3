"""The replica's transaction budget (``TXSTAGE_MAX_TRANSACTIONS_PER_S``): one transaction
per input partition per commit interval costs the broker a transaction's requests and
markers each time, so at many busy partitions the interval is stretched until the
replica's total stays within the budget. At a few partitions nothing changes."""

from __future__ import annotations

# A partition counts as busy while a transaction is open on it or for this long after
# its last commit (a partition idle for longer commits nothing, and costs nothing).
BUSY_FOR_S = 2.0


def budgeted_interval(base_s: float, busy: int, per_s: float, ceiling_s: float) -> float:
    """The commit interval for ``busy`` partitions: ``base_s`` (the configured one)
    unless ``busy / base_s`` transactions a second would pass ``per_s`` (0: no budget),
    then ``busy / per_s``, at most ``ceiling_s`` (a tenth of the transaction time-out)
    and never below ``base_s``."""
    if per_s <= 0 or busy <= 0:
        return base_s
    return max(base_s, min(busy / per_s, ceiling_s))
