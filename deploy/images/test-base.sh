#!/usr/bin/env bash
# A local stand-in for python:3.11-slim, for machines that reach Debian's package
# mirror but no image registry: Debian bookworm (debootstrap minbase) with Debian's
# Python 3.11, trimmed like the official slim images (no man pages or docs, so the
# JRE's post-install hits the same missing /usr/share/man/man1 the real base has).
#
# FOR TESTS ONLY: it trusts the host's extra CA certificates (an intercepting proxy's,
# if this machine reaches the package indexes through one). Never push it.
#
#   deploy/images/test-base.sh podman        # prints the tag; builds it once
set -euo pipefail
engine=${1:-podman}
tag=${TXSTAGE_TEST_BASE:-localhost/txstage-test-base:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if "$engine" image inspect "$tag" >/dev/null 2>&1; then
    echo "$tag"
    exit 0
fi
command -v debootstrap >/dev/null || { echo "debootstrap not found (apt-get install debootstrap)" >&2; exit 1; }

root=$(mktemp -d /var/tmp/txstage-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
# The same trimming the official slim images do, in place before any package unpacks.
mkdir -p "$root/etc/dpkg/dpkg.cfg.d"
cat > "$root/etc/dpkg/dpkg.cfg.d/slim" <<'CFG'
path-exclude /usr/share/man/*
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
CFG
debootstrap --variant=minbase \
    --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates \
    bookworm "$root" "$mirror" >&2
rm -rf "$root/usr/share/man"/* "$root/usr/share/doc"/*/[!c]* 2>/dev/null || true
cat > "$root/etc/apt/sources.list" <<SRC
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
SRC
shopt -s nullglob
extra=(/usr/local/share/ca-certificates/*.crt)
if ((${#extra[@]})); then
    cp "${extra[@]}" "$root/usr/local/share/ca-certificates/"
    chroot "$root" update-ca-certificates >&2
fi
chroot "$root" apt-get clean
rm -rf "$root/var/lib/apt/lists"/* "$root/var/cache/apt"/*.bin
tar --numeric-owner -C "$root" -c . | "$engine" import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    --message "txstage test base (debootstrap bookworm minbase; trusts the build host's CAs; never push)" \
    - "$tag" >&2
echo "$tag"
