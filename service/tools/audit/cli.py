"""``txstage audit [options]``: the stage's own settings (TXSTAGE_* variables, the same
ConfigMap) say what to audit; options say how.

Exit codes (service/exit_codes.py): 0 clean, 1 violations found, 2 bad settings or
arguments, 4 the audit could not finish (cluster unreachable, a read that did not reach
its end in time).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from service.arguments import Parser
from service.backfill.specs import Timestamp, parse_bound
from service.exit_codes import ExitCode
from service.formats.load import load_formatted
from service.kafka.config import admin_config
from service.tools.audit.run import audit
from service.tools.common import run_tool, tool_settings


def _positive(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(text: str) -> float:
    number, unit = text[:-1], text[-1:]
    if unit not in _UNITS or not number.replace(".", "", 1).isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number and s, m, h or d")
    return float(number) * _UNITS[unit]


def parser() -> argparse.ArgumentParser:
    """``txstage audit`` alone (the tree in service/cli.py adds the same arguments)."""
    p = Parser(prog="txstage audit")
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Check a running pipeline's exactly-once by lineage: duplicates, inputs "
                     "below the committed offsets without their outputs, outputs without an "
                     "input, order per input partition, hanging transactions. Reads the "
                     "stage's settings (TXSTAGE_*).")
    p.epilog = ("exit codes: 0 clean, 1 violations, 2 bad settings or arguments, "
                "4 the audit could not finish")
    window = p.add_mutually_exclusive_group()
    window.add_argument("--from", dest="start", default="earliest", metavar="BOUND",
                        help="window start: earliest (default), timestamp:<ms | ISO-8601>, or "
                             "offsets:<partition>=<offset>,... (one input topic); the window "
                             "ends at the group's committed offsets")
    window.add_argument("--last", type=_duration, metavar="DURATION",
                        help="window start this long ago, e.g. 90s, 30m, 1h, 2d")
    p.add_argument("--extra-output-topic", action="append", default=[], metavar="TOPIC",
                   help="an output topic written by other means; the topics the transform "
                        "writes are learned by running it (repeatable)")
    p.add_argument("--parking-topic", metavar="TOPIC",
                   help="where txstage redrive parks letters, if not the DLQ's name + .parked "
                        "(as redrive's --parking-topic); parked letters are counted, by topic")
    p.add_argument("--stuck-after", type=_positive, default=15.0, metavar="SECONDS",
                   help="a last stable offset below the high watermark this long is a "
                        "hanging transaction (default 15)")
    p.add_argument("--timeout", type=_positive, default=300.0, metavar="SECONDS",
                   help="give up reading after this long (default 300)")
    p.add_argument("--max-examples", type=int, default=10, metavar="N",
                   help="examples listed per kind of violation (default 10)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=handle)


def main(argv: Sequence[str]) -> int:
    return handle(parser().parse_args(argv))  # exits 2 on bad arguments


def handle(args: argparse.Namespace) -> int:
    return run_tool("audit", lambda: _audit(args))


def _audit(args: argparse.Namespace) -> int:
    settings = tool_settings()
    start = (Timestamp(round((time.time() - args.last) * 1000)) if args.last is not None
             else parse_bound(args.start, "--from"))
    transform = load_formatted(settings.transform, settings)
    outputs = [settings.output_topic, *([settings.dlq_topic] if settings.dlq_topic else []),
               *args.extra_output_topic]
    report = audit(config=admin_config(settings), group_id=settings.group_id,
                   input_topics=list(settings.input_topics), output_topics=outputs,
                   transform=transform, default_topic=settings.output_topic,
                   dlq_topic=settings.dlq_topic or None, start=start,
                   stuck_after_s=args.stuck_after, timeout_s=args.timeout,
                   max_examples=args.max_examples, parking_topic=args.parking_topic)
    print(report.to_json() if args.json else report.summary())
    return ExitCode.OK if report.ok else ExitCode.VIOLATIONS
