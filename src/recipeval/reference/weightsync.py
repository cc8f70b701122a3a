"""Weights from the trainer (rank 0) to the rollout worker (rank 1) through torch.distributed:
one broadcast per tensor of the state dict, in the state dict's order, which both sides build
from the same model config. NCCL between GPUs, gloo on CPU. The group has a timeout, so a
collective whose peer is gone fails instead of waiting for ever."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

TRAINER_RANK = 0
ROLLOUT_RANK = 1
WORLD_SIZE = 2


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def join_group(rendezvous: Path, rank: int, device: torch.device, timeout_s: float) -> None:
    """Join the two-process group through a rendezvous file neither process has opened yet
    (no port to pick, nothing left listening)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend=backend_for(device),
        init_method=rendezvous.resolve().as_uri(),
        rank=rank,
        world_size=WORLD_SIZE,
        timeout=timedelta(seconds=timeout_s),
    )


def leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


Layout = list[tuple[str, tuple[int, ...], str]]


def check_layout(names_and_shapes: Layout) -> None:
    """Both ranks call this once: the rollout worker raises when its tensors are not the
    trainer's (every later broadcast pairs tensors by position)."""
    sent = [names_and_shapes if dist.get_rank() == TRAINER_RANK else None]
    dist.broadcast_object_list(sent, src=TRAINER_RANK)
    if sent[0] != names_and_shapes:
        raise RuntimeError(
            "the rollout worker's model does not match the trainer's: "
            f"{len(names_and_shapes)} tensors here, {len(sent[0] or [])} in the trainer"
        )


def layout(state: dict[str, torch.Tensor]) -> Layout:
    """Name, shape and dtype of each tensor, in the order the broadcasts pair them."""
    return [(name, tuple(tensor.shape), str(tensor.dtype)) for name, tensor in state.items()]


def send_weights(tensors: Iterable[torch.Tensor]) -> None:
    """Trainer side: broadcast each tensor as it is (float32 master weights)."""
    for tensor in tensors:
        dist.broadcast(tensor.detach().contiguous(), src=TRAINER_RANK)


def receive_weights(buffers: Iterable[torch.Tensor]) -> None:
    """Rollout side: receive into buffers shaped and typed as the trainer's tensors."""
    for buffer in buffers:
        dist.broadcast(buffer, src=TRAINER_RANK)
