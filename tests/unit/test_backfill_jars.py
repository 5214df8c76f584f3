"""Connector resolution with a fake ``mvn``: cached once, offline after, atomic."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from service.backfill import jars

FAKE_MVN = """#!/bin/sh
# Records its arguments; "copies" jars into -DoutputDirectory like dependency:copy-dependencies.
echo "$@" >> "{log}"
for arg in "$@"; do
  case "$arg" in
    -DoutputDirectory=*) out="${{arg#-DoutputDirectory=}}" ;;
    -Dspark.version=*) version="${{arg#-Dspark.version=}}" ;;
    -Dspark.token.provider.version=*) token="${{arg#-Dspark.token.provider.version=}}" ;;
  esac
done
if [ "{missing_token}" = "$token" ]; then
  echo "[ERROR] Could not find artifact" \
       "org.apache.spark:spark-token-provider-kafka-0-10_2.13:jar:$token"
  exit 1
fi
mkdir -p "$out"
touch "$out/spark-sql-kafka-0-10_2.13-$version.jar" "$out/kafka-clients-3.9.1.jar" \\
      "$out/spark-token-provider-kafka-0-10_2.13-$token.jar" "$out/scala-library-2.13.15.jar"
"""


@pytest.fixture
def fake_mvn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TXSTAGE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "mvn.log"


def install_mvn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing_token: str = "") -> None:
    script = tmp_path / "mvn"
    script.write_text(FAKE_MVN.format(log=tmp_path / "mvn.log", missing_token=missing_token))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("TXSTAGE_MVN", str(script))


def names(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


def test_resolves_once_then_works_offline(fake_mvn: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    install_mvn(tmp_path, monkeypatch)
    first = jars.ensure_jars("4.0.1")
    assert names(first) == ["kafka-clients-3.9.1.jar", "spark-sql-kafka-0-10_2.13-4.0.1.jar",
                            "spark-token-provider-kafka-0-10_2.13-4.0.1.jar"]
    assert first[0].parent == tmp_path / "cache" / "spark-4.0.1" / "jars"
    monkeypatch.setenv("TXSTAGE_MVN", str(tmp_path / "no-such-mvn"))  # "no network" now
    assert jars.ensure_jars("4.0.1") == first
    assert len(fake_mvn.read_text().splitlines()) == 1
    assert "-Dspark.version=4.0.1" in fake_mvn.read_text()


def test_jars_pyspark_ships_are_dropped(fake_mvn: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    install_mvn(tmp_path, monkeypatch)
    assert "scala-library-2.13.15.jar" not in names(jars.ensure_jars("4.0.1"))


def test_a_mirror_without_the_exact_token_provider_falls_back_to_an_earlier_patch(
        fake_mvn: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_mvn(tmp_path, monkeypatch, missing_token="4.0.2")
    found = names(jars.ensure_jars("4.0.2"))
    assert "spark-sql-kafka-0-10_2.13-4.0.2.jar" in found
    assert "spark-token-provider-kafka-0-10_2.13-4.0.1.jar" in found


def test_a_failed_resolution_leaves_no_cache(fake_mvn: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    install_mvn(tmp_path, monkeypatch, missing_token="4.0.0")
    with pytest.raises(jars.JarResolutionError, match="Could not find artifact"):
        jars.ensure_jars("4.0.0")
    assert not (tmp_path / "cache" / "spark-4.0.0" / "jars").exists()
    assert [p.name for p in (tmp_path / "cache" / "spark-4.0.0").iterdir()] == [".jars.lock"]


def test_the_installed_pyspark_decides_the_version() -> None:
    import pyspark

    assert jars.jars_dir().parent.name == f"spark-{pyspark.__version__}"


def test_classpath_is_what_spark_submit_jars_takes() -> None:
    assert jars.classpath([Path("/a/x.jar"), Path("/b/y.jar")]) == "/a/x.jar,/b/y.jar"
