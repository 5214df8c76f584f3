"""The local registry's Java choice: Java 21 or later, one clear line when there is none."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.local_registry import install
from service.local_registry.install import RegistryError, find_java


def _jdk(root: Path, name: str, version: str) -> Path:
    home = root / name
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "java").write_text("#!/bin/sh\n")
    (home / "release").write_text(f'JAVA_VERSION="{version}"\n')
    return home


def test_the_newest_java_21_or_later_is_chosen(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    homes = [_jdk(tmp_path, "jdk17", "17.0.15"), _jdk(tmp_path, "jdk25", "25.0.3"),
             _jdk(tmp_path, "jdk21", "21.0.2")]
    monkeypatch.setattr(install, "_candidates", lambda: homes)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert find_java() == str(tmp_path / "jdk25" / "bin" / "java")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk21"))
    assert find_java() == str(tmp_path / "jdk21" / "bin" / "java")


def test_no_java_21_names_the_need(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    homes = [_jdk(tmp_path, "jdk17", "17.0.15")]
    monkeypatch.setattr(install, "_candidates", lambda: homes)
    monkeypatch.setenv("JAVA_HOME", str(homes[0]))
    with pytest.raises(RegistryError, match=r"needs Java 21 or later .*jdk17 \(Java 17\)"):
        find_java()


def test_the_machine_has_one() -> None:
    # CI and the image-test base run the registry: the machine must offer Java 21+.
    assert Path(find_java()).is_file()
