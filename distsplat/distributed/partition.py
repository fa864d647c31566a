"""Gaussian ownership: each rank keeps one contiguous chunk of the N_all Gaussians.

docs/design.md: a Gaussian lives on exactly one rank, with its parameters and optimizer state.
Chunks are contiguous so that concatenating the ranks' chunks in rank order gives back
the global array (checkpoints, exports and the W-invariance tests rely on that) and so
that packed pairs, sorted by local Gaussian id on every rank, come out in global id order
after the exchange.
"""

from __future__ import annotations

import math
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union, overload

import torch
import torch.distributed as dist
from torch import Tensor

from .context import all_reduce_sum, rank, world_size
from .exchange import exchange_rows

T = TypeVar("T")


def _check_layout(n_all: int, world_size: int) -> None:
    for name, v in (("N_all", n_all), ("world_size", world_size)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{name} must be an int, got {v!r}")
    if n_all < 0:
        raise ValueError(f"N_all must be >= 0, got {n_all}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")


def chunk_bounds(n_all: int, world_size: int) -> List[Tuple[int, int]]:
    """[(start, end)] of W near-equal contiguous chunks covering range(n_all): the first
    n_all % W chunks hold one more element. Chunks may be empty when n_all < W."""
    _check_layout(n_all, world_size)
    base, extra = divmod(n_all, world_size)
    bounds, start = [], 0
    for r in range(world_size):
        end = start + base + (1 if r < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


Tensors = Union[Mapping[str, Tensor], Sequence[Tensor], Tensor]


@overload
def local_chunk(tensors: Tensor, rank: int, world_size: int) -> Tensor: ...
@overload
def local_chunk(tensors: Mapping[str, Tensor], rank: int, world_size: int) -> dict: ...
@overload
def local_chunk(tensors: Sequence[Tensor], rank: int, world_size: int) -> list: ...


def local_chunk(tensors: Tensors, rank: int, world_size: int):
    """Rank `rank`'s chunk (dim 0) of a tensor, a dict of tensors or a list of tensors
    that all hold the same N_all rows, e.g. an initial point cloud. The slices are views;
    clone them if the global arrays should be freed."""
    if isinstance(tensors, Tensor):
        items, kind = [("", tensors)], "tensor"
    elif isinstance(tensors, Mapping):
        items, kind = list(tensors.items()), "dict"
    else:
        items, kind = list(enumerate(tensors)), "list"
    if not items:
        raise ValueError("local_chunk: nothing to split")
    n_all = items[0][1].shape[0]
    for key, t in items:
        if t.shape[0] != n_all:
            raise ValueError(
                f"local_chunk: every tensor must have the same number of rows; "
                f"{key!r} has {t.shape[0]}, the first has {n_all}"
            )
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"local_chunk: rank must be an int in [0, {world_size}), got {rank!r}")
    start, end = chunk_bounds(n_all, world_size)[rank]
    chunks = [(key, t[start:end]) for key, t in items]
    if kind == "tensor":
        return chunks[0][1]
    if kind == "dict":
        return dict(chunks)
    return [t for _, t in chunks]


def gather_counts(n_local: int, device: torch.device, group: Optional[dist.ProcessGroup] = None) -> List[int]:
    """[W] Gaussians held by every rank: one all-reduce, one host transfer."""
    W, me = world_size(group), rank(group)
    v = torch.zeros(W, dtype=torch.int64, device=device)
    v[me] = n_local
    return all_reduce_sum(v, group).tolist()


def move_rows(
    rows: Dict[str, Tensor],  # name -> [N_local, ...] this rank's rows, all float
    counts: List[int],  # [W] rows held by every rank now (gather_counts)
    target: List[Tuple[int, int]],  # [W] global (start, end) each rank should hold
    group: Optional[dist.ProcessGroup] = None,
) -> Dict[str, Tensor]:
    """Re-chunks rows that are contiguous in rank order so rank r holds global rows
    target[r] (rebalancing after densification). Every tensor travels in ONE packed
    payload: one all-to-all; global order is kept."""
    W, me = world_size(group), rank(group)
    starts = [sum(counts[:r]) for r in range(W)]

    def overlap(a: Tuple[int, int], b: Tuple[int, int]) -> int:
        return max(0, min(a[1], b[1]) - max(a[0], b[0]))

    mine = (starts[me], starts[me] + counts[me])
    send = [overlap(mine, target[r]) for r in range(W)]
    recv = [overlap((starts[r], starts[r] + counts[r]), target[me]) for r in range(W)]
    names = list(rows)
    # Explicit widths: a rank may hold no rows, and reshape(0, -1) is ambiguous.
    flat = [rows[k].reshape(counts[me], math.prod(rows[k].shape[1:])) for k in names]  # [N_local, F_k]
    widths = [f.shape[1] for f in flat]
    dtype = flat[0].dtype if flat else torch.float32
    payload = torch.cat([f.to(dtype) for f in flat], dim=1)  # [N_local, F]
    received = exchange_rows(payload, send, recv, group)  # [N_target, F] in global order
    n_new = target[me][1] - target[me][0]
    # Each tensor contiguous, in storage of its own: the columns of `received` are strided views,
    # and torch's fused Adam updates a parameter and its moments as if they were contiguous
    # (on views of one buffer it writes over the neighbouring columns: NaN after a rebalance).
    return {
        k: part.reshape((n_new,) + tuple(rows[k].shape[1:])).to(rows[k].dtype, memory_format=torch.contiguous_format,
                                                                copy=True)
        for k, part in zip(names, torch.split(received, widths, dim=1))
    }
