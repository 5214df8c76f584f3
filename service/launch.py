"""The ``txstage`` process's first lines: a signal while the stage starts ends it with 0
(SIGTERM, SIGINT) or prints every thread's stack (SIGUSR1) and lets it go on.

Until the stage installs its own handlers (``cli._install_signal_handlers``) nothing is
open: the consumer has not joined the group, no producer exists, no transaction is
open. A SIGTERM then (an orchestrator scaling down a replica that is still importing
on a busy node, or still waiting for its cluster in the start-up checks) needs nothing
committed and no group left, so the process leaves at once with 0, as a stopped
replica does, instead of dying by the signal (exit 143, -15 to a parent); a replica
started right after a broker pause can be told to leave while still in its start-up
checks (docs/journal/2026-11-26-seed-11-sigterm-while-starting.md).

Only ``txstage run`` is guarded: a backfill or a local broker stopped by a signal did
not finish, and says so by the signal. So this looks at the first argument itself,
before ``service.cli`` (the argparse tree, and the stage's heavy imports) is loaded."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
from types import FrameType
from typing import NoReturn

from service.exit_codes import ExitCode  # an IntEnum, nothing else: cheap before the signals


class StoppedWhileStarting(BaseException):
    """Raised by the start-up handler. A BaseException, like KeyboardInterrupt: no
    ``except Exception`` in the start-up path takes it for a failure to report."""


def main() -> int:
    if sys.argv[1:2] == ["run"]:
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        # Every thread's stack, as SIGUSR1 gives later, and the replica keeps waiting:
        # SIGUSR1's default action would end it (the test harness sends it to every
        # live replica when a wait times out, one still in its start-up checks too:
        # docs/journal/2026-11-27-seed-11-test-in-ci.md).
        with contextlib.suppress(ValueError, OSError):  # no real stderr
            faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        from service.cli import main as cli_main  # the imports take a while on a busy node

        return cli_main()
    except StoppedWhileStarting as stopped:
        _leave(signal.Signals(stopped.args[0]))


def _stop(signum: int, frame: FrameType | None) -> None:
    raise StoppedWhileStarting(signum)


def _leave(signum: signal.Signals) -> NoReturn:
    """Exit 0 without the interpreter's finalisation: an admin client's librdkafka
    threads may still run (see ``cli._exit_now``)."""
    with contextlib.suppress(Exception):  # the logger may be half imported
        import structlog

        structlog.get_logger("txstage").info("stage.stopped_while_starting",
                                             signal=signum.name)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(ExitCode.OK)
