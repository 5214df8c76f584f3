#!/usr/bin/env bash
# offline.sh <command...>: runs the command in a new network namespace whose only
# interface is loopback. `make image-test` runs the stage and backfill image tests so:
# the test broker (127.0.0.1) and containers on the host network share it, and nothing
# there reaches any other host (the backfill image must not fetch jars at run time).
set -euo pipefail
netns=txstage-offline-$$
ip netns add "$netns"
trap 'ip netns delete "$netns"' EXIT
ip -netns "$netns" link set lo up
# nsenter, not `ip netns exec`: that remounts /sys, hiding the cgroup mounts runc needs.
nsenter --net="/run/netns/$netns" "$@"
