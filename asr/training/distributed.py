"""One process or several (torchrun): which rank this is and which device it trains on."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device_kind: str) -> Distributed:
    """Join the process group torchrun describes in the environment, if any (nccl on GPUs, gloo on CPU)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return Distributed()
    backend = "nccl" if device_kind == "cuda" else "gloo"
    dist.init_process_group(backend=backend)
    return Distributed(rank=dist.get_rank(), world_size=world_size, local_rank=int(os.environ.get("LOCAL_RANK", 0)))


def all_agree(value: bool, device: torch.device) -> bool:
    """True when ``value`` is True on every rank of the process group (one all-reduce)."""
    flag = torch.tensor(float(value), device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def all_max(value: float, device: torch.device) -> float:
    """The largest ``value`` over the ranks of the process group (one all-reduce)."""
    number = torch.tensor(float(value), dtype=torch.float64, device=device)
    dist.all_reduce(number, op=dist.ReduceOp.MAX)
    return float(number.item())


def device_kind(requested: str) -> str:
    """``cuda`` or ``cpu``: what ``train.device`` (``auto``, ``cpu``, ``cuda``, ``cuda:1``) resolves to."""
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if requested.startswith("cuda") else "cpu"


def resolve_device(name: str, local_rank: int) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        return torch.device("cuda", local_rank)
    return torch.device(name)
