"""Where the broker's time goes, per mode: Java Flight Recorder on a broker JVM on this box.

``python -m bench.throughput --broker-profile DIR`` records each measured run of the
broker (``jcmd <pid> JFR.start``, the JDK's ``profile`` settings sampling Java code
every millisecond instead of every 10) from the process's start to its last commit,
into ``DIR/<mode>.jfr``, and summarises each recording by what the broker was doing:
the Kafka API a request-handler sample was serving (``KafkaApis.handleProduceRequest``
and the append it finishes after the transaction coordinator verified the partition,
``ReplicaManager.postVerificationCallback``), or else the thread (network threads,
the group coordinator, the transaction marker sender). Samples count Java code only,
not the JIT, the collector or the kernel: compare modes by samples per 100k records.

The JDK's ``jcmd`` and ``jfr`` are the ones next to the broker's own ``java``.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

SAMPLE_PERIOD = "1 ms"
_SETTINGS_LINE = '<setting name="period" control="method-sampling-java-interval">'
# Request-handler work done outside KafkaApis.handle*: the append of a transactional
# produce request, resumed once the coordinator verified its partitions (KIP-890).
_PRODUCE_RESUMED = "ReplicaManager.postVerificationCallback"
_DIGITS = "0123456789-#"


class BrokerProfile:
    """One JFR recording at a time of the broker JVM ``pid`` into ``directory``."""

    def __init__(self, pid: int, directory: Path) -> None:
        self.pid = pid
        self.directory = directory
        self._bin = Path(f"/proc/{pid}/exe").resolve().parent
        directory.mkdir(parents=True, exist_ok=True)
        self._settings = directory / "sampling.jfc"
        default = (self._bin.parent / "lib" / "jfr" / "profile.jfc").read_text()
        self._settings.write_text(default.replace(f"{_SETTINGS_LINE}10 ms",
                                                  f"{_SETTINGS_LINE}{SAMPLE_PERIOD}"))
        self._recording: str | None = None

    def start(self, name: str) -> None:
        self.stop()
        self._jcmd("JFR.start", f"name={name}", f"settings={self._settings}",
                   f"filename={self.directory / name}.jfr")
        self._recording = name

    def stop(self) -> Path | None:
        """Stop the recording (its file is written); its path, None if none ran."""
        name, self._recording = self._recording, None
        if name is None:
            return None
        self._jcmd("JFR.stop", f"name={name}")
        return self.directory / f"{name}.jfr"

    def _jcmd(self, *args: str) -> None:
        subprocess.run([str(self._bin / "jcmd"), str(self.pid), *args], check=True,
                       capture_output=True, timeout=60)

    def samples(self, path: Path) -> Iterator[tuple[list[str], str]]:
        """Each execution sample of a recording: its frames (innermost first, as
        ``Class.method`` with the package dropped) and its thread's name."""
        text = subprocess.run(
            [str(self._bin / "jfr"), "print", "--json", "--stack-depth", "64", "--events",
             "jdk.ExecutionSample", str(path)],
            check=True, capture_output=True, text=True, timeout=600).stdout
        for event in json.loads(text)["recording"]["events"]:
            values = event["values"]
            trace = values.get("stackTrace") or {"frames": []}
            thread = values.get("sampledThread") or {}
            yield ([_frame(f["method"]) for f in trace["frames"]],
                   thread.get("javaName") or thread.get("osName") or "?")


def _frame(method: dict[str, object]) -> str:
    kind = method.get("type")
    name = kind.get("name", "?") if isinstance(kind, dict) else "?"
    return f"{str(name).rpartition('/')[2].rpartition('.')[2]}.{method.get('name')}"


def category(frames: Sequence[str], thread: str) -> str:
    """What a sample was doing: the Kafka API it served on a request handler (the
    outermost ``KafkaApis.handleX``), a transactional append resumed after
    verification (``Produce (verified)``), or else its thread's name without the
    numbers (``network thread`` for Kafka's socket processors)."""
    for frame in reversed(frames):  # outermost first
        if frame.startswith("KafkaApis.handle") and frame != "KafkaApis.handle":
            return frame.removeprefix("KafkaApis.handle").removesuffix("Request")
        if frame.startswith(_PRODUCE_RESUMED):
            return "Produce (verified)"
    name = thread.rstrip(_DIGITS)
    if name.startswith("data-plane-kafka-network-thread"):
        return "network thread"
    if name.startswith("data-plane-kafka-request-handler"):
        return "request handler, other"
    return name


def summarise(samples: Iterable[tuple[list[str], str]]) -> Counter[str]:
    return Counter(category(frames, thread) for frames, thread in samples)


def lines(per_100k: dict[str, dict[str, float]], top: int = 14) -> list[str]:
    """A table of samples per 100k records by category (``summarise``, scaled), one
    column per mode, the categories ordered by the first mode's."""
    modes = list(per_100k)
    first = per_100k[modes[0]]
    order = sorted({cat for rates in per_100k.values() for cat in rates},
                   key=lambda cat: -first.get(cat, 0.0))
    out = [f"  {'JFR samples per 100k records':<34}" + "".join(f"{m:>15}" for m in modes),
           f"  {'all':<34}" + "".join(f"{sum(per_100k[m].values()):>15.1f}" for m in modes)]
    for cat in order[:top]:
        out.append(f"  {cat[:34]:<34}"
                   + "".join(f"{per_100k[m].get(cat, 0.0):>15.1f}" for m in modes))
    return out
