"""``txstage kafka install|up|down|status``: one detached broker on 127.0.0.1:9092.

The broker behind ``make kafka-up`` and ``make demo``: data, config, log and pid file in
``<cache>/local-broker/`` (kept across ``down``/``up``), its own session, so it outlives
this command. Also ``python -m service.local_kafka``.

Exit codes (service/exit_codes.py): 0 done (``up`` also when it was up already; ``down``
also when nothing ran), 1 it could not be installed or started (or a port is taken),
2 bad arguments, 3 ``status``: not running.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from confluent_kafka import KafkaException

from service.exit_codes import ExitCode
from service.local_kafka.cache import cache_root
from service.local_kafka.errors import KafkaStartError, LocalKafkaError
from service.local_kafka.jars import KAFKA_VERSION, install
from service.local_kafka.node import Node, port_open, tail_file, wait_for_start
from service.local_kafka.properties import broker_properties, kafka_uuid, write_properties
from service.local_kafka.readiness import listed_brokers, wait_ready

LOCAL_BROKER_PORT = 9092
LOCAL_CONTROLLER_PORT = 9093
_PROBE_ID = "txstage-local-probe"


def local_broker_dir() -> Path:
    return cache_root() / "local-broker"


def _local_node(port: int, controller_port: int) -> Node:
    return Node(0, port, controller_port, local_broker_dir(), detached=True)


def _pid_file() -> Path:
    return local_broker_dir() / "broker.pid"


def _local_pids() -> list[int]:
    """Live JVMs started by ``up`` (found by command line, so a lost pid file is no excuse)."""
    needle = str(local_broker_dir() / "server.properties").encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"kafka.Kafka" in cmdline and needle in cmdline.split(b"\0"):
            pids.append(int(entry.name))
    return sorted(pids)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie has exited: only its exit status is left.
    with contextlib.suppress(OSError):
        if (Path("/proc") / str(pid) / "stat").read_text().split()[2] == "Z":
            return False
    return True


def _cmd_install(_: argparse.Namespace) -> int:
    began = time.monotonic()
    libs = install(quiet=True)
    print(f"Kafka {KAFKA_VERSION}: {libs} ({time.monotonic() - began:.1f} s)")
    return ExitCode.OK


def _cmd_up(args: argparse.Namespace) -> int:
    node = _local_node(args.port, args.controller_port)
    pids = _local_pids()
    if pids:
        try:
            wait_ready(node.bootstrap, broker_ids={0}, timeout=args.timeout, probe_id=_PROBE_ID)
        except (TimeoutError, KafkaException) as exc:
            print(f"local Kafka (pid {pids[0]}) is running but not ready: {exc}", file=sys.stderr)
            print(tail_file(node.log, 40), file=sys.stderr)
            return ExitCode.FAILED
        print(f"Kafka {KAFKA_VERSION} already up (pid {pids[0]})")
        _print_location(node)
        return ExitCode.OK
    for port in (args.port, args.controller_port):
        if port_open(port):
            print(f"127.0.0.1:{port} is taken by another process; not starting", file=sys.stderr)
            return ExitCode.FAILED
    libs = install()
    node.directory.mkdir(parents=True, exist_ok=True)
    write_properties(
        node.config,
        broker_properties(
            node_id=0,
            broker_port=args.port,
            controller_port=args.controller_port,
            controller_ports={0: args.controller_port},
            log_dir=node.data,
        ),
    )
    if not (node.data / "meta.properties").exists():
        node.format(libs, kafka_uuid(), ["--standalone"])
    began = time.monotonic()
    offset = node.start(libs)
    assert node.proc is not None
    _pid_file().write_text(f"{node.proc.pid}\n")
    try:
        wait_for_start({0: (node, offset)}, time.monotonic() + args.timeout)
        wait_ready(node.bootstrap, broker_ids={0}, timeout=args.timeout, probe_id=_PROBE_ID)
    except (KafkaStartError, TimeoutError, KafkaException) as exc:
        node.kill()
        _pid_file().unlink(missing_ok=True)
        print(f"local Kafka did not start: {exc}", file=sys.stderr)
        print(tail_file(node.log, 40), file=sys.stderr)
        return ExitCode.FAILED
    print(f"Kafka {KAFKA_VERSION} up in {time.monotonic() - began:.1f} s (pid {node.proc.pid})")
    _print_location(node)
    return ExitCode.OK


def _print_location(node: Node) -> None:
    print(f"bootstrap: {node.bootstrap}")
    print(f"log:       {node.log}")


def _cmd_down(args: argparse.Namespace) -> int:
    pids = _local_pids()
    if not pids:
        _pid_file().unlink(missing_ok=True)
        print("local Kafka is not running")
        return ExitCode.OK
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.grace
    while any(_pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    forced = [pid for pid in pids if _pid_alive(pid)]
    for pid in forced:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    while any(_pid_alive(pid) for pid in forced):
        time.sleep(0.05)
    _pid_file().unlink(missing_ok=True)
    how = f"killed after {args.grace:.0f} s" if forced else "stopped"
    print(f"local Kafka {how} (pid {', '.join(map(str, pids))})")
    return ExitCode.OK


def _cmd_status(args: argparse.Namespace) -> int:
    node = _local_node(args.port, args.controller_port)
    pids = _local_pids()
    if not pids:
        print("local Kafka is not running")
        return ExitCode.NOT_RUNNING
    try:
        ids = listed_brokers(node.bootstrap, 5.0)
        state = f"answering (brokers {sorted(ids)})"
    except KafkaException as exc:
        state = f"not answering: {exc}"
    print(f"local Kafka {KAFKA_VERSION} running (pid {pids[0]}), {state}")
    _print_location(node)
    return ExitCode.OK


def main(argv: Sequence[str] | None = None, *, prog: str = "txstage kafka") -> int:
    """This command alone: ``python -m service.local_kafka``, the demo."""
    parser = argparse.ArgumentParser(prog=prog)
    add_arguments(parser)
    return handle(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = f"Local Apache Kafka {KAFKA_VERSION} (KRaft) for txstage development."
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help="resolve the broker jars into the cache"
                   ).set_defaults(kafka_command=_cmd_install)
    for name, helptext, command in (
        ("up", "start one detached node on 127.0.0.1:9092 (idempotent)", _cmd_up),
        ("status", "say whether the local node runs and answers (exit 3 if not running)",
         _cmd_status),
    ):
        cmd = sub.add_parser(name, help=helptext)
        cmd.add_argument("--port", type=int, default=LOCAL_BROKER_PORT)
        cmd.add_argument("--controller-port", type=int, default=LOCAL_CONTROLLER_PORT)
        cmd.add_argument("--timeout", type=float, default=90.0)
        cmd.set_defaults(kafka_command=command)
    down = sub.add_parser("down", help="stop the local node (SIGTERM, then SIGKILL)")
    down.add_argument("--grace", type=float, default=30.0)
    down.set_defaults(kafka_command=_cmd_down)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    command: Callable[[argparse.Namespace], int] = args.kafka_command
    try:
        return command(args)
    except LocalKafkaError as exc:
        print(str(exc), file=sys.stderr)
        return ExitCode.FAILED
