"""The same command resumes (issue 44; docs/robustness.md "Preemption"): a launch without
--ckpt finds the newest checkpoint of this run in --result_dir/ckpts and resumes from it, so a
requeued job, or torchrun's restart of its workers after a rank died, goes on where the run
stopped instead of training from step 1 over its own checkpoints.

A checkpoint is *of this run* when the flags that change the result (every trainer flag but
NOT_RESULT) are those it was saved with: meta.json's state `flags`, as typed, before
--steps_scaler / --schedule_in_images scale the schedule, so a resume on another W matches too
(older checkpoints without them: the scaled `config`). Newest first, a checkpoint that is
damaged (meta.json unreadable or failing its checksum, a shard missing or failing its SHA-256
on any rank) is skipped with a warning, one of other flags is passed over. None of this run
but some of other flags: refused, naming the flags (--ckpt resumes one anyway, --no-resume
starts over). The newest at or past --max_steps with its final PLY and evaluation written:
the run is finished and nothing is written; without them (stopped while writing them) the
launch resumes it at its last step and writes them.

It runs after the flags' check and before setup, reading only; every rank reads the same files,
and one agreement per candidate (an all-reduce of W rows: the step each rank chose and
whether the shards it reads verify) makes every rank resume from the same checkpoint, or give
the same error (agreed), whatever its own reads found.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..distributed import DistContext, all_reduce_sum
from .files import checkpoint as ck
from .files.checkpointer import shards_to_read
from .config import Config
from .run_checks import agree

log = logging.getLogger("distsplat.train.trainer")  # the trainer's log lines

# The trainer's flags that do not change the trained model: where and when it is written, what
# is evaluated or rendered, how images are read and cached, resources and guards, logs, the
# backend's kernels (the W-invariance of docs/determinism.md), and this module's own. A flag
# not listed counts (a new flag is refused until someone says it does not change the result).
NOT_RESULT = frozenset({
    "result_dir", "max_steps", "save_steps", "save_ply", "ply_steps", "keep_ckpts", "ckpt", "resume",
    "save_every_minutes", "eval_steps", "eval_only", "render_only", "render_traj_path", "render_traj_frames",
    "render_fps", "disable_video", "lpips_net", "lpips_weights", "lpips_heads", "ply_frame", "tb_every",
    "tb_save_image", "log_every", "use_fused_bilagrid",
    "cache", "cache_budget_gb", "num_workers", "prefetch", "node_local_data", "data_shards",
    "memory_limit_gb", "memory_fraction", "max_bad_steps", "backend", "ssim_impl", "strategy.verbose",
})


def run_flags(cfg: Config) -> Dict[str, Any]:
    """The trainer's flags of `cfg` (not the viewer's), flattened (`strategy.grow_grad2d`,
    `strategy.type` for the subcommand), as JSON reads them back: what a checkpoint saves."""
    own = {f.name for f in dataclasses.fields(Config)}
    flat: Dict[str, Any] = {}

    def walk(prefix: str, d: Dict[str, Any]) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                walk(f"{prefix}{k}.", v)
            else:
                flat[prefix + k] = v

    walk("", {k: v for k, v in cfg.to_dict().items() if k in own})
    return json.loads(json.dumps(flat))


def differing(saved: Dict[str, Any], now: Dict[str, Any]) -> List[Tuple[str, Any, Any]]:
    """(flag, saved value, value now) of the result flags both hold that differ."""
    return [(k, saved[k], now[k]) for k in sorted(now) if k not in NOT_RESULT and k in saved and saved[k] != now[k]]


def describe(diffs: List[Tuple[str, Any, Any]]) -> str:
    def show(v: Any) -> str:
        return json.dumps(v) if isinstance(v, (list, dict)) else str(v)

    def name(k: str) -> str:
        return "the subcommand (default | mcmc)" if k == "strategy.type" else f"--{k}"

    return "; ".join(f"{name(k)} {show(a)} there, {show(b)} now" for k, a, b in diffs)


@dataclass
class Candidate:
    path: Path
    step: int
    problem: Optional[str] = None  # why it cannot be read (the same on every rank: its meta.json)
    diffs: List[Tuple[str, Any, Any]] = field(default_factory=list)  # result flags it differs in
    meta: Optional[Dict[str, Any]] = None

    @property
    def usable(self) -> bool:
        return self.problem is None and not self.diffs


@dataclass
class Plan:
    """Where setup resumes from. ckpt None: from step 0; finished: the run is done, nothing to do."""

    ckpt: Optional[str] = None
    found: bool = False  # found in --result_dir, not named by --ckpt
    verified: bool = False  # the shards this rank reads passed their checksums here
    finished: Optional[str] = None  # rank 0's line saying so


def plan(cfg: Config, ctx: DistContext, flags: Dict[str, Any]) -> Plan:
    """The checkpoint this launch resumes from: --ckpt's, else the newest of this run in
    --result_dir (`flags`: this run's, run_flags of the command line), the same on every rank.
    Bad states raise a ValueError agreed by every rank; rank 0 logs what it chose and skipped."""
    if cfg.ckpt is not None or cfg.eval_only or cfg.render_only:
        return Plan(ckpt=cfg.ckpt)
    root = Path(cfg.result_dir) / "ckpts"
    found: List[Candidate] = []
    agree(ctx, lambda: found.extend(scan(root, cfg, flags)), "looking for a checkpoint to resume")
    if not cfg.resume:
        if found and ctx.is_main:
            log.warning("--no-resume: %s holds checkpoints (newest %s); this run starts from step 0 and its saves "
                        "replace them at the same steps", root, found[0].path.name)
        return Plan()
    chosen, damaged = choose(ctx, found)
    result: List[Plan] = []
    agree(ctx, lambda: result.append(decide(cfg, ctx, root, found, chosen, damaged)), "choosing the checkpoint")
    return result[0]


def scan(root: Path, cfg: Config, flags: Dict[str, Any]) -> List[Candidate]:
    """The complete checkpoints under `root`, newest first, each read (meta.json) and compared."""
    out = []
    for path in reversed(ck.complete_checkpoints(root)):
        c = Candidate(path, ck._step_of(path))
        try:
            c.meta = ck.read_meta(path)
        except ck.CheckpointError as e:
            c.problem = str(e).split("; ", 1)[0]  # without read_meta's advice: we fall back ourselves
            out.append(c)
            continue
        saved = c.meta["state"].get("flags")
        if saved is None:  # written before checkpoints kept their flags: the scaled config
            c.diffs = differing(_flat(c.meta["state"].get("config", {})), _flat(cfg.to_dict()))
        else:
            c.diffs = differing(saved, flags)
        out.append(c)
    return out


def _flat(d: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    flat: Dict[str, Any] = {}
    for k, v in d.items():
        flat.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
    return json.loads(json.dumps(flat))


def choose(ctx: DistContext, found: List[Candidate]) -> Tuple[Optional[Candidate], Dict[int, str]]:
    """The newest usable candidate whose shards verify on every rank, and {step: why} of those
    skipped as damaged. One all-reduce per candidate tried, of W rows (the step this rank chose
    + 1, whether its shards fail): every rank takes the same decisions from the same sums."""
    W, r = ctx.world_size, ctx.rank
    damaged = {c.step: c.problem for c in found if c.problem is not None}
    excluded: set = set()
    while True:
        c = next((c for c in found if c.usable and c.step not in excluded), None)
        problem = None
        if c is not None:
            bad = ck.check_shards(c.meta, shards_to_read(c.meta, ctx))
            if bad:
                first = min(bad)
                problem = str(ck.shard_error(c.meta, first, bad[first], len(bad) - 1)).split("; ", 1)[0]
                log.warning("%s cannot be resumed: %s", c.path, problem)  # every rank that found it says it
        row = torch.zeros(W, 2, dtype=torch.int64, device=ctx.device)  # [W, (chosen step + 1, shards bad)]
        row[r, 0], row[r, 1] = (c.step + 1 if c is not None else 0), int(problem is not None)
        rows = all_reduce_sum(row).tolist()
        steps = {v[0] for v in rows}
        if len(steps) > 1:  # a network file system that does not show every rank the same files yet
            e = ValueError(f"the ranks see different checkpoints in {found[0].path.parent if found else 'ckpts/'}: "
                           f"{', '.join(f'rank {q}: step {v[0] - 1}' for q, v in enumerate(rows))}; relaunch once "
                           "the file system shows every node the same files, or pass --ckpt")
            e.agreed = True  # type: ignore[attr-defined]  # from the summed rows: the same on every rank
            raise e
        if c is None:
            return None, damaged
        bad_ranks = [q for q, v in enumerate(rows) if v[1]]
        if not bad_ranks:
            return c, damaged
        excluded.add(c.step)
        damaged[c.step] = problem if problem is not None else (
            f"a shard fails its checksum on rank{'s' if len(bad_ranks) > 1 else ''} "
            f"{', '.join(map(str, bad_ranks))} (see {'their' if len(bad_ranks) > 1 else 'its'} warning)")


def decide(cfg: Config, ctx: DistContext, root: Path, found: List[Candidate], chosen: Optional[Candidate],
           damaged: Dict[int, str]) -> Plan:
    """The plan from the agreed choice; the errors and lines are the same on every rank."""
    others = [c for c in found if c.problem is None and c.diffs]
    if chosen is None:
        if others:
            c = others[0]
            raise ValueError(
                f"--result_dir {cfg.result_dir} holds a run with other flags ({c.path}): {describe(c.diffs)}. "
                f"To resume that run, relaunch with its flags (in {c.path / ck.META}, state.flags); to resume it "
                f"with these, pass --ckpt {root}; to start this run over there, pass --no-resume (its saves replace "
                "the old checkpoints of the same steps); or pass another --result_dir")
        if damaged:
            raise ValueError(
                f"no checkpoint in {root} can be resumed: "
                + "; ".join(f"step_{s:06d}: {why}" for s, why in sorted(damaged.items(), reverse=True))
                + ". Pass --no-resume to start over (its saves replace these), or --ckpt a good copy")
        return Plan()
    if ctx.is_main:
        for s, why in sorted(damaged.items(), reverse=True):
            if s > chosen.step:
                log.warning("%s cannot be resumed (%s): resuming from the previous one, %s",
                            ck.step_dir(root, s), why, chosen.path)
        newer = [c for c in others if c.step > chosen.step]
        if newer:
            log.warning("%s also holds newer checkpoints of other flags (%s: %s); they are kept", root,
                        newer[0].path.name, describe(newer[0].diffs))
    if chosen.step >= cfg.max_steps and (chosen.step > cfg.max_steps or final_outputs_written(cfg)):
        where = "past" if chosen.step > cfg.max_steps else "at"
        return Plan(finished=(
            f"{cfg.result_dir} holds this run finished: {chosen.path} is {where} --max_steps {cfg.max_steps}, "
            "nothing to train and nothing written. A larger --max_steps trains on from it; --no-resume trains "
            "again from step 0"))
    return Plan(ckpt=str(chosen.path), found=True, verified=True)


def final_outputs_written(cfg: Config) -> bool:
    """Whether the run's last step has its evaluation (and PLY, with --save_ply) in --result_dir."""
    r, m = Path(cfg.result_dir), cfg.max_steps
    ply = r / "ply" / f"point_cloud_{m:04d}.ply"
    return (r / "stats" / f"val_step{m:04d}.json").is_file() and (not cfg.save_ply or ply.is_file())
