"""``txstage topics``: the stage's topics by hand.

- ``create``: its topics (input, output, dead letters) from the same TXSTAGE_* settings
  the stage runs with; idempotent, a topic that exists is left as it is.
- ``produce TOPIC``: each line of stdin a record.
- ``read TOPIC``: its committed records' values, one per line, from the start.

Exit codes (service/exit_codes.py): 0 done, 2 bad settings or arguments or a missing
permission (named), 4 the cluster did not answer."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from confluent_kafka.admin import AdminClient

from service.arguments import Parser
from service.exit_codes import ExitCode
from service.kafka.config import admin_config
from service.kafka.topics import create_topic, follow, produce_lines
from service.settings import Settings
from service.tools.common import run_tool, tool_settings

DEFAULT_PARTITIONS = 8


def parser() -> argparse.ArgumentParser:
    """``txstage topics`` alone (the tree in service/cli.py adds the same arguments)."""
    p = Parser(prog="txstage topics")
    add_arguments(p)
    return p


def _at_least_one(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of at least 1")
    return int(text)


def _config(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    return key, value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("The stage's topics by hand: create them from its settings "
                     "(TXSTAGE_INPUT_TOPICS, TXSTAGE_OUTPUT_TOPIC, TXSTAGE_DLQ_TOPIC; a topic "
                     "that exists is left as it is), produce lines into one, read one.")
    p.epilog = "exit codes: 0 done, 2 bad settings or arguments or a missing permission, " \
               "4 the cluster did not answer"
    p.add_argument("action", choices=["create", "produce", "read"],
                   help="create the stage's topics; produce stdin's lines into TOPIC; "
                        "read TOPIC's committed values")
    p.add_argument("name", nargs="?", metavar="TOPIC", help="the topic to produce or read")
    p.add_argument("--max", type=_at_least_one, metavar="N",
                   help="read: stop after N records")
    p.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                   help="read: stop when nothing came for this long (default 30)")
    p.add_argument("--partitions", type=_at_least_one, default=DEFAULT_PARTITIONS, metavar="N",
                   help=f"partitions of each new topic (default {DEFAULT_PARTITIONS}): "
                        "the most replicas that can share the input")
    p.add_argument("--replication-factor", type=int, default=-1, metavar="N",
                   help="replicas of each partition (default: the broker's "
                        "default.replication.factor)")
    p.add_argument("--config", type=_config, action="append", default=[],
                   metavar="KEY=VALUE", help="a topic config, e.g. retention.ms=604800000 "
                                             "(repeatable)")
    p.add_argument("--topic", action="append", default=[], metavar="NAME",
                   help="one more topic, e.g. one the transform writes to (repeatable)")
    p.set_defaults(handler=handle)


def main(argv: Sequence[str]) -> int:
    return handle(parser().parse_args(argv))  # exits 2 on bad arguments


def handle(args: argparse.Namespace) -> int:
    if (args.name is None) != (args.action == "create"):
        print(f"txstage topics: {args.action} " +
              ("takes no TOPIC" if args.action == "create" else "needs a TOPIC"),
              file=sys.stderr)
        return ExitCode.CONFIG
    action = {"create": _create, "produce": _produce, "read": _read}[args.action]
    return run_tool("topics", lambda: action(args))


def _client_config(settings: Settings) -> dict[str, object]:
    return {k: v for k, v in admin_config(settings).items() if k != "client.id"}


def _produce(args: argparse.Namespace) -> int:
    lines = (line.rstrip(b"\n") for line in sys.stdin.buffer)
    count = produce_lines(_client_config(tool_settings()), args.name, lines)
    print(f"produced {count} records to {args.name}", file=sys.stderr)
    return ExitCode.OK


def _read(args: argparse.Namespace) -> int:
    values = follow(_client_config(tool_settings()), args.name, idle_s=args.timeout)
    for count, value in enumerate(values, 1):
        print("" if value is None else value.decode("utf-8", "backslashreplace"), flush=True)
        if args.max is not None and count >= args.max:
            break
    return ExitCode.OK


def _create(args: argparse.Namespace) -> int:
    settings = tool_settings()
    names = [*settings.input_topics, settings.output_topic,
             *([settings.dlq_topic] if settings.dlq_topic else []), *args.topic]
    admin = AdminClient(dict(admin_config(settings)))
    for name in dict.fromkeys(names):  # in order, once each
        created = create_topic(admin, name, partitions=args.partitions,
                               config=dict(args.config),
                               replication_factor=args.replication_factor, timeout_s=60)
        print(f"{'created' if created else 'exists '} {name}"
              + (f" ({args.partitions} partitions)" if created else " (left as it is)"))
    return ExitCode.OK
