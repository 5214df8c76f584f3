"""``python -m service.backfill ...`` and ``spark-submit service/backfill/__main__.py ...``.

spark-submit runs this file as a script, with its own directory on ``sys.path``; put the
repository root there instead so ``service`` imports (on a cluster, ship the package to
the executors too: see docs/backfill.md).
"""

import sys
from pathlib import Path

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.path = [p for p in sys.path if Path(p).resolve() != Path(__file__).resolve().parent]

from service.backfill import main

raise SystemExit(main(sys.argv[1:]))
