# syntax=docker/dockerfile:1.7
# The `default` workload runtime for GPU pools: what a Kubernetes pool's `runtimes: {default: ...}`
# names (deploy/pools/*.yaml). A step runs in it as `python -m <entry_point>`, e.g.
# `python -m cell_lane.workloads.pretrain`; it talks back only through Dagster Pipes and the
# object store.
#
# Build from the repository root:
#   docker build -f deploy/docker/workload.Dockerfile -t ghcr.io/sinewgrid/workload:0.1.0 .
#
# CUDA version: CUDA_VERSION picks the base image and TORCH_CUDA the PyTorch wheel index; the two
# must name the same CUDA major.minor (12.8.1 <-> cu128), the index must publish TORCH_VERSION for
# that CUDA (see https://download.pytorch.org/whl/torch/), and the nodes' NVIDIA driver must
# support it (CUDA 12.8 needs driver 570 or newer). For example, for CUDA 12.6:
#   docker build --build-arg CUDA_VERSION=12.6.3 --build-arg TORCH_CUDA=cu126 -f deploy/docker/workload.Dockerfile .
#
# The version arguments restate pins from pyproject.toml; tests/test_deploy.py fails when they drift.

ARG CUDA_VERSION=12.8.1
ARG UBUNTU_VERSION=24.04
ARG UV_VERSION=0.8.0

FROM ghcr.io/astral-sh/uv:${UV_VERSION} AS uv

# The `base` flavour is enough: torch's CUDA wheels carry their own CUDA and cuDNN libraries; the
# image supplies the NVIDIA container runtime settings and states the CUDA version it expects.
FROM nvidia/cuda:${CUDA_VERSION}-base-ubuntu${UBUNTU_VERSION}

ARG PYTHON_VERSION=3.11
ARG TORCH_VERSION=2.13.0
ARG TORCH_CUDA=cu128

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    UV_NO_CACHE=1 \
    UV_PYTHON_INSTALL_DIR=/opt/python \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    MUJOCO_GL=egl

# EGL and OpenGL for MuJoCo's headless camera rendering (Mesa's EGL and software rasteriser on a CPU
# node; a GPU node also needs NVIDIA_DRIVER_CAPABILITIES to include `graphics`); OpenMP for torch.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libegl1 libegl-mesa0 libgl1 libgl1-mesa-dri libgomp1 \
    && rm -rf /var/lib/apt/lists/*

# Ubuntu 24.04 ships Python 3.12; the project is built and tested on 3.11, which uv installs.
COPY --from=uv /uv /usr/local/bin/uv
RUN uv python install "${PYTHON_VERSION}" && uv venv --python "${PYTHON_VERSION}" /opt/venv

WORKDIR /opt/sinewgrid

# torch first, from the CUDA index: the project's `torch==2.13.0` is then already satisfied.
RUN uv pip install --index-url "https://download.pytorch.org/whl/${TORCH_CUDA}" "torch==${TORCH_VERSION}"

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
RUN uv pip install .

RUN useradd --uid 10001 --create-home sinewgrid
USER 10001
