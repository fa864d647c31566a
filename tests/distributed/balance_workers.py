"""Workers for test_balanced_ranks.py: the Trainer with issue 33's balancing on gloo CPU ranks,
recording what the balancing decides (the agreed costs, the batches, the moves)."""

from __future__ import annotations

import copy
from typing import Any, Dict, List

import numpy as np
import torch

from distsplat.train.config import Config
from distsplat.train.trainer import Trainer


def spread(trainer: Trainer, factor: float) -> None:
    """Scales the Gaussians' positions: the tiny ball then fills more than each camera's view,
    so cameras see different parts of it and their pair counts (costs) differ."""
    with torch.no_grad():
        trainer.params["means"].mul_(factor)


def train(ctx, cfg: Config, factor: float = 2.5) -> Dict[str, Any]:
    """Trains (Trainer.train, from cfg.ckpt when given) and returns per step the batch cameras
    and this rank's pairs rasterized, per agreement the step and the costs set, and the final
    Gaussians."""
    trainer = Trainer(copy.deepcopy(cfg), ctx)
    try:
        trainer.setup()
        if factor and trainer.start_step == 0:
            spread(trainer, factor)
        steps: List[tuple] = []  # (step, batch cameras, pairs rasterized here)
        agreed: List[tuple] = []  # (step before which it was agreed, epoch, costs)
        now = [0]
        real_step, real_set = trainer.train_step, trainer.batcher.set_costs

        def train_step(step: int):
            now[0] = step
            out = real_step(step)
            steps.append((step, trainer._batch(step).cameras.tolist(), trainer.work.steps[-1][1]))
            return out

        def set_costs(epoch: int, costs, keep_from=None) -> None:
            agreed.append((now[0], epoch, np.asarray(costs, dtype=np.float64).copy()))
            real_set(epoch, costs, keep_from)

        trainer.train_step, trainer.batcher.set_costs = train_step, set_costs
        trainer.train()
        return {"steps": steps, "agreed": agreed, "start_step": trainer.start_step,
                "batch_start": trainer.schedule.batch_start, "steps_per_epoch": trainer.batcher.steps_per_epoch,
                "own": trainer.batcher.own_cameras(ctx.rank).tolist(),
                "params": {k: v.detach().clone() for k, v in trainer.params.items()},
                "uid": trainer.strategy_state["uid"].clone()}
    finally:
        trainer.cleanup()


def pair_move(ctx, cfg: Config) -> Dict[str, Any]:
    """Rank 1 drops most of its Gaussians (as pruning may), so rank 0's project far more pairs;
    training through one agreement must move chunk boundaries by pairs: every Gaussian kept
    once, in its global order, the ranks' projected pairs closer."""
    from gsplat.strategy.ops import remove

    trainer = Trainer(copy.deepcopy(cfg), ctx)
    try:
        trainer.setup()
        if ctx.rank == 1:
            mask = torch.zeros(len(trainer.params["means"]), dtype=torch.bool)
            mask[len(mask) // 4:] = True
            remove(trainer.params, trainer.optimizers, trainer.strategy_state, mask)
        moves: List[Dict[str, Any]] = []
        real = trainer._rebalance

        def rebalance(counts, target=None, why=""):
            uid_before, cap_before = trainer.strategy_state["uid"].clone(), getattr(trainer.strategy, "cap_max", None)
            real(counts, target, why)
            moves.append({"counts": list(counts), "target": target, "why": why, "uid_before": uid_before,
                          "uid_after": trainer.strategy_state["uid"].clone(), "cap_before": cap_before,
                          "cap_after": getattr(trainer.strategy, "cap_max", None)})

        trainer._rebalance = rebalance
        for step in range(cfg.max_steps):
            trainer.train_step(step)
        return {"moves": moves, "pairs": list(trainer.work.steps), "n_local": len(trainer.params["means"]),
                "finite": bool(all(torch.isfinite(p).all() for p in trainer.params.values()))}
    finally:
        trainer.cleanup()
