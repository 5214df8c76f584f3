"""How fast ``txstage audit`` and ``txstage redrive`` go.

``python -m bench.operator_tools [--records N] [--partitions P] [--value-bytes B]``

On a private broker (or ``--bootstrap``): N records of B bytes, an exactly-once stage
with a buggy transform (``bench.transforms:identity_failing_every_hundredth``: 1% of the
records are dead-lettered) until it committed them all; then, the stage stopped,

1. ``txstage audit`` over everything (inputs, outputs, DLQ): records audited per second
   (inputs + outputs read, transform rerun, judged) and its peak memory;
2. ``txstage redrive`` with the bug fixed: letters redriven per second;
3. ``txstage audit`` again: clean, nothing pending.

Both tools run as processes, as an operator runs them; the figures are theirs (their
``--json`` reports), the broker on the same machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from bench.common import REPO_ROOT, ensure_topics, free_port, stage_env
from bench.replica import Replica
from bench.throughput import broker, prefill
from service.tools.verify import committed_offsets, end_offsets

TRANSFORM = "bench.transforms:identity_failing_every_hundredth"


def tool(env: dict[str, str], *args: str) -> tuple[dict[str, object], float]:
    """Run ``txstage <args> --json``; its report and its peak RSS in MB (VmHWM, sampled
    every 20 ms until it exits)."""
    proc = subprocess.Popen([sys.executable, "-m", "service", *args, "--json"], cwd=REPO_ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak_kb = 0
    while proc.poll() is None:
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
            peak_kb = max(peak_kb, int(status.split("VmHWM:")[1].split()[0]))
        except (OSError, IndexError, ValueError):
            pass
        time.sleep(0.02)
    out, err = proc.communicate()
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"txstage {args[0]} exited {proc.returncode}: {err}")
    return json.loads(out), peak_kb / 1024


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.operator_tools")
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--value-bytes", type=int, default=100)
    p.add_argument("--bootstrap", help="an existing broker instead of a private one")
    args = p.parse_args(argv)
    run = uuid.uuid4().hex[:8]
    topics = {"in": f"ops-in-{run}", "out": f"ops-out-{run}", "dlq": f"ops-dlq-{run}"}
    with broker(args.bootstrap, print) as bootstrap:
        ensure_topics(bootstrap, {topics["out"]: args.partitions, topics["dlq"]: 1})
        seconds = prefill(bootstrap, topics["in"], args.partitions, args.records,
                          args.value_bytes)
        print(f"{args.records} records of {args.value_bytes} B in {args.partitions} "
              f"partitions written in {seconds:.1f} s")
        env = stage_env({"TXSTAGE_BOOTSTRAP_SERVERS": bootstrap, "TXSTAGE_GROUP_ID": f"ops-{run}",
                         "TXSTAGE_INPUT_TOPICS": topics["in"],
                         "TXSTAGE_OUTPUT_TOPIC": topics["out"],
                         "TXSTAGE_DLQ_TOPIC": topics["dlq"], "TXSTAGE_TRANSFORM": TRANSFORM,
                         "TXSTAGE_LOG_LEVEL": "WARNING"})
        with tempfile.TemporaryDirectory() as logs:
            port = free_port()
            stage = Replica("stage", {**env, "TXSTAGE_METRICS_PORT": str(port)},
                            Path(logs) / "stage.log", port).start()
            began = time.monotonic()
            ends = end_offsets(bootstrap, [topics["in"]])
            while any(committed_offsets(bootstrap, f"ops-{run}", [topics["in"]]).get(k, -1) < e
                      for k, e in ends.items()):
                if time.monotonic() - began > 900:
                    raise RuntimeError("the stage did not commit the input in 15 minutes")
                time.sleep(1)
            stage.stop()
        print(f"stage: committed everything in {time.monotonic() - began:.1f} s")

        audit, peak = tool(env, "audit", "--stuck-after", "0")
        records = int(str(audit["inputs"])) + int(str(audit["outputs_read"]))
        print(f"audit: {records} records ({audit['inputs']} inputs, {audit['outputs_read']} "
              f"outputs) in {audit['seconds']} s = {audit['records_per_second']} records/s; "
              f"peak RSS {peak:.0f} MB; clean={audit['ok']}, pending redrive "
              f"{audit['letters_pending']}")
        fixed = {**env, "BENCH_TRANSFORM_FIXED": "1"}
        redriven, peak = tool(fixed, "redrive", "--batch", "1000")
        print(f"redrive: {redriven['redriven']} letters in {redriven['seconds']} s = "
              f"{redriven['letters_per_second']} letters/s ({redriven['transactions']} "
              f"transactions); peak RSS {peak:.0f} MB")
        after, _ = tool(fixed, "audit", "--stuck-after", "0")
        print(f"audit after redrive: clean={after['ok']}, pending {after['letters_pending']}, "
              f"{after['records_per_second']} records/s")
        return 0 if audit["ok"] and after["ok"] and after["letters_pending"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
