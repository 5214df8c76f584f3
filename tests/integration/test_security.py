"""The stage on a secured broker: SASL/SCRAM-SHA-512 over TLS, the StandardAuthorizer,
and a principal holding exactly the ACLs of service/tools/acls.py (docs/security.md).

One secured broker for the module (``secured_kafka``); each test gets a user, topics and a
group of its own. The harness creates topics, feeds input and verifies output through the
broker's plaintext super-user listener; the stage only ever sees the SASL_SSL one.

Takes ≈ 58 s (2 cores; make test, 2026-11-28).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._acl import AclBinding, AclBindingFilter

from service.backfill.config import default_progress_topic
from service.examples.square import square
from service.kafka.reading import read_topics
from service.local_kafka.cluster import KafkaCluster
from service.local_kafka.security import upsert_scram_user
from service.tools.acls import Grant, audit_grants, backfill_grants, stage_grants
from service.tools.verify import compare, expected_outputs
from tests.harness.admin import create_topic
from tests.harness.spark import Backfill, spark_fixture  # noqa: F401  (fixture)
from tests.harness.stage import (
    StageSetup,
    build_stage,
    produce_inputs,
    stage_tree,
    tear_down,
    wait_for,
)

RECORDS = 200


@dataclass
class SecuredStage:
    """A stage whose replicas authenticate as ``user`` and hold ``grants``."""

    setup: StageSetup
    cluster: KafkaCluster
    user: str
    password: str
    grants: list[Grant]
    _admin: AdminClient | None = None

    @property
    def principal(self) -> str:
        return f"User:{self.user}"

    def admin(self) -> AdminClient:
        """The super user, over SASL_SSL (what docs/security.md tells an operator to use).
        One client: a future outlives a client only while the client lives."""
        assert self.cluster.secured is not None
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.cluster.secure_bootstrap,
                                       **self.cluster.secured.admin_config()})
        return self._admin

    def bindings(self, grants: list[Grant]) -> list[AclBinding]:
        return [grant.binding(self.principal) for grant in grants]

    def grant(self, grants: list[Grant]) -> None:
        for future in self.admin().create_acls(self.bindings(grants)).values():
            future.result(30)

    def revoke(self, grant: Grant) -> None:
        [b] = self.bindings([grant])
        matching = AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal,
                                    b.host, b.operation, b.permission_type)
        for future in self.admin().delete_acls([matching]).values():
            assert len(future.result(30)) == 1, f"{grant} was not granted"

    def produce(self, start: int, count: int) -> None:
        produce_inputs(self.setup.bootstrap, self.setup.input_topic, range(start, start + count),
                       8)

    def command(self, name: str, **overrides: str) -> subprocess.CompletedProcess[str]:
        """``txstage <name>`` with the stage's settings, to its end."""
        env = {**os.environ, **self.setup.env, **overrides}
        return subprocess.run([sys.executable, "-m", "service", name], cwd=stage_tree(),
                              env=env, capture_output=True, text=True, timeout=150,
                              check=False)


@pytest.fixture
def secured_stage(secured_kafka: KafkaCluster, unique_name: Callable[[str], str],
                  tmp_path: Path) -> Iterator[SecuredStage]:
    """Topics and a group (made through the harness listener), a SCRAM user of the
    stage's own, exactly the documented ACLs, and settings that reach the broker only
    through SASL_SSL."""
    assert secured_kafka.secured is not None
    setup = build_stage(secured_kafka.bootstrap, unique_name, tmp_path)
    user, password = unique_name("stage"), secrets.token_urlsafe(24)
    grants = stage_grants(input_topics=[setup.input_topic], group_id=setup.group_id,
                          output_topic=setup.output_topic, dlq_topic=setup.dlq_topic)
    secured = SecuredStage(setup, secured_kafka, user, password, grants)
    upsert_scram_user(secured.admin(), user, password)
    secured.grant(grants)
    setup.env |= {
        "TXSTAGE_BOOTSTRAP_SERVERS": secured_kafka.secure_bootstrap,
        "TXSTAGE_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
        "TXSTAGE_KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
        "TXSTAGE_KAFKA__SASL_USERNAME": user,
        "TXSTAGE_KAFKA__SASL_PASSWORD": password,
        "TXSTAGE_KAFKA__SSL_CA_LOCATION": secured_kafka.secured.ca_location,
    }
    yield secured
    tear_down(setup)


def test_stage_is_exactly_once_over_sasl_ssl_with_only_the_documented_acls(
        secured_stage: SecuredStage) -> None:
    secured_stage.produce(0, RECORDS)
    replica = secured_stage.setup.replica("a")
    secured_stage.setup.wait_committed(90)
    assert replica.terminate() == 0
    secured_stage.setup.assert_exactly_once()


# Each documented ACL, and the line check-config answers when only that one is missing.
_GRANTS = ["input READ", "group READ", "output WRITE", "dlq WRITE", "transactional WRITE"]


def _expected_line(grant: Grant) -> str:
    if grant.resource == "transactional-id":
        return f"missing permission: WRITE on transactional id prefix `{grant.name}`"
    return f"missing permission: {grant.operation} on {grant.resource} `{grant.name}`"


@pytest.mark.parametrize("missing", range(len(_GRANTS)), ids=_GRANTS)
def test_check_config_names_the_one_missing_permission_and_exits_2(
        secured_stage: SecuredStage, missing: int) -> None:
    grant = secured_stage.grants[missing]
    secured_stage.revoke(grant)
    result = secured_stage.command("check-config")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(lines) == 1 and lines[0].startswith(
        f"txstage: config error: {_expected_line(grant)}"), result.stderr


def test_run_exits_2_naming_a_missing_transactional_id_permission(
        secured_stage: SecuredStage) -> None:
    grant = secured_stage.grants[_GRANTS.index("transactional WRITE")]
    secured_stage.revoke(grant)
    result = secured_stage.command("run")
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr
    assert f"txstage: config error: {_expected_line(grant)}" in result.stderr


# What the replica's stage.failed line says when one ACL goes while it runs (the DLQ's
# WRITE is left out: only a poison record would use it).
_WHILE_RUNNING = {
    "input READ": "permission denied: READ on input topic `{input}`",
    "group READ": "permission denied: READ on the consumer group",
    "output WRITE": "permission denied: WRITE on an output or dead-letter topic",
    "transactional WRITE": "permission denied: WRITE on transactional id prefix `{group}.`",
}


@pytest.mark.parametrize("removed", list(_WHILE_RUNNING))
def test_acl_removed_while_running_fails_the_replica_naming_it(
        secured_stage: SecuredStage, removed: str) -> None:
    setup = secured_stage.setup
    secured_stage.produce(0, 50)
    replica = setup.replica("a")
    setup.wait_committed(90)
    secured_stage.revoke(secured_stage.grants[_GRANTS.index(removed)])
    secured_stage.produce(50, 50)
    wait_for(lambda: not replica.alive(), 60, "the replica to fail", setup.diagnose)
    assert replica.proc is not None and replica.proc.returncode == 1, setup.logs()
    [failed] = replica.events("stage.failed")
    expected = _WHILE_RUNNING[removed].format(input=setup.input_topic, group=setup.group_id)
    assert str(failed["error"]).startswith(expected), failed["error"]


def test_wrong_password_exits_2_at_once_saying_authentication_failed(
        secured_stage: SecuredStage) -> None:
    for command in ("check-config", "run"):
        started = time.monotonic()
        result = secured_stage.command(command, TXSTAGE_KAFKA__SASL_PASSWORD="not-it")
        took = time.monotonic() - started
        assert result.returncode == 2, result.stdout[-3000:] + result.stderr
        assert "authentication failed" in result.stderr, result.stderr
        assert took < 15, f"{command} took {took:.1f} s"


def test_password_appears_nowhere_the_stage_writes_even_at_debug(
        secured_stage: SecuredStage) -> None:
    setup = secured_stage.setup
    debug = {"TXSTAGE_LOG_LEVEL": "DEBUG", "TXSTAGE_KAFKA__DEBUG": "security,broker,conf"}
    checked = secured_stage.command("check-config", **debug)
    assert checked.returncode == 0, checked.stderr
    secured_stage.produce(0, 50)
    replica = setup.replica("a", **debug)
    setup.wait_committed(90)
    answers = [replica.get(path)[1] for path in ("/metrics", "/healthz", "/readyz")]
    assert replica.terminate() == 0
    emitted = {"check-config": checked.stdout + checked.stderr,
               "log": replica.log_path.read_text(errors="replace"),
               **dict(zip(("/metrics", "/healthz", "/readyz"), answers, strict=True))}
    assert "sasl" in emitted["log"].lower(), "no librdkafka security debug was forwarded"
    leaks = [where for where, text in emitted.items() if secured_stage.password in text]
    assert not leaks, f"the SASL password appears in {leaks}"


def test_the_audit_runs_with_only_its_read_only_acls_and_names_each_missing_one(
        secured_stage: SecuredStage, unique_name: Callable[[str], str]) -> None:
    setup = secured_stage.setup
    secured_stage.produce(0, RECORDS)
    replica = setup.replica("a")
    setup.wait_committed(90)
    assert replica.terminate() == 0
    user, password = unique_name("audit"), secrets.token_urlsafe(24)
    upsert_scram_user(secured_stage.admin(), user, password)
    grants = audit_grants(input_topics=[setup.input_topic], group_id=setup.group_id,
                          output_topics=[setup.output_topic, setup.dlq_topic])
    auditor = SecuredStage(setup, secured_stage.cluster, user, password, grants)
    auditor.grant(grants)
    env = {**os.environ, **setup.env, "TXSTAGE_KAFKA__SASL_USERNAME": user,
           "TXSTAGE_KAFKA__SASL_PASSWORD": password}

    def audit() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "service", "audit", "--stuck-after", "1",
                               "--timeout", "30"], cwd=stage_tree(), env=env,
                              capture_output=True, text=True, timeout=120, check=False)

    clean = audit()
    assert clean.returncode == 0 and "exactly-once: CLEAN" in clean.stdout, \
        clean.stdout + clean.stderr
    for grant in grants:
        auditor.revoke(grant)
        try:
            denied = audit()
        finally:
            auditor.grant([grant])
        assert denied.returncode == 2, (str(grant), denied.stdout + denied.stderr)
        # (librdkafka may add a log line of its own to stderr)
        assert f"txstage audit: missing permission: {grant}" in denied.stderr.splitlines(), \
            (str(grant), denied.stderr)


_SECURITY_SETTINGS = ("TXSTAGE_BOOTSTRAP_SERVERS", "TXSTAGE_KAFKA__SECURITY_PROTOCOL",
                      "TXSTAGE_KAFKA__SASL_MECHANISM", "TXSTAGE_KAFKA__SASL_USERNAME",
                      "TXSTAGE_KAFKA__SASL_PASSWORD", "TXSTAGE_KAFKA__SSL_CA_LOCATION")


def test_backfill_is_exactly_once_over_sasl_ssl_with_only_its_documented_acls(
        secured_stage: SecuredStage, spark: object, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    setup, harness = secured_stage.setup, secured_stage.setup.bootstrap
    secured_stage.produce(0, RECORDS)
    prefix = unique_name("bf")
    out = create_topic(harness, unique_name("bf-out"), partitions=4)
    dlq = create_topic(harness, unique_name("bf-dlq"), partitions=1)
    secured_stage.grant(backfill_grants(
        input_topics=[setup.input_topic], output_topic=out, dlq_topic=dlq,
        transactional_id_prefix=prefix, progress_topic=default_progress_topic(prefix)))
    monkeypatch.chdir(tmp_path)
    for name in _SECURITY_SETTINGS:
        monkeypatch.setenv(name, setup.env[name])
    monkeypatch.setenv("TXSTAGE_TRANSFORM", "service.examples.square:square")
    monkeypatch.setenv("TXSTAGE_TRANSACTIONAL_ID_PREFIX", prefix)
    for name in ("TXSTAGE_OUTPUT_TOPIC", "TXSTAGE_DLQ_TOPIC", "TXSTAGE_GROUP_ID"):
        monkeypatch.delenv(name, raising=False)
    backfill = Backfill(secured_stage.cluster.secure_bootstrap, capsys)

    code, printed, err = backfill("--source", f"kafka://{setup.input_topic}",
                                  "--sink", f"kafka://{out}", "--dlq-topic", dlq)

    assert code == 0, printed + err
    inputs = read_topics(harness, [setup.input_topic])
    report = compare(read_topics(harness, [out, dlq]),
                     expected_outputs(inputs, square, default_topic=out, dlq_topic=dlq))
    assert report.ok, report.problems()
    assert report.expected == report.found == RECORDS


def test_topics_create_without_the_create_permission_exits_2_naming_it(
        secured_stage: SecuredStage, unique_name: Callable[[str], str]) -> None:
    # The stage's documented ACLs hold no CREATE: `txstage topics create` with them, for
    # topics that do not exist yet, must say which permission is missing, not fail later.
    wanted = {"TXSTAGE_INPUT_TOPICS": unique_name("new-in"),
              "TXSTAGE_OUTPUT_TOPIC": unique_name("new-out"),
              "TXSTAGE_DLQ_TOPIC": unique_name("new-dlq")}
    env = {**os.environ, **secured_stage.setup.env, **wanted}
    result = subprocess.run([sys.executable, "-m", "service", "topics", "create"],
                            cwd=stage_tree(), env=env, capture_output=True, text=True,
                            timeout=150, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"CREATE on topic `{wanted['TXSTAGE_INPUT_TOPICS']}`" in result.stderr, result.stderr
    listed = secured_stage.admin().list_topics(timeout=30).topics
    assert not set(wanted.values()) & set(listed), "nothing may have been created"
