"""Shared by the benchmarks that start ranks (scaling_gpu.py, studies/): the benchmark scene as a trainer
Config, and W gloo CPU processes started the way torchrun would start them.

SCENE (environment): `builtin` (the trainer's synthetic scene at the size below), or a
scene folder (COLMAP or Blender) read with DATA_FACTOR. The synthetic size comes from
SYNTH = "GAUSSIANS,WIDTH,HEIGHT,CAMERAS" (default 20000,128,96,32): bigger than the
ball scene's old default (3000 at 64x48) so that a step does measurable work on CPU.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SYNTH = "20000,128,96,32"


def scene_spec() -> Dict[str, Any]:
    """The benchmark scene from the environment, as a plain dict (it travels to workers)."""
    scene = os.environ.get("SCENE", "builtin")
    if scene == "builtin":
        n, w, h, c = (int(x) for x in os.environ.get("SYNTH", DEFAULT_SYNTH).split(","))
        return {"kind": "builtin", "gaussians": n, "width": w, "height": h, "cameras": c}
    return {"kind": "folder", "data_dir": scene, "data_factor": int(os.environ.get("DATA_FACTOR", 4))}


def trainer_config(result_dir: str, max_steps: int, data_dir: Optional[str] = None,
                   data_factor: Optional[int] = None, strategy: str = "default"):
    """What `simple_trainer.py default|mcmc --max_steps S --result_dir R --disable_viewer --no-save_ply
    --eval_steps --save_steps` (with `--data_dir D --data_factor F` for a scene folder) parses: the
    user's config, nothing evaluated or saved inside the benchmark's steps. Not validated."""
    from distsplat.train.config import default_config, mcmc_config

    cfg = default_config() if strategy == "default" else mcmc_config()
    cfg.data_dir = data_dir
    if data_factor is not None:
        cfg.data_factor = data_factor
    cfg.max_steps, cfg.result_dir = max_steps, result_dir
    cfg.eval_steps, cfg.save_steps, cfg.save_ply = [], [], False  # (cli.run: the app's viewer is not attached)
    return cfg


def steady_state(cfg, refine_at: Optional[int] = None):
    """cfg for timing steps: SH degree 3 from step 3 on (the steady-state payload), images decoded
    in RAM (see prewarm()). Densification statistics are accumulated every step
    (DefaultStrategy.step_post_backward); the grow/prune/rebalance step runs only at step
    `refine_at` (None: never), so the other steps have a fixed number of Gaussians. Validated."""
    cfg.cache = "decoded"
    cfg.sh_degree_interval = 1
    s = cfg.strategy
    if refine_at is None:
        s.refine_start_iter = s.refine_stop_iter = 10 ** 9
    else:  # only refine_at satisfies start < step < stop and step % every == 0
        s.refine_start_iter, s.refine_every, s.refine_stop_iter = refine_at - 1, refine_at, refine_at + 1
    if hasattr(s, "reset_every"):
        s.reset_every = 10 ** 9
    cfg.validate()
    return cfg


def make_config(spec: Dict[str, Any], steps: int, result_dir: str, refine_at: Optional[int] = None,
                strategy: str = "default"):
    """A trainer Config for `steps` calls of Trainer.train_step on `spec`, one loader thread per
    rank (W ranks share the cores), timed as steady_state says."""
    from distsplat.train.config import SyntheticConfig

    cfg = trainer_config(result_dir, steps, spec.get("data_dir"), spec.get("data_factor"), strategy)
    if spec["kind"] == "builtin":
        cfg.synthetic = SyntheticConfig(kind="ball", num_cameras=spec["cameras"], num_gaussians=spec["gaussians"],
                                        width=spec["width"], height=spec["height"])
    cfg.num_workers = 1
    return steady_state(cfg, refine_at)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, W: int, port: int, fn: Callable, args: tuple, out_dir: str) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(W), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(W)})
    sys.path.insert(0, str(ROOT))
    torch.set_num_threads(1)  # as torchrun's OMP_NUM_THREADS=1: W processes share the cores
    from distsplat.distributed import destroy, init_distributed

    ctx = init_distributed(backend="gloo", timeout_s=300)
    try:
        torch.save(fn(ctx, *args), Path(out_dir) / f"rank{rank}.pt")
    finally:
        destroy(ctx)


def run_ranks(fn: Callable, W: int, *args: Any) -> List[Any]:
    """fn(ctx, *args) on W gloo CPU processes (spawned, one thread each); per-rank results."""
    with tempfile.TemporaryDirectory(prefix="distsplat-bench-") as out_dir:
        mp.start_processes(_entry, args=(W, free_port(), fn, args, out_dir), nprocs=W,
                           start_method="spawn", join=True)
        return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=False) for r in range(W)]


def prewarm(trainer) -> None:
    """Fills the rank's image cache before timing. The built-in scene renders its
    ground-truth images on first read (in the loader's thread, during the first epoch),
    which would otherwise run next to the timed steps."""
    import numpy as np

    cache = trainer.cache
    for cam in cache.own:
        cache.read_into(cam, np.empty(cache.specs[cam].shape, dtype=np.uint8))


def worker_pids(agent: int) -> Dict[int, int]:
    """{rank: pid} of torchrun's workers (children of the agent process). Each runs in a
    session of its own, so killing torchrun's process group leaves them running."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) != agent:
                continue
            env = dict(kv.split("=", 1) for kv in (d / "environ").read_text().split("\0") if "=" in kv)
        except (OSError, ValueError, IndexError):
            continue
        if "RANK" in env:
            out[int(env["RANK"])] = int(d.name)
    return out
