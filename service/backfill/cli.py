"""``txstage backfill [run|verify] ...``: arguments in, exit code out.

Exit codes (service/exit_codes.py): 0 done (or identical, for verify), 1 the job failed
(or verify found differences), 2 bad arguments or configuration, one line per problem on
stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn

from service.arguments import Parser
from service.backfill import config, parity, plan
from service.backfill.slice_writer import DEFAULT_TRANSACTION_BYTES, DEFAULT_TRANSACTION_RECORDS
from service.backfill.specs import KafkaSource, parse_sink, parse_source
from service.backfill.topic_map import UnmappedTopicError, parse_pairs
from service.contract.lineage import Lineage
from service.errors import ConfigError
from service.exit_codes import ExitCode
from service.settings import environment

PROG = "txstage backfill"
COMMANDS = ("run", "verify")
_PYTHON_ERROR = re.compile(r"^\s*(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.+)$", re.MULTILINE)

log = logging.getLogger("txstage.backfill")


class _Parser(Parser):
    """A bad argument is one line, as every other problem: ``txstage backfill: error: ...``,
    exit 2. An argument it does not know is its own error too, not its parent's."""

    def error(self, message: str) -> NoReturn:
        self.exit(ExitCode.CONFIG, f"{PROG}: error: {message}\n")

    def parse_known_args(self, args: Iterable[str] | None = None,
                         namespace: Any = None) -> tuple[Any, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def main(argv: Sequence[str]) -> int:
    """This command alone: ``python -m service.backfill``, ``spark-submit``, the tests."""
    parser = _Parser(prog=PROG)
    add_arguments(parser)
    try:
        args = parser.parse_args(with_command(argv))
    except SystemExit as exc:  # --help, or a bad argument (said already)
        return exc.code if isinstance(exc.code, int) else 0
    return handle(args)


def with_command(argv: Sequence[str]) -> list[str]:
    """``run`` unless the first argument names a command: ``txstage backfill --source ...``
    runs a job, ``txstage backfill --help`` is run's help."""
    args = list(argv)
    return args if args and args[0] in COMMANDS else ["run", *args]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``run`` and ``verify``; the command is named first (``with_command``)."""
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _run_arguments(commands.add_parser("run", prog=f"{PROG} [run]"))
    _verify_arguments(commands.add_parser("verify"))
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    command: Callable[[argparse.Namespace], int] = args.backfill_command
    _configure_logging()
    try:
        return command(args)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"{PROG}: error: {problem}", file=sys.stderr)
        return ExitCode.CONFIG
    except Exception as exc:
        log.debug("backfill failed", exc_info=True)
        failure = describe_failure(exc)
        if failure.startswith(f"{UnmappedTopicError.__name__}: "):  # met in a Spark task
            print(f"{PROG}: error: {failure.partition(': ')[2]}", file=sys.stderr)
            return ExitCode.CONFIG
        print(f"{PROG}: failed: {failure}", file=sys.stderr)
        return ExitCode.FAILED


def describe_failure(exc: BaseException) -> str:
    """One line for a failure; from a Spark task's Python traceback, its last error line."""
    text = str(exc)
    found = _PYTHON_ERROR.findall(text)
    if found:
        name, message = found[-1]
        return f"{name}: {message.strip()}"
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(exc).__name__}: {first}"


def _configure_logging() -> None:
    """The stage's log pipeline, unless the host (pytest, an app) already set one up."""
    if logging.getLogger().handlers:
        return
    from service.observability.logs import configure_logging

    env = environment()
    fmt = env.get("TXSTAGE_LOG_FORMAT", "console")
    configure_logging("json" if fmt == "json" else "console", env.get("TXSTAGE_LOG_LEVEL",
                                                                        "INFO"))


# -- run ---------------------------------------------------------------------------------


def _run_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Run TXSTAGE_TRANSFORM over history on PySpark; re-running the same "
                     "command resumes the same job (docs/backfill.md).")
    p.add_argument("--source", required=True, help="kafka://<topic>?from=<bound>&to=<bound> "
                   "(bounds: earliest, latest, offsets:<p>=<o>,..., timestamp:<ms|ISO-8601>), "
                   "parquet:<path> or jsonl:<path>[?encoding=base64]")
    p.add_argument("--sink", required=True,
                   help="kafka[://<output topic>] (exactly once) or parquet:<path>")
    p.add_argument("--job-id", help="names the job; default: derived from the arguments, so "
                   "the same command resumes the same job")
    p.add_argument("--transform", help="module.path:function (default TXSTAGE_TRANSFORM)")
    p.add_argument("--output-topic", help="for outputs with topic=None "
                   "(default TXSTAGE_OUTPUT_TOPIC)")
    p.add_argument("--dlq-topic", help="dead-letter topic; '' fails on a poison record "
                   "(default: TXSTAGE_DLQ_TOPIC mapped by --topic-map or --topic-suffix)")
    p.add_argument("--topic-map", action="append", default=[], metavar="TOPIC=SINK_TOPIC",
                   help="write the outputs the transform (or TXSTAGE_OUTPUT_TOPIC, "
                   "TXSTAGE_DLQ_TOPIC) sends to TOPIC into SINK_TOPIC (repeatable); a Kafka "
                   "sink refuses an output to a topic not mapped or named; TOPIC=TOPIC "
                   "writes into the live topic")
    p.add_argument("--topic-suffix", metavar="SUFFIX", help="map every topic not given by "
                   "--topic-map to <topic><SUFFIX>, e.g. -v2")
    p.add_argument("--bootstrap-servers", help="default TXSTAGE_BOOTSTRAP_SERVERS")
    p.add_argument("--transactional-id-prefix", help="default TXSTAGE_TRANSACTIONAL_ID_PREFIX, "
                   "else TXSTAGE_GROUP_ID, else txstage")
    p.add_argument("--progress-topic", help="default <prefix>.backfill.progress")
    p.add_argument("--slice-records", type=_positive, default=plan.DEFAULT_SLICE_RECORDS,
                   help="cut input partitions at multiples of this many offsets "
                   "(default %(default)s)")
    p.add_argument("--transaction-records", type=_positive,
                   default=DEFAULT_TRANSACTION_RECORDS,
                   help="inputs per transaction, at most (default %(default)s)")
    p.add_argument("--transaction-bytes", type=_positive, default=DEFAULT_TRANSACTION_BYTES,
                   help="keys and values of a transaction's inputs and outputs, kept in "
                   "memory to replay it, at most (default %(default)s)")
    p.add_argument("--transaction-ms", type=_positive, default=2000,
                   help="commit at least this often (default %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and the topics "
                   "the transform writes in a sample of each slice, mapped or not, and exit")
    p.add_argument("--overwrite", action="store_true", help="replace an existing Parquet sink")
    p.add_argument("--master", help="Spark master when not under spark-submit "
                   "(default local[*,4])")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting (repeatable)")
    p.add_argument("--progress-interval", type=float, default=10.0, metavar="SECONDS",
                   help="log progress this often; 0 disables (default %(default)s)")
    p.set_defaults(backfill_command=_run)


def _run(ns: argparse.Namespace) -> int:
    try:
        from service.backfill import job  # imports pyspark: only when a job runs
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in ("pyspark", "pyarrow", "pandas"):
            raise
        raise ConfigError(f"{exc.name} is not installed: pip install 'txstage[spark]'") from exc
    flags = config.Flags(
        source=parse_source(ns.source), sink=parse_sink(ns.sink), job_id=ns.job_id,
        transform=ns.transform, output_topic=ns.output_topic, dlq_topic=ns.dlq_topic,
        bootstrap_servers=ns.bootstrap_servers,
        transactional_id_prefix=ns.transactional_id_prefix, progress_topic=ns.progress_topic,
        slice_records=ns.slice_records, transaction_records=ns.transaction_records,
        transaction_bytes=ns.transaction_bytes,
        transaction_ms=ns.transaction_ms, dry_run=ns.dry_run, overwrite=ns.overwrite,
        master=ns.master, spark_conf=_pairs(ns.conf, "--conf"),
        progress_interval_s=ns.progress_interval, topic_map=parse_pairs(ns.topic_map),
        topic_suffix=ns.topic_suffix)
    return job.run(config.build(flags, environment()))


# -- verify ------------------------------------------------------------------------------


def _verify_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Compare two sets of outputs by lineage (txstage.src, txstage.idx): key, "
                     "value, topic and headers must match. A dead letter that txstage redrive "
                     "replaced (by its outputs, or by a later attempt) counts as what replaced "
                     "it; redrive's marks are not compared. Each kafka:// topic's parking "
                     "topic (<topic>.parked), if any, is read too; a parked letter compares "
                     "as if in its DLQ, and the report counts parked letters by topic.")
    p.add_argument("--expected", required=True,
                   help="kafka://<topic>[,<topic>...] or parquet:<path> (e.g. the stream's)")
    p.add_argument("--actual", required=True, help="the same forms (e.g. the backfill's)")
    p.add_argument("--rename", "--topic-map", dest="rename", action="append", default=[],
                   metavar="EXPECTED=ACTUAL",
                   help="an expected topic name that is another name on the actual side, as "
                   "the backfill's --topic-map (repeatable)")
    p.add_argument("--topic-suffix", metavar="SUFFIX", help="every expected kafka:// topic "
                   "not renamed is <topic><SUFFIX> on the actual side, as the backfill's")
    p.add_argument("--job-id", help="compare only outputs of that backfill job's input range")
    p.add_argument("--within", metavar="KAFKA_SOURCE", help="compare only outputs of inputs in "
                   "this range, e.g. kafka://orders?from=offsets:0=0&to=offsets:0=500")
    p.add_argument("--progress-topic", help="where the job's plan is "
                   "(default <prefix>.backfill.progress)")
    p.add_argument("--bootstrap-servers", help="default TXSTAGE_BOOTSTRAP_SERVERS")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (verdict, counts, examples) instead of "
                   "the report for a person")
    p.set_defaults(backfill_command=_verify)


def _verify(ns: argparse.Namespace) -> int:
    env = environment()
    bootstrap = ns.bootstrap_servers or env.get("TXSTAGE_BOOTSTRAP_SERVERS")
    if ns.job_id and ns.within:
        raise ConfigError("give --job-id or --within, not both")
    within = _job_range(ns, env, bootstrap) if ns.job_id else \
        _input_range(ns.within, env, bootstrap) if ns.within else None
    rename = _pairs(ns.rename, "--rename")
    if ns.topic_suffix:
        if not ns.expected.startswith("kafka://"):
            raise ConfigError("--topic-suffix needs --expected kafka://<topics>; "
                              "name each with --topic-map")
        for topic in ns.expected.removeprefix("kafka://").split(","):
            rename.setdefault(topic, topic + ns.topic_suffix)
    report = parity.compare(parity.read(ns.expected, bootstrap),
                            parity.read(ns.actual, bootstrap), rename=rename, within=within)
    print(json.dumps(report.as_dict()) if ns.json else "\n".join(report.lines()))
    return ExitCode.OK if report.ok else ExitCode.DIFFERENT


def _job_range(ns: argparse.Namespace, env: dict[str, str],
               bootstrap: str | None) -> Callable[[Lineage], bool]:
    from service.backfill import kafka_clients

    if not bootstrap:
        raise ConfigError("--job-id needs TXSTAGE_BOOTSTRAP_SERVERS or --bootstrap-servers")
    settings = config.reader_settings(env, bootstrap)
    topic = ns.progress_topic or config.default_progress_topic(config.id_prefix(None, env))
    state = kafka_clients.read_job(settings, topic, ns.job_id)
    if state.plan is None:
        raise ConfigError(f"job {ns.job_id} has no plan in {topic}")
    return parity.within_slices(state.plan.slices)


def _input_range(text: str, env: dict[str, str],
                 bootstrap: str | None) -> Callable[[Lineage], bool]:
    from service.backfill import kafka_clients, offsets

    source = parse_source(text)
    if not isinstance(source, KafkaSource):
        raise ConfigError(f"--within {text!r}: name a Kafka range, kafka://<topic>?from=&to=")
    if not bootstrap:
        raise ConfigError("--within needs TXSTAGE_BOOTSTRAP_SERVERS or --bootstrap-servers")
    ranges = offsets.resolve(kafka_clients.admin(config.reader_settings(env, bootstrap)), source)
    return parity.within_slices(plan.slice_ranges(ranges, 1 << 62))


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be positive")
    return value


def _pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"{flag} {item!r}: expected KEY=VALUE")
        found[name] = value
    return found
