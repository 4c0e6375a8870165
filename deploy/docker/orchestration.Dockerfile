# syntax=docker/dockerfile:1.7
# The orchestration image: the Dagster webserver, the daemon, the two user-code deployments
# (`cell`, `robotics`) and the run pods the K8sRunLauncher starts all run this one image
# (deploy/helm/values.yaml). It does no GPU work: GPU steps run in the workload images.
#
# Built by `make images` (deploy/docker/build.py), which first fills build/wheelhouse with the
# wheels of exactly the versions the suite ran (`pip freeze` of .venv, torch's CPU build: this
# image never touches a GPU) and passes the base image and the code version:
#   podman build -f deploy/docker/orchestration.Dockerfile \
#     --build-arg BASE_IMAGE=<a Debian bookworm with python3.11> \
#     --build-arg SINEWGRID_CODE_VERSION=orchestration@sha256:<digest of what went in> .
# Nothing is downloaded while the image builds except Debian's packages; pip installs from the
# wheelhouse only.
#
# The version arguments restate pins from pyproject.toml; tests/test_deploy.py fails when they drift.

ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ARG PYTHON_VERSION=3.11
# pyproject.toml pins torch==2.13.0; the wheelhouse holds its CPU build (2.13.0+cpu).
ARG TORCH_VERSION=2.13.0
# The Dagster integrations (dagster-k8s, dagster-postgres, dagster-docker, dagster-aws for the S3
# compute log manager) are pinned in pyproject.toml with this version; the wheelhouse holds exactly it.
ARG DAGSTER_INTEGRATIONS_VERSION=0.29.27

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    DAGSTER_HOME=/opt/dagster/dagster_home

# git: the data registry is a git repository plus a DVC remote (docs/datasets.md). Slurm's client
# (sbatch, scontrol, scancel, sacct, with munge): runs submit their steps to Slurm pools
# (deploy/slurm/README.md); SLURM_CLIENT="" leaves it out, or names the site's own version's packages.
ARG SLURM_CLIENT=slurm-client
RUN apt-get update && apt-get install -y --no-install-recommends git ${SLURM_CLIENT} && rm -rf /var/lib/apt/lists/* \
    && "python${PYTHON_VERSION}" -m venv /opt/venv

WORKDIR /opt/sinewgrid

# The dependencies first, in their own layer: it changes only when the lock does.
# The lock is copied in first: the layer's cache key then changes with it (a bind mount's content
# is not part of the key, and an unchanged key would reuse the old dependencies).
COPY build/wheelhouse/requirements.lock /opt/requirements.lock
RUN --mount=type=bind,source=build/wheelhouse,target=/wheels \
    pip install --no-index --find-links /wheels -r /opt/requirements.lock

# The project itself, with no dependency resolution left to do.
COPY pyproject.toml README.md ./
COPY sinewgrid ./sinewgrid
COPY workload_runtime ./workload_runtime
COPY control_plane ./control_plane
COPY data_layer ./data_layer
COPY model_gateway ./model_gateway
COPY shared_resources ./shared_resources
COPY cell_lane ./cell_lane
COPY robotics_lane ./robotics_lane
COPY sensors ./sensors
COPY platform_location ./platform_location
COPY drills ./drills
COPY testbed ./testbed
RUN pip install --no-index --no-deps --no-build-isolation .

# The pool catalogs (SINEWGRID_POOLS=/opt/sinewgrid/deploy/pools/<cloud>.yaml) and the workspace.
COPY workspace.yaml ./
COPY deploy/pools ./deploy/pools
COPY deploy/jobs ./deploy/jobs
# The batch script a run renders for each step it sends to a Slurm pool.
COPY deploy/slurm ./deploy/slurm

RUN useradd --uid 10001 --create-home sinewgrid \
    && mkdir -p "${DAGSTER_HOME}" && chown sinewgrid "${DAGSTER_HOME}"
USER 10001

# The code version every lineage record carries (the image has no .git): `make images` passes
# `orchestration@sha256:<digest>`, the digest of everything that went into the image.
ARG SINEWGRID_CODE_VERSION=unknown
ENV SINEWGRID_CODE_VERSION=${SINEWGRID_CODE_VERSION}

# 3000: webserver; 3030: code server (`dagster api grpc -m <lane>.definitions`).
EXPOSE 3000 3030
