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
    CONTAINERS_CONF=${CONTAINERS_CONF:-$("$(dirname "${BASH_SOURCE[0]}")/podman-setup.sh")}
    export CONTAINERS_CONF
    # Docker's image format keeps HEALTHCHECK (the OCI format drops it).
    BUILD_FORMAT=(--format docker)
else
    BUILD_FORMAT=()
fi
export ENGINE
