"""Resolve Apicurio Registry's fast-jar from Maven Central into the per-user cache, once,
and find a Java that runs it (21 or later: its classes are version 65)."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

from service.local_kafka.cache import cache_root, install_once, installed
from service.local_kafka.errors import LocalKafkaError

REGISTRY_VERSION = "3.3.3"
ARTIFACT = f"io.apicurio:apicurio-registry-app:{REGISTRY_VERSION}:tar.gz:all"
MIN_JAVA = 21
# Where JDKs are installed besides JAVA_HOME and PATH (Debian's, Temurin's packages, SDKs).
_JVM_GLOBS = ("/usr/lib/jvm/*", "/usr/local/lib/jvm/*", "/opt/java/*", "/opt/*jdk*")


class RegistryError(LocalKafkaError):
    """The local registry could not be installed, started or stopped."""


def install_dir() -> Path:
    return cache_root() / f"apicurio-registry-{REGISTRY_VERSION}"


def install(*, quiet: bool = True) -> Path:
    """The directory holding ``quarkus-run.jar``, resolved and unpacked if missing.

    Idempotent and atomic (``cache.install_once``); Maven keeps its own copy of the
    tarball in ``~/.m2``, so a second install on the machine downloads nothing."""
    target = install_dir()
    if installed(target, ARTIFACT):
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RegistryError("`mvn` not found on PATH: Maven is needed to resolve the registry")

    def build(staging: Path) -> None:
        download = staging / "download"
        command = [mvn, "-B", *(["-q"] if quiet else []),
                   "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy",
                   f"-Dartifact={ARTIFACT}", f"-DoutputDirectory={download}"]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        tarballs = list(download.glob("*.tar.gz"))
        if result.returncode != 0 or not tarballs:
            output = (result.stdout + result.stderr)[-4000:]
            raise RegistryError(f"Maven could not resolve {ARTIFACT}:\n{output}")
        with tarfile.open(tarballs[0]) as archive:
            archive.extractall(staging, filter="data")
        shutil.rmtree(download)
        if not (staging / "quarkus-run.jar").is_file():
            raise RegistryError(f"{ARTIFACT} unpacked without quarkus-run.jar")

    install_once(target, ARTIFACT, build, lock_name=f".apicurio-{REGISTRY_VERSION}.lock")
    return target


def java_major(home: Path) -> int | None:
    """The feature version of the JDK/JRE at ``home`` (its ``release`` file), if any."""
    release = home / "release"
    if not release.is_file() or not (home / "bin" / "java").is_file():
        return None
    found = re.search(r'^JAVA_VERSION="(\d+)', release.read_text(), re.MULTILINE)
    return int(found.group(1)) if found else None


def _candidates() -> list[Path]:
    homes: list[Path] = []
    if os.environ.get("JAVA_HOME"):
        homes.append(Path(os.environ["JAVA_HOME"]))
    on_path = shutil.which("java")
    if on_path:
        homes.append(Path(os.path.realpath(on_path)).parent.parent)
    for pattern in _JVM_GLOBS:
        homes.extend(Path(p) for p in sorted(glob.glob(pattern)))
    return homes


def find_java() -> str:
    """The ``java`` of a JDK with version >= 21: JAVA_HOME's when it is one, else the
    newest on PATH or in the usual install places; one clear error when there is none."""
    seen: dict[Path, int] = {}
    for home in _candidates():
        major = java_major(home)
        if major is not None and home not in seen:
            seen[home] = major
    configured = os.environ.get("JAVA_HOME")
    if configured and seen.get(Path(configured), 0) >= MIN_JAVA:
        return str(Path(configured) / "bin" / "java")
    usable = [(major, str(home)) for home, major in seen.items() if major >= MIN_JAVA]
    if not usable:
        found = ", ".join(f"{home} (Java {major})" for home, major in seen.items()) or "none"
        raise RegistryError(f"Apicurio Registry {REGISTRY_VERSION} needs Java {MIN_JAVA} or "
                            f"later (JAVA_HOME, PATH, /usr/lib/jvm); found: {found}")
    return str(Path(max(usable)[1]) / "bin" / "java")
