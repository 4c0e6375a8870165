"""The Cell workloads' configs: one model each, read by the workload and shown in the launchpad.

`PretrainSettings` / `FinetuneSettings` are what a scientist may change (the training assets'
launchpad configs are built on them); `PretrainConfig` / `FinetuneConfig` add what the asset
decides (which dataset, which foundation checkpoint, where predictions go) and are what the
workload validates when it starts. No Dagster here: workloads import this module.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field

from workload_runtime.setting_ranges import RangedSettings

Positive = Annotated[int, Field(ge=1)]
Rate = Annotated[float, Field(gt=0)]


class PretrainSettings(RangedSettings):
    """Masked-expression pretraining of the foundation model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: Positive = Field(400, description="Optimiser steps.")
    batch_size: Positive = Field(64, description="Cells per step.")
    mask_fraction: Annotated[float, Field(gt=0, lt=1)] = Field(0.15, description="Share of each cell's genes hidden and predicted back.")
    embedding_dim: Positive = Field(32, description="Size of each gene's embedding.")
    learning_rate: Rate = Field(2e-3, description="Adam learning rate.")
    seed: int = Field(0, description="Seeds the batches and masks: the same seed gives the same model.")


class PretrainConfig(PretrainSettings):
    """What the pretraining workload runs: the settings and the dataset the asset chose."""

    @classmethod
    def of(cls, settings: PretrainSettings, **decided: object) -> PretrainConfig:
        return cls(**settings.model_dump(include=set(PretrainSettings.model_fields)), **decided)

    dataset_uri: str = Field(description="The omics dataset version (AnnData on zarr).")
    hidden: Positive = 128
    threads: Positive = Field(1, description="Torch threads: one keeps CPU runs bit-for-bit reproducible across resumes.")
    device: str = Field("auto", description="`auto` (CUDA when there is one), `cpu` or `cuda`.")


class FinetuneSettings(RangedSettings):
    """K-fold fine-tuning of effect heads on the foundation's gene embeddings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    folds: Annotated[int, Field(ge=2)] = Field(5, description="K of the K-fold split of assayed genes (at least 2).")
    steps_per_fold: Positive = Field(300, description="Optimiser steps per fold.")
    learning_rate: Rate = Field(3e-3, description="Adam learning rate of the effect head.")
    seed: int = Field(0, description="Seeds the fold split and the heads.")


class FinetuneConfig(FinetuneSettings):
    """What the fine-tune workload runs: the settings, its inputs and where predictions go."""

    @classmethod
    def of(cls, settings: FinetuneSettings, **decided: object) -> FinetuneConfig:
        return cls(**settings.model_dump(include=set(FinetuneSettings.model_fields)), **decided)

    dataset_uri: str
    foundation_checkpoint_uri: str
    predictions_uri: str
    embedding_learning_rate: Rate = 3e-4
    hidden: Positive = 32
    threads: Positive = 1
