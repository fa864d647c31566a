"""The training recipe of one rank (docs/design.md's step, end to end):

    batch = shared-seed CameraBatcher (same on every rank; this rank's own cameras)
    images = ImageLoader(own cameras only, prefetched)
    render = distributed_rasterize(local Gaussians, all batch cameras)   # own cameras out
             (one call per image size in the batch: size_groups.py)
    loss   = photometric loss of own cameras / global batch (+ regularizers)
    backward (the reverse exchange), per-rank Adam on local Gaussians
    densification on local Gaussians; rebalance when ranks drift apart
    eval / checkpoint / PLY at their steps

setup() builds everything, train() runs the loop, cleanup() releases workers and files.
"""

from __future__ import annotations

import copy
import math
import logging
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from ..data import ImageCache, ImageLoader
from ..distributed import (
    CameraBatch,
    CameraBatcher,
    DistContext,
    all_reduce_sum,
    chunk_bounds,
    distributed_rasterize,
    gather_counts,
    move_rows,
)
from . import batch_scaling
from . import checkpoint as ck
from . import strategy_ops
from .config import Config
from .depth_loss import DepthTargets
from .pose_opt import setup_pose_opt
from .app_opt import colour_kwargs, setup_app_opt
from .checkpointer import PER_GAUSSIAN_STATE, Checkpointer, image_sizes, seed_rank_rng
from .evaluate import evaluate, test_owners
from .lpips import load_lpips, ready_lpips, short_lpips_note
from .metrics import report_eval
from .trajectory import camera_path
from .video import render_frames, write_mp4
from .gaussians import (activated, adam_step, check_finite_params, create_optimizers, from_float_rows,
                        init_gaussians, init_kind, init_line, initial_ids, random_points, to_float_rows)
from .losses import photometric_loss, resolve_ssim_impl
from .memory import MemoryGuard, bytes_per_gaussian, default_limit, fmt_bytes, render_working_bytes
from .strategies import MCMCStrategy
from .outputs import TensorBoard, memory_gb, write_json, write_yaml
from .coords import write_transform
from .faults import DivergenceGuard
from .balance import Balancer, WorkMeter, interleave, pair_bounds
from ..data.heap import TRIM_FROM, trim_heap
from ..profiling import StepRanges
from ..transfer import to_device
from .scene_setup import agree_cameras, checks_own_images, load_scene, scene_scale
from .size_groups import group_cameras, group_images, merge_meta, size_groups
from .node_data import check_own_images
from ..distributed.nodes import node_name

log = logging.getLogger(__name__)

NUM_RENDERS = 4  # test images saved side by side (ground truth | render) at each evaluation


class Trainer:
    def __init__(self, cfg: Config, ctx: DistContext):
        self.cfg, self.ctx = cfg, ctx
        self.device = ctx.device
        self.result_dir = Path(cfg.result_dir)
        self.loader: Optional[ImageLoader] = None
        self.cache: Optional[ImageCache] = None
        self.tb: Optional[TensorBoard] = None
        self.metrics: Dict[str, Any] = {}
        # Called as hook(trainer, step) on EVERY rank after each step (e.g. the viewer). Hooks
        # that need collectives must call them on every rank in the same order; with no hook
        # the loop does no extra work.
        self.step_hooks: List[Callable[["Trainer", int], None]] = []
        # Called as hook(trainer) on EVERY rank once training ended, saved and evaluated (e.g.
        # the viewer's --viewer_keep_open); the same collective rule as step_hooks.
        self.end_hooks: List[Callable[["Trainer"], None]] = []
        self.where = "during setup"  # for failure reports: what this rank was doing

        self.checkpointer = Checkpointer(ctx, self.device, self.result_dir)  # save, resume (a full disk skips a save)
        self.divergence = DivergenceGuard(ctx, self.device, cfg.max_bad_steps)  # NaN/Inf steps are skipped
        self.ranges = StepRanges()  # named parts of train_step for torch.profiler (benchmarks time them)
        self.work = WorkMeter(ctx, self.device)  # how evenly the ranks share each step's pairs (balance.py)

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        """Builds everything this rank needs. It runs no collective, so that a failure on
        some ranks can be agreed by all of them afterwards (cli.run: raise_together), and
        writes nothing, so that a failure leaves the result dir as it was."""
        cfg, ctx = self.cfg, self.ctx
        # "fused" (fused-ssim's kernels) or "torch"; rank 0 says which on a GPU
        self.ssim_impl = resolve_ssim_impl(cfg.ssim_impl, self.device, log.info if ctx.is_main else None)
        self.scene = scene = load_scene(cfg)
        cams = scene.camera_tensors(device=self.device)
        self.viewmats, self.Ks = cams["viewmats"], cams["Ks"]  # [C_all, 4, 4], [C_all, 3, 3]
        # Every camera renders at its own size (size_groups.py); width/height: the first camera's
        self.widths, self.heights = scene.widths.copy(), scene.heights.copy()  # [C_all] int64
        self.width, self.height = int(scene.widths[0]), int(scene.heights[0])
        self.scene_scale = scene_scale(scene, cfg.global_scale)
        self.train_idx = torch.as_tensor(scene.train, dtype=torch.int64)  # [C_train] scene indices
        self.train_np = self.train_idx.numpy()  # the same, for the host's per-step lookups
        self.test_idx = torch.as_tensor(scene.test, dtype=torch.int64)  # [C_test]
        W, r = ctx.world_size, ctx.rank
        self.pose = setup_pose_opt(cfg, self.viewmats, self.train_idx, cfg.batch_size * W)  # None without --pose_opt
        check_batch_size(len(self.train_idx), W, cfg.batch_size)
        self.batcher = CameraBatcher(len(self.train_idx), W, cfg.batch_size, cfg.seed)
        # issue 33: the cameras' costs and the ranks' pairs, agreed once per epoch (balance.py); one
        # rank has nothing to balance (the initial points are interleaved at any W: the global order)
        self.balance = Balancer(ctx, self.device, scene.num_cameras, cfg.balance_cameras and W > 1,
                                cfg.balance_pairs and W > 1, lead=cfg.prefetch)
        self.app = setup_app_opt(cfg, len(self.train_idx), self.batcher.own_cameras(r), cfg.batch_size * W,
                                 self.device)  # None without --app_opt; embeddings of own images only
        t0, t1 = test_owners(len(self.test_idx), W)[r]
        own = torch.cat([self.train_idx[self.batcher.own_cameras(r)], self.test_idx[t0:t1]])
        if checks_own_images(cfg):  # staged per node, or shards: this rank must have all it owns (node_data.py)
            check_own_images(scene, own.tolist(), f"{node_name()}, rank {r},")
        budget = None if cfg.cache_budget_gb is None else int(cfg.cache_budget_gb * 2**30)
        self.cache = ImageCache(scene.images, scene.specs(), own.tolist(), mode=cfg.cache, device=self.device,
                                budget=budget, rank=r)
        if scene.num_cameras >= TRIM_FROM:
            trim_heap()  # setup's freed [C_all] temporaries back to the OS (data/heap.py, issue 20)

        self.depth = (DepthTargets(scene, own.tolist(), None, None, self.scene_scale, self.device,
                                   warn=ctx.is_main) if cfg.depth_loss else None)  # own cameras' SfM depths

        # MCMC draws from torch's global RNG (multinomial, noise; the default strategy's split
        # draws by Gaussian id instead): one seeded stream per rank makes runs repeat.
        seed_rank_rng(cfg.seed, r)
        self._init_gaussians()
        self.start_step = 0
        self.batch_start = 0  # batcher position (epoch * steps_per_epoch + step) at start_step
        self._saved_lr_batch = None  # a resumed run's learning-rate scaling (batch_scaling.py)
        if cfg.ckpt is not None:
            self.checkpointer.resume(self, cfg.ckpt)
        # The renders do not check the parameters every step: here, where they come from
        check_finite_params(self.params, f"--ckpt {cfg.ckpt}" if cfg.ckpt is not None else
                            "the initial Gaussians (--init_type, the scene's points)")
        self._init_memory_guard()
        # Bad --lpips_* files are setup's errors; weights missing from the usual places are
        # fetched after setup (_ready_lpips: a download waits on the node's other ranks)
        self.min_side = int(min(scene.widths.min(), scene.heights.min()))
        self.lpips, self.lpips_note = load_lpips(cfg.lpips_net, cfg.lpips_weights, cfg.lpips_heads, self.device,
                                                 min_side=self.min_side)
        self.lpips_skipped = None if self.lpips is not None else self.lpips_note
        self._lpips_ready = False
        if cfg.eval_only or cfg.render_only:  # no training: no training images to read ahead
            return
        self.loader = ImageLoader(
            self.cache, self._own_cameras, start_step=self.start_step, end_step=cfg.max_steps,
            num_workers=cfg.num_workers, prefetch=cfg.prefetch, device=self.device,
        )
        if ctx.is_main:
            sizes = self._image_sizes()
            log.info("scene: %d train / %d test cameras at %s, scale %.3f; %d Gaussians on %d ranks",
                     len(self.train_idx), len(self.test_idx), ", ".join(f"{w}x{h}" for w, h in sizes[:4])
                     + (f" (+{len(sizes) - 4} sizes)" if len(sizes) > 4 else ""), self.scene_scale, self.n_all, W)

    def _init_gaussians(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        init = init_kind(cfg.init_type, len(self.scene.points))
        if init == "sfm":
            points = torch.from_numpy(self.scene.points).float()
            rgbs = torch.from_numpy(self.scene.points_rgb).float() / 255.0
            if cfg.balance_pairs:  # every rank's chunk samples the whole scene (balance.py)
                order = torch.from_numpy(interleave(len(points), cfg.seed))
                points, rgbs = points[order], rgbs[order]
        else:
            points, rgbs = random_points(cfg.init_num_pts, cfg.init_extent * self.scene_scale, cfg.seed)
        if ctx.is_main and cfg.init_type == "auto" and cfg.ckpt is None:
            log.info("%s", init_line(init, len(points), cfg.init_extent, self.scene_scale))
        self.n_all = len(points)
        bounds = chunk_bounds(self.n_all, ctx.world_size)[ctx.rank]
        self.params = init_gaussians(points, rgbs, cfg.sh_degree, bounds, init_opacity=cfg.init_opa,
                                     init_scale=cfg.init_scale, seed=cfg.seed, device=self.device,
                                     feature_dim=32 if cfg.app_opt else None)
        lrs = {"means": cfg.means_lr, "scales": cfg.scales_lr, "opacities": cfg.opacities_lr,
               "quats": cfg.quats_lr, "sh0": cfg.sh0_lr, "shN": cfg.shN_lr,
               "features": cfg.sh0_lr, "colors": cfg.sh0_lr}  # --app_opt's, as gsplat
        self.optimizers = create_optimizers(self.params, cfg.batch_size * ctx.world_size,
                                            self.scene_scale, lrs)  # lr x sqrt(B), until _scale_lrs
        self.means_lr0 = self.optimizers["means"].param_groups[0]["lr"]
        B = cfg.batch_size * ctx.world_size  # train() rescales them by --lr_batch_scaling (_scale_lrs)
        self.lr_batch = {"rule": "sqrt", "global_batch": B, "visible_fraction": None, "factor": math.sqrt(B)}
        self.noise_scale = 1.0
        strategy_ops.install()
        self.strategy = copy.deepcopy(cfg.strategy)
        if isinstance(self.strategy, MCMCStrategy):
            if ctx.is_main and self.n_all > self.strategy.cap_max:  # gsplat runs on too: warn, do not refuse
                log.warning("--strategy.cap_max %d is below the %d initial Gaussians: MCMC will relocate but never add "
                            "Gaussians; raise --strategy.cap_max or start from fewer (--init_type random "
                            "--init_num_pts N)", self.strategy.cap_max, self.n_all)
            # The global cap, split like the Gaussians: rank r may grow to its share.
            cap = chunk_bounds(self.strategy.cap_max, ctx.world_size)[ctx.rank]
            self.strategy.cap_max = max(cap[1] - cap[0], 1)
            self.strategy_state = self.strategy.initialize_state()
        else:
            self.strategy_state = self.strategy.initialize_state(scene_scale=self.scene_scale)
        # Persistent Gaussian ids, their global indices now (densification names and draws by id).
        self.strategy_state.update(uid=initial_ids(bounds, self.device), seed=cfg.seed)
        self.strategy.check_sanity(self.params, self.optimizers)

    def _init_memory_guard(self) -> None:
        """Growth of this rank's Gaussians stops near its memory limit (memory.py)."""
        cfg = self.cfg
        if cfg.memory_limit_gb is None:
            limit, source = default_limit(self.device)
        else:
            limit, source = int(cfg.memory_limit_gb * 2**30), f"--memory_limit_gb {cfg.memory_limit_gb:g}"
        mcmc = isinstance(self.strategy, MCMCStrategy)
        # float32 slots: the int64 id (2), grad2d, count (, radii)
        accumulators = 2 + (0 if mcmc else 2 + (self.strategy.refine_scale2d_stop_iter > 0))
        advice = ("lower --strategy.cap_max" if mcmc else
                  "densify less (a higher --strategy.grow_grad2d, an earlier --strategy.refine_stop_iter)")
        # One render call per image size of a step's batch (train_step), each under the budget.
        train = self.train_np
        sizes = np.unique(self.widths[train].astype(np.int64) << 32 | self.heights[train])  # no tuple per camera
        calls = min(cfg.batch_size * self.ctx.world_size, len(sizes))
        working = render_working_bytes(cfg.backend, self.device, calls)
        self.memory_guard = MemoryGuard(limit, cfg.memory_fraction, self.ctx.rank, accumulators=accumulators,
                                        advice=advice, device=self.device, limit_source=source, working=working)
        self.strategy.growth_check = self.memory_guard.allow
        self._rebalance_held = False
        if self.ctx.is_main and not (cfg.eval_only or cfg.render_only):  # nothing grows without training
            b, r = bytes_per_gaussian(dict(self.params), accumulators)
            log.info("memory guard: growth stops past %.0f%% of %s per rank (%s); %d B per Gaussian "
                     "+ %d B per held Gaussian while growing + %s of the renderer's working memory per step",
                     100 * cfg.memory_fraction, fmt_bytes(limit), source, b, r, fmt_bytes(working))
        self.memory_guard.check_setup(self.params, self.optimizers, self.strategy_state)

    # -------------------------------------------------------------- schedule
    def _batch_pos(self, step: int) -> Tuple[int, int]:
        """(epoch, step within it) of training step `step` in the batcher's sequence."""
        return divmod(self.batch_start + step - self.start_step, self.batcher.steps_per_epoch)

    def _batch(self, step: int) -> CameraBatch:
        """The global batch of training step `step` (a pure function: the loader asks ahead)."""
        return self.batcher.batch(*self._batch_pos(step))

    def _own_cameras(self, step: int) -> List[int]:
        """This rank's scene cameras of training step `step` (the image loader's schedule)."""
        train = self.train_np  # per-step lookups without torch ops
        return [int(train[c]) for c in self.batcher.own_batch(*self._batch_pos(step), self.ctx.rank)]

    def _scale_lrs(self) -> None:
        """Learning rates for the global batch (batch_scaling.py): the visible fraction p
        measured now (one all-reduce, so after setup's agreement), or the one a resumed run
        measured."""
        cfg, ctx = self.cfg, self.ctx
        B, rule = len(self._batch(self.start_step).cameras), cfg.lr_batch_scaling  # the global batch a step draws
        saved = self._saved_lr_batch or {}
        p = None
        if rule == "visibility" and B > 1:
            p = saved.get("visible_fraction") if (saved.get("rule"), saved.get("global_batch")) == (rule, B) else None
            if p is None:
                cams = batch_scaling.sample(self.train_np)  # [<= SAMPLE] scene indices
                p = batch_scaling.visible_fraction(
                    activated(self.params, 0), self.viewmats[cams], self.Ks[torch.from_numpy(cams)],
                    self.widths[cams], self.heights[cams], backend=cfg.backend, near_plane=cfg.near_plane,
                    far_plane=cfg.far_plane)
        factor = batch_scaling.lr_factor(rule, B, p)
        batch_scaling.scale_learning_rates(self.optimizers, B, factor)
        self.means_lr0 = self.optimizers["means"].param_groups[0]["lr"]
        self.noise_scale = math.sqrt(B) / factor  # MCMC's noise: lr x sqrt(B) whatever the rule
        self.lr_batch = {"rule": rule, "global_batch": B, "visible_fraction": p, "factor": factor}
        if ctx.is_main and B > 1:
            log.info("%s", batch_scaling.describe(self.lr_batch))

    def _means_lr(self, step: int) -> float:
        """gsplat's schedule: the means' lr decays exponentially to 1% over the run."""
        return self.means_lr0 * 0.01 ** (min(step, self.cfg.max_steps) / self.cfg.max_steps)

    def _render_kwargs(self, backgrounds: Optional[Tensor] = None, sh: Optional[int] = None,
                       cameras: Optional[Tensor] = None) -> Dict[str, Any]:
        """Render options; with `sh`, the colour model too: SH of that degree, or with
        --app_opt the appearance MLP for training positions `cameras` [C] (None: zero embedding)."""
        cfg = self.cfg
        colours = {} if sh is None else colour_kwargs(self.app, sh, cameras)
        return dict(packed=cfg.packed, backend=cfg.backend, near_plane=cfg.near_plane,
                    far_plane=cfg.far_plane, backgrounds=backgrounds,
                    rasterize_mode="antialiased" if cfg.antialiased else "classic", **colours)

    # ------------------------------------------------------------------ train
    def train(self) -> Dict[str, Any]:
        cfg, ctx = self.cfg, self.ctx
        # The renders do not compare the ranks' cameras every step: once here (one gather)
        agree_cameras(self.scene, self.train_np, self.batcher.state_dict(), self.device)
        self._scale_lrs()  # the learning rates for the global batch (one all-reduce: not in setup)
        self._open_outputs()
        self._ready_lpips()  # said (and fetched) before the steps, not at the first evaluation
        eval_steps = {s for s in cfg.eval_steps if s > 0}
        save_steps = {s for s in cfg.save_steps if s > 0}
        # The final state is always evaluated and saved, whatever --max_steps cuts off.
        eval_steps.add(cfg.max_steps)
        save_steps.add(cfg.max_steps)
        progress = None
        if ctx.is_main:
            from tqdm import tqdm

            # A bar on a terminal; in logs (CI, torchrun to files) one line per --log_every.
            progress = tqdm(total=cfg.max_steps, initial=self.start_step, dynamic_ncols=True,
                            disable=not sys.stderr.isatty())
        t_start = time.perf_counter()
        loss_sum, loss_n = torch.zeros((), device=self.device), torch.zeros((), device=self.device)
        for step in range(self.start_step, cfg.max_steps):
            self.where = f"at step {step}"
            loss = self.train_step(step).detach()
            done = step + 1
            found = self.divergence.found  # [] on the device: 1.0 for a NaN/Inf step, skipped on every rank
            if found is None:
                loss_sum, loss_n = loss_sum + loss, loss_n + 1
            else:  # masked on the device: a skipped step's loss is left out of the average
                loss_sum, loss_n = loss_sum + torch.where(found > 0, 0.0, loss), loss_n + (1.0 - found)
            # The first step logs too: a slow run (CPU, big images) shows it is alive and its pace
            # before --log_every steps; a step count, not a clock, so every rank agrees (the work
            # summary below is a collective)
            log_step = done % cfg.log_every == 0 or done == cfg.max_steps or done == self.start_step + 1
            # The flags are read on the host lazily, all of them before a log, save or eval (faults.py)
            if self.divergence.poll(done, flush=log_step or done in save_steps or done in eval_steps):
                # --max_bad_steps in a row: keep the last good state (no bad step changed it), stop
                raise self.divergence.error(self.save(done), self.result_dir / "ckpts", done)
            if log_step:
                self.metrics["loss"] = (loss_sum / loss_n).item()  # one sync; nan when every step was skipped
                loss_sum, loss_n = torch.zeros((), device=self.device), torch.zeros((), device=self.device)
                self.metrics["steps_per_s"] = (done - self.start_step) / (time.perf_counter() - t_start)
                self.metrics.update(self.work.summary())  # one all-reduce per log interval
                if progress is not None:
                    progress.set_postfix(loss=f"{self.metrics['loss']:.4f}", GS=self.n_all)
                    if progress.disable:
                        log.info("step %d/%d: loss %.4f, %.2f steps/s, %d Gaussians; work max/mean: projected "
                                 "%.2f, rasterized %.2f", done, cfg.max_steps, self.metrics["loss"],
                                 self.metrics["steps_per_s"], self.n_all, self.metrics["projected_max_over_mean"],
                                 self.metrics["rasterized_max_over_mean"])
            if progress is not None:
                progress.update(1)
            if done % cfg.tb_every == 0 and "loss" in self.metrics:
                self.tb.scalars(done, {"train/loss": self.metrics["loss"], "train/num_GS": self.n_all})
            for hook in self.step_hooks:
                hook(self, done)
            if done in save_steps:
                self.where = f"saving the checkpoint of step {done}"
                self.save(done)
            if done in eval_steps:
                self.where = f"evaluating step {done}"
                self.eval(done, time.perf_counter() - t_start)
        if progress is not None:
            progress.close()
        self.checkpointer.saves.report_end(self.metrics)  # which saves a full disk skipped
        self.where = "after training"
        for hook in self.end_hooks:
            hook(self)
        return self.metrics

    def _open_outputs(self) -> None:
        """The first write into the result dir: only once setup succeeded on every rank."""
        self.tb = TensorBoard(self.result_dir, self.ctx)
        if self.ctx.is_main:
            self.result_dir.mkdir(parents=True, exist_ok=True)
            name = "cfg.yml" if not (self.cfg.eval_only or self.cfg.render_only) else "cfg_eval.yml"
            write_yaml(self.result_dir / name, self.cfg.to_dict())  # the resolved config, as gsplat's cfg.yml
            if not (self.cfg.eval_only or self.cfg.render_only):  # the world of this run's PLYs (coords.py)
                write_transform(self.result_dir, self.scene, self.cfg.ply_frame)  # cameras.json: with the first PLY

    def train_step(self, step: int) -> Tensor:
        cfg = self.cfg
        self.ranges("train/batch")
        self._balance_point(step)  # once per epoch, before the loader asks for the next one
        batch = self._batch(step)
        images = next(self.loader)
        C = len(batch.cameras)
        scene_np = self.train_np[batch.host_cameras()]  # [C] scene indices (host bookkeeping in numpy)
        scene_cams = torch.from_numpy(scene_np)
        cams = to_device(scene_cams, self.device)
        sh = min(step // cfg.sh_degree_interval, cfg.sh_degree)
        backgrounds = None
        if cfg.random_bkgd:  # the same draw on every rank: seeded by the step
            gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
            backgrounds = to_device(torch.rand(C, 3, generator=gen), self.device)
        g = activated(self.params, sh)
        viewmats, Ks = self.viewmats[scene_np], self.Ks[cams]  # [C, 4, 4] (host index: data/poses.py), [C, 3, 3]
        if self.pose is not None:  # the learned corrections, identical on every rank
            viewmats = self.pose.apply(viewmats, to_device(batch.cameras, self.device))
        # One render per image size of the batch (one for a single-size scene), in the same
        # order on every rank. Sum of own images' losses / global batch: the ranks' gradients
        # add up to those of the mean loss over the global batch, whatever W is.
        groups = size_groups(self.widths[scene_np], self.heights[scene_np], batch.host_owners(), self.ctx.rank)
        loss, metas = 0.0, []
        for grp in groups:
            self.ranges("train/render")
            colors, _, meta = distributed_rasterize(
                g["means"], g["quats"], g["scales"], g["opacities"], g["colors"],
                grp.select(viewmats), grp.select(Ks), grp.width, grp.height, grp.owner,
                **self._render_kwargs(grp.select(backgrounds), sh, grp.select(batch.cameras)),
                absgrad=getattr(self.strategy, "absgrad", False),
                render_mode="RGB" if self.depth is None else "RGB+ED",
                # No device checks per step: the parameters are checked where they change (setup,
                # resume, the divergence guard), the cameras agreed once (train: _agree_cameras).
                check_finite=False, check_cameras=False,
            )
            metas.append(meta)
            self.ranges("train/loss")
            gt = group_images(images, grp).to(self.device).float() / 255.0  # [C_own_g, H, W, 3] (already there)
            loss = loss + photometric_loss(colors[..., :3], gt, cfg.ssim_lambda, self.ssim_impl) / C
            if self.depth is not None:  # expected depth in the 4th channel
                loss = loss + cfg.depth_lambda * self.depth.loss(colors[..., 3:], group_cameras(images, grp)) / C
        self.work.record(metas)  # this rank's pairs, from the count exchange (host ints)
        self.balance.record(metas, groups, cams, len(self.params["means"]))  # each camera's pairs (device)
        meta = merge_meta(metas, groups, C)  # what densification reads, as of one render
        if cfg.opacity_reg > 0:
            loss = loss + cfg.opacity_reg * g["opacities"].sum() / self.n_all
        if cfg.scale_reg > 0:
            loss = loss + cfg.scale_reg * g["scales"].sum() / (3 * self.n_all)
        self.strategy.step_pre_backward(self.params, self.optimizers, self.strategy_state, step, meta)
        self.ranges("train/backward")
        loss.backward()
        learned = self.params if self.pose is None else {**self.params, "pose": self.pose.deltas}
        learned = learned if self.app is None else {**learned, **self.app.grads()}
        self.ranges("train/divergence")
        # [] 1.0 when the loss or gradients are NaN/Inf on any rank (on the device, never read
        # here; None with --max_bad_steps 0): every fused Adam skips its update, densification
        # adds nothing to its statistics, the loop leaves the loss out of its average.
        found = self.divergence.check(step, loss, learned)
        good = None if found is None else 1.0 - found
        self.ranges("train/optimizer")
        if self.pose is not None:
            self.pose.step(found)  # one all-reduce of the corrections' gradient, the same step everywhere
        if self.app is not None:
            self.app.step(found)  # one all-reduce of the MLP's gradient; embeddings on their owner only
        lr = self._means_lr(step)
        self.optimizers["means"].param_groups[0]["lr"] = lr
        for opt in self.optimizers.values():
            adam_step(opt, found)
            opt.zero_grad(set_to_none=True)
        self.ranges("train/densify")
        self._densify(step, meta, lr, good)
        self.ranges.end()
        return loss

    # ---------------------------------------------------------- densification
    def _is_refine_step(self, step: int) -> bool:
        s = self.strategy
        return s.refine_start_iter < step < s.refine_stop_iter and step % s.refine_every == 0

    def _densify(self, step: int, meta: Dict[str, Any], lr: float, good: Optional[Tensor]) -> None:
        """The strategy's step; `good` ([] on the device, None: no check) masks what a bad
        step would add (strategies.py): a refinement due at a bad step still runs."""
        if isinstance(self.strategy, MCMCStrategy):  # its noise's lr stays lr x sqrt(B) (batch_scaling.py)
            self.strategy.step_post_backward(self.params, self.optimizers, self.strategy_state, step, meta,
                                             lr=lr * self.noise_scale, good=good)
        else:
            self.strategy.step_post_backward(self.params, self.optimizers, self.strategy_state,
                                             step, meta, packed=self.cfg.packed, good=good)
        if self._is_refine_step(step):
            counts = gather_counts(len(self.params["means"]), self.device)
            self.n_all = sum(counts)
            if max(counts) > self.cfg.rebalance_ratio * max(min(counts), 1) and self._receivers_have_room(counts):
                self._rebalance(counts)

    def _balance_point(self, step: int) -> None:
        """Where balance.py's agreement is due (once per epoch, `--prefetch` steps before it
        ends): the next epoch's camera costs, and chunk boundaries by projected pairs when the
        ranks' pairs drifted apart."""
        spe = self.batcher.steps_per_epoch
        position = self.batch_start + step - self.start_step
        epoch = self.balance.due(position, spe)
        if epoch is None:
            return
        agreed = self.balance.agree(len(self.params["means"]))
        if agreed.costs is not None:
            self.batcher.set_costs(epoch, agreed.costs[self.train_np], keep_from=position // spe)
        if not self.cfg.balance_pairs or agreed.pair_imbalance() <= self.cfg.balance_pairs_ratio:
            return
        target = pair_bounds(agreed.counts, agreed.pairs_per_gaussian, 1 + (self.cfg.rebalance_ratio - 1) / 2)
        if [e - s for s, e in target] != agreed.counts and self._receivers_have_room(agreed.counts, target):
            self._rebalance(agreed.counts, target, f"projected pairs max/mean {agreed.pair_imbalance():.3f}")

    def _receivers_have_room(self, counts: List[int], target: Optional[List[Tuple[int, int]]] = None) -> bool:
        """Whether every rank that a rebalance would give Gaussians to has the memory for
        them (one all-reduce of W flags, only on steps that would rebalance). A rank whose
        growth stopped for memory would be pushed over by receiving, so the rebalance waits
        (the ranks stay uneven, but none runs out of memory); ranks that give are relieved."""
        W, r = self.ctx.world_size, self.ctx.rank
        start, end = (target or chunk_bounds(sum(counts), W))[r]
        incoming = (end - start) - counts[r]
        full = torch.zeros(W, dtype=torch.int64, device=self.device)
        full[r] = int(incoming > 0 and not self.memory_guard.fits(self.params, incoming))
        full_ranks = [q for q, f in enumerate(all_reduce_sum(full).tolist()) if f]
        if bool(full_ranks) != self._rebalance_held:
            self._rebalance_held = bool(full_ranks)
            if self.ctx.is_main:
                if full_ranks:
                    log.warning("rebalancing waits: rank(s) %s would receive Gaussians but are near their memory "
                                "limit; per-rank counts stay %s", full_ranks, counts)
                else:
                    log.warning("rebalancing resumes: every receiving rank has room again (counts %s)", counts)
        return not full_ranks

    def _rebalance(self, counts, target: Optional[List[Tuple[int, int]]] = None, why: str = "") -> None:
        """Moves Gaussians (with their Adam moments and strategy accumulators) so every
        rank holds its near-equal contiguous chunk again, or its chunk of `target`."""
        target = target or chunk_bounds(sum(counts), self.ctx.world_size)
        n_local = counts[self.ctx.rank]
        rows: Dict[str, Tensor] = {}
        for name, p in self.params.items():
            rows[f"p/{name}"] = p.detach()
            state = self.optimizers[name].state.get(p, {})
            for k in ("exp_avg", "exp_avg_sq"):
                rows[f"m/{name}/{k}"] = state[k] if k in state else torch.zeros_like(p)
        for k in PER_GAUSSIAN_STATE:
            v = self.strategy_state.get(k)
            if isinstance(v, Tensor) and v.shape[:1] == (n_local,):
                rows[f"s/{k}"] = to_float_rows(v)  # ids travel exactly
        moved = move_rows(rows, counts, target)
        payload = {"params": {}, "optim": {}, "per_gaussian": {}}
        for name, p in self.params.items():
            payload["params"][name] = moved[f"p/{name}"]
            step_t = self.optimizers[name].state.get(p, {}).get("step", torch.tensor(0.0))
            payload["optim"][name] = {"step": step_t, "exp_avg": moved[f"m/{name}/exp_avg"],
                                      "exp_avg_sq": moved[f"m/{name}/exp_avg_sq"]}
        payload["per_gaussian"] = {k[2:]: v for k, v in moved.items() if k.startswith("s/")}
        extra = ck.load_rows_into(payload, self.params, self.optimizers, self.device)
        for k, v in extra.items():
            self.strategy_state[k] = from_float_rows(v, self.strategy_state[k].dtype)
        if isinstance(self.strategy, MCMCStrategy):  # each rank keeps its headroom under the global cap
            self.strategy.cap_max += (target[self.ctx.rank][1] - target[self.ctx.rank][0]) - n_local
        self.balance.rows_moved()
        if self.ctx.is_main:
            log.info("rebalanced %d Gaussians%s: per-rank counts %s -> %s", sum(counts), f" ({why})" if why else "",
                     counts, [e - s for s, e in target])

    # ------------------------------------------------------------ eval / save
    def _ready_lpips(self) -> None:
        """Once, before the first evaluation (every rank calls it): lpips.ready_lpips fetches
        missing weights and agrees on every rank whether LPIPS is computed; rank 0 says so."""
        if self._lpips_ready or len(self.test_idx) == 0:  # no test cameras: nothing to score
            return
        self._lpips_ready = True
        cfg = self.cfg
        self.lpips, note = ready_lpips(self.ctx, cfg.lpips_net, cfg.lpips_weights, cfg.lpips_heads, self.device,
                                       self.min_side, self.lpips, self.lpips_note, log.info)
        self.lpips_skipped = None if self.lpips is not None else note
        if self.ctx.is_main:  # a skip's full advice goes into val_stepNNNN.json; the log keeps one short line
            log.info("%s", note if self.lpips is not None else short_lpips_note(note))

    def eval(self, step: int, elapsed: Optional[float]) -> Dict[str, Any]:
        ctx = self.ctx
        self._ready_lpips()
        test = self.test_idx.to(self.device)

        def read(pos: int) -> Tensor:
            cam = int(self.test_idx[pos])
            out = np.empty((self.heights[cam], self.widths[cam], 3), dtype=np.uint8)
            self.cache.read_into(cam, out)
            return torch.from_numpy(out).to(self.device).float() / 255.0

        names = [self.scene.names[i] for i in self.test_idx.tolist()]
        stats, per_image = evaluate(
            lambda: activated(self.params, self.cfg.sh_degree), self.viewmats[self.test_idx], self.Ks[test],
            self.widths[self.test_idx.numpy()], self.heights[self.test_idx.numpy()], read, names, ctx,
            self.cfg.sh_degree, self._render_kwargs(sh=self.cfg.sh_degree),
            self.result_dir / "renders", step, save_renders=NUM_RENDERS, lpips=self.lpips,
        )
        stats.update(num_GS=self.n_all, elapsed=elapsed, step=step)
        if elapsed is None:  # eval only: no training time to report
            stats.pop("elapsed")
        else:
            write_json(self.result_dir / "stats" / f"train_step{step:04d}_rank{ctx.rank}.json", {
                "mem": memory_gb(self.device), "ellipse_time": elapsed,
                "num_GS": len(self.params["means"]), "step": step,
                **{k: self.metrics[k] for k in ("projected_max_over_mean", "rasterized_max_over_mean",
                                                "pairs_projected", "pairs_rasterized") if k in self.metrics},
            })
        if ctx.is_main:
            stats = report_eval(self.result_dir, step, stats, per_image, names, self.lpips_skipped, self.tb,
                                NUM_RENDERS)
        self.metrics.update({f"val_{k}": v for k, v in stats.items()})
        return stats

    def eval_only(self) -> Dict[str, Any]:
        """--eval_only: the evaluation of the checkpoint that setup() loaded, nothing trained."""
        self._open_outputs()
        self.where = f"evaluating the checkpoint of step {self.start_step}"
        self.eval(self.start_step, None)
        return self.metrics

    def render_only(self) -> Dict[str, Any]:
        """--render_only: a camera path through the checkpoint that setup() loaded, as PNG
        frames (RGB | depth) and an MP4 in R/videos/, rendered with the distributed render."""
        cfg = self.cfg
        self._open_outputs()
        self.where = "rendering the camera path"
        c2w = camera_path(cfg.render_traj_path, self.scene.camtoworlds[self.scene.train], cfg.render_traj_frames)
        viewmats = torch.from_numpy(np.linalg.inv(c2w)).float().to(self.device)  # [F, 4, 4]
        frames = self.result_dir / "videos" / f"traj_{cfg.render_traj_path}_step{self.start_step:04d}"
        first = int(self.train_idx[0])  # the path is seen through the first training camera, at its size
        n = render_frames(lambda: activated(self.params, cfg.sh_degree), viewmats, self.Ks[first],
                          int(self.widths[first]), int(self.heights[first]), self.ctx, cfg.sh_degree,
                          self._render_kwargs(sh=cfg.sh_degree), frames)
        mp4 = write_mp4(frames, n, frames.with_suffix(".mp4"), cfg.render_fps) if self.ctx.is_main else None
        if self.ctx.is_main:
            log.info("rendered %d frames (RGB | depth) to %s%s", n, frames, f" and {mp4}" if mp4 else "")
        self.metrics.update(frames=n, frames_dir=str(frames), video=str(mp4) if mp4 else None)
        return self.metrics

    def save(self, step: int) -> bool:
        """Checkpoint and PLY of `step` (checkpointer.py); every rank calls it. False: a full disk skipped it."""
        return self.checkpointer.save(self, step)

    def _image_sizes(self) -> List[Tuple[int, int]]:
        return image_sizes(self.widths, self.heights)

    # ---------------------------------------------------------------- cleanup
    def cleanup(self) -> None:
        if self.loader is not None:
            self.loader.close()
        if self.cache is not None:
            self.cache.close()
        if self.tb is not None:
            self.tb.close()


def check_batch_size(n_train: int, world_size: int, batch_size: int) -> None:
    """ValueError naming the flags unless every rank can draw --batch_size distinct cameras
    of its own each step (the batcher's shards: n_train // world_size cameras each)."""
    if n_train >= world_size * batch_size:
        return
    fix = (f"pass --batch_size {n_train // world_size} or less, or run on fewer ranks" if n_train >= world_size
           else f"run on at most {n_train} ranks (--nproc_per_node) with --batch_size 1")
    raise ValueError(f"--batch_size {batch_size} on {world_size} rank(s) needs {world_size * batch_size} distinct "
                     f"training cameras per step, and the scene has {n_train} ({n_train // world_size} per rank): "
                     f"{fix}")

