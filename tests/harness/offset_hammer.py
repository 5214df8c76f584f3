"""Asks ``service.kafka.cluster.Cluster.committed_offset`` again and again from four threads,
while a test moves the group's coordinator, until its stdin closes (at most ``SECONDS``).
Run as a subprocess: ``python -m tests.harness.offset_hammer BOOTSTRAP GROUP TOPIC
SECONDS``. It prints
how many answers and errors it got and exits 0; a crash of the client library shows as
a death by signal (librdkafka#5040 killed the stage with SIGSEGV this way)."""

from __future__ import annotations

import sys
import threading
import time

from service.errors import KafkaOperationError
from service.kafka.cluster import Cluster


def main(bootstrap: str, group: str, topic: str, seconds: float) -> int:
    cluster = Cluster({"bootstrap.servers": bootstrap, "client.id": "offset-hammer"})
    until = time.monotonic() + seconds
    told = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), told.set()), daemon=True).start()
    counts = {"answers": 0, "errors": 0}
    lock = threading.Lock()

    def ask(stable: bool) -> None:
        while time.monotonic() < until and not told.is_set():
            try:
                cluster.committed_offset(group, topic, 0, require_stable=stable, timeout_s=3)
                outcome = "answers"
            except KafkaOperationError:
                outcome = "errors"
                time.sleep(0.05)
            with lock:
                counts[outcome] += 1

    threads = [threading.Thread(target=ask, args=(i % 2 == 0,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"answers={counts['answers']} errors={counts['errors']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])))
