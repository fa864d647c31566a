"""Rebalancing: Gaussians move between ranks when their chunks drift apart (docs/design.md,
"every collective": each refine step, and balance.py's once-per-epoch agreement).

Densification grows and prunes each rank's chunk on its own, so the ranks' counts drift. At
a refine step whose counts differ by more than --rebalance_ratio, every rank's rows (its
parameters, their Adam moments and per-Gaussian strategy state, ids exactly) move in one
all-to-all (`move_gaussians`, distributed/partition.py: move_rows) so that each rank holds
its near-equal contiguous chunk again. With --balance_pairs the chunk boundaries move by
projected pairs instead (balance.py: pair_bounds) when the ranks' pairs differ by more than
--balance_pairs_ratio. A rank near its memory limit would be pushed over by receiving, so a
rebalance waits until every receiver has room (`Rebalancer.receivers_have_room`).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from ..distributed import DistContext, all_reduce_sum, chunk_bounds, move_rows
from .files import checkpoint as ck
from .model.balance import Agreement, pair_bounds
from .files.checkpointer import PER_GAUSSIAN_STATE
from .model.gaussians import from_float_rows, to_float_rows
from .model.strategies import MCMCStrategy

log = logging.getLogger("distsplat.train.trainer")  # the trainer's log lines, as before the split

Bounds = List[Tuple[int, int]]  # [W] (start, end) global rows of each rank


class Rebalancer:
    """When to rebalance, and whether the receivers have room (one rank's view, agreed by all)."""

    def __init__(self, ctx: DistContext, device: torch.device, rebalance_ratio: float, balance_pairs: bool,
                 balance_pairs_ratio: float):
        self.ctx, self.device = ctx, device
        self.ratio, self.pairs, self.pairs_ratio = rebalance_ratio, balance_pairs, balance_pairs_ratio
        self.held = False  # a rebalance waits for a receiver's memory (warned once per change)

    def drifted(self, counts: List[int]) -> bool:
        """Whether the ranks' Gaussian counts differ by more than --rebalance_ratio."""
        return max(counts) > self.ratio * max(min(counts), 1)

    def pairs_target(self, agreed: Agreement) -> Optional[Bounds]:
        """The chunk boundaries by projected pairs when the ranks' pairs drifted apart, else None."""
        if not self.pairs or agreed.pair_imbalance() <= self.pairs_ratio:
            return None
        target = pair_bounds(agreed.counts, agreed.pairs_per_gaussian, 1 + (self.ratio - 1) / 2)
        return None if [e - s for s, e in target] == agreed.counts else target

    def receivers_have_room(self, counts: List[int], target: Optional[Bounds], fits: Callable[[int], bool]) -> bool:
        """Whether every rank that a rebalance would give Gaussians to has the memory for
        them (one all-reduce of W flags, only on steps that would rebalance; `fits(n)`: this
        rank's memory guard for n more). A rank whose growth stopped for memory would be
        pushed over by receiving, so the rebalance waits (the ranks stay uneven, but none
        runs out of memory); ranks that give are relieved."""
        W, r = self.ctx.world_size, self.ctx.rank
        start, end = (target or chunk_bounds(sum(counts), W))[r]
        incoming = (end - start) - counts[r]
        full = torch.zeros(W, dtype=torch.int64, device=self.device)
        full[r] = int(incoming > 0 and not fits(incoming))
        full_ranks = [q for q, f in enumerate(all_reduce_sum(full).tolist()) if f]
        if bool(full_ranks) != self.held:
            self.held = bool(full_ranks)
            if self.ctx.is_main:
                if full_ranks:
                    log.warning("rebalancing waits: rank(s) %s would receive Gaussians but are near their memory "
                                "limit; per-rank counts stay %s", full_ranks, counts)
                else:
                    log.warning("rebalancing resumes: every receiving rank has room again (counts %s)", counts)
        return not full_ranks


def move_gaussians(ctx: DistContext, device: torch.device, params: Dict[str, Tensor], optimizers: Dict[str, Any],
                   strategy: Any, strategy_state: Dict[str, Any], counts: List[int],
                   target: Optional[Bounds] = None, why: str = "") -> None:
    """Moves Gaussians (with their Adam moments and strategy accumulators) so every
    rank holds its near-equal contiguous chunk again, or its chunk of `target`."""
    target = target or chunk_bounds(sum(counts), ctx.world_size)
    n_local = counts[ctx.rank]
    rows: Dict[str, Tensor] = {}
    for name, p in params.items():
        rows[f"p/{name}"] = p.detach()
        state = optimizers[name].state.get(p, {})
        for k in ("exp_avg", "exp_avg_sq"):
            rows[f"m/{name}/{k}"] = state[k] if k in state else torch.zeros_like(p)
    for k in PER_GAUSSIAN_STATE:
        v = strategy_state.get(k)
        if isinstance(v, Tensor) and v.shape[:1] == (n_local,):
            rows[f"s/{k}"] = to_float_rows(v)  # ids travel exactly
    moved = move_rows(rows, counts, target)
    payload: Dict[str, Dict[str, Any]] = {"params": {}, "optim": {}, "per_gaussian": {}}
    for name, p in params.items():
        payload["params"][name] = moved[f"p/{name}"]
        step_t = optimizers[name].state.get(p, {}).get("step", torch.tensor(0.0))
        payload["optim"][name] = {"step": step_t, "exp_avg": moved[f"m/{name}/exp_avg"],
                                  "exp_avg_sq": moved[f"m/{name}/exp_avg_sq"]}
    payload["per_gaussian"] = {k[2:]: v for k, v in moved.items() if k.startswith("s/")}
    extra = ck.load_rows_into(payload, params, optimizers, device)
    for k, v in extra.items():
        strategy_state[k] = from_float_rows(v, strategy_state[k].dtype)
    if isinstance(strategy, MCMCStrategy):  # each rank keeps its headroom under the global cap
        strategy.cap_max += (target[ctx.rank][1] - target[ctx.rank][0]) - n_local
    if ctx.is_main:
        log.info("rebalanced %d Gaussians%s: per-rank counts %s -> %s", sum(counts), f" ({why})" if why else "",
                 counts, [e - s for s, e in target])
