"""Gaussian ownership: each rank keeps one contiguous chunk of the N_all Gaussians.

DESIGN.md: a Gaussian lives on exactly one rank, with its parameters and optimizer state.
Chunks are contiguous so that concatenating the ranks' chunks in rank order gives back
the global array (checkpoints, exports and the W-invariance tests rely on that) and so
that packed pairs, sorted by local Gaussian id on every rank, come out in global id order
after the exchange.
"""

from __future__ import annotations

from typing import List, Mapping, Sequence, Tuple, TypeVar, Union, overload

from torch import Tensor

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
