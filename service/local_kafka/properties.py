"""``server.properties`` of a node, and the ids Kafka wants when formatting storage."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping
from pathlib import Path

HOST = "127.0.0.1"


def kafka_uuid() -> str:
    """A random Kafka ``Uuid`` string (cluster and directory ids): url-safe base64, 22 chars."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):  # would read as a CLI flag; Kafka avoids them too
            return text


def broker_properties(
    *,
    node_id: int,
    broker_port: int,
    controller_port: int,
    controller_ports: Mapping[int, int],
    log_dir: Path,
    overrides: Mapping[str, str | int] | None = None,
    direct_port: int | None = None,
    advertised_port: int | None = None,
    secure_port: int | None = None,
    secure: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """``server.properties`` of one combined broker+controller node.

    ``controller_ports`` maps every node id of the cluster to its controller port. One node
    forms a dynamic quorum (formatted ``--standalone``), several nodes one formatted with
    ``--initial-controllers``; both are found through ``controller.quorum.bootstrap.servers``.

    Behind a proxy: ``advertised_port`` is what the ``PLAINTEXT`` listener (bound at
    ``broker_port``) tells clients to connect to, and ``direct_port`` adds a ``DIRECT``
    listener advertised as itself, which brokers also use among themselves.
    """
    replicas = len(controller_ports)
    min_isr = 1 if replicas == 1 else 2
    quorum = ",".join(f"{HOST}:{port}" for _, port in sorted(controller_ports.items()))
    listeners = [f"PLAINTEXT://{HOST}:{broker_port}"]
    advertised = [f"PLAINTEXT://{HOST}:{advertised_port or broker_port}"]
    if direct_port is not None:
        listeners.append(f"DIRECT://{HOST}:{direct_port}")
        advertised.append(f"DIRECT://{HOST}:{direct_port}")
    direct = direct_port is not None
    protocols = "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT" + (",DIRECT:PLAINTEXT" if direct else "")
    if secure_port is not None:
        listeners.append(f"SASL_SSL://{HOST}:{secure_port}")
        advertised.append(f"SASL_SSL://{HOST}:{secure_port}")
        protocols += ",SASL_SSL:SASL_SSL"
    props: dict[str, str | int] = {
        "process.roles": "broker,controller",
        "node.id": node_id,
        "listeners": ",".join([*listeners, f"CONTROLLER://{HOST}:{controller_port}"]),
        "advertised.listeners": ",".join(advertised),
        "listener.security.protocol.map": protocols,
        "inter.broker.listener.name": "DIRECT" if direct else "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "controller.quorum.bootstrap.servers": quorum,
        "log.dirs": str(log_dir),
        # Topics exist only when a test creates them.
        "auto.create.topics.enable": "false",
        "num.partitions": 1,
        "default.replication.factor": replicas,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": replicas,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
        # Tests use short sessions (zombies) and must not wait for timed-out transactions.
        "group.initial.rebalance.delay.ms": 0,
        "group.min.session.timeout.ms": 1000,
        "group.consumer.min.session.timeout.ms": 1000,
        "group.consumer.min.heartbeat.interval.ms": 500,
        # The next-generation group protocol (KIP-848, group.protocol=consumer) takes the
        # session timeout and heartbeat interval from the broker, not from the client (which
        # may not set them). The defaults (45 s / 5 s) would make a killed member's partitions
        # move 45 s later; 6 s / 0.5 s fail over as fast as the classic protocol does with
        # the 6 s session the tests give their clients.
        "group.consumer.session.timeout.ms": 6000,
        "group.consumer.heartbeat.interval.ms": 500,
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": 1000,
        # Sized for a small box: 128 MB of dedupe buffer per broker is most of a 512 MB heap.
        "log.cleaner.dedupe.buffer.size": 16 * 1024 * 1024,
        "num.network.threads": 2,
        "num.io.threads": 4,
        "background.threads": 4,
        "num.recovery.threads.per.data.dir": 1,
        # A killed node is fenced (its leaderships move) after 3 s instead of 9 s, and may
        # register again after a SIGKILL+restart that soon (DUPLICATE_BROKER_REGISTRATION
        # until the old session expires, even on a single node).
        "broker.heartbeat.interval.ms": 500,
        "broker.session.timeout.ms": 3000,
    }
    props.update(secure or {})
    props.update(overrides or {})
    return {key: str(value) for key, value in props.items()}


def write_properties(path: Path, props: Mapping[str, str]) -> None:
    path.write_text("".join(f"{key}={value}\n" for key, value in props.items()))
