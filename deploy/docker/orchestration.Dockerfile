# syntax=docker/dockerfile:1.7
# The orchestration image: the Dagster webserver, the daemon, the two user-code deployments
# (`cell`, `robotics`) and the run pods the K8sRunLauncher starts all run this one image
# (deploy/helm/values.yaml). It does no GPU work: GPU steps run in the workload images.
#
# Build from the repository root:
#   docker build -f deploy/docker/orchestration.Dockerfile -t ghcr.io/sinewgrid/orchestration:0.1.0 .
#
# The version arguments restate pins from pyproject.toml; tests/test_deploy.py fails when they drift.

ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim-bookworm

# pyproject.toml pins torch==2.13.0; here it comes from PyTorch's CPU index, because PyPI's Linux
# wheel of the same version is the multi-GB CUDA build and this image never touches a GPU.
ARG TORCH_VERSION=2.13.0
# dagster-aws (the S3 compute log manager in the instance config) belongs to the integration
# family pyproject.toml pins for dagster-k8s and dagster-postgres; unpinned, pip picks a 2021
# release that imports `dagster.core` and crashes.
ARG DAGSTER_INTEGRATIONS_VERSION=0.29.27

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DAGSTER_HOME=/opt/dagster/dagster_home

WORKDIR /opt/sinewgrid

# git: the data registry is a git repository plus a DVC remote (docs/datasets.md).
RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*

RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}"

# The project with the dependency pins of pyproject.toml (Dagster family and torch exact).
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
RUN pip install . "dagster-aws==${DAGSTER_INTEGRATIONS_VERSION}"

# The pool catalogs (SINEWGRID_POOLS=/opt/sinewgrid/deploy/pools/<cloud>.yaml) and the workspace.
COPY workspace.yaml ./
COPY deploy/pools ./deploy/pools
COPY deploy/jobs ./deploy/jobs

RUN useradd --uid 10001 --create-home sinewgrid \
    && mkdir -p "${DAGSTER_HOME}" && chown sinewgrid "${DAGSTER_HOME}"
USER 10001

# The code version every lineage record carries (the image has no .git):
#   docker build --build-arg SINEWGRID_CODE_VERSION=$(git rev-parse HEAD) …
ARG SINEWGRID_CODE_VERSION=unknown
ENV SINEWGRID_CODE_VERSION=${SINEWGRID_CODE_VERSION}

# 3000: webserver; 3030: code server (`dagster api grpc -m <lane>.definitions`).
EXPOSE 3000 3030
