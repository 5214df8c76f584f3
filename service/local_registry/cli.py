"""``txstage registry install|up|down|status``: one detached registry on 127.0.0.1:8081.

Its Confluent-compatible API is ``http://127.0.0.1:8081/apis/ccompat/v7`` (what
``TXSTAGE_REGISTRY_URL`` names); data (H2) and log in ``<cache>/local-registry/``, kept
across ``down``/``up``; its own session, so it outlives this command. Also
``python -m service.local_registry``.

Exit codes (service/exit_codes.py): 0 done (``up`` also when it was up already; ``down``
also when nothing ran), 1 it could not be installed or started (no Java 21+, a port
taken), 2 bad arguments, 3 ``status``: not running.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from service.exit_codes import ExitCode
from service.local_kafka.cache import cache_root
from service.local_kafka.cli import handle
from service.local_kafka.node import port_open
from service.local_registry.install import REGISTRY_VERSION, find_java, install
from service.local_registry.process import CCOMPAT_PATH, Registry, ready

LOCAL_REGISTRY_PORT = 8081
LOCAL_MANAGEMENT_PORT = 8091


def local_registry_dir() -> Path:
    return cache_root() / "local-registry"


def _local_pids() -> list[int]:
    """Live JVMs started by ``up``, found by their command line (its H2 file)."""
    needle = f"jdbc:h2:file:{local_registry_dir() / 'registry-db'}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline and b"quarkus-run.jar" in cmdline:
            pids.append(int(entry.name))
    return sorted(pids)


def _local(args: argparse.Namespace) -> Registry:
    return Registry(local_registry_dir(), args.port, args.management_port, detached=True)


def _cmd_install(_: argparse.Namespace) -> int:
    began = time.monotonic()
    home = install(quiet=True)
    java = find_java()
    print(f"Apicurio Registry {REGISTRY_VERSION}: {home} ({time.monotonic() - began:.1f} s); "
          f"runs on {java}")
    return ExitCode.OK


def _cmd_up(args: argparse.Namespace) -> int:
    registry = _local(args)
    pids = _local_pids()
    if pids:
        registry.wait_ready(args.timeout)
        print(f"Apicurio Registry {REGISTRY_VERSION} already up (pid {pids[0]})")
    else:
        for port in (args.port, args.management_port):
            if port_open(port):
                print(f"127.0.0.1:{port} is taken by another process; not starting",
                      file=sys.stderr)
                return ExitCode.FAILED
        registry.start(args.timeout)
        assert registry.proc is not None
        print(f"Apicurio Registry {REGISTRY_VERSION} up in {registry.startup_seconds:.1f} s "
              f"(pid {registry.proc.pid})")
    print(f"url: {registry.url}")
    print(f"log: {registry.log}")
    return ExitCode.OK


def _cmd_down(args: argparse.Namespace) -> int:
    pids = _local_pids()
    if not pids:
        print("local registry is not running")
        return ExitCode.OK
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.grace
    while set(pids) & set(_local_pids()) and time.monotonic() < deadline:
        time.sleep(0.1)
    forced = sorted(set(pids) & set(_local_pids()))
    for pid in forced:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    how = f"killed after {args.grace:.0f} s" if forced else "stopped"
    print(f"local registry {how} (pid {', '.join(map(str, pids))})")
    return ExitCode.OK


def _cmd_status(args: argparse.Namespace) -> int:
    registry = _local(args)
    pids = _local_pids()
    if not pids:
        print("local registry is not running")
        return ExitCode.NOT_RUNNING
    state = "ready" if ready(registry.ready_url) else "not ready"
    print(f"local registry {REGISTRY_VERSION} running (pid {pids[0]}), {state}")
    print(f"url: {registry.url}")
    return ExitCode.OK


def _cmd_register(args: argparse.Namespace) -> int:
    """Register a schema file under a subject (idempotent: the same schema keeps its id)."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    client = SchemaRegistryClient({"url": args.url, "timeout": 10})
    text = Path(args.schema_file).read_text()
    schema_id = client.register_schema(args.subject, Schema(text, args.type))
    print(f"{args.subject}: schema id {schema_id}")
    return ExitCode.OK


def main(argv: Sequence[str] | None = None, *, prog: str = "txstage registry") -> int:
    parser = argparse.ArgumentParser(prog=prog)
    add_arguments(parser)
    return handle(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (f"A local Apicurio Registry {REGISTRY_VERSION} (Confluent-compatible "
                          "API) for txstage development.")
    sub = parser.add_subparsers(dest="command", required=True)
    # ``kafka_command``: the local broker's ``handle`` runs it (a RegistryError is one of
    # its LocalKafkaErrors: one line, exit 1).
    sub.add_parser("install", help="resolve the registry into the cache, find Java 21+"
                   ).set_defaults(kafka_command=_cmd_install)
    for name, helptext, command in (
        ("up", "start one detached registry on 127.0.0.1:8081 (idempotent)", _cmd_up),
        ("status", "say whether it runs and is ready (exit 3 if not running)", _cmd_status),
    ):
        cmd = sub.add_parser(name, help=helptext)
        cmd.add_argument("--port", type=int, default=LOCAL_REGISTRY_PORT)
        cmd.add_argument("--management-port", type=int, default=LOCAL_MANAGEMENT_PORT)
        cmd.add_argument("--timeout", type=float, default=120.0)
        cmd.set_defaults(kafka_command=command)
    register = sub.add_parser("register", help="register a schema file under a subject")
    register.add_argument("subject")
    register.add_argument("schema_file")
    register.add_argument("--type", choices=("AVRO", "JSON", "PROTOBUF"), default="AVRO")
    register.add_argument("--url", default=f"http://127.0.0.1:{LOCAL_REGISTRY_PORT}"
                          f"{CCOMPAT_PATH}", help="the registry (default: the local one)")
    register.set_defaults(kafka_command=_cmd_register)
    down = sub.add_parser("down", help="stop the local registry (SIGTERM, then SIGKILL)")
    down.add_argument("--grace", type=float, default=30.0)
    down.set_defaults(kafka_command=_cmd_down)
    parser.set_defaults(handler=handle)
