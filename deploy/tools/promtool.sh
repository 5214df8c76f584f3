#!/usr/bin/env bash
# Puts Prometheus's promtool in the txstage cache, from Debian's `prometheus` package
# (unpacked, not installed: no service is started). Prints the binary's path.
# Best effort: where apt is missing or unreachable it says so and exits 0, and the
# deploy tests check the alert rules structurally without it.
set -u
root="${TXSTAGE_CACHE_DIR:-$HOME/.cache/txstage}/promtool"
bin="$root/usr/bin/promtool"
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "promtool: no apt-get here; alert rules get the structural check only" >&2; exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && { apt-get download prometheus >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 && apt-get download prometheus >/dev/null 2>&1; }; }) \
  || { echo "promtool: could not fetch Debian's prometheus package; structural check only" >&2; exit 0; }
mkdir -p "$root.tmp" && dpkg-deb -x "$work"/prometheus_*.deb "$root.tmp" \
  && rm -rf "$root" && mv "$root.tmp" "$root" && echo "$bin"
