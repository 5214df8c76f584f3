"""Each test module's wall time (setup, call and teardown of its tests), printed at
the end of a run and written to ``$TXSTAGE_TEST_DURATIONS`` (JSON) when set: where
an integration module's docstring gets its closing "≈ N s"."""

from __future__ import annotations

import json
import os
from collections import defaultdict

import pytest

_SECONDS: defaultdict[str, float] = defaultdict(float)
_AT_LEAST_S = 1.0  # modules faster than this are left out of the printed list


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _SECONDS[report.nodeid.split("::", 1)[0]] += report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _SECONDS:
        return
    terminalreporter.section("seconds per test module")
    for module, seconds in sorted(_SECONDS.items(), key=lambda kv: -kv[1]):
        if seconds >= _AT_LEAST_S:
            terminalreporter.write_line(f"{seconds:8.1f}  {module}")
    target = os.environ.get("TXSTAGE_TEST_DURATIONS")
    if target:
        with open(target, "w") as out:
            json.dump(dict(_SECONDS), out, indent=1, sort_keys=True)
