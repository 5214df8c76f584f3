# Sourced by the image scripts: picks the container engine and exports what it needs.
#   ENGINE=docker|podman   forces one; by default docker when a Docker daemon answers
#                          (`docker --version` alone is only the client), else podman.
if [[ -z ${ENGINE:-} ]]; then
    if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
        ENGINE=docker
    else
        ENGINE=podman
    fi
fi
if [[ $ENGINE == podman ]]; then
    # Always: it installs what is missing (a CONTAINERS_CONF of the caller's is kept).
    txstage_podman_conf=$("$(dirname "${BASH_SOURCE[0]}")/podman-setup.sh")
    CONTAINERS_CONF=${CONTAINERS_CONF:-$txstage_podman_conf}
    export CONTAINERS_CONF
    # Docker's image format keeps HEALTHCHECK (the OCI format drops it).
    BUILD_FORMAT=(--format docker)
else
    BUILD_FORMAT=()
fi
export ENGINE
