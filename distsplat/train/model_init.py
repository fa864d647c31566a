"""The trainer's model at the start of a run (docs/design.md, start-up step 3): this rank's
chunk of the initial Gaussians, their optimizers, the densification strategy with this
rank's share of a global cap, and the memory guard that stops growth near the rank's limit.

Every random number is drawn for all N_all Gaussians and this rank keeps its rows, so the
initial model does not depend on W; with --balance_pairs the SfM points are dealt in a
seeded shuffled order (balance.py: interleave) so every rank's chunk samples the whole scene.
"""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import dataclass
from typing import Any, Dict

import numpy as np
import torch
from torch import Tensor

from ..distributed import DistContext, chunk_bounds
from .model import strategy_ops
from .model.balance import interleave
from .config import Config
from .model.gaussians import create_optimizers, init_gaussians, init_kind, init_line, initial_ids, random_points
from .files.model_import import initial_params
from .guards.memory import MemoryGuard, bytes_per_gaussian, default_limit, fmt_bytes, render_working_bytes
from .model.strategies import MCMCStrategy

log = logging.getLogger("distsplat.train.trainer")  # the trainer's log lines, as before the split


@dataclass
class Model:
    """This rank's Gaussians and what trains them."""

    n_all: int  # all ranks' Gaussians
    params: torch.nn.ParameterDict  # [N, ...] this rank's rows
    optimizers: Dict[str, torch.optim.Optimizer]
    strategy: Any  # a per-rank copy of --strategy (MCMC: cap_max is this rank's share)
    strategy_state: Dict[str, Any]  # with `uid` [N] int64, persistent Gaussian ids
    lr_batch: Dict[str, Any]  # the learning-rate scaling until the trainer's _scale_lrs


def init_model(cfg: Config, ctx: DistContext, device: torch.device, scene: Any, scene_scale: float) -> Model:
    """The initial Gaussians (SfM points, random ones, or a model file's: --init_type) and their training state."""
    init = "ply" if cfg.init_ply is not None else init_kind(cfg.init_type, len(scene.points))
    if init == "ply":  # another trainer's model (model_import.py), its rows as they are
        params, n_all = initial_params(cfg, ctx, device, scene.transform)
        bounds = chunk_bounds(n_all, ctx.world_size)[ctx.rank]
    else:
        if init == "sfm":
            points = torch.from_numpy(scene.points).float()
            rgbs = torch.from_numpy(scene.points_rgb).float() / 255.0
            if cfg.balance_pairs:  # every rank's chunk samples the whole scene (balance.py)
                order = torch.from_numpy(interleave(len(points), cfg.seed))
                points, rgbs = points[order], rgbs[order]
        else:
            points, rgbs = random_points(cfg.init_num_pts, cfg.init_extent * scene_scale, cfg.seed)
        if ctx.is_main and cfg.init_type == "auto" and cfg.ckpt is None:
            log.info("%s", init_line(init, len(points), cfg.init_extent, scene_scale))
        n_all = len(points)
        bounds = chunk_bounds(n_all, ctx.world_size)[ctx.rank]
        params = init_gaussians(points, rgbs, cfg.sh_degree, bounds, init_opacity=cfg.init_opa,
                                init_scale=cfg.init_scale, seed=cfg.seed, device=device,
                                feature_dim=32 if cfg.app_opt else None)
    lrs = {"means": cfg.means_lr, "scales": cfg.scales_lr, "opacities": cfg.opacities_lr,
           "quats": cfg.quats_lr, "sh0": cfg.sh0_lr, "shN": cfg.shN_lr,
           "features": cfg.sh0_lr, "colors": cfg.sh0_lr}  # --app_opt's, as gsplat
    B = cfg.batch_size * ctx.world_size  # the trainer rescales them by --lr_batch_scaling (_scale_lrs)
    optimizers = create_optimizers(params, B, scene_scale, lrs)  # lr x sqrt(B), until _scale_lrs
    lr_batch = {"rule": "sqrt", "global_batch": B, "visible_fraction": None, "factor": math.sqrt(B)}
    strategy_ops.install()
    strategy = copy.deepcopy(cfg.strategy)
    if isinstance(strategy, MCMCStrategy):
        if ctx.is_main and n_all > strategy.cap_max:  # gsplat runs on too: warn, do not refuse
            log.warning("--strategy.cap_max %d is below the %d initial Gaussians: MCMC will relocate but never add "
                        "Gaussians; raise --strategy.cap_max or start from fewer (--init_type random "
                        "--init_num_pts N)", strategy.cap_max, n_all)
        # The global cap, split like the Gaussians: rank r may grow to its share.
        cap = chunk_bounds(strategy.cap_max, ctx.world_size)[ctx.rank]
        strategy.cap_max = max(cap[1] - cap[0], 1)
        strategy_state = strategy.initialize_state()
    else:
        strategy_state = strategy.initialize_state(scene_scale=scene_scale)
    # Persistent Gaussian ids, their global indices now (densification names and draws by id).
    strategy_state.update(uid=initial_ids(bounds, device), seed=cfg.seed)
    strategy.check_sanity(params, optimizers)
    return Model(n_all, params, optimizers, strategy, strategy_state, lr_batch)


def memory_guard(cfg: Config, ctx: DistContext, device: torch.device, strategy: Any, params: Dict[str, Tensor],
                 widths: np.ndarray, heights: np.ndarray, train: np.ndarray) -> MemoryGuard:
    """Growth of this rank's Gaussians stops near its memory limit (memory.py); widths, heights
    [C_all] and the training cameras `train` [C_train] give the renderer's working memory."""
    if cfg.memory_limit_gb is None:
        limit, source = default_limit(device)
    else:
        limit, source = int(cfg.memory_limit_gb * 2**30), f"--memory_limit_gb {cfg.memory_limit_gb:g}"
    mcmc = isinstance(strategy, MCMCStrategy)
    # float32 slots: the int64 id (2), grad2d, count (, radii)
    accumulators = 2 + (0 if mcmc else 2 + (strategy.refine_scale2d_stop_iter > 0))
    advice = ("lower --strategy.cap_max" if mcmc else
              "densify less (a higher --strategy.grow_grad2d, an earlier --strategy.refine_stop_iter)")
    # One render call per image size of a step's batch (train_step), each under the budget.
    sizes = np.unique(widths[train].astype(np.int64) << 32 | heights[train])  # no tuple per camera
    calls = min(cfg.batch_size * ctx.world_size, len(sizes))
    working = render_working_bytes(cfg.backend, device, calls)
    guard = MemoryGuard(limit, cfg.memory_fraction, ctx.rank, accumulators=accumulators,
                        advice=advice, device=device, limit_source=source, working=working)
    if ctx.is_main and not (cfg.eval_only or cfg.render_only):  # nothing grows without training
        b, r = bytes_per_gaussian(dict(params), accumulators)
        log.info("memory guard: growth stops past %.0f%% of %s per rank (%s); %d B per Gaussian "
                 "+ %d B per held Gaussian while growing + %s of the renderer's working memory per step",
                 100 * cfg.memory_fraction, fmt_bytes(limit), source, b, r, fmt_bytes(working))
    return guard
