"""The per-user cache of what txstage installs once (jars Maven resolves): the
local Kafka broker (:mod:`service.local_kafka`), Spark's Kafka connector."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

MARKER = ".complete"


def cache_root() -> Path:
    """``$TXSTAGE_CACHE_DIR`` or ``~/.cache/txstage``."""
    configured = os.environ.get("TXSTAGE_CACHE_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "txstage"


def installed(target: Path, fingerprint: str) -> bool:
    """``target`` is complete and built from the inputs ``fingerprint`` names."""
    marker = target / MARKER
    return marker.is_file() and marker.read_text().strip() == fingerprint


def install_once(target: Path, fingerprint: str, build: Callable[[Path], None],
                 *, lock_name: str) -> None:
    """Make ``target`` exist, built by ``build(staging_dir)``, exactly once.

    Idempotent (a marker holding ``fingerprint`` says the install is complete and
    current), atomic (built in a temp dir renamed into place: an interrupted build
    leaves nothing), and serialised across processes by ``<parent>/<lock_name>``.
    """
    if installed(target, fingerprint):
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / lock_name):
        if installed(target, fingerprint):
            return
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            build(staging)
            staging.chmod(0o755)  # mkdtemp makes it private; jars are not secrets
            (staging / MARKER).write_text(fingerprint + "\n")
            if target.exists():
                stale = target.with_name(f".{target.name}-stale-{uuid.uuid4().hex[:8]}")
                target.rename(stale)
                shutil.rmtree(stale, ignore_errors=True)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
