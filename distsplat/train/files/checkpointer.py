"""A run's state in and out of checkpoints (docs/design.md invariant 5: nothing lost).

The trainer hands the checkpointer one dict of state objects, each with `state_dict()` and
`load_state_dict()` (torch's Stateful protocol) and a kind that says how it crosses world sizes
(docs/design.md, "where state lives"):

    rows    per Gaussian (ModelRows: parameters, Adam moments, strategy accumulators, ids): each
            rank writes its chunk; a resume reads its rows of any W
    shared  identical on every rank and JSON (the batch sequence, the learning-rate rule, the frame,
            the balance costs): rank 0 writes one copy into meta.json's state
    table   tensors every rank holds alike, or per-image rows summed into one table by state_dict
            (pose corrections, appearance embeddings, bilateral grids): rank 0's shard holds them
    rank    each rank's own (RankRNG: its random streams): its own shard, kept on the same W only
            (on another W the object's restart(step) runs instead)

Every rank calls every entry's state_dict() in the dict's order (some are collectives). A new
piece of state is one entry (trainer.py: `_run_state`). `Checkpointer.save` writes them through
checkpoint.py's atomic layout, guarded by save_guard.py's SaveGuard (a full disk on any rank skips
the save on every rank), with the merged PLY and cameras.json beside it; `Checkpointer.resume`
loads this rank's part of a checkpoint written by any number of ranks, after checking it was
written for this scene (`scene_fingerprint`), SH degree and colour model. Neither knows the
trainer: every rank calls them at the same point of the recipe (trainer.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from ...distributed import DistContext, barrier, chunk_bounds, gather_counts
from . import checkpoint as ck
from ..model.app_opt import check_resume as check_app_resume
from .coords import CAPTURE, NORMALIZED, frame_info, to_capture, write_cameras
from ..model.gaussians import initial_ids
from ..model.size_groups import image_sizes
from .outputs import export_ply
from .save_guard import SaveGuard, last_complete

log = logging.getLogger("distsplat.train.trainer")  # the trainer's log lines, as before the split

# Per-Gaussian strategy state: DefaultStrategy's accumulators and every Gaussian's id.
PER_GAUSSIAN_STATE = ("grad2d", "count", "radii", "uid")
ROWS, SHARED, TABLE, RANK = "rows", "shared", "table", "rank"  # the kinds of state (module doc)


@dataclass
class Entry:
    """One piece of a run's state: the object (state_dict / load_state_dict), its kind (ROWS,
    SHARED, TABLE, RANK) and its key in the checkpoint (meta.json's state or a shard)."""

    obj: Any
    kind: str
    key: str


@dataclass
class Resumed:
    """What a resume (or an imported model, model_import.py) leaves the run at."""

    step: int
    n_all: int  # Gaussians over all ranks
    dir: str  # the checkpoint, as messages name it


class ModelRows:
    """This rank's Gaussians as a checkpoint's rows: the parameters, their Adam moments and the
    per-Gaussian strategy state (the dicts are the trainer's own, updated in place)."""

    def __init__(self, params: torch.nn.ParameterDict, optimizers: Dict[str, torch.optim.Optimizer],
                 strategy_state: Dict[str, Any], device: torch.device):
        self.params, self.optimizers, self.strategy_state, self.device = params, optimizers, strategy_state, device

    def __len__(self) -> int:
        return len(self.params["means"])

    def state_dict(self) -> Dict[str, Any]:
        per_gaussian = {k: v for k, v in self.strategy_state.items()
                        if k in PER_GAUSSIAN_STATE and isinstance(v, Tensor)}
        return ck.shard_payload(self.params, self.optimizers, per_gaussian)

    def load_state_dict(self, rows: Dict[str, Any]) -> None:
        """`rows`: read_rows' of the global rows [start, end) (`bounds`); what they lack of the
        ids starts as the rows' global order."""
        extra = ck.load_rows_into(rows, self.params, self.optimizers, self.device)
        if "uid" not in extra:
            extra["uid"] = initial_ids(rows["bounds"], self.device)
        self.strategy_state.update(extra)


class RankRNG:
    """This rank's random streams (torch's global CPU and CUDA generators): densification and
    MCMC draw from them. Seeded per (seed, rank, step): a fresh run at step 0, a resume on
    another W at its step; on the same W a resume continues the saved streams."""

    def __init__(self, seed: int, rank: int, device: torch.device):
        self.seed, self.rank, self.device = seed, rank, device

    def restart(self, step: int = 0) -> None:
        seed_rank_rng(self.seed, self.rank, step)

    def state_dict(self) -> Dict[str, Tensor]:
        return rng_state(self.device)

    def load_state_dict(self, state: Optional[Dict[str, Tensor]]) -> None:
        set_rng_state(state, self.device)


class Checkpointer:
    """Saves and resumes one rank's part of a run's state (a dict of Entry) under R/ckpts."""

    def __init__(self, ctx: DistContext, device: torch.device, result_dir: Path, cfg: Any,
                 flags: Dict[str, Any]):
        self.ctx, self.device, self.result_dir = ctx, device, Path(result_dir)
        self.cfg = cfg  # the run's flags (keep_ckpts, save_ply, ply_steps, ply_frame, sh_degree, app_opt, seed)
        self.flags = flags  # as typed: what makes a checkpoint "of this run" (auto_resume.py)
        self.root = self.result_dir / "ckpts"
        self.saves = SaveGuard(ctx, device, self.root)  # a full disk skips a save
        self.cameras_written = False  # cameras.json (rank 0), with the first save
        self._warned_newer = False
        self.scene: Any = None

    def attach(self, scene: Any, width: int, height: int, ply_gaussians: Callable[[], Dict[str, Tensor]],
               resumed_found: bool = False) -> None:
        """The scene a checkpoint belongs to, and the Gaussians its PLY holds (the trainer's,
        with --app_opt baked as gsplat does); `resumed_found`: this run resumes a checkpoint
        found in --result_dir (auto_resume.py said so already: no warning of newer ones)."""
        self.scene, self.fingerprint = scene, scene_fingerprint(scene, width, height)
        self.ply_gaussians, self._warned_newer = ply_gaussians, resumed_found

    def step_dir(self, step: int) -> Path:
        """Where the checkpoint of `step` is once complete."""
        return ck.step_dir(self.root, step)

    def last_complete(self) -> str:
        """The newest complete checkpoint, in words (after a save that failed)."""
        return last_complete(self.root)

    def save(self, state: Dict[str, Entry], step: int, interim: bool = False) -> Tuple[bool, int]:
        """Checkpoint (atomic, resumable on any W) and the merged PLY (with --ply_steps only at those);
        every rank calls it. A full disk on any rank skips either on every rank, and training goes on
        (save_guard.py). `interim` (--save_every_minutes, a stop signal: preemption.py): the checkpoint
        alone, marked to be pruned once a newer regular one is whole (checkpoint.prunable).
        Returns (whether the checkpoint is complete, the same on every rank; the Gaussians of all ranks)."""
        ctx, root, cfg = self.ctx, self.root, self.cfg
        rows = next(e.obj for e in state.values() if e.kind == ROWS)  # this rank's Gaussians
        counts = gather_counts(len(rows), self.device)
        payload: Dict[str, Any] = {}
        shared: Dict[str, Any] = {}
        for entry in state.values():  # every rank, in order: some state_dicts are collectives
            value = entry.obj.state_dict()
            if entry.kind == ROWS:
                payload.update(value)
            elif entry.kind == RANK or (entry.kind == TABLE and ctx.is_main):
                payload[entry.key] = value
            elif entry.kind == SHARED:
                shared[entry.key] = value

        def finalize() -> None:  # rank 0, once every shard is written
            meta_state = {"config": cfg.to_dict(), "flags": self.flags, "scene": self.fingerprint, **shared}
            ck.finalize(root, step, counts, meta_state, keep=cfg.keep_ckpts, interim=interim)
            newer = ck.newer_checkpoints(root, step)
            if newer and not self._warned_newer:
                self._warned_newer = True
                log.warning("%s holds checkpoints newer than this run's step %d (%s), from another "
                            "run: they are kept, and --ckpt %s resumes from the newest of them",
                            root, step, ", ".join(p.name for p in newer), root)

        saved = self.saves.checkpoint(step, payload, finalize)
        if cfg.save_ply and not interim and ply_due(cfg, step):
            self._export_ply(step, counts)
        self._write_cameras()
        barrier()
        return saved, sum(counts)

    def save_ply(self, n_local: int, step: int) -> int:
        """The merged PLY of `step` alone (--ply_steps between checkpoints); every rank calls it.
        Returns the Gaussians of all ranks."""
        counts = gather_counts(n_local, self.device)
        self._export_ply(step, counts)
        self._write_cameras()
        barrier()
        return sum(counts)

    def _export_ply(self, step: int, counts: List[int]) -> None:
        """Every rank writes its rows of R/ply/point_cloud_NNNN.ply (a full disk skips it everywhere)."""
        start = sum(counts[: self.ctx.rank])
        gaussians = self.ply_gaussians()
        if self.cfg.ply_frame == CAPTURE:
            gaussians = to_capture(gaussians, self.scene.transform)
        export_ply(self.result_dir, step, gaussians, start, sum(counts), self.ctx, self.saves)

    def _write_cameras(self) -> None:
        """The PLY's cameras (coords.py), once; a full disk: the next save."""
        if not self.cameras_written:
            write = lambda: write_cameras(self.result_dir, self.scene, self.cfg.ply_frame)  # noqa: E731
            self.cameras_written = self.saves.run("cameras.json", lambda r: self.result_dir / "cameras.json", 0,
                                                  write if self.ctx.is_main else None)

    def resume(self, state: Dict[str, Entry], path: str, found: bool = False, verified: bool = False) -> Resumed:
        """Loads this rank's part of a checkpoint written by any number of ranks into `state`.
        `found`: the checkpoint was found in --result_dir (auto_resume.py), not named by --ckpt;
        `verified`: the shards this rank reads passed their checksums there already."""
        ctx = self.ctx
        meta = ck.read_meta(Path(path))
        self._check(meta, found)
        n_all = meta["num_gaussians"]
        bounds = chunk_bounds(n_all, ctx.world_size)[ctx.rank]
        same_w = meta["world_size"] == ctx.world_size
        # Every shard this rank reads: a bad one raises on this rank, and the run's setup
        # agreement makes every rank raise it.
        if not verified:
            ck.verify_shards(meta, shards_to_read(meta, ctx))
        step = int(meta["step"])
        shard0: Dict[str, Any] = {}  # rank 0's shard, read once for every table entry

        def table(key: str) -> Any:
            if not shard0:
                shard0.update(ck.load_shard(meta, 0))
            return shard0.get(key)

        for entry in state.values():
            if entry.kind == ROWS:
                rows = ck.read_rows(meta, *bounds, verify=False)
                if "uid" not in rows["per_gaussian"] and ctx.is_main:
                    log.warning("--ckpt %s holds no Gaussian ids (written before they existed): its "
                                "Gaussians are numbered by their global order now", meta["dir"])
                entry.obj.load_state_dict({**rows, "bounds": bounds})
            elif entry.kind == RANK:
                if same_w:  # each rank continues its own stream
                    entry.obj.load_state_dict(ck.load_shard(meta, ctx.rank).get(entry.key))
                else:  # another W cannot replay the old streams: a fresh, deterministic one per rank
                    entry.obj.restart(step)
            else:
                value = meta["state"].get(entry.key) if entry.kind == SHARED else table(entry.key)
                if value is not None:
                    try:
                        entry.obj.load_state_dict(value)
                    except ValueError as e:  # the object's words, with the checkpoint they are about
                        raise ck.CheckpointError(f"--ckpt {meta['dir']}: {e}") from e
                elif entry.kind == TABLE and ctx.is_main:
                    log.info("--ckpt %s holds no %s (trained without it): it starts fresh", meta["dir"],
                             entry.key.replace("_", " "))
        if ctx.is_main:
            log.info("resumed %s: step %d, %d Gaussians (saved by %d ranks, now %d)%s", meta["dir"],
                     step, n_all, meta["world_size"], ctx.world_size,
                     "; the newest checkpoint of this run's flags in --result_dir (--no-resume starts over)"
                     if found else "")
        return Resumed(step, n_all, meta["dir"])

    def _check(self, meta: Dict[str, Any], found: bool) -> None:
        """CheckpointError unless the checkpoint fits this run: its scene, colour model, SH degree."""
        cfg = self.cfg
        saved = meta["state"].get("scene", {})
        if saved != self.fingerprint:
            source, instead = ((f"{meta['dir']} (the newest checkpoint of this run's flags in --result_dir)",
                                "pass --no-resume to start over, or another --result_dir") if found else
                               (f"--ckpt {meta['dir']}", "start without --ckpt"))
            raise ck.CheckpointError(
                f"{source} was written for another scene ({saved}) than this one "
                f"({self.fingerprint}); pass the matching --data_dir or {instead}"
            )
        saved_cfg = meta["state"].get("config", {})
        check_app_resume(saved_cfg, cfg, meta["dir"])  # colours are SH or appearance features
        saved_sh = saved_cfg.get("sh_degree", cfg.sh_degree)
        if saved_sh != cfg.sh_degree:  # else the first render fails on the colours' shape
            raise ck.CheckpointError(
                f"--ckpt {meta['dir']} holds colours of SH degree {saved_sh}, this run asks for "
                f"--sh_degree {cfg.sh_degree}; pass --sh_degree {saved_sh} to resume it"
            )


class Frame:
    """The world the checkpoint's Gaussians are in (coords.py: `frame` in meta.json, for the
    tools that read a checkpoint); nothing to restore, the scene gives it."""

    def __init__(self, transform: np.ndarray):
        self.transform = transform

    def state_dict(self) -> Dict[str, Any]:
        return frame_info(self.transform, NORMALIZED)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        pass


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
