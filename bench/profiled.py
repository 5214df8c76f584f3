"""``txstage run`` under a profiler, for ``bench.throughput --profile``.

``python -m bench.profiled {cprofile|pyinstrument} FILE`` runs the stage as ``python
-m service run`` would and writes the profile (pstats format) to FILE when the stage
leaves. A profiler's own command line (``python -m cProfile -o FILE -m service run``)
writes nothing: the stage leaves with ``os._exit`` once everything is committed and
closed (``service.cli._exit_now``), which skips the code after it. This wraps
``os._exit`` so the profile is written first.
"""

from __future__ import annotations

import cProfile
import os
import sys
from collections.abc import Callable
from typing import NoReturn


def _profiler(kind: str, path: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """(start, stop-and-write) for ``kind``."""
    if kind == "cprofile":
        profile = cProfile.Profile()

        def write_cprofile() -> None:
            profile.disable()
            profile.dump_stats(path)
        return profile.enable, write_cprofile
    if kind == "pyinstrument":  # sampling, main thread; pip install pyinstrument
        from pyinstrument import Profiler  # type: ignore[import-not-found]
        from pyinstrument.renderers import PstatsRenderer  # type: ignore[import-not-found]
        sampler = Profiler()

        def write_pyinstrument() -> None:
            sampler.stop()
            with open(path, "wb") as out:
                out.write(sampler.output(PstatsRenderer()))
        return sampler.start, write_pyinstrument
    raise SystemExit(f"bench.profiled: unknown profiler {kind!r} (cprofile, pyinstrument)")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        raise SystemExit("usage: python -m bench.profiled {cprofile|pyinstrument} FILE")
    start, write = _profiler(argv[0], argv[1])
    leave = os._exit

    def write_then_leave(code: int) -> NoReturn:
        write()
        leave(code)

    setattr(os, "_exit", write_then_leave)  # noqa: B010 (mypy: a module's function)
    from service.cli import main as txstage

    start()
    code = txstage(["run"])
    write_then_leave(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
