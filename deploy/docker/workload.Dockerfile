# syntax=docker/dockerfile:1.7
# The `default` workload runtime for GPU pools: what a Kubernetes pool's `runtimes: {default: ...}`
# names (deploy/pools/*.yaml). A step runs in it as `python -m <entry_point>`, e.g.
# `python -m cell_lane.workloads.pretrain`; it talks back only through Dagster Pipes and the
# object store.
#
# Built by `make images` (deploy/docker/build.py), which fills build/wheelhouse with the wheels of
# exactly the versions the suite ran (`pip freeze` of .venv) and passes the base image. Two flavours:
# - GPU (the defaults): NVIDIA's CUDA base, Python 3.11 installed by uv (Ubuntu 24.04 ships 3.12),
#   and torch's CUDA build from PyTorch's index in place of the wheelhouse's CPU build:
#     podman build -f deploy/docker/workload.Dockerfile .
#   CUDA_VERSION picks the base and TORCH_CUDA the wheel; the two must name the same CUDA
#   (12.8.1 <-> cu128), PyTorch must publish TORCH_VERSION for it (https://download.pytorch.org/whl/torch/),
#   and the nodes' driver must support it (CUDA 12.8 needs driver 570 or newer).
# - CPU (what `make images` builds on a machine without a GPU or a reachable registry): a Debian
#   bookworm base with python3.11 and the wheelhouse's CPU torch:
#     --build-arg BASE_IMAGE=<that base> --build-arg PYTHON_FROM=base --build-arg TORCH_CUDA=
#
# The version arguments restate pins from pyproject.toml; tests/test_deploy.py fails when they drift.

ARG CUDA_VERSION=12.8.1
ARG UBUNTU_VERSION=24.04
ARG UV_VERSION=0.8.0
ARG BASE_IMAGE=nvidia/cuda:${CUDA_VERSION}-base-ubuntu${UBUNTU_VERSION}
# Where Python 3.11 comes from: `uv` installs it, or `base`: the base image's own python3.11.
ARG PYTHON_FROM=uv

FROM ghcr.io/astral-sh/uv:${UV_VERSION} AS uv

FROM ${BASE_IMAGE} AS python-uv
ARG PYTHON_VERSION=3.11
ENV UV_NO_CACHE=1 UV_PYTHON_INSTALL_DIR=/opt/python
COPY --from=uv /uv /usr/local/bin/uv
RUN uv python install "${PYTHON_VERSION}" && uv venv --seed --python "${PYTHON_VERSION}" /opt/venv

FROM ${BASE_IMAGE} AS python-base
ARG PYTHON_VERSION=3.11
RUN "python${PYTHON_VERSION}" -m venv /opt/venv

FROM python-${PYTHON_FROM}

ARG TORCH_VERSION=2.13.0
ARG TORCH_CUDA=cu128

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    MUJOCO_GL=egl

# EGL and OpenGL for MuJoCo's headless camera rendering (Mesa's EGL and software rasteriser on a CPU
# node; a GPU node also needs NVIDIA_DRIVER_CAPABILITIES to include `graphics`); OpenMP for torch;
# git for the data registry; Slurm's client, for a run started from this image that submits its
# steps to Slurm pools (the rehearsal's runs: docs/deploy.md; SLURM_CLIENT="" leaves it out).
ARG SLURM_CLIENT=slurm-client
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates git libegl1 libegl-mesa0 libgl1 libgl1-mesa-dri libgomp1 ${SLURM_CLIENT} \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/sinewgrid

# The dependencies in their own layer (it changes only when the lock does); on the GPU flavour,
# torch's CUDA build then replaces the CPU build the lock names.
# The lock is copied in first: the layer's cache key then changes with it (a bind mount's content
# is not part of the key, and an unchanged key would reuse the old dependencies).
COPY build/wheelhouse/requirements.lock /opt/requirements.lock
RUN --mount=type=bind,source=build/wheelhouse,target=/wheels \
    pip install --no-index --find-links /wheels -r /opt/requirements.lock \
    && if [ -n "${TORCH_CUDA}" ]; then \
      pip install --index-url "https://download.pytorch.org/whl/${TORCH_CUDA}" "torch==${TORCH_VERSION}+${TORCH_CUDA}"; fi

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
# The batch script a run renders for each step it sends to a Slurm pool (a run may start from this image).
COPY deploy/slurm ./deploy/slurm
RUN pip install --no-index --no-deps --no-build-isolation .

RUN useradd --uid 10001 --create-home sinewgrid
USER 10001

# The code version a step's lineage records: `make images` passes `workload@sha256:<digest>`.
ARG SINEWGRID_CODE_VERSION=unknown
ENV SINEWGRID_CODE_VERSION=${SINEWGRID_CODE_VERSION}
