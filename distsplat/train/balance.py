"""How evenly the ranks share a step's work, in units no device can skew (issue 33).

A synchronous step lasts as long as its slowest rank. A rank's projection costs its
projected pairs (its Gaussians x the batch cameras that see them), its rasterization the
pairs it receives for its own cameras. Both counts are already on the host after each
render's count exchange (meta["comm"]: pairs_projected, pairs_rendered), so recording them
costs nothing per step. At log intervals one all-reduce of every rank's per-step counts gives
each step's max/mean over the ranks; the median over the interval's steps is what the log
line and the train stats report (1.0: perfectly balanced, W: one rank does everything).
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import torch

from ..distributed import DistContext, all_reduce_sum


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
