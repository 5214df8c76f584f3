"""The container engine the image tests drive: docker when a Docker daemon answers, else
podman configured by deploy/images/podman-setup.sh — the same choice ``make image``
makes (deploy/images/engine.sh decides for both)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


class EngineError(RuntimeError):
    """An engine command failed; carries what it printed."""


@dataclass(frozen=True)
class Engine:
    name: str  # "docker" or "podman"
    env: Mapping[str, str]

    @classmethod
    def detect(cls) -> Engine:
        """The engine deploy/images/engine.sh picks (installing podman if needed)."""
        script = ('source deploy/images/engine.sh && echo "$ENGINE" '
                  '&& echo "${CONTAINERS_CONF:-}"')
        out = subprocess.run(["bash", "-c", script], cwd=REPO_ROOT, capture_output=True,
                             text=True, check=True, timeout=600).stdout.split("\n")
        env = dict(os.environ)
        if out[1]:
            env["CONTAINERS_CONF"] = out[1]
        return cls(out[0], env)

    def __call__(self, *args: str, timeout: float = 120, check: bool = True
                 ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([self.name, *args], capture_output=True, text=True,
                                env=dict(self.env), timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise EngineError(f"{self.name} {' '.join(args)} exited {result.returncode}:\n"
                              f"{result.stdout[-3000:]}{result.stderr[-3000:]}")
        return result

    def image(self, ref: str) -> dict[str, object]:
        """``image inspect`` of ``ref``: its config (User, Healthcheck, ...) and Size."""
        info = json.loads(self("image", "inspect", ref).stdout)[0]
        assert isinstance(info, dict)
        return info

    def healthcheck(self, ref: str) -> list[str]:
        """The image's HEALTHCHECK command ([] if none): docker keeps it in the config,
        podman beside it."""
        info = self.image(ref)
        config = info.get("Config")
        found = info.get("Healthcheck") or (config.get("Healthcheck")
                                            if isinstance(config, dict) else None) or {}
        assert isinstance(found, dict)
        return list(found.get("Test") or [])

    def has_image(self, ref: str) -> bool:
        return self("image", "inspect", ref, check=False).returncode == 0

    def state(self, container: str) -> dict[str, object]:
        info = json.loads(self("container", "inspect", container).stdout)[0]
        state = info["State"]
        assert isinstance(state, dict)
        return state

    def logs(self, container: str) -> str:
        result = self("logs", container, check=False)
        return result.stdout + result.stderr

    def healthy(self, container: str, timeout: float = 60) -> bool:
        """The image's HEALTHCHECK passes. podman without systemd schedules no health
        checks, so run it on demand; docker schedules them itself."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.name == "podman":
                if self("healthcheck", "run", container, check=False).returncode == 0:
                    return True
            else:
                health = self.state(container).get("Health") or {}
                if isinstance(health, dict) and health.get("Status") == "healthy":
                    return True
            time.sleep(2)
        return False


def env_args(env: Mapping[str, str]) -> list[str]:
    return [arg for key, value in env.items() for arg in ("--env", f"{key}={value}")]
