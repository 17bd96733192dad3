# The trioserve image (docs/docker.md): `make image`, or `docker build -t trioserve .`
#
# Build arguments:
#   BASE_IMAGE       a Debian-based image with Python 3.11+ whose python3 can make a venv
#                    (python:3.11-slim by default; scripts/build_image.sh makes a local one
#                    with debootstrap where no registry is reachable)
#   TORCH_INDEX_URL  where PyTorch comes from: the CPU build by default; for CUDA, e.g.
#                    --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126
#   TORCH_VERSION    the PyTorch release (the one the Makefile pins)
#   EXTRAS           trioserve's extras, comma-separated: torch (numpy), vision, ...
# Wheels in docker/wheels/ are used in preference to the indexes (a local torch wheel).
ARG BASE_IMAGE=python:3.11-slim

# -- build: a compiler, the venv, PyTorch, and trioserve's wheel built here --------------
# trioserve has a small C extension (cffi, docs/native.md), so its wheel is built against
# this image's Python and C library, not the build machine's; the compiler, headers and
# build tools stay in this stage and only the finished venv is copied on.
FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends gcc libc6-dev; \
    if ! python3 -c 'import os, sys, sysconfig; \
            sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("include"), "Python.h")))'; \
    then apt-get install -y --no-install-recommends python3-dev; fi; \
    rm -rf /var/lib/apt/lists/*; \
    python3 -m venv /opt/trioserve

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
COPY docker/wheels/ /tmp/wheels/
RUN set -eux; \
    if ls /tmp/wheels/torch-*.whl >/dev/null 2>&1; then \
        /opt/trioserve/bin/pip install --find-links /tmp/wheels "torch==${TORCH_VERSION}"; \
    else \
        /opt/trioserve/bin/pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"; \
    fi

COPY pyproject.toml setup.py MANIFEST.in README.md /src/
COPY native/ /src/native/
COPY trioserve/ /src/trioserve/
ARG EXTRAS=torch
RUN set -eux; \
    /opt/trioserve/bin/pip wheel --no-deps --wheel-dir /tmp/dist /src; \
    wheel="$(ls /tmp/dist/trioserve-*.whl)"; \
    /opt/trioserve/bin/pip install --find-links /tmp/wheels "${wheel}${EXTRAS:+[$EXTRAS]}"; \
    /opt/trioserve/bin/python -c 'import trioserve._collate, torch; print("torch", torch.__version__)'

# -- the image: the venv, a user, TorchServe's layout -----------------------------------
FROM ${BASE_IMAGE}
ENV PATH=/opt/trioserve/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    TS_CONFIG_FILE=/home/model-server/config.properties \
    TEMP=/home/model-server/tmp \
    TMPDIR=/home/model-server/tmp
# TorchServe's image: user model-server (uid 1000), everything under its home. The home is
# the server's working directory and must be writable (key_file.json, the temp folder
# where archives are unpacked); the config is root's, read-only to the server.
RUN set -eux; \
    useradd --create-home --home-dir /home/model-server --uid 1000 --user-group \
        --shell /bin/bash model-server; \
    install -d -o model-server -g model-server /home/model-server/tmp \
        /home/model-server/model-store
COPY --from=build /opt/trioserve /opt/trioserve
COPY docker/config.properties /home/model-server/config.properties
COPY docker/healthcheck.py /opt/trioserve/healthcheck.py

USER model-server
WORKDIR /home/model-server
EXPOSE 8080 8081 8082 7070 7071
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD ["/opt/trioserve/bin/python", "/opt/trioserve/healthcheck.py"]
# Exec form: trioserve is PID 1 and gets `docker stop`'s SIGTERM itself, drains in-flight
# requests and stops its workers. Arguments after the image name are added to these
# (e.g. `--models classifier.mar`).
ENTRYPOINT ["/opt/trioserve/bin/trioserve", "start", "--foreground"]
