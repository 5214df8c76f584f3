"""Resolve the broker's jars from Maven Central into the per-user cache, once.

``pom.xml`` and ``log4j2.properties`` ship next to this module (package data), so an
installed wheel can install and run the broker as well as a checkout can.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from service.local_kafka.cache import cache_root, install_once, installed
from service.local_kafka.errors import LocalKafkaError

KAFKA_VERSION = "4.1.1"
POM = Path(__file__).with_name("pom.xml")
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")


def install_dir() -> Path:
    return cache_root() / f"kafka-{KAFKA_VERSION}"


def _install_fingerprint() -> str:
    digest = hashlib.sha256()
    for source in (POM, LOG4J_CONFIG):
        digest.update(source.read_bytes())
    return digest.hexdigest()


def install(*, quiet: bool = True) -> Path:
    """Resolve the broker's jars if missing and return the ``libs`` directory.

    Idempotent (a marker holding the hash of the POM and log config says the install is
    complete and current) and atomic (Maven copies into a temp dir that is renamed into
    place). A file lock serialises concurrent installs from parallel test runs.
    """
    target = install_dir()
    fingerprint = _install_fingerprint()
    if installed(target, fingerprint):
        return target / "libs"
    mvn = shutil.which("mvn")
    if mvn is None:
        raise LocalKafkaError("`mvn` not found on PATH: Maven is needed to resolve Kafka jars")

    def build(staging: Path) -> None:
        _resolve_jars(mvn, staging / "libs", quiet=quiet)
        shutil.copy2(LOG4J_CONFIG, staging / "log4j2.properties")

    install_once(target, fingerprint, build, lock_name=f".kafka-{KAFKA_VERSION}.lock")
    return target / "libs"


def _resolve_jars(mvn: str, libs: Path, *, quiet: bool) -> None:
    command = [
        mvn,
        "-B",
        *(["-q"] if quiet else []),
        "-f",
        str(POM),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={libs}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        output = (result.stdout + result.stderr)[-4000:]
        raise LocalKafkaError(f"Maven could not resolve Kafka {KAFKA_VERSION}:\n{output}")
    if not (libs / f"kafka_2.13-{KAFKA_VERSION}.jar").is_file():
        raise LocalKafkaError(f"Maven finished but kafka_2.13-{KAFKA_VERSION}.jar is missing")


def log4j_config(libs: Path) -> Path:
    """The installed copy of the log config (the packaged one if the install has none)."""
    copy = libs.parent / "log4j2.properties"
    return copy if copy.is_file() else LOG4J_CONFIG
