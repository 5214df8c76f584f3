"""``txstage audit``: checks a live pipeline's exactly-once by lineage, from the outside
(its reads: service/kafka/reading.py).

- ledger.py   what is kept per input partition: ~10 bytes per input record in the window
- report.py   the findings, as a human summary or JSON
- run.py      the audit: committed offsets → inputs → outputs → open transactions
- cli.py      arguments in, exit code out (0 clean, 1 violations, 2 bad arguments)
"""

from service.tools.audit.run import audit

__all__ = ["audit"]
