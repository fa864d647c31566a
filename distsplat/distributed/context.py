"""Process layout: who am I, how many are we, which device and process group.

The first thing an entry point does (docs/design.md: one process per GPU under torchrun, or
one CPU process). `init_distributed()` reads torchrun's environment and returns one small
frozen `DistContext`; everything below takes the layout from it or from the default
process group. Without torchrun it returns a one-process context with no process group,
and every helper here returns the local value, so W=1 walks the same code as W>1.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from ..transfer import to_device
from . import staging

logger = logging.getLogger(__name__)

# A hung peer (a rank that crashed or took another branch) should fail the job in
# minutes, not hold every GPU for gloo's 30-minute default.
DEFAULT_TIMEOUT_S = 600.0
TIMEOUT_ENV = "DISTSPLAT_TIMEOUT_S"
# W ranks on one GPU over gloo, every collective staged through pinned host memory
# (staging.py): for correctness checks of the CUDA path on one lent GPU, never for speed.
SHARED_GPU_ENV = "DISTSPLAT_SHARED_GPU"
_shared_gpu_warned = False  # its warning is logged once per process


@dataclass(frozen=True)
class DistContext:
    """The process layout of this run, identical in shape on every rank."""

    rank: int  # global rank in [0, world_size)
    world_size: int  # W
    local_rank: int  # index of this process on its node (picks the GPU)
    device: torch.device  # where this rank's tensors live
    backend: Optional[str]  # 'nccl' or 'gloo'; None without a process group
    shared_gpu: bool = False  # W ranks share one GPU over gloo (correctness checks only)

    def __post_init__(self) -> None:
        if not (0 <= self.rank < self.world_size):
            raise ValueError(f"rank {self.rank} is outside [0, {self.world_size})")
        if self.local_rank < 0:
            raise ValueError(f"local_rank must be >= 0, got {self.local_rank}")

    @property
    def is_main(self) -> bool:
        """Rank 0 writes files and logs at INFO."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def _env_int(name: str, default: Optional[int] = None) -> int:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise ValueError(f"torchrun environment incomplete: {name} is not set")
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an int, got {value!r}") from None


def _shared_gpu_flag(shared_gpu: Optional[bool]) -> bool:
    if shared_gpu is not None:
        return bool(shared_gpu)
    value = os.environ.get(SHARED_GPU_ENV, "").strip()
    if value in ("", "0"):
        return False
    if value == "1":
        return True
    raise ValueError(f"environment variable {SHARED_GPU_ENV} must be 1 (several ranks share one "
                     f"GPU, for correctness checks) or 0, got {value!r}")


def _local_ranks(local_rank: int) -> int:
    """Ranks on this node: LOCAL_WORLD_SIZE (torchrun sets it), at least local_rank + 1."""
    return max(_env_int("LOCAL_WORLD_SIZE", 0), local_rank + 1)


def init_distributed(
    backend: Optional[str] = None,
    timeout_s: Optional[float] = None,
    device: Optional[torch.device] = None,
    shared_gpu: Optional[bool] = None,
) -> DistContext:
    """Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT
    (set by torchrun) and joins the default process group: 'nccl' when CUDA is available,
    'gloo' otherwise (`backend` overrides). Without WORLD_SIZE in the environment (plain
    `python`) it returns a one-process context and creates no process group.

    `shared_gpu` (default: $DISTSPLAT_SHARED_GPU == 1) puts every rank of the node on ONE
    GPU, cuda:(local_rank % device_count), with a gloo group whose collectives are staged
    through pinned host memory: for checking the CUDA path with W ranks on one GPU, e.g.
    `DISTSPLAT_SHARED_GPU=1 torchrun --standalone --nproc_per_node=2 ...`; its speed must
    never be reported. Without it, more ranks on a node than GPUs with nccl is a
    ValueError raised before joining the group (NCCL refuses two ranks on one GPU).

    `timeout_s` bounds every collective (default: $DISTSPLAT_TIMEOUT_S or 600 s), so a
    rank that died or diverged turns into an error on its peers instead of a hang. The
    group's store keys live under torchrun's attempt (TORCHELASTIC_RESTART_COUNT), so the
    workers torchrun restarts after a rank died never meet the dead attempt's addresses.
    Calling it again in a process whose group exists returns the same layout."""
    if timeout_s is None:
        timeout_s = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if "WORLD_SIZE" not in os.environ and not dist.is_initialized():
        if device is None:
            device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        return DistContext(rank=0, world_size=1, local_rank=0, device=device, backend=None)

    rank = _env_int("RANK", 0)
    world_size = _env_int("WORLD_SIZE")
    local_rank = _env_int("LOCAL_RANK", 0)
    shared = _shared_gpu_flag(shared_gpu)
    if shared:
        backend, device = _shared_gpu_layout(backend, device, local_rank)
    else:
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend not in ("nccl", "gloo"):
            raise ValueError(f"backend must be 'nccl' or 'gloo', got {backend!r}")
        if backend == "nccl":
            _check_gpus_per_node(local_rank)
        if device is None:
            device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if dist.is_initialized():
        backend = dist.get_backend()
    else:
        dist.init_process_group(
            backend=backend, rank=rank, world_size=world_size,
            timeout=timedelta(seconds=timeout_s), store=_attempt_store(rank, world_size, timeout_s),
        )
    staging.set_shared_device(device if shared else None)
    ctx = DistContext(rank=rank, world_size=world_size, local_rank=local_rank,
                      device=device, backend=backend, shared_gpu=shared)
    global _shared_gpu_warned
    if shared and rank == 0 and not _shared_gpu_warned:
        _shared_gpu_warned = True
        logger.warning(
            "shared-GPU mode (%s=1): %d ranks share %s over gloo, every collective staged "
            "through host memory. For correctness checks only: never report its speed.",
            SHARED_GPU_ENV, world_size, device)
    logger.info("joined process group: %s", ctx)
    return ctx


def _attempt_store(rank: int, world_size: int, timeout_s: float) -> Optional[dist.Store]:
    """Under torchrun, the env:// store (torchrun's agent store, or rank 0's) with its keys under
    this attempt's prefix: torchrun's restarts (--max_restarts) keep the agent's store and
    init_process_group uses the same keys every attempt, so a restarted rank could read a dead
    rank's address (gloo: "connectFullMesh failed ... Connection refused") or NCCL id from the
    attempt before. None elsewhere: init_process_group's own env:// store."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None:
        return None
    store, _, _ = next(dist.rendezvous("env://", rank, world_size, timeout=timedelta(seconds=timeout_s)))
    store.set_timeout(timedelta(seconds=timeout_s))
    return dist.PrefixStore(f"distsplat/attempt_{attempt}", store)


def _check_gpus_per_node(local_rank: int) -> None:
    n_local, n_gpus = _local_ranks(local_rank), torch.cuda.device_count()
    if n_gpus == 0:
        raise ValueError("backend 'nccl' needs CUDA devices and none is visible; use backend "
                         "'gloo' (the default without CUDA)")
    if n_local > n_gpus:
        raise ValueError(
            f"{n_local} ranks on this node (LOCAL_WORLD_SIZE / LOCAL_RANK) but "
            f"{n_gpus} CUDA devices visible, and NCCL refuses two ranks on one GPU. Launch at "
            f"most {n_gpus} ranks per node (torchrun --nproc_per_node={n_gpus}), or, for "
            f"correctness checks only, set {SHARED_GPU_ENV}=1 to run them all on one GPU over gloo"
        )


def _shared_gpu_layout(
    backend: Optional[str], device: Optional[torch.device], local_rank: int
) -> Tuple[str, torch.device]:
    """(backend, device) of shared-GPU mode, or a ValueError saying why it cannot run."""
    if backend not in (None, "gloo"):
        raise ValueError(f"shared-GPU mode ({SHARED_GPU_ENV}=1) runs over gloo; got "
                         f"backend={backend!r}. Unset {SHARED_GPU_ENV} to use {backend}")
    if not torch.cuda.is_available():
        raise ValueError(f"{SHARED_GPU_ENV}=1 shares one GPU between ranks, but no CUDA device "
                         "is visible; unset it to run the ranks on the CPU")
    if device is None:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
    if device.type != "cuda":
        raise ValueError(f"shared-GPU mode ({SHARED_GPU_ENV}=1) needs a CUDA device, got {device}")
    return "gloo", device


def destroy(ctx: Optional[DistContext] = None) -> None:
    """Leaves the process group (entry points call this in `finally`); no-op without one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    staging.set_shared_device(None)


def world_size(group: Optional[dist.ProcessGroup] = None) -> int:
    """W of `group` (default group), 1 without a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def rank(group: Optional[dist.ProcessGroup] = None) -> int:
    """This process's rank in `group`, 0 without a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    return dist.get_rank(group)


def _all_reduce(x: Tensor, op: dist.ReduceOp, group: Optional[dist.ProcessGroup]) -> Tensor:
    """Reduction of `x` over ranks as a new tensor (`x` is untouched); `x` itself at W=1.
    Shared-GPU mode: reduced in host memory (one counted sync), back on x's device."""
    if world_size(group) == 1:
        return x
    if staging.staged(group):
        host = staging.to_host(x)
        dist.all_reduce(host, op=op, group=group)
        return to_device(host, x.device)
    out = x.detach().clone()
    dist.all_reduce(out, op=op, group=group)
    return out


def all_reduce_sum(x: Tensor, group: Optional[dist.ProcessGroup] = None) -> Tensor:
    """Sum of `x` over ranks as a new tensor (`x` is untouched); `x` itself at W=1."""
    return _all_reduce(x, dist.ReduceOp.SUM, group)


def all_reduce_max(x: Tensor, group: Optional[dist.ProcessGroup] = None) -> Tensor:
    """Elementwise max over ranks as a new tensor; `x` itself at W=1."""
    return _all_reduce(x, dist.ReduceOp.MAX, group)


def broadcast(x: Tensor, src: int = 0, group: Optional[dist.ProcessGroup] = None) -> Tensor:
    """Rank `src`'s `x` on every rank, written into `x` in place and returned; `x`
    itself at W=1 (the viewer's per-poll message is the one user)."""
    if world_size(group) > 1:
        if staging.staged(group):  # shared-GPU mode: through host memory (one counted sync)
            host = staging.to_host(x)
            dist.broadcast(host, src=src, group=group)
            x.copy_(host, non_blocking=True)  # pinned source: asynchronous
        else:
            dist.broadcast(x, src=src, group=group)
    return x


def barrier(group: Optional[dist.ProcessGroup] = None) -> None:
    """Waits for every rank; no-op at W=1."""
    if world_size(group) > 1:
        dist.barrier(group=group)


class _RankFilter(logging.Filter):
    def __init__(self, rank: int):
        super().__init__()
        self.prefix = f"[rank {rank}] "

    def filter(self, record: logging.LogRecord) -> bool:
        # A warning every rank raises alike (e.g. the data layer's, from files all ranks read,
        # logged with extra={"same_on_every_rank": True}) is rank 0's to print, once.
        if getattr(record, "same_on_every_rank", False):
            return False
        if not str(record.msg).startswith(self.prefix):
            record.msg = self.prefix + str(record.msg)
        return True


def setup_logging(ctx: DistContext, level: int = logging.INFO) -> None:
    """Rank 0 logs at `level`, other ranks at WARNING with a `[rank r]` prefix
    (CONVENTIONS.md 8), so W processes do not print W copies of every line."""
    root = logging.getLogger("distsplat")
    root.setLevel(level if ctx.is_main else max(level, logging.WARNING))
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    if not ctx.is_main:
        for handler in root.handlers:
            if not any(isinstance(f, _RankFilter) for f in handler.filters):
                handler.addFilter(_RankFilter(ctx.rank))
