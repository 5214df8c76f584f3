"""Spark's Kafka connector, resolved with Maven once and cached for offline runs.

``ensure_jars()`` runs ``pom.xml`` (beside this module, so the wheel ships it) for the
installed ``pyspark.__version__`` into ``$TXSTAGE_CACHE_DIR/spark-<version>/jars``
(default ``~/.cache/txstage``; the backfill image resolves it at build time).
Idempotent (a marker holds the hash of the POM and the version) and atomic (Maven copies
into a staging dir renamed into place, under a file lock), so once cached nothing
touches the network. Jars PySpark already ships are dropped: Spark's own copy wins anyway.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from service.cache import cache_root, install_once, installed
from service.errors import ConfigError

log = logging.getLogger(__name__)

POM = Path(__file__).resolve().with_name("pom.xml")
CONNECTOR = "spark-sql-kafka-0-10_2.13"
TOKEN_PROVIDER = "spark-token-provider-kafka-0-10_2.13"
_VERSION_SUFFIX = re.compile(r"-\d[\w.+-]*\.jar$")


class JarResolutionError(RuntimeError):
    """Maven could not resolve the connector (no network on first use, no Maven, ...)."""


def spark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def jars_dir(version: str | None = None) -> Path:
    return cache_root() / f"spark-{version or spark_version()}" / "jars"


def ensure_jars(version: str | None = None) -> list[Path]:
    """The connector's jars for ``version`` (default: the installed PySpark), resolved if
    missing. Raises JarResolutionError with Maven's output when that fails."""
    version = version or spark_version()
    target, fingerprint = jars_dir(version), _fingerprint(version)
    if not installed(target, fingerprint):
        mvn = shutil.which(os.environ.get("TXSTAGE_MVN", "mvn"))
        if mvn is None:
            raise ConfigError("`mvn` not found on PATH: Maven resolves Spark's Kafka connector "
                              f"once into {target.parent} (or set TXSTAGE_MVN)")
        install_once(target, fingerprint, lambda staging: _build(mvn, staging, version),
                     lock_name=".jars.lock")
    return sorted(target.glob("*.jar"))


def classpath(jars: list[Path]) -> str:
    """The comma-separated list ``spark-submit --jars`` and ``spark.jars`` take."""
    return ",".join(str(jar) for jar in jars)


def _fingerprint(version: str) -> str:
    return hashlib.sha256(POM.read_bytes() + version.encode()).hexdigest()


def _build(mvn: str, staging: Path, version: str) -> None:
    _resolve(mvn, staging, version)
    _drop_shipped(staging)


def _resolve(mvn: str, out: Path, version: str) -> None:
    """Resolve the connector; if the repository lacks the token provider of this exact
    patch release (seen on partial mirrors), fall back to an earlier patch of its line."""
    failure = _maven(mvn, out, version, version)
    if failure is None:
        return
    for fallback in _earlier_patches(version):
        if TOKEN_PROVIDER not in failure:
            break
        log.warning("%s:%s is not in the Maven repository; trying %s (the connector stays %s)",
                    TOKEN_PROVIDER, version, fallback, version)
        failure = _maven(mvn, out, version, fallback)
        if failure is None:
            return
    raise JarResolutionError(f"Maven could not resolve {CONNECTOR}:{version}:\n{failure}")


def _maven(mvn: str, out: Path, version: str, token_provider: str) -> str | None:
    command = [mvn, "-B", "-q", "-f", str(POM), "dependency:copy-dependencies",
               f"-DoutputDirectory={out}", f"-Dspark.version={version}",
               f"-Dspark.token.provider.version={token_provider}"]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode == 0 and (out / f"{CONNECTOR}-{version}.jar").is_file():
        return None
    return (result.stdout + result.stderr)[-4000:] or "no connector jar was copied"


def _earlier_patches(version: str) -> Iterator[str]:
    parts = version.split(".")
    if len(parts) != 3 or not parts[2].isdigit():
        return
    for patch in range(int(parts[2]) - 1, -1, -1):
        yield f"{parts[0]}.{parts[1]}.{patch}"


def _drop_shipped(directory: Path) -> None:
    shipped = {_artifact(jar.name) for jar in _pyspark_jars()}
    for jar in directory.glob("*.jar"):
        if _artifact(jar.name) in shipped:
            jar.unlink()


def _pyspark_jars() -> list[Path]:
    import pyspark

    return list((Path(pyspark.__file__).parent / "jars").glob("*.jar"))


def _artifact(name: str) -> str:
    """``kafka-clients-3.9.1.jar`` → ``kafka-clients``."""
    return _VERSION_SUFFIX.sub("", name)


