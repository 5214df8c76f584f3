"""docker-compose.yml checked by a real compose implementation (docker-compose 1.29) and
brought up end to end: broker, topics, two replicas, Prometheus, the feed — verified
exactly once from the host.

On a machine without a Docker engine docker-compose drives podman through its
Docker-compatible API (``podman system service``), with the broker and Prometheus from
the local stand-in images of deploy/compose/local-images.yml (no registry reachable;
Grafana has no stand-in and stays out). ``make image-test`` runs this module outside the
offline namespace the other image tests use: compose needs its own bridge network.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from service.examples.square import square
from service.tools.verify import verify
from tests.harness.containers import REPO_ROOT, Engine
from tests.harness.stage import all_committed, wait_for
from tests.image.conftest import RUNTIME_IMAGE

pytestmark = pytest.mark.image

PROJECT = "txstage-image-test"
FILES = ("-f", "docker-compose.yml", "-f", "deploy/compose/local-images.yml")
BROKER = "localhost:9094"  # the compose broker's listener for the host
FEED = 10_001  # `seq 1 10000` and one record that is not a number


class Compose:
    """docker-compose with a project name and files; ``env`` reaches the engine."""

    def __init__(self, env: dict[str, str], project: str = PROJECT,
                 files: tuple[str, ...] = FILES) -> None:
        self.env, self.project, self.files = env, project, files

    def variant(self, project: str, *extra_files: str) -> Compose:
        return Compose(self.env, project, self.files + extra_files)

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"

    def __call__(self, *args: str, timeout: float = 300, check: bool = True
                 ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(["docker-compose", "-p", self.project, *self.files, *args],
                                cwd=REPO_ROOT, env=self.env, capture_output=True, text=True,
                                timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)} exited {result.returncode}:\n"
                                 f"{result.stdout[-3000:]}{result.stderr[-3000:]}")
        return result


@pytest.fixture(scope="module")
def compose(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Compose]:
    """docker-compose against the engine: docker's own daemon, or podman's API socket."""
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose not found (deploy/images/podman-setup.sh installs it)",
                    pytrace=False)
    # The secured variant's certificate job runs the broker's image (KAFKA_IMAGE).
    env = {**engine.env, "KAFKA_IMAGE": "localhost/txstage-kafka-standin:dev"}
    service = None
    if engine.name == "podman":
        socket = tmp_path_factory.mktemp("podman") / "podman.sock"
        service = subprocess.Popen(["podman", "system", "service", "--time=0",
                                    f"unix://{socket}"], env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        wait_for(socket.exists, 30, "podman's API socket")
        env["DOCKER_HOST"] = f"unix://{socket}"
    yield Compose(env)
    if service is not None:
        service.terminate()
        service.wait(30)


def test_docker_compose_accepts_the_compose_file_and_rejects_a_broken_one(
        compose: Compose, tmp_path: Path) -> None:
    assert compose("config", "--quiet").returncode == 0
    broken = tmp_path / "docker-compose.yml"
    text = (REPO_ROOT / "docker-compose.yml").read_text()
    broken.write_text(text.replace("condition: service_healthy", "condition: service_happy"))
    result = subprocess.run(["docker-compose", "-f", str(broken), "config", "--quiet"],
                            env=compose.env, capture_output=True, text=True, check=False)
    assert result.returncode != 0 and "service_happy" in result.stderr


def _up(compose: Compose, engine: Engine) -> None:
    """`up -d`, driving the broker's HEALTHCHECK when the engine does not (podman without
    systemd): compose waits for it before the topics job."""
    outcome: list[subprocess.CompletedProcess[str]] = []
    up = threading.Thread(target=lambda: outcome.append(compose("up", "-d", check=False)))
    up.start()
    while up.is_alive():
        if engine.name == "podman":
            engine("healthcheck", "run", compose.container("kafka"), check=False, timeout=30)
        up.join(3)
    assert outcome and outcome[0].returncode == 0, outcome[0].stdout + outcome[0].stderr


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return str(answer.read().decode())


def test_compose_up_runs_the_demo_exactly_once_with_two_replicas_and_prometheus(
        compose: Compose, engine: Engine) -> None:
    compose("down", "--volumes", "--remove-orphans", check=False)
    try:
        _up(compose, engine)
        _wait_ready(compose)
        compose("--profile", "feed", "run", "--rm", "feed")
        wait_for(lambda: all_committed(BROKER, "txstage-demo", ["txstage-in"]), 120,
                 "the replicas to commit the feed", lambda: compose("logs").stdout[-5000:])
        report = verify(BROKER, input_topics=["txstage-in"],
                        output_topics=["txstage-out", "txstage-dlq"], group_id="txstage-demo",
                        transform=square, default_topic="txstage-out", dlq_topic="txstage-dlq",
                        timeout_s=60)
        assert report.ok, report.problems()
        assert report.found == report.expected == FEED
        consumed = [_consumed(_get(f"http://localhost:{port}/metrics")) for port in (9108, 9109)]
        assert sum(consumed) >= FEED, consumed

        def scraped() -> bool:
            targets = json.loads(_get("http://localhost:9090/api/v1/targets"))["data"]
            return sorted(t["health"] for t in targets["activeTargets"]) == ["up", "up"]
        wait_for(scraped, 60, "Prometheus to scrape both replicas")

        _stop_replicas(compose, engine)
    finally:
        compose("down", "--volumes", "--remove-orphans", check=False)


SECRETS = REPO_ROOT / "deploy" / "compose" / "secrets"
# Run beside the broker (its network namespace): the loopback-only PLAINTEXT listener
# the setup jobs use. Waits for the group to commit the whole input, then checks V1-V5.
VERIFY_INSIDE = """
import json, time
from service.examples.square import square
from service.tools.verify import committed_offsets, end_offsets, verify
B = "127.0.0.1:9095"
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    try:
        ends = end_offsets(B, ["txstage-in"])
        done = committed_offsets(B, "txstage-demo", ["txstage-in"])
        if ends and all(e == 0 or done.get(k, -1) >= e for k, e in ends.items()):
            break
    except Exception:
        pass
    time.sleep(1)
r = verify(B, input_topics=["txstage-in"], output_topics=["txstage-out", "txstage-dlq"],
           group_id="txstage-demo", transform=square, default_topic="txstage-out",
           dlq_topic="txstage-dlq", timeout_s=60)
print(json.dumps({"ok": r.ok, "found": r.found, "expected": r.expected,
                  "problems": r.problems()[:20]}))
"""


def test_the_secured_compose_runs_exactly_once_with_least_privilege_and_file_secrets(
        compose: Compose, engine: Engine, tmp_path: Path) -> None:
    """deploy/compose/secured.yml: SASL_SSL/SCRAM, the StandardAuthorizer,
    exactly the documented ACLs for User:txstage, passwords as mounted files."""
    secured = compose.variant("txstage-image-secured", "-f", "deploy/compose/secured.yml")
    secured("down", "--volumes", "--remove-orphans", check=False)
    try:
        _up(secured, engine)
        _wait_ready(secured)  # authenticated, and the ACLs let every producer init
        ca = tmp_path / "ca.pem"
        ca.write_text(engine("run", "--rm", "--volume", f"{secured.project}_tls-ca:/ca:ro",
                             "--entrypoint", "cat", RUNTIME_IMAGE, "/ca/ca.pem").stdout)
        admin = (SECRETS / "admin-password.txt").read_text().strip()
        assert _lists_topics({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                              "sasl.username": "admin", "sasl.password": admin,
                              "ssl.ca.location": str(ca)})
        assert not _lists_topics({}), "the host listener answered PLAINTEXT"

        secured("--profile", "feed", "run", "--rm", "feed")
        inside = engine("run", "--rm", "--network", f"container:{secured.container('kafka')}",
                        "--entrypoint", "python", RUNTIME_IMAGE, "-c", VERIFY_INSIDE,
                        timeout=300)
        report = json.loads(inside.stdout.strip().splitlines()[-1])
        assert report["ok"], report["problems"]
        assert report["found"] == report["expected"] == FEED

        password = (SECRETS / "txstage-password.txt").read_text().strip()
        for replica in ("txstage-1", "txstage-2"):
            seen = engine("container", "inspect", secured.container(replica)).stdout
            seen += engine.logs(secured.container(replica))
            assert password not in seen and "TXSTAGE_KAFKA__SASL_PASSWORD" not in seen
        _stop_replicas(secured, engine)
    finally:
        secured("down", "--volumes", "--remove-orphans", check=False)


def _lists_topics(config: dict[str, str]) -> bool:
    admin = AdminClient({"bootstrap.servers": BROKER, **config})
    try:
        return "txstage-in" in admin.list_topics(timeout=10).topics
    except KafkaException:
        return False


def _wait_ready(compose: Compose) -> None:
    for port in (9108, 9109):
        wait_for(lambda port=port: '"status": "ok"' in _ready(port), 120,  # type: ignore[misc]
                 f"replica on :{port} to be ready", lambda: compose("logs").stdout[-6000:])


def _stop_replicas(compose: Compose, engine: Engine) -> None:
    compose("stop", "txstage-1", "txstage-2", timeout=120)
    for replica in ("txstage-1", "txstage-2"):
        state = engine.state(compose.container(replica))
        assert state["ExitCode"] == 0, compose("logs", replica).stdout[-3000:]


def _ready(port: int) -> str:
    try:
        return _get(f"http://localhost:{port}/readyz")
    except OSError:
        return ""


def _consumed(metrics: str) -> float:
    return sum(float(line.split()[-1]) for line in metrics.splitlines()
               if line.startswith("txstage_records_consumed_total"))

