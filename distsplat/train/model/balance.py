"""How evenly the ranks share a step's work, in units no device can skew (issue 33).

A synchronous step lasts as long as its slowest rank. A rank's projection costs its
projected pairs (its Gaussians x the batch cameras that see them), its rasterization the
pairs it receives for its own cameras. Both counts are already on the host after each
render's count exchange (meta["comm"]: pairs_projected, pairs_rendered), so recording them
costs nothing per step. At log intervals one all-reduce of every rank's per-step counts gives
each step's max/mean over the ranks; the median over the interval's steps is what the log
line and the train stats report (1.0: perfectly balanced, W: one rank does everything).

`Balancer` evens both out (on by default: --balance_cameras, --balance_pairs). Per step it
notes, on the device and without a sync, the pairs this rank projected into each batch camera
(one searchsorted of the projection's sorted camera ids): summed over the ranks, a camera's
pairs at its last render, i.e. its rasterization cost. Once per epoch, at a position every
rank reaches together and early enough that the image loader has not yet asked for the next
epoch (`lead` = its prefetch), ONE all-reduce agrees those costs and each rank's projected
pairs per Gaussian. The costs order the next epoch (CameraBatcher.set_costs: every step the
same cost stratum on all ranks); when the ranks' projected pairs differ by more than a ratio,
the chunk boundaries move so that each rank's Gaussians project about the same pairs
(`pair_bounds`, rows and Adam state moved by the trainer's rebalancing). The projection's
per-step balance also needs each rank's chunk to sample the whole scene: `interleave` deals
the initial SfM points to the ranks in a seeded shuffled order (contiguous chunks of a
capture's point list are regions of the scene, and a batch of W cameras sees some regions more
than others).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from ...distributed import DistContext, all_reduce_sum, chunk_bounds
from ...distributed.batcher import pack_floats, unpack_floats

_INTERLEAVE_STREAM = 3  # seed-sequence key of the initial Gaussians' order (batcher.py uses 0-2)


class WorkMeter:
    """Per step, this rank's (pairs projected, pairs rasterized); `summary()` at a log step."""

    def __init__(self, ctx: DistContext, device: torch.device):
        self.ctx, self.device = ctx, device
        self.steps: List[Tuple[int, int]] = []  # this rank's (projected, rasterized) per step since the last summary

    def record(self, metas: Sequence[Dict[str, Any]]) -> None:
        """One training step's renders (one per image size): host ints, no device work."""
        self.steps.append((sum(m["comm"]["pairs_projected"] for m in metas),
                           sum(m["comm"]["pairs_rendered"] for m in metas)))

    def summary(self) -> Dict[str, float]:
        """Medians over the recorded steps of max/mean over the ranks, and this rank's mean
        counts; every rank calls it at the same step (one all-reduce of [W, K, 2])."""
        if not self.steps:
            return {}
        W, r = self.ctx.world_size, self.ctx.rank
        counts = torch.zeros(W, len(self.steps), 2, dtype=torch.float64)  # [W, K, 2]
        counts[r] = torch.tensor(self.steps, dtype=torch.float64)
        counts = all_reduce_sum(counts.to(self.device)).cpu().numpy()  # every rank's steps
        self.steps = []
        return {
            "projected_max_over_mean": _median_ratio(counts[..., 0]),
            "rasterized_max_over_mean": _median_ratio(counts[..., 1]),
            "pairs_projected": float(counts[r, :, 0].mean()),
            "pairs_rasterized": float(counts[r, :, 1].mean()),
        }


def _median_ratio(per_rank: np.ndarray) -> float:
    """per_rank [W, K] -> the median over the K steps of max/mean over the W ranks (1.0 for
    a step without work)."""
    mean = per_rank.mean(0)  # [K]
    ratio = np.where(mean > 0, per_rank.max(0) / np.maximum(mean, 1e-300), 1.0)
    return float(np.median(ratio))


def interleave(n: int, seed: int) -> np.ndarray:
    """[n] a seeded permutation of the initial points (the same on every rank and every W):
    dealt in this order, each rank's contiguous chunk samples the whole scene."""
    return np.random.default_rng((seed, _INTERLEAVE_STREAM)).permutation(n)


@dataclass(frozen=True)
class Agreement:
    """What one agreement gives every rank, identically."""

    costs: Optional[np.ndarray]  # [num_cameras] float64 pairs at each camera's last render, NaN: not seen
    pairs_per_gaussian: List[float]  # [W] each rank's projected pairs per local Gaussian per step since rows last moved
    counts: List[int]  # [W] Gaussians on each rank

    def pair_imbalance(self) -> float:
        """max/mean over the ranks of the pairs their Gaussians project per step (1.0 with no data)."""
        pairs = np.asarray(self.counts, np.float64) * np.asarray(self.pairs_per_gaussian)
        return float(pairs.max() / pairs.mean()) if pairs.mean() > 0 else 1.0


class Balancer:
    """One rank's side of the balancing; every rank calls `record` each step and `agree`
    where `due` says, in the same order."""

    def __init__(self, ctx: DistContext, device: torch.device, num_cameras: int, cameras: bool, pairs: bool,
                 lead: int):
        self.ctx, self.device = ctx, device
        self.cameras, self.pairs, self.lead = cameras, pairs, lead
        self.num_cameras = num_cameras
        # [num_cameras] this rank's projected pairs into each scene camera at its last render; -1: never
        self.table = torch.full((num_cameras if cameras else 0,), -1, dtype=torch.int64, device=device)
        self._edges: Dict[Any, Tensor] = {}  # record()'s arange per (cameras, device, dtype)
        self._density, self._steps = 0.0, 0  # projected pairs per local Gaussian, summed over steps

    @property
    def on(self) -> bool:
        return self.cameras or self.pairs

    def record(self, metas: Sequence[Dict[str, Any]], groups: Sequence[Any], cameras: Tensor, n_local: int) -> None:
        """One step's renders (one per size group: size_groups.SizeGroup), the batch's scene
        cameras [C] on the device and this rank's Gaussian count."""
        if self.cameras:
            for meta, grp in zip(metas, groups):
                cams = grp.select(cameras)  # [C_g]
                ids = meta["camera_ids"]  # [M] sorted: the projection emits pairs by (camera, Gaussian)
                key = (len(cams), ids.device, ids.dtype)
                if key not in self._edges:  # [C_g + 1], cached: one op less per step
                    self._edges[key] = torch.arange(len(cams) + 1, device=ids.device, dtype=ids.dtype)
                self.table.index_copy_(0, cams, torch.searchsorted(ids, self._edges[key]).diff())  # int64
        if self.pairs and n_local > 0:
            self._density += sum(m["comm"]["pairs_projected"] for m in metas) / n_local
            self._steps += 1

    def rows_moved(self) -> None:
        """The chunks changed: pairs per Gaussian are measured afresh."""
        self._density, self._steps = 0.0, 0

    def due(self, position: int, steps_per_epoch: int) -> Optional[int]:
        """The epoch whose order is agreed before the step at batcher `position`, or None. The
        image loader has asked for `lead` steps ahead, so the costs for epoch E are agreed `lead`
        steps before E starts."""
        if not self.on or (position + self.lead) % steps_per_epoch:
            return None
        return (position + self.lead) // steps_per_epoch

    def agree(self, n_local: int) -> Agreement:
        """One all-reduce (and one host read) of [num_cameras + 2W] float64: every camera's pairs
        at its last render (every rank's share), each rank's pairs per Gaussian and count."""
        W, r = self.ctx.world_size, self.ctx.rank
        mine = torch.zeros(len(self.table) + 2 * W, dtype=torch.float64, device=self.device)
        mine[:len(self.table)] = self.table
        mine[len(self.table) + r] = self._density / max(self._steps, 1)
        mine[len(self.table) + W + r] = n_local
        total = all_reduce_sum(mine).cpu().numpy()
        costs = None
        if self.cameras:
            costs = total[:len(self.table)].copy()
            costs[costs < 0] = np.nan  # -1 on every rank: never rendered
        tail = total[len(self.table):]
        return Agreement(costs, tail[:W].tolist(), [int(c) for c in tail[W:]])

    def at(self, position: int, batcher: Any, train: np.ndarray, n_local: int) -> Optional[Agreement]:
        """At batcher position `position` (every rank, every step): None unless the agreement
        is due; then it runs, and `batcher` orders the next epoch by the agreed costs (`train`
        [C_train]: each training camera's scene index)."""
        spe = batcher.steps_per_epoch
        epoch = self.due(position, spe)
        if epoch is None:
            return None
        agreed = self.agree(n_local)
        if agreed.costs is not None:
            batcher.set_costs(epoch, agreed.costs[train], keep_from=position // spe)
        return agreed

    def state_dict(self) -> Dict[str, Any]:
        """Every camera's pairs at its last render (one all-reduce: call on every rank), for the
        checkpoint: a resumed run agrees the same costs as an uninterrupted one."""
        if not self.cameras:
            return {}
        total = all_reduce_sum(self.table.to(torch.float64)).cpu().numpy()
        total[total < 0] = -1
        return {"camera_pairs": pack_floats(total)}

    def load_state_dict(self, state: Optional[Dict[str, Any]]) -> None:
        """Rank 0 holds the saved totals, the others zero for every camera seen (-1 for the
        rest), so the next agreement's sum gives them back."""
        if not self.cameras or not state or "camera_pairs" not in state:
            return
        total = torch.from_numpy(unpack_floats(state["camera_pairs"], self.num_cameras)).to(torch.int64)
        mine = total if self.ctx.rank == 0 else torch.where(total < 0, total, torch.zeros_like(total))
        self.table.copy_(mine)


def pair_bounds(counts: Sequence[int], pairs_per_gaussian: Sequence[float], max_count_ratio: float
                ) -> List[Tuple[int, int]]:
    """[W] contiguous (start, end) chunks of the sum(counts) Gaussians in their global order
    under which every rank's Gaussians project about the same pairs, each Gaussian taken to
    project its rank's mean (the density is piecewise constant; measured again after a move,
    so repeated moves converge). The ranks' Gaussian counts (memory) stay within
    max_count_ratio of each other: the boundaries go only that far from equal counts."""
    W, n = len(counts), int(sum(counts))
    equal = np.array([0] + [e for _, e in chunk_bounds(n, W)], np.float64)
    if n == 0 or W == 1:
        return chunk_bounds(n, W)
    x = np.concatenate([[0], np.cumsum(counts)]).astype(np.float64)  # [W + 1] current cuts
    rho = np.asarray(pairs_per_gaussian, np.float64)
    rho = np.maximum(rho, 1e-9 * max(float(rho.max()), 1e-300))  # no flat stretch: interp needs increasing
    mass = np.concatenate([[0], np.cumsum(np.diff(x) * rho)])  # [W + 1] pairs up to each cut
    by_pairs = np.interp(mass[-1] * np.arange(W + 1) / W, mass, x)  # [W + 1]

    def cuts(alpha: float) -> np.ndarray:
        c = np.round(equal + alpha * (by_pairs - equal)).astype(np.int64)
        c[0], c[-1] = 0, n
        return np.maximum.accumulate(c)

    def fits(c: np.ndarray) -> bool:
        sizes = np.diff(c)
        return sizes.min() > 0 and sizes.max() <= max_count_ratio * sizes.min()

    lo, hi = 0.0, 1.0
    if not fits(cuts(hi)):
        for _ in range(20):  # the largest step towards equal pairs that keeps counts within the ratio
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if fits(cuts(mid)) else (lo, mid)
        hi = lo
    c = cuts(hi).tolist()
    return list(zip(c[:-1], c[1:]))
