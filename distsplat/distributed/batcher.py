"""Shared-seed camera batches and the fixed camera -> owner rank assignment.

docs/design.md: every rank holds all cameras and draws the same batch each step from a shared
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

Cost-balanced epochs (issue 33). A synchronous step lasts as long as its slowest rank, and a
rank's rasterization costs the pairs of its own cameras, which differ from camera to camera.
Ownership stays fixed (images live on their owner), but which of its cameras a rank renders
in a step can follow cost: given every camera's agreed cost (`set_costs`, the same numbers on
every rank), an epoch deals each shard, dearest camera first, into S groups of k (each camera
to the lightest group with room: near-equal sums) and sorts the groups by sum: stratum j is
the j-th dearest group of EVERY shard (k = 1: its j-th dearest camera), and every step takes
the same stratum on all ranks, the strata's order a seeded shuffle per epoch.
Every camera is still rendered once per epoch (a short shard's empty slots take its cheapest
cameras, never one already in the step), and the sequence stays a pure function of the seed
and the agreed costs: `state_dict` carries them, so a resume replays it.
No order within fixed shards beats, on average over an epoch, the max/mean of the shards'
total costs (every rank renders its whole shard): this balancing comes close to it (k = 1:
the median step within ~0.01 for real captures' costs, the mean step further above).
"""

from __future__ import annotations

import base64
import heapq
import logging
import math
import zlib
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from .partition import chunk_bounds

logger = logging.getLogger(__name__)

_OWNER_STREAM = 0  # seed-sequence keys: ownership and per-epoch orders never share a stream
_EPOCH_STREAM = 1
_STEPS_STREAM = 2  # a cost-balanced epoch's order of its step groups


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
        # epoch -> [num_cameras] float64 agreed costs that order it (and later epochs without
        # their own); no entry at or before an epoch: the seeded order
        self.costs: Dict[int, np.ndarray] = {}
        self._asked = -1  # the latest epoch whose batches were drawn: its order is in use

    def own_cameras(self, rank: int) -> Tensor:
        """The dataset cameras `rank` owns for the whole run (ascending): the only images
        its loader needs."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"CameraBatcher: rank must be in [0, {self.world_size}), got {rank}")
        return torch.from_numpy(self._shards[rank].copy())

    def _epoch_orders(self, epoch: int) -> List[np.ndarray]:
        """Every shard's order in `epoch`: its cameras in a seeded shuffle (a short shard's
        batches wrap around to its start), or with agreed costs the cost-balanced order of
        exactly steps_per_epoch * k slots."""
        if self._orders[0] != epoch:
            shuffled = [shard[np.random.default_rng((self.seed, _EPOCH_STREAM, epoch, r)).permutation(len(shard))]
                        for r, shard in enumerate(self._shards)]
            costs = self.costs_for(epoch)
            self._orders = (epoch, shuffled if costs is None else [
                balanced_order(order, costs, self.steps_per_epoch, self.cameras_per_rank,
                               np.random.default_rng((self.seed, _STEPS_STREAM, epoch)).permutation(self.steps_per_epoch))
                for order in shuffled])
        self._asked = max(self._asked, epoch)
        return self._orders[1]

    def costs_for(self, epoch: int) -> Optional[np.ndarray]:
        """[num_cameras] the agreed costs that order `epoch`: those set for it, else the latest
        set for an earlier epoch; None (the seeded order) when there are none."""
        known = [e for e in self.costs if e <= epoch]
        return self.costs[max(known)] if known else None

    def set_costs(self, epoch: int, costs: Sequence[float], keep_from: Optional[int] = None) -> None:
        """Agreed per-camera costs (e.g. pairs rasterized at each camera's last render; NaN:
        unknown, taken as the mean of the known ones) that order `epoch` and later epochs.
        Every rank must set the same costs for the same epoch, before any of its batches is
        drawn (the image loader asks ahead: agree early enough). keep_from: entries that no
        epoch from it on uses are dropped."""
        c = np.asarray(costs, dtype=np.float64).reshape(-1)
        if len(c) != self.num_cameras:
            raise ValueError(f"CameraBatcher.set_costs: need {self.num_cameras} costs, got {len(c)}")
        if epoch <= self._asked:
            raise ValueError(f"CameraBatcher.set_costs: epoch {epoch}'s batches were already drawn (up to epoch "
                             f"{self._asked}); costs must be agreed before an epoch starts")
        known = np.isfinite(c)
        if not known.any():
            return
        if (c[known] < 0).any():
            raise ValueError("CameraBatcher.set_costs: costs must be >= 0")
        c = np.where(known, c, c[known].mean())
        self.costs[int(epoch)] = c
        if keep_from is not None:
            first = max([e for e in self.costs if e <= keep_from], default=None)
            self.costs = {e: v for e, v in self.costs.items() if first is None or e >= first}
        if self._orders[0] >= epoch:
            self._orders = (-1, [])

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
        """The batch of (epoch, step), a pure function of the constructor arguments and the
        agreed costs (`set_costs`)."""
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
        state = {
            "num_cameras": self.num_cameras, "world_size": self.world_size,
            "cameras_per_rank": self.cameras_per_rank, "seed": self.seed,
            "epoch": self.epoch, "step": self.step,
        }
        if self.costs:  # compact: a capture of a million cameras must not bloat meta.json
            state["costs"] = {str(e): pack_floats(c) for e, c in sorted(self.costs.items())}
        return state

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
        # Costs are per camera: they order this layout's epochs as well as the saved one's.
        self.costs = {int(e): unpack_floats(v, self.num_cameras) for e, v in state.get("costs", {}).items()}
        self._orders, self._asked = (-1, []), -1
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


def balanced_order(
    order: np.ndarray,  # [n] one shard's cameras in the epoch's seeded shuffle (breaks cost ties)
    costs: np.ndarray,  # [num_cameras] float64 agreed costs
    steps: int,  # S steps per epoch
    k: int,  # cameras per rank and step
    step_perm: np.ndarray,  # [S] the epoch's shuffle of the cost strata, the same for every shard
) -> np.ndarray:
    """[S * k] one shard's cameras of an epoch, step j's at [j*k, (j+1)*k). The shard, dearest
    first, is dealt into S groups of k, each camera to the lightest group with room (LPT), so
    with k > 1 the groups' sums are near equal; a shard of fewer than S*k cameras fills each
    short group with its cheapest cameras not in the group (each at most once while others
    remain: every camera once per epoch, none twice in a step). The groups sorted by sum,
    dearest first, are the shard's cost strata (k = 1: its g-th dearest camera); step j takes
    stratum step_perm[j], on every shard alike."""
    n = len(order)
    if not (k <= n <= steps * k):
        raise ValueError(f"balanced_order: a shard of {n} cameras cannot fill {steps} steps of {k}")
    by_cost = order[np.argsort(-costs[order], kind="stable")]  # [n] dearest first, ties: seeded order
    groups: List[List[int]] = [[] for _ in range(steps)]
    sums = [0.0] * steps
    if k == 1:  # the lightest group with room is always the next empty one
        for j, cam in enumerate(by_cost.tolist()):
            groups[j].append(cam)
            sums[j] = float(costs[cam])
    else:
        room = [(0.0, j) for j in range(steps)]  # heap of (sum, group) of the groups with room
        for cam in by_cost.tolist():
            total, j = heapq.heappop(room)
            groups[j].append(cam)
            sums[j] = total + float(costs[cam])
            if len(groups[j]) < k:
                heapq.heappush(room, (sums[j], j))
    cheapest = by_cost[::-1].tolist()
    used: set = set()
    for j, g in enumerate(groups):
        while len(g) < k:
            fresh = [c for c in cheapest if c not in g and c not in used]
            c = (fresh or [c for c in cheapest if c not in g])[0]
            g.append(c)
            used.add(c)
            sums[j] += float(costs[c])
    strata = sorted(range(steps), key=lambda j: (-sums[j], j))
    return np.asarray([c for s in step_perm for c in groups[strata[s]]], dtype=order.dtype)


def pack_floats(values: np.ndarray) -> str:
    """[n] float64 -> a short ASCII string (zlib + base64) for JSON checkpoint metadata."""
    return base64.b64encode(zlib.compress(np.ascontiguousarray(values, dtype="<f8").tobytes())).decode("ascii")


def unpack_floats(text: str, n: int) -> np.ndarray:
    """pack_floats' inverse; ValueError unless it holds n values."""
    out = np.frombuffer(zlib.decompress(base64.b64decode(text)), dtype="<f8").astype(np.float64)
    if len(out) != n:
        raise ValueError(f"CameraBatcher: saved costs hold {len(out)} cameras, this scene has {n}")
    return out
