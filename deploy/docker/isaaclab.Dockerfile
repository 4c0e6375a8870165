# syntax=docker/dockerfile:1.7
# The `isaaclab` workload runtime: Isaac Lab rollouts for the Robotics lane, what a Kubernetes
# pool's `runtimes: {isaaclab: ...}` names (deploy/pools/*.yaml). It is the container form of
# mk/isaaclab.mk: Python 3.12 (Isaac Lab 3.0 supports no other), isaaclab and the workload
# packages that file installs, and the repository's source on PYTHONPATH; the main project is not
# installed here, as in the venv.
#
# Build from the repository root:
#   docker build -f deploy/docker/isaaclab.Dockerfile -t ghcr.io/sinewgrid/isaaclab:3.0.0 .
#
# CUDA_VERSION picks the base image; the nodes' NVIDIA driver must support it.
# ISAACLAB_VERSION and ISAACLAB_WORKLOAD_PACKAGES restate mk/isaaclab.mk; tests/test_deploy.py
# fails when they drift.

ARG CUDA_VERSION=12.8.1
ARG UBUNTU_VERSION=24.04
ARG UV_VERSION=0.8.0

FROM ghcr.io/astral-sh/uv:${UV_VERSION} AS uv

FROM nvidia/cuda:${CUDA_VERSION}-base-ubuntu${UBUNTU_VERSION}

ARG PYTHON_VERSION=3.12
ARG ISAACLAB_VERSION=3.0.0
# The same list as mk/isaaclab.mk (s3fs: the production storage root is s3://).
ARG ISAACLAB_WORKLOAD_PACKAGES="dagster-pipes==1.13.27 pydantic safetensors fsspec s3fs pyarrow pandas numpy cryptography aws-encryption-sdk==4.0.7 boto3 av==18.1.0"

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    UV_NO_CACHE=1 \
    UV_PYTHON_INSTALL_DIR=/opt/python \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/opt/sinewgrid

# OpenGL, EGL and GLib for the simulator's headless renderer; OpenMP for the CPU side.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libegl1 libgl1 libglib2.0-0 libgomp1 \
    && rm -rf /var/lib/apt/lists/*

COPY --from=uv /uv /usr/local/bin/uv
RUN uv python install "${PYTHON_VERSION}" && uv venv --python "${PYTHON_VERSION}" /opt/venv

# Several GB; if Isaac Lab pulls in Isaac Sim, accepting NVIDIA's EULA is yours to do at run time.
RUN uv pip install "isaaclab==${ISAACLAB_VERSION}" ${ISAACLAB_WORKLOAD_PACKAGES}

# The workloads import the repository's packages from the working directory (PYTHONPATH above).
WORKDIR /opt/sinewgrid
COPY workload_runtime ./workload_runtime
COPY robotics_lane ./robotics_lane

RUN useradd --uid 10001 --create-home sinewgrid
USER 10001
