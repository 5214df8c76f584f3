"""``txstage redrive [options]``: the stage's settings (TXSTAGE_*) say which DLQ, which
transform and where outputs go; options choose the letters.

Exit codes (service/exit_codes.py): 0 done (letters that failed again are back in the
DLQ or parked: see the report), 2 bad settings or arguments, 4 the redrive could not
finish (it resumes where its last committed transaction ended).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from service.arguments import Parser
from service.backfill.specs import Timestamp, parse_bound
from service.contract.letters import parking_topic_of
from service.errors import ConfigError
from service.exit_codes import ExitCode
from service.formats.load import load_formatted
from service.kafka.cluster import Cluster, OutputLimits
from service.kafka.config import admin_config, producer_config
from service.preflight import sized_max_bytes
from service.settings import Settings
from service.tools.common import run_tool, tool_settings
from service.tools.redrive.letters import Filter
from service.tools.redrive.run import MAX_ATTEMPTS, redrive, transactional_id


def parser() -> argparse.ArgumentParser:
    """``txstage redrive`` alone (the tree in service/cli.py adds the same arguments)."""
    p = Parser(prog="txstage redrive")
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Reprocess dead letters through the current transform, exactly once: "
                     "outputs carry the original record's lineage; a letter that fails again "
                     "goes back to the DLQ with txstage.redrive.attempt + 1, or to the "
                     "parking topic once that reaches --max-attempts. Reads the stage's "
                     "settings (TXSTAGE_*); the stream may keep running.")
    p.epilog = "exit codes: 0 done, 2 bad settings or arguments, 4 could not finish"
    p.add_argument("--error-class", action="append", metavar="NAME",
                   help="only letters whose txstage.error.class is NAME (repeatable)")
    p.add_argument("--source-topic", metavar="TOPIC", help="only letters of this input topic")
    p.add_argument("--source-partition", action="append", type=int, metavar="N",
                   help="only letters of this input partition (repeatable)")
    p.add_argument("--from-offset", type=int, metavar="OFFSET",
                   help="only letters whose original offset is at least OFFSET")
    p.add_argument("--to-offset", type=int, metavar="OFFSET",
                   help="only letters whose original offset is at most OFFSET")
    p.add_argument("--since", metavar="TIME", help="only letters written at or after TIME "
                   "(epoch ms or ISO-8601 with a time zone)")
    p.add_argument("--until", metavar="TIME", help="only letters written before TIME")
    p.add_argument("--dry-run", action="store_true",
                   help="run the transform and show what would be written; write nothing")
    p.add_argument("--max-attempts", type=_at_least_one, default=MAX_ATTEMPTS, metavar="N",
                   help="a letter whose N-th redrive fails goes to the parking topic, marked "
                        "txstage.redrive.parked=1, instead of back to the DLQ, so scheduled "
                        f"redrives stop growing the DLQ (default {MAX_ATTEMPTS})")
    p.add_argument("--parking-topic", metavar="TOPIC",
                   help="where parked letters go (default: the DLQ's name + .parked, "
                        "created if missing; a DLQ named *.parked parks in itself). A "
                        "parked letter that fails again stays where it is")
    p.add_argument("--batch", type=int, default=500, metavar="N",
                   help="letters per transaction (default 500)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=handle)


def _at_least_one(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a whole number, 1 or more")
    return number


def _ms(text: str | None, name: str) -> int | None:
    if text is None:
        return None
    bound = parse_bound(f"timestamp:{text}", name)
    assert isinstance(bound, Timestamp)
    return bound.ms


def _settings() -> Settings:
    settings = tool_settings()
    if not settings.dlq_topic:
        raise ConfigError("TXSTAGE_DLQ_TOPIC: not set: there is no dead-letter topic to "
                          "redrive")
    return settings


def main(argv: Sequence[str]) -> int:
    return handle(parser().parse_args(argv))  # exits 2 on bad arguments


def handle(args: argparse.Namespace) -> int:
    return run_tool("redrive", lambda: _redrive(args),
                    unfinished_hint=" (a rerun resumes from its last committed transaction)")


def _redrive(args: argparse.Namespace) -> int:
    settings = _settings()
    parking = args.parking_topic or parking_topic_of(settings.dlq_topic)
    # Parking in the DLQ itself would grow it again, unless it is a parking topic: then
    # that is where its letters park (no nesting).
    if parking == settings.dlq_topic != parking_topic_of(settings.dlq_topic):
        raise ConfigError(f"--parking-topic: {parking} is the dead-letter topic")
    letter_filter = Filter(
        error_classes=frozenset(args.error_class) if args.error_class else None,
        source_topic=args.source_topic,
        source_partitions=frozenset(args.source_partition) if args.source_partition else None,
        min_offset=args.from_offset, max_offset=args.to_offset,
        since_ms=_ms(args.since, "--since"), until_ms=_ms(args.until, "--until"))
    # As the stage checks each output: against its topic's max.message.bytes, and a
    # topic that does not exist dead-letters the record again (UnknownTopicError)
    # instead of failing the batch's transaction on every run.
    # Its producer is sized as the stage's, from the output and dead-letter topics: a
    # letter the stage kept whole is written whole again.
    cluster = Cluster(admin_config(settings))
    limits = OutputLimits(cluster, sized_max_bytes(settings, cluster))
    tid = transactional_id(settings.id_prefix, settings.dlq_topic)
    report = redrive(producer_config=producer_config(
                         settings, tid, message_max_bytes=limits.producer_max_bytes),
                     admin_config=admin_config(settings), dlq_topic=settings.dlq_topic,
                     transform=load_formatted(settings.transform, settings),
                     default_topic=settings.output_topic, prefix=settings.id_prefix,
                     letter_filter=letter_filter, max_bytes=limits.lookup,
                     dry_run=args.dry_run, batch=args.batch, timeout_s=args.timeout,
                     max_attempts=args.max_attempts, parking_topic=parking,
                     deadline_s=settings.call_deadline_s)
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.summary())
    return ExitCode.OK
