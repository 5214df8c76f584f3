"""The local schema registry (Apicurio, run by service/local_registry) is a real one: it
registers and serves schemas through the Confluent-compatible API confluent-kafka's client
speaks, refuses an incompatible schema under BACKWARD, and keeps schemas and ids across a
SIGKILL and restart. ``txstage registry up|status|down`` run a detached one.

Takes ≈ 11 s (the session registry's start, one kill and restart, a detached one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from service.local_kafka.node import free_ports
from service.local_registry.install import install, install_dir
from service.local_registry.process import Registry

_RECORD = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}


def test_registry_serves_schemas_and_survives_a_kill(schema_registry: Registry) -> None:
    client = SchemaRegistryClient({"url": schema_registry.url, "timeout": 10})
    subject = "local-registry-test-value"
    schema_id = client.register_schema(subject, Schema(json.dumps(_RECORD), "AVRO"))
    client.set_compatibility(subject, "BACKWARD")
    incompatible = {"type": "record", "name": "R", "fields": [{"name": "b", "type": "string"}]}
    assert not client.test_compatibility(subject, Schema(json.dumps(incompatible), "AVRO"))
    schema_registry.kill()
    assert not schema_registry.alive()
    schema_registry.start()
    again = SchemaRegistryClient({"url": schema_registry.url, "timeout": 10})
    assert json.loads(again.get_schema(schema_id).schema_str) == _RECORD


def test_registry_command_up_status_down(tmp_path: Path) -> None:
    # A cache of its own (data, pid, log) that links the installed registry, not a copy.
    (tmp_path / install_dir().name).symlink_to(install())
    port, management = free_ports(2)
    ports = ["--port", str(port), "--management-port", str(management)]

    def registry(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "service", "registry", *args],
                              capture_output=True, text=True, timeout=180, check=False,
                              env={**os.environ, "TXSTAGE_CACHE_DIR": str(tmp_path)})

    try:
        up = registry("up", *ports)
        assert up.returncode == 0, up.stderr
        assert f"url: http://127.0.0.1:{port}/apis/ccompat/v7" in up.stdout
        status = registry("status", *ports)
        assert status.returncode == 0 and ", ready" in status.stdout
    finally:
        down = registry("down")
    assert down.returncode == 0 and "stopped" in down.stdout, down.stdout
    assert registry("status", *ports).returncode == 3
