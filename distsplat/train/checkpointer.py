"""The trainer's state in and out of checkpoints (docs/design.md invariant 5: nothing lost).

`Checkpointer.save` gathers one rank's rows (parameters, Adam moments, per-Gaussian strategy
state), its RNG stream and the small shared state (batcher position, learning-rate scaling,
balancing costs, pose and appearance corrections) and writes them through checkpoint.py's
atomic layout, guarded by faults.py's SaveGuard (a full disk on any rank skips the save on
every rank), with the merged PLY and cameras.json beside it. `Checkpointer.resume` loads this
rank's chunk of a checkpoint written by any number of ranks, after checking it was written
for this scene (`scene_fingerprint`) and SH degree. Both read and set the trainer's state:
every rank calls them at the same point of the recipe (trainer.py).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import numpy as np
import torch
from torch import Tensor

from ..distributed import DistContext, barrier, chunk_bounds, gather_counts
from . import checkpoint as ck
from .app_opt import check_resume as check_app_resume
from .coords import CAPTURE, NORMALIZED, frame_info, to_capture, write_cameras
from .faults import SaveGuard
from .gaussians import initial_ids
from .outputs import export_ply
from .size_groups import image_sizes

if TYPE_CHECKING:
    from .trainer import Trainer

log = logging.getLogger("distsplat.train.trainer")  # the trainer's log lines, as before the split

# Per-Gaussian strategy state: DefaultStrategy's accumulators and every Gaussian's id.
PER_GAUSSIAN_STATE = ("grad2d", "count", "radii", "uid")


class Checkpointer:
    """Saves and resumes one rank's part of the trainer's state under R/ckpts."""

    def __init__(self, ctx: DistContext, device: torch.device, result_dir: Path):
        self.ctx, self.device, self.result_dir = ctx, device, Path(result_dir)
        self.root = self.result_dir / "ckpts"
        self.saves = SaveGuard(ctx, device, self.root)  # a full disk skips a save
        self.cameras_written = False  # cameras.json (rank 0), with the first save
        self._warned_newer = False

    def save(self, t: "Trainer", step: int, interim: bool = False) -> bool:
        """Checkpoint (atomic, resumable on any W) and the merged PLY (with --ply_steps only at those);
        every rank calls it. A full disk on any rank skips either on every rank, and training goes on
        (faults.py). `interim` (--save_every_minutes, a stop signal: preemption.py): the checkpoint
        alone, marked to be pruned once a newer regular one is whole (checkpoint.prunable)."""
        ctx, root, cfg = self.ctx, self.root, t.cfg
        counts = gather_counts(len(t.params["means"]), self.device)
        t.n_all = sum(counts)
        per_gaussian = {k: v for k, v in t.strategy_state.items()
                        if k in PER_GAUSSIAN_STATE and isinstance(v, Tensor)}
        payload = ck.shard_payload(t.params, t.optimizers, per_gaussian)
        payload["rng"] = rng_state(self.device)  # densification draws from it
        if t.pose is not None:  # identical on every rank; any shard restores it
            payload["pose_opt"] = t.pose.state_dict()
        if t.app is not None:  # every rank's embedding rows in one table (one all-reduce), in shard 0
            app_state = t.app.state_dict()
            if ctx.is_main:
                payload["app_opt"] = app_state
        if t.bilagrid is not None:  # every rank's grids in one table (one all-reduce), in shard 0
            grid_state = t.bilagrid.state_dict()
            if ctx.is_main:
                payload["bilateral_grid"] = grid_state
        balance = t.balance.state_dict()  # every camera's last pairs (one all-reduce): the next costs

        def finalize() -> None:  # rank 0, once every shard is written
            epoch, in_epoch = t._batch_pos(step)
            # flags: the command line's, before the schedule was scaled (auto_resume.py compares them)
            state = {"config": cfg.to_dict(), "flags": t.flags, "scene": scene_fingerprint(t.scene, t.width, t.height),
                     "batcher": {**t.batcher.state_dict(), "epoch": epoch, "step": in_epoch},
                     "frame": frame_info(t.scene.transform, NORMALIZED),  # the checkpoint's Gaussians' world
                     "lr_batch": t.lr_batch, **({"balance": balance} if balance else {})}
            ck.finalize(root, step, counts, state, keep=cfg.keep_ckpts, interim=interim)
            newer = ck.newer_checkpoints(root, step)
            if newer and not self._warned_newer and not t.resume.found:  # found: said at start (auto_resume.py)
                self._warned_newer = True
                log.warning("%s holds checkpoints newer than this run's step %d (%s), from another "
                            "run: they are kept, and --ckpt %s resumes from the newest of them",
                            root, step, ", ".join(p.name for p in newer), root)

        saved = self.saves.checkpoint(step, payload, finalize)
        if cfg.save_ply and not interim and ply_due(cfg, step):
            self._export_ply(t, step, counts)
        self._write_cameras(t)
        barrier()
        return saved  # whether the checkpoint is complete (the same on every rank)

    def save_ply(self, t: "Trainer", step: int) -> None:
        """The merged PLY of `step` alone (--ply_steps between checkpoints); every rank calls it."""
        counts = gather_counts(len(t.params["means"]), self.device)
        t.n_all = sum(counts)
        self._export_ply(t, step, counts)
        self._write_cameras(t)
        barrier()

    def _export_ply(self, t: "Trainer", step: int, counts) -> None:
        """Every rank writes its rows of R/ply/point_cloud_NNNN.ply (a full disk skips it everywhere)."""
        cfg, ctx = t.cfg, self.ctx
        start = sum(counts[: ctx.rank])
        gaussians = dict(t.params) if t.app is None else t.app.baked(t.params)  # --app_opt: as gsplat
        if cfg.ply_frame == CAPTURE:
            gaussians = to_capture(gaussians, t.scene.transform)
        export_ply(self.result_dir, step, gaussians, start, t.n_all, ctx, self.saves)

    def _write_cameras(self, t: "Trainer") -> None:
        """The PLY's cameras (coords.py), once; a full disk: the next save."""
        if not self.cameras_written:
            write = lambda: write_cameras(self.result_dir, t.scene, t.cfg.ply_frame)  # noqa: E731
            self.cameras_written = self.saves.run("cameras.json", lambda r: self.result_dir / "cameras.json", 0,
                                                  write if self.ctx.is_main else None)

    def resume(self, t: "Trainer", path: str, found: bool = False, verified: bool = False) -> None:
        """Loads this rank's chunk of a checkpoint written by any number of ranks. `found`: the
        checkpoint was found in --result_dir (auto_resume.py), not named by --ckpt; `verified`:
        the shards this rank reads passed their checksums there already."""
        cfg, ctx = t.cfg, self.ctx
        meta = ck.read_meta(Path(path))
        saved = meta["state"].get("scene", {})
        mine = scene_fingerprint(t.scene, t.width, t.height)
        if saved != mine:
            source, instead = ((f"{meta['dir']} (the newest checkpoint of this run's flags in --result_dir)",
                                "pass --no-resume to start over, or another --result_dir") if found else
                               (f"--ckpt {meta['dir']}", "start without --ckpt"))
            raise ck.CheckpointError(
                f"{source} was written for another scene ({saved}) than this one "
                f"({mine}); pass the matching --data_dir or {instead}"
            )
        check_app_resume(meta["state"].get("config", {}), cfg, meta["dir"])
        saved_sh = meta["state"].get("config", {}).get("sh_degree", cfg.sh_degree)
        if saved_sh != cfg.sh_degree:  # else the first render fails on the colours' shape
            raise ck.CheckpointError(
                f"--ckpt {meta['dir']} holds colours of SH degree {saved_sh}, this run asks for "
                f"--sh_degree {cfg.sh_degree}; pass --sh_degree {saved_sh} to resume it"
            )
        n_all = meta["num_gaussians"]
        bounds = chunk_bounds(n_all, ctx.world_size)[ctx.rank]
        same_w = meta["world_size"] == ctx.world_size
        # Every shard this rank reads: a bad one raises on this rank, and the run's setup
        # agreement makes every rank raise it.
        if not verified:
            ck.verify_shards(meta, shards_to_read(meta, ctx))
        rows = ck.read_rows(meta, *bounds, verify=False)
        extra = ck.load_rows_into(rows, t.params, t.optimizers, self.device)
        if "uid" not in extra:
            extra["uid"] = initial_ids(bounds, self.device)
            if ctx.is_main:
                log.warning("--ckpt %s holds no Gaussian ids (written before they existed): its "
                            "Gaussians are numbered by their global order now", meta["dir"])
        for k, v in extra.items():
            t.strategy_state[k] = v
        t.n_all = n_all
        t._saved_lr_batch = meta["state"].get("lr_batch")
        t.start_step = int(meta["step"])
        t.ckpt_dir = meta["dir"]
        if t.pose is not None:
            t.pose.load_state_dict(ck.load_shard(meta, 0).get("pose_opt") or t.pose.state_dict())
        if t.app is not None:  # shard 0 holds every image's embedding; this rank keeps its own
            t.app.load_state_dict(ck.load_shard(meta, 0)["app_opt"])
        if t.bilagrid is not None:  # shard 0 holds every image's grid; this rank keeps its own
            grids = ck.load_shard(meta, 0).get("bilateral_grid")
            if grids is not None:
                t.bilagrid.load_state_dict(grids, meta["dir"])
            elif ctx.is_main:
                log.info("--ckpt %s holds no bilateral grids (trained without --use_bilateral_grid): they start "
                         "at the identity", meta["dir"])
        if same_w:  # each rank continues its own stream
            set_rng_state(ck.load_shard(meta, ctx.rank).get("rng"), self.device)
        else:  # another W cannot replay the old streams: a fresh, deterministic one per rank
            seed_rank_rng(cfg.seed, ctx.rank, t.start_step)
        if not (cfg.eval_only or cfg.render_only):  # no training: no batch sequence to continue
            t.batcher.load_state_dict(meta["state"]["batcher"])
            t.balance.load_state_dict(meta["state"].get("balance"))
            t.batch_start = t.batcher.epoch * t.batcher.steps_per_epoch + t.batcher.step
        if ctx.is_main:
            log.info("resumed %s: step %d, %d Gaussians (saved by %d ranks, now %d)%s", meta["dir"],
                     t.start_step, n_all, meta["world_size"], ctx.world_size,
                     "; the newest checkpoint of this run's flags in --result_dir (--no-resume starts over)"
                     if found else "")


def shards_to_read(meta: Dict[str, Any], ctx: DistContext) -> List[int]:
    """The shards a resume on this rank reads: those holding its rows on this W, and its own
    on the same W (its RNG state)."""
    bounds = chunk_bounds(meta["num_gaussians"], ctx.world_size)[ctx.rank]
    return ck.shards_for_rows(meta, *bounds) + ([ctx.rank] if meta["world_size"] == ctx.world_size else [])


def ply_due(cfg: Any, step: int) -> bool:
    """Whether --ply_steps asks for the PLY of `step` (its steps and the last; None: every save's)."""
    return cfg.ply_steps is None or step in cfg.ply_steps or step == cfg.max_steps


def scene_fingerprint(scene: Any, width: int, height: int) -> Dict[str, Any]:
    """What a checkpoint's scene must match: cameras, the first camera's size, names, sizes."""
    fp = {"num_cameras": scene.num_cameras, "width": width, "height": height, "names_head": scene.names[:3]}
    sizes = image_sizes(scene.widths, scene.heights)
    if len(sizes) > 1:  # mixed sizes: all of them (a single-size scene's stays as before)
        fp["sizes"] = [list(s) for s in sizes]
    return fp


def seed_rank_rng(seed: int, rank: int, step: int = 0) -> None:
    """Seeds torch's global RNG (CPU and CUDA) with a stream of its own for every
    (seed, rank, step): a fresh run at step 0, a resume onto another W at its step."""
    torch.manual_seed(int(np.random.SeedSequence([seed, rank, step]).generate_state(1, np.uint64)[0]))


def rng_state(device: torch.device) -> Dict[str, Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: Optional[Dict[str, Tensor]], device: torch.device) -> None:
    if not state:
        return
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
