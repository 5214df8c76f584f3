"""A replica of the stage as a real OS process, as the tests run it: the process
helper of :mod:`bench.replica` (``tests.harness.stage`` re-exports it) with the test
suite's environment, source tree and clean-up."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Self

from bench.replica import REPO_ROOT
from bench.replica import Replica as StageProcess
from service.local_kafka.node import free_ports


def stage_tree() -> Path:
    """The source tree replicas run from (their cwd, so ``service`` and the test
    transforms are imported from it): this repo, or ``$TXSTAGE_TEST_STAGE_TREE`` to run
    another version of the stage under the same tests, e.g. to show that a regression
    test fails on the code before a fix. That tree needs ``tests/harness/
    transforms.py`` with the transforms the tests name."""
    override = os.environ.get("TXSTAGE_TEST_STAGE_TREE")
    return Path(override).resolve() if override else REPO_ROOT


class Replica(StageProcess):
    """``python -m service run`` with our environment plus ``env``, a free metrics port
    on 127.0.0.1, unbuffered output, cwd ``stage_tree()``, stdin ours, the log (JSON
    lines) appended to ``log_dir/<name>.log``. Every one started is in
    ``Replica.started`` until ``kill_leftovers`` (after each test) ends it."""

    started: ClassVar[list[Replica]] = []

    @classmethod
    def kill_leftovers(cls) -> list[str]:
        """SIGKILL every replica still running; the names of those that were."""
        running = [replica for replica in cls.started if replica.alive()]
        for replica in running:
            replica.kill()
        cls.started.clear()
        return [replica.name for replica in running]

    def __init__(self, name: str, env: Mapping[str, str], log_dir: Path) -> None:
        port = free_ports(1)[0]
        super().__init__(name, {**os.environ, **env, "TXSTAGE_METRICS_PORT": str(port),
                                "TXSTAGE_METRICS_HOST": "127.0.0.1", "PYTHONUNBUFFERED": "1"},
                         log_dir / f"{name}.log", port)

    def start(self, *, append: bool = True) -> Self:
        """Launch it; the log is always appended to (a restarted replica keeps its
        earlier lines), whatever ``append`` says."""
        self._launch(self.argv, stage_tree(), None, "ab")
        Replica.started.append(self)
        return self
