"""Shared-seed camera batches and the fixed camera -> owner rank assignment.

DESIGN.md: every rank holds all cameras and draws the same batch each step from a shared
seed, so no camera crosses the wire; each camera is owned by one rank, the only one that
rasterizes it and reads its image. Ownership is fixed for the run (a seeded permutation
cut into W near-equal contiguous shards), so rank r's image loader only ever touches its
own shard. Each step takes k cameras from every shard, rank-major, so the batch's
`camera_owner` is simply [0]*k + [1]*k + ... and `distributed_rasterize` can be fed
directly. Nothing here depends on the local rank or the node: every process of a
multi-node job computes the same sequence.

Epochs. Shards differ in size by at most one camera. An epoch is
ceil(max_shard / k) steps; in each epoch every shard is visited in a fresh seeded order,
and a shard whose order runs out (the smaller shards, or a last partial batch) wraps
around to the start of the same epoch's order. So every camera is rendered at least once
per epoch, at most one camera-slot per shard and epoch is a repeat, and every step has
exactly W*k cameras (a constant global batch, as gsplat's `--batch_size`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from .partition import chunk_bounds

logger = logging.getLogger(__name__)

_OWNER_STREAM = 0  # seed-sequence keys: ownership and per-epoch orders never share a stream
_EPOCH_STREAM = 1


@dataclass(frozen=True)
class CameraBatch:
    """One step's global batch, identical on every rank."""

    cameras: Tensor  # [W*k] int64 camera indices into the dataset, rank-major
    camera_owner: Tensor  # [W*k] int64 owner rank of each batch camera (non-decreasing)
    epoch: int
    step: int  # step index within the epoch
    # The same values on the host, as the batcher drew them (a step's bookkeeping reads
    # these, not the tensors); None for a batch built from tensors alone.
    index: Optional[np.ndarray] = field(default=None, compare=False, repr=False)  # [W*k] int64
    owners: Optional[Tuple[int, ...]] = field(default=None, compare=False, repr=False)  # [W*k]

    def host_cameras(self) -> np.ndarray:
        """[W*k] int64 `cameras` as a numpy array."""
        return self.index if self.index is not None else self.cameras.numpy()

    def host_owners(self) -> Tuple[int, ...]:
        """[W*k] `camera_owner` as Python ints (what distributed_rasterize takes for free)."""
        return self.owners if self.owners is not None else tuple(self.camera_owner.tolist())

    def own(self, rank: int) -> Tensor:
        """Positions in the batch of the cameras `rank` renders, in batch order."""
        return (self.camera_owner == rank).nonzero()[:, 0]


class CameraBatcher:
    """Iterates over `CameraBatch`es forever; construct it with the same arguments on
    every rank. `state_dict()` after n batches + `load_state_dict()` on a fresh batcher
    continues with batch n+1."""

    def __init__(self, num_cameras: int, world_size: int, cameras_per_rank: int = 1, seed: int = 0):
        for name, v, lo in (("num_cameras", num_cameras, 1), ("world_size", world_size, 1),
                            ("cameras_per_rank", cameras_per_rank, 1), ("seed", seed, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"CameraBatcher: `{name}` must be an int >= {lo}, got {v!r}")
        if num_cameras < world_size * cameras_per_rank:
            raise ValueError(
                f"CameraBatcher: {num_cameras} cameras cannot give each of {world_size} ranks "
                f"{cameras_per_rank} distinct cameras per step (the smallest shard holds "
                f"{num_cameras // world_size}); lower cameras_per_rank or world_size"
            )
        self.num_cameras = num_cameras
        self.world_size = world_size
        self.cameras_per_rank = cameras_per_rank
        self.seed = seed
        perm = np.random.default_rng((seed, _OWNER_STREAM)).permutation(num_cameras)
        self._shards: List[np.ndarray] = [
            np.sort(perm[a:b]) for a, b in chunk_bounds(num_cameras, world_size)
        ]
        owner = np.empty(num_cameras, dtype=np.int64)
        for r, shard in enumerate(self._shards):
            owner[shard] = r
        self.owner = torch.from_numpy(owner)  # [num_cameras] int64, fixed for the run
        self.steps_per_epoch = math.ceil(max(len(s) for s in self._shards) / cameras_per_rank)
        self.epoch = 0
        self.step = 0  # next step within self.epoch
        self._orders: Tuple[int, List[np.ndarray]] = (-1, [])

    def own_cameras(self, rank: int) -> Tensor:
        """The dataset cameras `rank` owns for the whole run (ascending): the only images
        its loader needs."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"CameraBatcher: rank must be in [0, {self.world_size}), got {rank}")
        return torch.from_numpy(self._shards[rank].copy())

    def _epoch_orders(self, epoch: int) -> List[np.ndarray]:
        if self._orders[0] != epoch:
            self._orders = (epoch, [
                shard[np.random.default_rng((self.seed, _EPOCH_STREAM, epoch, r)).permutation(len(shard))]
                for r, shard in enumerate(self._shards)
            ])
        return self._orders[1]

    def _slots(self, epoch: int, step: int) -> Tuple[List[np.ndarray], np.ndarray]:
        """(every shard's order in `epoch`, the k slots of `step` in each): a shard's cameras
        of the batch are order[slots % len(order)] (a short shard wraps around)."""
        if not 0 <= step < self.steps_per_epoch or epoch < 0:
            raise ValueError(
                f"CameraBatcher: need epoch >= 0 and 0 <= step < {self.steps_per_epoch}, "
                f"got epoch={epoch}, step={step}"
            )
        k = self.cameras_per_rank
        return self._epoch_orders(epoch), np.arange(step * k, (step + 1) * k)

    def batch(self, epoch: int, step: int) -> CameraBatch:
        """The batch of (epoch, step), a pure function of the constructor arguments."""
        orders, slots = self._slots(epoch, step)
        cameras = np.concatenate([order[slots % len(order)] for order in orders]).astype(np.int64)
        owner = np.repeat(np.arange(self.world_size, dtype=np.int64), self.cameras_per_rank)
        return CameraBatch(torch.from_numpy(cameras), torch.from_numpy(owner), epoch, step,
                           index=cameras, owners=tuple(owner.tolist()))

    def own_batch(self, epoch: int, step: int, rank: int) -> List[int]:
        """`rank`'s cameras of batch (epoch, step), in batch order: the same as
        `batch(epoch, step)`'s cameras[own(rank)], without building the batch (the image
        loader asks this every step, on the host path of a GPU step)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"CameraBatcher: need 0 <= rank < {self.world_size}, got rank={rank}")
        orders, slots = self._slots(epoch, step)
        order = orders[rank]
        return order[slots % len(order)].tolist()

    def __iter__(self) -> Iterator[CameraBatch]:
        return self

    def __next__(self) -> CameraBatch:
        out = self.batch(self.epoch, self.step)
        self.step += 1
        if self.step == self.steps_per_epoch:
            self.epoch, self.step = self.epoch + 1, 0
        return out

    def state_dict(self) -> Dict[str, Any]:
        return {
            "num_cameras": self.num_cameras, "world_size": self.world_size,
            "cameras_per_rank": self.cameras_per_rank, "seed": self.seed,
            "epoch": self.epoch, "step": self.step,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes at the saved position. The seed and camera count must match (else the
        ownership and every batch would change silently). With another world size or
        cameras_per_rank a step index means nothing, so it resumes at the start of the
        next epoch."""
        for key in ("num_cameras", "seed"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"CameraBatcher.load_state_dict: saved {key}={state[key]} but this "
                    f"batcher has {key}={getattr(self, key)}"
                )
        if (state["world_size"], state["cameras_per_rank"]) == (self.world_size, self.cameras_per_rank):
            self.epoch, self.step = int(state["epoch"]), int(state["step"])
            return
        self.epoch, self.step = int(state["epoch"]) + (1 if state["step"] > 0 else 0), 0
        logger.warning(
            "CameraBatcher: resuming a run saved with world_size=%d, cameras_per_rank=%d on "
            "world_size=%d, cameras_per_rank=%d: starting at the beginning of epoch %d",
            state["world_size"], state["cameras_per_rank"], self.world_size,
            self.cameras_per_rank, self.epoch, extra={"same_on_every_rank": True},  # rank 0 says it, once
        )
