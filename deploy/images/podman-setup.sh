#!/usr/bin/env bash
# Podman for `make image` / `make image-test` on a machine without a Docker engine:
# installs Debian's podman (and what the image tests use) if missing, and writes the
# configuration this kind of machine needs. Prints the path of that configuration;
# callers export it as CONTAINERS_CONF, so nothing in /etc/containers is changed.
#
# What the configuration works around (Debian 12, podman 4.3, root without systemd):
#   runtime runc            Debian's crun fails on cgroups v1 / hybrid hosts
#   cgroup_manager cgroupfs no systemd to ask for cgroups
#   default_ulimits         podman's defaults exceed what a root without
#                           CAP_SYS_RESOURCE may set (nofile <= `ulimit -Hn`)
#   events_logger file      no journald
set -euo pipefail

packages=(podman runc debootstrap docker-compose dnsmasq-base
          golang-github-containernetworking-plugin-dnsname iproute2)
missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" \
        || missing+=("$package")
done
if ((${#missing[@]})); then
    echo "installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    sudo=(); ((EUID == 0)) || sudo=(sudo)
    "${sudo[@]}" apt-get install --yes --no-install-recommends "${missing[@]}" >&2 \
        || { "${sudo[@]}" apt-get update >&2 \
             && "${sudo[@]}" apt-get install --yes --no-install-recommends "${missing[@]}" >&2; }
fi

conf_dir=${TXSTAGE_CACHE_DIR:-$HOME/.cache/txstage}/podman
mkdir -p "$conf_dir"
nofile=$(ulimit -Hn)
[[ $nofile == unlimited ]] && nofile=1048576
nproc=$(ulimit -Hu)
[[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768
cat > "$conf_dir/containers.conf" <<CONF
# Written by deploy/images/podman-setup.sh (see there why).
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
echo "$conf_dir/containers.conf"
