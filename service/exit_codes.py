"""Every exit code of every ``txstage`` command, in one table.

The numbers are an interface: Kubernetes (the Deployment's restarts, the audit CronJob's
failed Job), scripts, the docs and the tests read them, so none of them changes. Where
one number means different things to different commands, each meaning has its own name,
an alias of the same member (``ExitCode.NOT_RUNNING is ExitCode.POISON``)::

    code  name         command                  meaning
    0     OK           every command            done; ``run``: stopped by SIGTERM/SIGINT;
                                                ``audit``: clean; ``backfill verify``: equal;
                                                ``kafka up``/``down``: also when it already
                                                was up / nothing ran
    1     FATAL        run                      a fatal runtime error
          VIOLATIONS   audit                    violations found
          FAILED       backfill run             the job failed (one line says why)
          DIFFERENT    backfill verify          the two outputs differ
          FAILED       kafka                    the broker could not be installed or
                                                started, or a port is taken
          FAILED       registry                 the same for the local schema registry (or
                                                no Java 21+)
    2     CONFIG       every command            bad settings or arguments (argparse's own
                                                2 too), a missing permission (audit,
                                                redrive), an unmapped topic (backfill)
    3     POISON       run                      a poison record exhausted its attempts and
                                                there is no dead-letter topic
          NOT_RUNNING  kafka status             the local broker is not running
                       registry status          the local registry is not running
    4     UNFINISHED   audit, redrive           could not finish (cluster unreachable, a
                                                read or a transaction that timed out)
          UNREACHABLE  run, check-config        the cluster could not be queried at
                                                start-up (``run`` asks for 120 s)
    5     TRANSFORM_TIMED_OUT  run              a transform call ran past
                                                TXSTAGE_TRANSFORM_TIMEOUT_MS: recorded for
                                                the next owner, which calls it again or
                                                dead-letters the record
    70    BUG          audit, redrive           an unexpected exception: a bug in the
                                                tool (its traceback on stderr; EX_SOFTWARE)

Not in the table: ``128 + signal`` when a second SIGTERM/SIGINT ends ``run`` at once
(``service.cli``), as a shell reports a process a signal ended.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """A command's exit code; the module docstring says which command uses which."""

    OK = 0
    FAILED = 1
    CONFIG = 2
    POISON = 3
    UNFINISHED = 4
    BUG = 70  # sysexits.h EX_SOFTWARE
    TRANSFORM_TIMED_OUT = 5

    # The same numbers, named for what they mean to the command that returns them.
    FATAL = 1  # run, check-config
    VIOLATIONS = 1  # audit
    DIFFERENT = 1  # backfill verify
    NOT_RUNNING = 3  # kafka status
    UNREACHABLE = 4  # run, check-config
