"""One ``txstage`` argparse tree and one exit-code table (service/exit_codes.py).

The numbers are an interface (Kubernetes, scripts, docs), so they are written out here;
each command's arguments are its own module's, and the tree gives the same help and the
same errors as the command alone."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from service import cli
from service.backfill import cli as backfill_cli
from service.exit_codes import ExitCode
from service.local_kafka import cli as kafka_cli
from service.tools.audit import cli as audit_cli
from service.tools.redrive import cli as redrive_cli

ROOT = Path(__file__).resolve().parents[2]


def test_the_exit_codes_keep_their_numbers() -> None:
    assert {code.name: int(code) for code in ExitCode} == {
        "OK": 0, "FAILED": 1, "CONFIG": 2, "POISON": 3, "UNFINISHED": 4,
        "TRANSFORM_TIMED_OUT": 5, "BUG": 70}
    assert (ExitCode.FATAL, ExitCode.VIOLATIONS, ExitCode.DIFFERENT) == (1, 1, 1)
    assert (ExitCode.NOT_RUNNING, ExitCode.UNREACHABLE) == (3, 4)


def test_no_other_module_defines_exit_codes() -> None:
    for path in (ROOT / "service").rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            assert not [n for n in names if n.startswith("EXIT_")], path


def help_of(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        cli.parser().parse_args(argv)
    assert exited.value.code == 0
    return capsys.readouterr().out


def test_a_command_in_the_tree_has_the_help_it_has_alone(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert help_of(["audit", "--help"], capsys) == audit_cli.parser().format_help()
    assert help_of(["redrive", "--help"], capsys) == redrive_cli.parser().format_help()
    for argv in (["--help"], ["verify", "--help"]):
        assert backfill_cli.main(argv) == 0
        alone = capsys.readouterr().out
        assert "--source" in alone or "--expected" in alone
        assert help_of(["backfill", *argv], capsys) == alone
    with pytest.raises(SystemExit):
        kafka_cli.main(["up", "--help"])
    alone = capsys.readouterr().out
    assert help_of(["kafka", "up", "--help"], capsys) == alone


@pytest.mark.parametrize(("argv", "error"), [
    (["audit", "--bogus"], "txstage audit: error: unrecognized arguments: --bogus"),
    (["kafka", "up", "--bogus"], "txstage kafka: error: unrecognized arguments: --bogus"),
    (["run", "--bogus"], "txstage: error: unrecognized arguments: --bogus"),
])
def test_an_unknown_argument_is_the_error_of_the_command_that_was_named(
        argv: list[str], error: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.parser().parse_args(argv)
    assert exited.value.code == ExitCode.CONFIG
    assert capsys.readouterr().err.splitlines()[-1] == error


def test_a_bad_backfill_argument_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.parser().parse_args(["backfill", "--source", "a", "--sink", "b", "--colour"])
    assert exited.value.code == ExitCode.CONFIG
    assert capsys.readouterr().err == \
        "txstage backfill: error: unrecognized arguments: --colour\n"


def test_backfill_runs_when_no_command_is_named() -> None:
    args = cli.parser().parse_args(["backfill", "--source", "a", "--sink", "b"])
    assert args.handler is backfill_cli.handle
    assert args.backfill_command is backfill_cli._run
    verify = cli.parser().parse_args(["backfill", "verify", "--expected", "a", "--actual", "b"])
    assert verify.backfill_command is backfill_cli._verify


def test_each_command_has_its_handler() -> None:
    parser = cli.parser()
    assert parser.parse_args(["run"]).handler is cli._stage_command
    assert parser.parse_args(["check-config"]).handler is cli._stage_command
    assert parser.parse_args(["audit"]).handler is audit_cli.handle
    assert parser.parse_args(["redrive"]).handler is redrive_cli.handle
    status = parser.parse_args(["kafka", "status"])
    assert status.handler is kafka_cli.handle and status.kafka_command is kafka_cli._cmd_status


def test_run_and_help_load_no_other_command() -> None:
    """Each command's module is imported when it is named: ``txstage run`` never loads
    PySpark, the local broker or the operator tools."""
    script = (
        "import sys\n"
        "from service import cli\n"
        "cli.parser().parse_args(['run'])\n"
        "try:\n"
        "    cli.parser().parse_args(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith(('pyspark', 'service.backfill',\n"
        "      'service.local_kafka', 'service.tools.audit', 'service.tools.redrive'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, check=True, timeout=60)
    assert done.stdout.splitlines()[-1] == "[]"


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    assert help_of(["--version"], capsys) == f"txstage {metadata.version('txstage')}\n"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert metadata.version("txstage") == pyproject["project"]["version"]


EVERY_HELP = [[], ["run"], ["check-config"], ["audit"], ["redrive"], ["backfill"],
              ["backfill", "verify"], ["kafka"], ["kafka", "install"], ["kafka", "up"],
              ["kafka", "status"], ["kafka", "down"], ["topics"]]


@pytest.mark.parametrize("argv", EVERY_HELP, ids=lambda argv: " ".join(argv) or "txstage")
def test_help_is_plain_text(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # Docstrings' reST (``txstage``) read as noise in a terminal.
    text = help_of([*argv, "--help"], capsys)
    assert "`" not in text, text


def test_each_command_in_the_overview_says_what_it_does(
        capsys: pytest.CaptureFixture[str]) -> None:
    overview = help_of(["--help"], capsys)
    topics = next(line for line in overview.splitlines() if line.strip().startswith("topics "))
    assert all(action in topics for action in ("create", "produce", "read")), topics
    check = help_of(["check-config", "--help"], capsys)
    assert check.split("\n\n")[1].startswith("Check the settings"), check
    assert "exits 2" in check and "configuration OK" in check, check
