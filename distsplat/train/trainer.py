"""The training recipe of one rank (docs/design.md's step, end to end):

    batch = shared-seed CameraBatcher (same on every rank; this rank's own cameras)
    images = ImageLoader(own cameras only, prefetched)
    render = distributed_rasterize(local Gaussians, all batch cameras)   # own cameras out
             (one call per image size in the batch: size_groups.py)
    loss   = photometric loss of own cameras / global batch (+ regularizers)
    backward (the reverse exchange), per-rank Adam on local Gaussians
    densification on local Gaussians; rebalance when ranks drift apart
    eval / checkpoint / PLY at their steps; a stop signal on any rank: save and stop

run() is one rank's lifecycle: flags agreed, the checkpoint to resume from agreed (--ckpt's, or
the newest of this run in --result_dir), setup() (no collective) agreed, extensions attached
(the viewer, by distsplat.app, given a RunView), train() (or eval_only() / render_only()), cleanup().
Features are modules it calls, in the rooms below it (docs/design.md, "train/ in rooms"): model/
(the Gaussians, strategies and extras), guards/ (divergence, memory, stop signals), files/
(checkpointer, outputs, video, models in and out), scoring/ (losses, evaluation); and beside it
schedule.py, auto_resume.py, rebalance.py, model_init.py, progress.py. What a checkpoint holds is
one dict of state objects (`_run_state`): the checkpointer saves and resumes it, never the trainer.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from ..data import ImageCache, ImageLoader
from ..distributed import (CameraBatch, CameraBatcher, DistContext, describe_failure, distributed_rasterize,
                           gather_counts)
from . import batch_scaling
from .config import Config
from .model.depth_loss import DepthTargets
from .model.pose_opt import setup_pose_opt
from .model.app_opt import colour_kwargs, setup_app_opt
from .model.bilateral_grid import setup_bilateral_grid
from .files.checkpoint import check_steps_left
from .files.checkpointer import RANK, ROWS, SHARED, TABLE, Checkpointer, Entry, Frame, ModelRows, RankRNG
from .scoring.evaluate import Evaluator, test_owners
from .files.video import render_path
from .model.gaussians import activated, adam_step, check_finite_params
from .model_init import init_model, memory_guard
from .files.model_import import import_checkpoint, is_model_file
from .progress import Progress
from .scoring.losses import photometric_loss, resolve_ssim_impl
from .model.strategies import MCMCStrategy
from .files.outputs import TensorBoard, open_outputs
from .run_checks import agree, check_flags
from .guards.faults import DivergenceGuard
from . import auto_resume
from .guards.preemption import Preemption
from .model.balance import Balancer, WorkMeter
from .rebalance import Rebalancer, move_gaussians
from ..profiling import StepRanges
from ..transfer import to_device
from .run_view import RunView
from .schedule import Schedule
from .scene_setup import (agree_cameras, check_batch_size, load_scene, own_image_cache, scene_line,
                          scene_scale)
from .model.size_groups import group_cameras, group_images, image_sizes, merge_meta, size_groups

log = logging.getLogger(__name__)

# An extension attaches to the trainer after setup (e.g. the live viewer, a layer above
# this one, wired in by distsplat.app) and returns a function that releases it, or None.
Extension = Callable[[Config, Any, Any], Optional[Callable[[], None]]]


class Trainer:
    def __init__(self, cfg: Config, ctx: DistContext):
        self.cfg, self.ctx = cfg, ctx
        self.device = ctx.device
        self.result_dir = Path(cfg.result_dir)
        self.loader: Optional[ImageLoader] = None
        self.cache: Optional[ImageCache] = None
        self.tb: Optional[TensorBoard] = None
        self.metrics: Dict[str, Any] = {}
        # Called as hook(view, step) on EVERY rank after each step (e.g. the viewer; view: run_view.py).
        # Hooks that need collectives must call them on every rank in the same order; with no hook
        # the loop does no extra work.
        self.step_hooks: List[Callable[[RunView, int], None]] = []
        # Called as hook(view) on EVERY rank once training ended, saved and evaluated (e.g.
        # the viewer's --viewer_keep_open); the same collective rule as step_hooks.
        self.end_hooks: List[Callable[[RunView], None]] = []
        self.where = "during setup"  # for failure reports: what this rank was doing
        # The flags as typed (check_flags scales the schedule later): what makes a checkpoint "of this run"
        self.flags = auto_resume.run_flags(cfg)
        # save, resume a dict of state objects (setup: _run_state); a full disk skips a save
        self.checkpointer = Checkpointer(ctx, self.device, self.result_dir, cfg, self.flags)
        self.resume = auto_resume.Plan(ckpt=cfg.ckpt)  # where setup resumes from (run(): auto_resume.plan)
        # Stop signals and --save_every_minutes: requests that ride on the divergence check's all-reduce
        self.preemption = Preemption(ctx.is_main, cfg.save_every_minutes)
        self.divergence = DivergenceGuard(ctx, self.device, cfg.max_bad_steps,  # NaN/Inf steps are skipped
                                          self.preemption)
        self.ranges = StepRanges()  # named parts of train_step for torch.profiler (benchmarks time them)
        self.work = WorkMeter(ctx, self.device)  # how evenly the ranks share each step's pairs (balance.py)
        self.rebalancer = Rebalancer(ctx, self.device, cfg.rebalance_ratio, cfg.balance_pairs, cfg.balance_pairs_ratio)

    def run(self, extensions: Sequence[Extension] = ()) -> Dict[str, Any]:
        """One rank's whole run: check the flags, setup(), attach the extensions, then train()
        (or --eval_only / --render_only), releasing everything at the end. Bad input (config,
        data, checkpoint) raises ValueError with the same message on every rank, before any
        collective can hang: setup runs no collective, and its outcome is agreed by every rank
        at its end. An exception later carries `report`, a line naming the rank that failed and where."""
        cfg, ctx = self.cfg, self.ctx
        closers = []
        try:
            self.preemption.install(cfg)  # from here a stop signal saves and stops at a step boundary
            check_flags(cfg, ctx)  # the same on every rank: a bad flag is one line, before anything is written
            # --ckpt's, or the newest checkpoint of this run in --result_dir (a requeued job goes on)
            self.resume = auto_resume.plan(cfg, ctx, self.flags)
            if self.resume.finished is not None:  # the same command again on a finished run: nothing to do
                if ctx.is_main:
                    log.info("%s", self.resume.finished)
                return {"finished": True}

            def setup() -> None:
                self.setup()
                if cfg.ckpt is not None and not (cfg.eval_only or cfg.render_only):  # a resume that trains nothing
                    check_steps_left(self.ckpt_dir, self.start_step, cfg.max_steps, cfg.steps_scaler)

            agree(ctx, setup, "setup")  # bad data or checkpoint on any rank: the same error on every rank
            # Only now (flags, data and checkpoint are good): a viewer's banner never precedes a bad input's error
            for extension in extensions:  # each agrees on its own start-up errors
                closers.append(extension(cfg, ctx, self.view))
            if cfg.eval_only:
                return self.eval_only()
            if cfg.render_only:
                return self.render_only()
            return self.train()
        except Exception as e:
            self.preemption.abandon()  # no save can follow: a stop signal ends this rank as it used to
            e.report = describe_failure(ctx, e, self.where)  # type: ignore[attr-defined]
            raise
        finally:
            self.preemption.restore()
            for close in reversed(closers):
                if close is not None:
                    close()
            self.cleanup()

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        """Builds everything this rank needs. It runs no collective, so that a failure on
        some ranks can be agreed by all of them afterwards (run: raise_together), and
        writes nothing, so that a failure leaves the result dir as it was."""
        cfg, ctx = self.cfg, self.ctx
        # "fused" (fused-ssim's kernels) or "torch"; rank 0 says which on a GPU
        self.ssim_impl = resolve_ssim_impl(cfg.ssim_impl, self.device, log.info if ctx.is_main else None)
        self.scene = scene = load_scene(cfg)
        self.Ks = scene.camera_tensors(device=self.device)["Ks"]  # [C_all, 3, 3]; poses: train_viewmats
        # Every camera renders at its own size (size_groups.py); width/height: the first camera's
        self.widths, self.heights = scene.widths.copy(), scene.heights.copy()  # [C_all] int64
        self.width, self.height = int(scene.widths[0]), int(scene.heights[0])
        self.scene_scale = scene_scale(scene, cfg.global_scale)
        self.train_idx = torch.as_tensor(scene.train, dtype=torch.int64)  # [C_train] scene indices
        self.train_np = self.train_idx.numpy()  # the same, for the host's per-step lookups
        self.test_idx = torch.as_tensor(scene.test, dtype=torch.int64)  # [C_test]
        W, r = ctx.world_size, ctx.rank
        # --pose_noise's perturbed training poses [C_train, 4, 4] and --pose_opt's corrections (None without)
        self.noisy, self.pose = setup_pose_opt(cfg, scene, self.train_np, cfg.batch_size * W, self.device)
        check_batch_size(len(self.train_idx), W, cfg.batch_size)
        self.batcher = CameraBatcher(len(self.train_idx), W, cfg.batch_size, cfg.seed)
        self.schedule = Schedule(self.batcher)  # training step -> the batcher's position (schedule.py)
        # issue 33: the cameras' costs and the ranks' pairs, agreed once per epoch (balance.py); one
        # rank has nothing to balance (the initial points are interleaved at any W: the global order)
        self.balance = Balancer(ctx, self.device, scene.num_cameras, cfg.balance_cameras and W > 1,
                                cfg.balance_pairs and W > 1, lead=cfg.prefetch)
        self.app = setup_app_opt(cfg, len(self.train_idx), self.batcher.own_cameras(r), cfg.batch_size * W,
                                 self.device)  # None without --app_opt; embeddings of own images only
        self.bilagrid = setup_bilateral_grid(cfg, len(self.train_idx), self.batcher.own_cameras(r), W,
                                             self.device)  # None without --use_bilateral_grid; own images' grids
        t0, t1 = test_owners(len(self.test_idx), W)[r]
        own = torch.cat([self.train_idx[self.batcher.own_cameras(r)], self.test_idx[t0:t1]])  # this rank's images
        self.cache = own_image_cache(cfg, scene, own.tolist(), self.device, r)  # checked, if staged or sharded

        self.depth = (DepthTargets(scene, own.tolist(), None, None, self.scene_scale, self.device,
                                   warn=ctx.is_main) if cfg.depth_loss else None)  # own cameras' SfM depths

        # MCMC draws from torch's global RNG (multinomial, noise; the default strategy's split
        # draws by Gaussian id instead): one seeded stream per rank makes runs repeat.
        self.rng = RankRNG(cfg.seed, r, self.device)
        self.rng.restart()
        self._init_gaussians()
        self.checkpointer.attach(scene, self.width, self.height, self._ply_gaussians, self.resume.found)
        self.state = self._run_state()  # what a checkpoint holds
        self.start_step = 0
        if self.resume.ckpt is not None:  # a distsplat checkpoint, or another trainer's model (model_import.py)
            resumed = (import_checkpoint(cfg, ctx, scene.transform, self.resume.ckpt, self.rows)
                       if is_model_file(self.resume.ckpt) else
                       self.checkpointer.resume(self.state, self.resume.ckpt, self.resume.found, self.resume.verified))
            self.start_step, self.n_all, self.ckpt_dir = resumed.step, resumed.n_all, resumed.dir
        self.schedule.start(self.start_step)
        # The renders do not check the parameters every step: here, where they come from
        check_finite_params(self.params, f"--ckpt {self.resume.ckpt}" if self.resume.ckpt is not None else
                            "the initial Gaussians (--init_type, the scene's points)")
        self._init_memory_guard()
        # Bad --lpips_* files are setup's errors; weights missing from the usual places are
        # fetched after setup (Evaluator.ready: a download waits on the node's other ranks)
        self.evaluator = Evaluator(cfg, ctx, self.device, scene, self.test_idx, self.Ks, self.cache, self.result_dir)
        # What extensions and hooks see of the run (run_view.py), not the trainer itself
        self.view = RunView(cfg, scene, self.train_np, self.params, self.app, self.metrics, lambda: self.n_all,
                            self.step_hooks, self.end_hooks)
        if cfg.eval_only or cfg.render_only:  # no training: no training images to read ahead
            return
        self.loader = ImageLoader(
            self.cache, self._own_cameras, start_step=self.start_step, end_step=cfg.max_steps,
            num_workers=cfg.num_workers, prefetch=cfg.prefetch, device=self.device,
        )
        if ctx.is_main:
            sizes = image_sizes(self.widths, self.heights)
            log.info("%s", scene_line(len(self.train_idx), len(self.test_idx), sizes, self.scene_scale, self.n_all, W))

    def _init_gaussians(self) -> None:
        """This rank's chunk of the initial Gaussians, its optimizers and strategy (model_init.py)."""
        m = init_model(self.cfg, self.ctx, self.device, self.scene, self.scene_scale)
        self.n_all, self.params, self.optimizers = m.n_all, m.params, m.optimizers
        self.strategy, self.strategy_state = m.strategy, m.strategy_state
        self.rows = ModelRows(self.params, self.optimizers, self.strategy_state, self.device)  # as a checkpoint's rows
        self.lr_rule = batch_scaling.LrRule(m.lr_batch)  # until _scale_lrs, at the start of training
        self.means_lr0 = self.optimizers["means"].param_groups[0]["lr"]
        self.noise_scale = 1.0

    def _run_state(self) -> Dict[str, Entry]:
        """Everything a checkpoint holds, each with its kind (checkpointer.py: how it crosses world
        sizes) and key; a new piece of state is one entry. Without training (--eval_only,
        --render_only) there is no batch sequence or balancing to continue."""
        state = {"model": Entry(self.rows, ROWS, "params"), "rng": Entry(self.rng, RANK, "rng")}
        for key, extra in (("pose_opt", self.pose), ("app_opt", self.app), ("bilateral_grid", self.bilagrid)):
            if extra is not None:  # identical on every rank, or every image's rows summed into one table
                state[key] = Entry(extra, TABLE, key)
        state["frame"] = Entry(Frame(self.scene.transform), SHARED, "frame")
        state["lr_rule"] = Entry(self.lr_rule, SHARED, "lr_batch")
        if not (self.cfg.eval_only or self.cfg.render_only):
            state["batcher"] = Entry(self.schedule, SHARED, "batcher")
            state["balance"] = Entry(self.balance, SHARED, "balance")
        return state

    def _ply_gaussians(self) -> Dict[str, Tensor]:
        """What a PLY holds of this rank's Gaussians: the raw parameters, with --app_opt their
        colours baked as gsplat does (app_opt.py)."""
        return dict(self.params) if self.app is None else self.app.baked(self.params)

    def _init_memory_guard(self) -> None:
        """Growth of this rank's Gaussians stops near its memory limit (memory.py)."""
        self.memory_guard = memory_guard(self.cfg, self.ctx, self.device, self.strategy, self.params,
                                         self.widths, self.heights, self.train_np)
        self.strategy.growth_check = self.memory_guard.allow
        self.memory_guard.check_setup(self.params, self.optimizers, self.strategy_state)

    # -------------------------------------------------------------- schedule
    def _batch(self, step: int) -> CameraBatch:
        """The global batch of training step `step` (a pure function: the loader asks ahead)."""
        return self.schedule.batch(step)

    def _own_cameras(self, step: int) -> List[int]:
        """This rank's scene cameras of training step `step` (the image loader's schedule)."""
        train = self.train_np  # per-step lookups without torch ops
        return [int(train[c]) for c in self.schedule.own(step, self.ctx.rank)]

    def _scale_lrs(self) -> None:
        """Learning rates for the global batch (batch_scaling.py): the visible fraction p
        measured now (one all-reduce, so after setup's agreement), or the one a resumed run
        measured."""
        cfg, B = self.cfg, len(self._batch(self.start_step).cameras)  # the global batch a step draws
        self.lr_rule.current = lr = batch_scaling.for_global_batch(
            cfg.lr_batch_scaling, B, self.lr_rule.saved, lambda: activated(self.params, 0), self.train_viewmats,
            self.Ks, self.widths, self.heights, self.train_np, backend=cfg.backend, near_plane=cfg.near_plane,
            far_plane=cfg.far_plane)
        factor = lr["factor"]
        batch_scaling.scale_learning_rates(self.optimizers, B, factor)
        self.means_lr0 = self.optimizers["means"].param_groups[0]["lr"]
        self.noise_scale = math.sqrt(B) / factor  # MCMC's noise: lr x sqrt(B) whatever the rule
        if self.ctx.is_main and B > 1:
            log.info("%s", batch_scaling.describe(lr))

    def train_viewmats(self, positions: np.ndarray) -> Tensor:
        """[C, 4, 4] world-to-camera of the training cameras at `positions` [C] (among them) as they
        render: the scene's, inverted per batch, or --pose_noise's; in the cameras' dtype (Ks')."""
        vm = self.scene.viewmats(self.train_np[positions]) if self.noisy is None else self.noisy[positions]
        return to_device(vm, self.device).to(self.Ks.dtype)

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
        self.evaluator.ready()  # LPIPS said (and fetched) before the steps, not at the first eval
        # The final state is saved and evaluated after the loop, whatever --max_steps cuts off
        eval_steps = {s for s in cfg.eval_steps if 0 < s < cfg.max_steps}
        save_steps = {s for s in cfg.save_steps if 0 < s < cfg.max_steps}
        progress = Progress(ctx.is_main, self.start_step, cfg.max_steps, self.device)  # rank 0's bar or log lines
        self.preemption.start()  # --save_every_minutes counts from here
        for step in range(self.start_step, cfg.max_steps):
            self.where = f"at step {step}"
            loss = self.train_step(step).detach()
            done = step + 1
            progress.add(loss, self.divergence.found)  # a NaN/Inf step is skipped on every rank, its loss left out
            log_step = progress.is_log_step(done, cfg.log_every)
            # The flags are read on the host lazily, all of them before a log, save or eval (faults.py);
            # with them the ranks' stop and save requests (preemption.py)
            if self.divergence.poll(done, flush=log_step or done in save_steps or done in eval_steps):
                # --max_bad_steps in a row: keep the last good state (no bad step changed it), stop
                raise self.divergence.error(self.save(done), self.checkpointer.step_dir(done),
                                            self.checkpointer.last_complete())
            if self.preemption.stop_due():  # a stop signal on any rank: every rank saves this step and stops
                self.where = f"saving the checkpoint of step {done} after a stop signal"
                saved = self.save(done, interim=done not in save_steps)  # a --save_steps step stays one
                return self.preemption.stopped(saved, done, self.checkpointer.step_dir(done),
                                               self.checkpointer.last_complete(), self.metrics)
            if log_step:  # one sync for the loss, one all-reduce for the work summary
                progress.report(done, self.n_all, self.metrics, self.work.summary)
            progress.update()
            if done % cfg.tb_every == 0 and "loss" in self.metrics:
                self.tb.scalars(done, {"train/loss": self.metrics["loss"], "train/num_GS": self.n_all})
            for hook in self.step_hooks:
                hook(self.view, done)
            if done in save_steps or self.preemption.save_due():  # save_due: --save_every_minutes, rank 0's clock
                self.where = f"saving the checkpoint of step {done}"
                self.save(done, interim=done not in save_steps)  # with the PLY, unless interim or --ply_steps
            if cfg.ply_steps is not None and done in cfg.ply_steps and done not in save_steps and cfg.save_ply:
                self.where = f"writing the PLY of step {done}"  # gsplat's PLY steps between checkpoints
                self.n_all = self.checkpointer.save_ply(len(self.params["means"]), done)
            if done in eval_steps:
                self.where = f"evaluating step {done}"
                self.eval(done, progress.elapsed())
        progress.close()
        # The final state (also when a launch finds the final checkpoint without its PLY or evaluation:
        # auto_resume.py resumes it at --max_steps, nothing left to train)
        self.where = f"saving the checkpoint of step {cfg.max_steps}"
        self.save(cfg.max_steps)
        self.where = f"evaluating step {cfg.max_steps}"
        self.eval(cfg.max_steps, progress.elapsed())
        self.checkpointer.saves.report_end(self.metrics)  # which saves a full disk skipped
        self.where = "after training"
        for hook in self.end_hooks:
            hook(self.view)
        return self.metrics

    def _open_outputs(self) -> None:
        """The first write into the result dir: only once setup succeeded on every rank."""
        self.tb = open_outputs(self.result_dir, self.ctx, self.cfg, self.scene)

    def train_step(self, step: int) -> Tensor:
        cfg = self.cfg
        self.ranges("train/batch")
        self._balance_point(step)  # once per epoch, before the loader asks for the next one
        batch = self.schedule.draw(step)
        images = next(self.loader)
        C = len(batch.cameras)
        positions = batch.host_cameras()  # [C] positions among the training cameras
        scene_np = self.train_np[positions]  # [C] scene indices (host bookkeeping in numpy)
        cams = to_device(torch.from_numpy(scene_np), self.device)
        sh = min(step // cfg.sh_degree_interval, cfg.sh_degree)
        backgrounds = None
        if cfg.random_bkgd:  # the same draw on every rank: seeded by the step
            gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
            backgrounds = to_device(torch.rand(C, 3, generator=gen), self.device)
        g = activated(self.params, sh)
        viewmats, Ks = self.train_viewmats(positions), self.Ks[cams]  # [C, 4, 4], [C, 3, 3]
        if self.pose is not None:  # the learned corrections, identical on every rank
            viewmats = self.pose.apply(viewmats, to_device(batch.cameras, self.device))
        # One render per image size of the batch (one for a single-size scene), in the same
        # order on every rank. Sum of own images' losses / global batch: the ranks' gradients
        # add up to those of the mean loss over the global batch, whatever W is.
        groups = size_groups(self.widths[scene_np], self.heights[scene_np], batch.host_owners(), self.ctx.rank)
        loss, metas = 0.0, []
        for grp in groups:
            self.ranges("train/render")
            colors, alphas, meta = distributed_rasterize(
                g["means"], g["quats"], g["scales"], g["opacities"], g["colors"],
                grp.select(viewmats), grp.select(Ks), grp.width, grp.height, grp.owner,
                # with bilateral grids the background comes after them (bilateral_grid.py: gsplat's order)
                **self._render_kwargs(grp.select(None if self.bilagrid else backgrounds), sh, grp.select(batch.cameras)),
                absgrad=getattr(self.strategy, "absgrad", False),
                render_mode="RGB" if self.depth is None else "RGB+ED",
                # No device checks per step: the parameters are checked where they change (setup,
                # resume, the divergence guard), the cameras agreed once (train: _agree_cameras).
                check_finite=False, check_cameras=False,
            )
            metas.append(meta)
            if self.bilagrid is not None:  # own images through their grids, then the background (bilateral_grid.py)
                colors = self.bilagrid.correct(colors, alphas, grp, positions, self.ctx.rank, backgrounds)
            self.ranges("train/loss")
            gt = group_images(images, grp).to(self.device).float() / 255.0  # [C_own_g, H, W, 3] (already there)
            loss = loss + photometric_loss(colors[..., :3], gt, cfg.ssim_lambda, self.ssim_impl) / C
            if cfg.tb_save_image and (step + 1) % cfg.tb_every == 0:  # rank 0's own images (outputs.py)
                self.tb.train_images(step + 1, gt, colors[..., :3])
            if self.depth is not None:  # expected depth in the 4th channel
                loss = loss + cfg.depth_lambda * self.depth.loss(colors[..., 3:], group_cameras(images, grp)) / C
        self.work.record(metas)  # this rank's pairs, from the count exchange (host ints)
        self.balance.record(metas, groups, cams, len(self.params["means"]))  # each camera's pairs (device)
        meta = merge_meta(metas, groups, C)  # what densification reads, as of one render
        if self.bilagrid is not None:  # this rank's grids' share of their total variation
            loss = loss + self.bilagrid.tv_loss()
        if cfg.opacity_reg > 0:
            loss = loss + cfg.opacity_reg * g["opacities"].sum() / self.n_all
        if cfg.scale_reg > 0:
            loss = loss + cfg.scale_reg * g["scales"].sum() / (3 * self.n_all)
        self.strategy.step_pre_backward(self.params, self.optimizers, self.strategy_state, step, meta)
        self.ranges("train/backward")
        loss.backward()
        learned = self.params if self.pose is None else {**self.params, "pose": self.pose.deltas}
        learned = learned if self.app is None else {**learned, **self.app.grads()}
        learned = learned if self.bilagrid is None else {**learned, **self.bilagrid.grads()}
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
        if self.bilagrid is not None:
            self.bilagrid.step(step, found)  # each grid on its owner: no collective
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
        if self._is_refine_step(step):  # the ranks' counts drift apart as they grow: rebalance (rebalance.py)
            counts = gather_counts(len(self.params["means"]), self.device)
            self.n_all = sum(counts)
            if self.rebalancer.drifted(counts) and self._receivers_have_room(counts):
                self._rebalance(counts)

    def _balance_point(self, step: int) -> None:
        """Where balance.py's agreement is due (once per epoch, `--prefetch` steps before it
        ends): the next epoch's camera costs, and chunk boundaries by projected pairs when the
        ranks' pairs drifted apart."""
        agreed = self.balance.at(self.schedule.index(step), self.batcher, self.train_np,
                                 len(self.params["means"]))
        target = None if agreed is None else self.rebalancer.pairs_target(agreed)
        if target is not None and self._receivers_have_room(agreed.counts, target):
            self._rebalance(agreed.counts, target, f"projected pairs max/mean {agreed.pair_imbalance():.3f}")

    def _receivers_have_room(self, counts: List[int], target: Optional[List[Tuple[int, int]]] = None) -> bool:
        return self.rebalancer.receivers_have_room(counts, target, lambda n: self.memory_guard.fits(self.params, n))

    def _rebalance(self, counts: List[int], target: Optional[List[Tuple[int, int]]] = None, why: str = "") -> None:
        """Moves Gaussians and their optimizer and strategy state into the chunks of `target`
        (None: near-equal ones); rebalance.py."""
        move_gaussians(self.ctx, self.device, self.params, self.optimizers, self.strategy, self.strategy_state,
                       counts, target, why)
        self.balance.rows_moved()

    # ------------------------------------------------------------ eval / save
    def eval(self, step: int, elapsed: Optional[float]) -> Dict[str, Any]:
        """The test cameras' scores at `step` (evaluate.py; every rank calls it)."""
        sh = self.cfg.sh_degree
        stats = self.evaluator(step, elapsed, lambda: activated(self.params, sh), self._render_kwargs(sh=sh),
                               self.n_all, len(self.params["means"]), self.tb, self.metrics)
        self.metrics.update({f"val_{k}": v for k, v in stats.items()})
        if not self.cfg.disable_video:  # --no-disable-video: gsplat's trajectory video after each evaluation
            self.render_video(step)
        return stats

    def eval_only(self) -> Dict[str, Any]:
        """--eval_only: the evaluation of the checkpoint that setup() loaded, nothing trained."""
        self._open_outputs()
        self.where = f"evaluating the checkpoint of step {self.start_step}"
        self.eval(self.start_step, None)
        return self.metrics

    def render_only(self) -> Dict[str, Any]:
        """--render_only: a camera path through the checkpoint that setup() loaded, as PNG
        frames (RGB | depth) and an MP4 in R/videos/, rendered with the distributed render (video.py)."""
        self._open_outputs()
        self.render_video(self.start_step)
        return self.metrics

    def render_video(self, step: int) -> None:
        """--render_traj_path's camera path through the Gaussians as they are, labelled `step` (video.py)."""
        cfg = self.cfg
        self.where = "rendering the camera path"
        first = int(self.train_idx[0])  # the path is seen through the first training camera, at its size
        self.metrics.update(render_path(
            cfg, self.ctx, self.scene.camtoworlds[self.scene.train], lambda: activated(self.params, cfg.sh_degree),
            self.Ks[first], int(self.widths[first]), int(self.heights[first]), self._render_kwargs(sh=cfg.sh_degree),
            self.result_dir, step, points=self.scene.points))

    def save(self, step: int, interim: bool = False) -> bool:
        """Checkpoint and PLY of `step` (checkpointer.py; `interim`: the checkpoint alone, pruned once a newer
        regular one is whole); every rank calls it. False: a full disk skipped it."""
        saved, self.n_all = self.checkpointer.save(self.state, step, interim)
        self.preemption.saved(step, interim)  # --save_every_minutes counts from the last save
        return saved

    # ---------------------------------------------------------------- cleanup
    def cleanup(self) -> None:
        if self.loader is not None:
            self.loader.close()
        if self.cache is not None:
            self.cache.close()
        if self.tb is not None:
            self.tb.close()

