"""Flatten torch training state (model, optimizer, RNG) into safetensors-ready tensors.

Workload side only: imports torch, never Dagster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from workload_runtime.checkpoints import Checkpoint


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Per-parameter optimizer state as flat tensors (`<param index>.<name>`)."""
    state = optimizer.state_dict()["state"]
    flat = {}
    for index, values in state.items():
        for name, value in values.items():
            tensor = value if torch.is_tensor(value) else torch.tensor(value)
            flat[f"{index}.{name}"] = tensor.detach().clone()
    return flat


def load_optimizer_tensors(optimizer: torch.optim.Optimizer, flat: dict[str, torch.Tensor]) -> None:
    state_dict = optimizer.state_dict()
    restored: dict[int, dict[str, torch.Tensor]] = {}
    for key, tensor in flat.items():
        index, name = key.split(".", 1)
        restored.setdefault(int(index), {})[name] = tensor
    state_dict["state"] = restored
    optimizer.load_state_dict(state_dict)


def rng_tensors(generator: torch.Generator) -> dict[str, torch.Tensor]:
    return {"generator": generator.get_state(), "torch_global": torch.get_rng_state()}


def load_rng_tensors(generator: torch.Generator, flat: dict[str, torch.Tensor]) -> None:
    generator.set_state(flat["generator"])
    torch.set_rng_state(flat["torch_global"])


def training_files(model_key: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, generator: torch.Generator) -> dict[str, dict[str, torch.Tensor]]:
    """Everything a resumed run needs to continue bit for bit: weights (under `model_key`),
    optimizer state and RNG state, one safetensors file each."""
    return {model_key: model.state_dict(), "optimizer": optimizer_tensors(optimizer), "rng": rng_tensors(generator)}


def restore_training(files: dict[str, dict[str, torch.Tensor]], model_key: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, generator: torch.Generator) -> None:
    """Load what `training_files` saved back into the model, optimizer and generator."""
    model.load_state_dict(files[model_key])
    load_optimizer_tensors(optimizer, files["optimizer"])
    load_rng_tensors(generator, files["rng"])


def seeded_torch(threads: int, seed: int) -> torch.Generator:
    """Fix torch's thread count and global seed (one thread keeps CPU runs bit for bit the same
    across resumes), and return a generator of the run's own, seeded alike, for its batches."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def pick_device(requested: str = "auto") -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, generator: torch.Generator) -> dict[str, Any]:
    """The training state as a `torch.distributed.checkpoint` state dict: parameter names without
    DDP's `module.` prefix, so one process and a gang of any size read and write the same keys.
    A fresh optimizer gets its (zero) state first, so that a load has somewhere to put it."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state, "rng": rng_tensors(generator)}


def restore_sharded(state: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer, generator: torch.Generator) -> None:
    """Load what `sharded_state` gave (filled in by `sharded.load_sharded`) back into training."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    load_rng_tensors(generator, state["rng"])


def resume_training(checkpoint: Checkpoint | None, model_key: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, generator: torch.Generator) -> int:
    """Load a checkpoint's training state into the model, optimizer and generator, whichever way it
    was written (sharded by a gang or one process, or safetensors files under `model_key`), and
    return the step to go on from: the checkpoint's, or 0 without one."""
    if checkpoint is None:
        return 0
    if checkpoint.sharded:
        from workload_runtime.sharded import load_sharded

        state = sharded_state(model, optimizer, generator)
        load_sharded(checkpoint, state)
        restore_sharded(state, model, optimizer, generator)
    else:  # written by one process as safetensors
        restore_training(checkpoint.tensors, model_key, model, optimizer, generator)
    return checkpoint.step
