#!/usr/bin/env bash
# `make image`: the stage image (txstage:dev) and the backfill image (txstage-backfill:dev)
# with docker when a Docker daemon answers, else podman (installed and configured by
# podman-setup.sh). The base is python:3.11-slim; when it cannot be pulled (no registry
# reachable) a local stand-in is built with debootstrap (test-base.sh, tests only).
#
#   deploy/images/build.sh                  # runtime + backfill
#   deploy/images/build.sh stand-ins        # + the broker and Prometheus stand-ins of
#                                           #   `make image-test`'s compose run
#   PYTHON_IMAGE=my.registry/python:3.11-slim TAG=1.2.3 deploy/images/build.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source deploy/images/engine.sh
tag=${TAG:-dev}

seconds() { local start=$SECONDS; "$@"; echo $((SECONDS - start)); }
size_mb() { "$ENGINE" image inspect --format '{{.Size}}' "$1" | awk '{printf "%.0f", $1 / 1e6}'; }

base=${PYTHON_IMAGE:-python:3.11-slim}
if ! "$ENGINE" image inspect "$base" >/dev/null 2>&1 \
        && ! timeout 120 "$ENGINE" pull -q "$base" >/dev/null 2>&1; then
    echo "$base cannot be pulled (no registry reachable?): building the local test base" >&2
    base=$(deploy/images/test-base.sh "$ENGINE")
fi

build() {  # build <tag> <dockerfile dir or context> [args...]
    local image=$1 context=$2
    shift 2
    local start=$SECONDS
    "$ENGINE" build "${BUILD_FORMAT[@]}" --build-arg "PYTHON_IMAGE=$base" -t "$image" "$@" "$context" >&2
    printf '%-40s %4d MB  built in %3d s\n' "$image" "$(size_mb "$image")" $((SECONDS - start))
}

build "txstage:$tag" . --target runtime
build "txstage-backfill:$tag" . --target backfill

if [[ ${1:-} == stand-ins ]]; then
    libs=$("${PY:-.venv/bin/python}" -c 'from service.local_kafka.jars import install; print(install(quiet=True))')
    context=$(mktemp -d)
    trap 'rm -rf "$context"' EXIT
    cp -r deploy/images/kafka-standin/. "$context/"
    cp -r "$libs" "$context/libs"
    cp service/local_kafka/log4j2.properties "$context/"
    build "txstage-kafka-standin:$tag" "$context" --build-arg "JRE_IMAGE=txstage-backfill:$tag"
    build "txstage-prometheus-standin:$tag" deploy/images/prometheus-standin --build-arg "BASE=$base"
fi
