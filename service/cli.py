"""The txstage command: run, check-config, audit, redrive, backfill, kafka, topics.

One argparse tree. ``run`` and ``check-config`` are defined here; every other command's
arguments are defined by its own module, ``add_arguments(parser)``, which also sets the
``handler`` that runs it. That module is imported only when its command is named:
``txstage run`` and ``txstage --help`` load neither PySpark nor the local broker.

Exit codes (service/exit_codes.py): 0 done (or stopped by a signal), 1 a fatal runtime
error, 2 bad settings or arguments, 3 a poison record and no dead-letter topic, 4 the
cluster could not be queried at start-up.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import faulthandler
import importlib
import logging
import os
import signal
import sys
from collections.abc import Iterable, Sequence
from types import FrameType
from typing import Any, NoReturn

import structlog
from prometheus_client import CollectorRegistry, disable_created_metrics

from service.arguments import Parser
from service.contract.loading import load_transform
from service.contract.records import Transform
from service.errors import ConfigError, PoisonRecordError, UnreachableError
from service.exit_codes import ExitCode
from service.formats.load import codec_module
from service.kafka.cluster import Cluster, OutputLimits
from service.kafka.config import admin_config, refused_configs
from service.observability import interpreter
from service.observability.group_lag import GroupLagWatch
from service.observability.health import Health, Server, listen, publish_readiness
from service.observability.logs import configure_logging
from service.observability.lso_watch import LsoWatch
from service.observability.metrics import Metrics
from service.preflight import Checked, check_cluster, session_timeout_s
from service.settings import Settings, load_settings
from service.stage.replica import Stage
from service.stage.transform_watch import timeout_ms as transform_timeout_ms
from service.stage.workers import WorkerPool
from service.version import __version__

log = structlog.get_logger("txstage")

# The commands defined in their own modules: name -> (module, its line in --help).
TOOLS = {
    "audit": ("service.tools.audit.cli", "check a running pipeline's exactly-once by lineage"),
    "redrive": ("service.tools.redrive.cli",
                "reprocess dead letters through the current transform"),
    "backfill": ("service.backfill.cli", "reprocess history on PySpark (see docs/backfill.md)"),
    "kafka": ("service.local_kafka.cli", "a local Kafka broker: install|up|down|status"),
    "registry": ("service.local_registry.cli",
                 "a local schema registry (Apicurio): install|up|down|status"),
    "topics": ("service.tools.topics", "the stage's topics by hand: create|produce|read"),
}

_CHECK_CONFIG = (
    "Check the settings (TXSTAGE_* variables and .env) as txstage run would, then the "
    "cluster: the topics exist, the principal holds the permissions the stage needs "
    "(READ on the inputs and the group, WRITE on the outputs and its transactional ids), "
    "the transaction time-out and the producer's message size fit the brokers'. Prints "
    "'txstage: configuration OK' and exits 0, or one line per problem and exits 2 (4 when "
    "the cluster cannot be queried).")


def main(argv: Sequence[str] | None = None) -> int:
    # A crash inside a C extension prints every thread's Python stack (a crash on one
    # of librdkafka's own threads cannot: they block signals, the kernel kills at once).
    with contextlib.suppress(ValueError, OSError):  # no real stderr (embedded, tests)
        faulthandler.enable(all_threads=True)
    args = parser().parse_args(argv)  # exits 2 on bad arguments, 0 after --help
    return int(args.handler(args))


def parser() -> argparse.ArgumentParser:
    """The whole tree: ``run``, ``check-config`` and each of ``TOOLS``."""
    p = argparse.ArgumentParser(prog="txstage", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"txstage {__version__}")
    commands = p.add_subparsers(dest="command", required=True, parser_class=_Command)
    commands.add_parser("run", help="run the stage (settings from TXSTAGE_* variables)"
                        ).set_defaults(handler=_stage_command)
    commands.add_parser("check-config", help="validate settings against the cluster, then exit",
                        description=_CHECK_CONFIG).set_defaults(handler=_stage_command)
    for name, (module, help_line) in TOOLS.items():
        commands.add_parser(name, help=help_line, module=module)
    return p


class _Command(Parser):
    """One command of the tree. With a ``module``, its arguments are that module's
    ``add_arguments(parser)``, added when the command is parsed (it was named), and an
    argument it does not know is its own error, with its own usage, as when it parsed
    alone. A module whose first argument may be left out (``txstage backfill [run]``)
    also has ``with_command(argv)``, which puts it in."""

    def __init__(self, *, module: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.module = module
        self.defined = False

    def parse_known_args(self, args: Iterable[str] | None = None,
                         namespace: Any = None) -> tuple[Any, list[str]]:
        if not self.module:
            return super().parse_known_args(args, namespace)
        tool = importlib.import_module(self.module)
        if not self.defined:
            tool.add_arguments(self)
            self.defined = True
        argv = list(sys.argv[1:] if args is None else args)
        if hasattr(tool, "with_command"):
            argv = tool.with_command(argv)
        parsed, extras = super().parse_known_args(argv, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def _stage_command(args: argparse.Namespace) -> int:
    """``run`` or ``check-config``: the settings, then the stage or its checks."""
    try:
        settings = load_settings()
        configure_logging(settings.log_format, settings.log_level)
        return _run(settings) if args.command == "run" else _check(settings)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"txstage: config error: {problem}", file=sys.stderr)
        return ExitCode.CONFIG
    except UnreachableError as exc:
        print(f"txstage: cluster unreachable: {exc}", file=sys.stderr)
        return ExitCode.UNREACHABLE


def _validated(settings: Settings, *, wait_s: float) -> tuple[Cluster, Checked]:
    refused = refused_configs(settings)
    if refused:
        raise ConfigError(*refused)
    load_transform(settings.transform)
    if settings.formatted:  # the formats' libraries only when a format is set
        codec_module()
        from service.formats.check import check_formats
        check_formats(settings)
    cluster = Cluster(admin_config(settings))
    return cluster, check_cluster(settings, cluster, wait_s=wait_s)


def _check(settings: Settings) -> int:
    _, checked = _validated(settings, wait_s=_CHECK_WAITS_S)
    for warning in checked.warnings:  # the settings work; something in them may not
        print(f"txstage: config warning: {warning}", file=sys.stderr)
    print("txstage: configuration OK")
    return ExitCode.OK


# How long start-up waits for a cluster that answers "not now" (a broker restarting)
# before exiting 4: a replica outlives a broker restart; an operator's check-config
# answers soon.
_RUN_WAITS_S = 120.0
_CHECK_WAITS_S = 10.0


def _run(settings: Settings) -> int:
    # The port first: a second replica on the host learns it at once, not after the
    # cluster checks (which may wait _RUN_WAITS_S).
    server = _listen(settings)
    try:
        cluster, checked = _validated(settings, wait_s=_RUN_WAITS_S)
        pool = _workers(settings)  # spawned before any Kafka client of ours exists
    except BaseException:
        server.close()
        raise
    for warning in checked.warnings:
        log.warning("startup.config_warning", warning=warning)
    interpreter.tune_threads()
    transform = load_transform(settings.transform)
    disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created: dashboard noise
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.describe_build(settings.guarantee, settings.group_id)
    metrics.transaction_timeout.set(settings.transaction_timeout_ms / 1000)
    health = Health(stale_after=settings.health_stale_after_s)
    publish_readiness(health, metrics)
    if settings.formatted:
        transform = _formatted(settings, transform, metrics, health)
    server.serve(registry, health)
    limits = OutputLimits(cluster, checked.producer_max_bytes, blocking=False)
    stage = Stage(settings, transform, metrics, health, limits,
                  session_timeout_s=session_timeout_s(settings, cluster), pool=pool)
    if settings.lso_check_interval_s:
        LsoWatch(admin_config(settings),
                 {"input": settings.input_topics,
                  "output": [settings.output_topic, *filter(None, [settings.dlq_topic])]},
                 metrics.lso_lag, metrics.lso_stuck,
                 interval_s=settings.lso_check_interval_s).start()
    if settings.group_lag_interval_s:
        GroupLagWatch(admin_config(settings), settings.group_id, settings.input_topics,
                      metrics.group_lag, interval_s=settings.group_lag_interval_s,
                      starts_at_end=settings.starts_at_end).start()
    _install_signal_handlers(stage)
    interpreter.tune_gc()
    log.info("metrics.serving", port=server.port, paths=["/metrics", "/healthz", "/readyz"])
    code = ExitCode.OK
    try:
        stage.run()
    except PoisonRecordError as exc:
        health.fatal(str(exc))
        log.error("stage.failed", reason="poison_record", topic=exc.topic,
                  partition=exc.partition, offset=exc.offset, error=str(exc))
        code = ExitCode.POISON
    except Exception as exc:
        health.fatal(str(exc))
        log.exception("stage.failed", error=_describe(exc))
        code = ExitCode.FATAL
    finally:
        server.close()
    _exit_now(stage, code)


def _workers(settings: Settings) -> WorkerPool | None:
    """TXSTAGE_WORKERS: the transform's worker processes, each with the transform
    imported (one that fails to import there exits 2, as here)."""
    if not settings.workers:
        return None
    pool = WorkerPool(settings.transform, settings.workers,
                      timeout_s=transform_timeout_ms(settings) / 1000,
                      max_record_attempts=settings.max_record_attempts)
    pool.start()
    return pool


def _listen(settings: Settings) -> Server:
    host, port = settings.metrics_host, settings.metrics_port
    try:
        return listen(port, host)
    except OSError as exc:
        taken = exc.errno == errno.EADDRINUSE
        hint = ("another process holds it (a second replica on this host?): give each "
                "replica on a host its own TXSTAGE_METRICS_PORT, or 0 for any free port"
                if taken else
                "check TXSTAGE_METRICS_HOST and TXSTAGE_METRICS_PORT")
        raise ConfigError(f"TXSTAGE_METRICS_PORT={port}: cannot serve /metrics on "
                          f"{host}:{port}: {exc.strerror or exc}; {hint}") from exc


def _formatted(settings: Settings, transform: Transform, metrics: Metrics,
               health: Health) -> Transform:
    """The transform on decoded keys and values; the registry's state told to the
    readiness and ``txstage_schema_registry_up``."""
    codec = codec_module()
    codecs = codec.build(settings, settings.transform)

    def registry_state(up: bool) -> None:
        metrics.schema_registry_up.set(1 if up else 0)
        health.waiting_for(None if up else "schema registry")
        error = None if up or codecs.registry is None else str(codecs.registry.last_error)
        log.warning("schema_registry.up" if up else "schema_registry.unavailable",
                    url=settings.registry_url, error=error)

    if codecs.registry is not None:
        codecs.registry.on_state = registry_state
    wrapped: Transform = codec.with_formats(transform, codecs, settings.output_topic)
    return wrapped


def _exit_now(stage: Stage, code: ExitCode) -> NoReturn:
    """Leave the process at once: everything that could be committed or closed was.

    A Kafka call still stuck in a job thread must not hold the exit (the interpreter
    would join that thread), and librdkafka's own threads (the admin client's, a
    stuck producer's) must not meet a finalizing interpreter, or the replica can exit
    with SIGSEGV after ``stage.stopped`` (docs/operations.md, "Crashes")."""
    if stage.loop.jobs.busy:
        log.warning("stage.exit_with_work_running", exit_code=int(code))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _describe(exc: BaseException) -> str:
    """The message and its notes (which coordinates, which output failed)."""
    return "; ".join([str(exc), *getattr(exc, "__notes__", ())])


def _install_signal_handlers(stage: Stage) -> None:
    """First SIGTERM/SIGINT: finish cleanly. Second: leave at once (the next
    owner's init_transactions aborts whatever this replica left open)."""
    def handle(signum: int, frame: FrameType | None) -> None:
        if stage.stopping:
            os._exit(128 + signum)
        log.info("stage.signal", signal=signal.Signals(signum).name)
        stage.stop()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    # SIGUSR1: every thread's stack to stderr now (even if the loop is stuck), and
    # each partition's state as one log line at the loop's next housekeeping.
    def describe(signum: int, frame: FrameType | None) -> None:
        stage.loop.housekeeper.describe_requested = True

    signal.signal(signal.SIGUSR1, describe)
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=True)  # runs first
