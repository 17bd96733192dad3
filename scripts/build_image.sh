#!/bin/sh
# Build the trioserve image from ./Dockerfile (docs/docker.md); `make image` runs this.
#
# With a docker daemon that answers and can pull BASE_IMAGE: `docker build`. Otherwise
# buildah (run as root, chroot isolation); with no BASE_IMAGE given it first makes a local
# Debian bookworm base with debootstrap (kept in build/image/base/ and as the image
# localhost/trioserve-base:bookworm, so later builds skip it), for machines that reach
# package repositories but no container registry.
#
# Environment:
#   IMAGE            the image's name (default trioserve:latest; buildah's is then
#                    localhost/trioserve:latest)
#   BASE_IMAGE       the base (default python:3.11-slim with docker, the local base with buildah)
#   TORCH_INDEX_URL  passed on as the build argument (a CUDA build: docs/docker.md)
#   TORCH_WHEEL      a local torch wheel to install instead of the index's; default: the CPU
#                    wheel in /opt/wheels when there is one; empty: none
#   BUILDER          docker or buildah (default: docker when usable as above, else buildah)
#   DEBIAN_MIRROR    debootstrap's mirror (default http://deb.debian.org/debian)
set -eu
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-trioserve:latest}
WORK=build/image
LOCAL_BASE=localhost/trioserve-base:bookworm
started=$(date +%s)

say() { printf 'build_image: %s\n' "$*" >&2; }

if [ -z "${BUILDER:-}" ]; then
    BUILDER=buildah
    if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1 &&
        docker pull "${BASE_IMAGE:-python:3.11-slim}" >/dev/null 2>&1; then
        BUILDER=docker
    fi
fi

# A local torch wheel goes into the build context for this build only.
default_wheel=$(ls /opt/wheels/torch-*+cpu-*.whl 2>/dev/null | head -n 1 || true)
TORCH_WHEEL=${TORCH_WHEEL-$default_wheel}
if [ -n "$TORCH_WHEEL" ]; then
    staged="docker/wheels/$(basename "$TORCH_WHEEL")"
    trap 'rm -f "$staged"' EXIT
    trap 'exit 130' INT TERM
    ln -f "$TORCH_WHEEL" "$staged" 2>/dev/null || cp "$TORCH_WHEEL" "$staged"
    say "installing torch from $TORCH_WHEEL"
fi

set --
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    set -- --build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL"
fi

if [ "$BUILDER" = docker ]; then
    BASE_IMAGE=${BASE_IMAGE:-python:3.11-slim}
    say "docker build on $BASE_IMAGE"
    docker build --build-arg "BASE_IMAGE=$BASE_IMAGE" "$@" -t "$IMAGE" .
    size=$(docker image inspect --format '{{.Size}}' "$IMAGE")
    say "built $IMAGE: $((size / 1000000)) MB in $(($(date +%s) - started)) s"
    echo "$IMAGE"
    exit 0
fi

command -v buildah >/dev/null 2>&1 || {
    say "neither a usable docker daemon nor buildah"
    exit 1
}
# No default ulimits for RUN steps (docker/buildah-containers.conf says why).
CONTAINERS_CONF=$(pwd)/docker/buildah-containers.conf
export CONTAINERS_CONF

make_local_base() {
    if buildah inspect --type image "$LOCAL_BASE" >/dev/null 2>&1; then
        say "reusing the local base $LOCAL_BASE"
        return
    fi
    mkdir -p "$WORK/base"
    if [ ! -f "$WORK/base/rootfs.tar" ]; then
        rootfs="$WORK/rootfs"
        rm -rf "$rootfs"
        say "debootstrap: Debian bookworm (minbase, python3, python3-venv, ca-certificates)"
        debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
            bookworm "$rootfs" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >&2
        # The host's own CA certificates (a TLS-inspecting proxy's, say), so that pip in
        # the build trusts what the host trusts (the base sets PIP_CERT to the bundle).
        if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
            cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
            chroot "$rootfs" update-ca-certificates >&2
        fi
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
        tar -C "$rootfs" --numeric-owner -cf "$WORK/base/rootfs.tar.part" .
        mv "$WORK/base/rootfs.tar.part" "$WORK/base/rootfs.tar"
        rm -rf "$rootfs"
    fi
    cp docker/base.Containerfile "$WORK/base/Containerfile"
    buildah bud --isolation chroot --format docker -t "$LOCAL_BASE" "$WORK/base" >&2
}

if [ -z "${BASE_IMAGE:-}" ]; then
    make_local_base
    BASE_IMAGE=$LOCAL_BASE
fi
say "buildah bud on $BASE_IMAGE"
# docker format: the OCI format has no HEALTHCHECK; --layers: cached steps are reused.
buildah bud --isolation chroot --layers --format docker \
    --build-arg "BASE_IMAGE=$BASE_IMAGE" "$@" -t "$IMAGE" -f Dockerfile . >&2
buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' "$IMAGE" >&2
say "built $IMAGE in $(($(date +%s) - started)) s"
echo "$IMAGE"
