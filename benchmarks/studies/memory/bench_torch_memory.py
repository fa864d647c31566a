"""Peak resident memory of a training step on the torch backend (issue 34): per rank, vs
Gaussians and image size, with the compositing's working memory bounded
(torch_backend.WORKING_BYTES, the default) and unbounded (WORKING_BYTES = 2^62: autograd
keeps every block's intermediates until backward, the code before the bound).

Two parts, each configuration in a fresh process (ru_maxrss is a process's lifetime peak):
  step  W = 1: the trainer (Trainer.setup, then STEPS calls of Trainer.train_step, the code
        the CLI runs) on the built-in ball scene with N Gaussians (the scene's points) at
        WIDTHxHEIGHT, one camera per step. Records RSS after setup (base), the peak after
        setup and after the steps; step_over_base_mb = peak after the steps - base; bounded,
        guard_sees_mb = the RSS after the steps + the guard's working memory (what its
        decisions count) against peak_rss_mb.
  cli   W = 2: the real CLI under torchrun (`simple_trainer.py default`, the built-in scene,
        CLI_STEPS steps, one evaluation at the end), peak RSS per rank from its
        stats/train_stepNNNN_rankR.json ("mem": ru_maxrss; includes setup and evaluation).

    nice -n 15 python benchmarks/studies/memory/bench_torch_memory.py

Environment: SIZES ("20000,50000,100000"), IMAGES ("240x135,479x269"), STEPS (2),
CLI ("100000x479x269": N x WIDTH x HEIGHT, empty for none), CLI_STEPS (3). Writes
the snapshot benchmarks/results/torch_memory_<device>_<date>.json and prints one summary line.
"""

from __future__ import annotations

import json
import os
import resource
import runpy
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

UNBOUNDED = 1 << 62


def _unbound(mode: str) -> None:
    from distsplat.render import torch_backend

    if mode == "unbounded":
        torch_backend.WORKING_BYTES = UNBOUNDED


def step_worker(mode: str, n: int, width: int, height: int, steps: int) -> dict:
    """One W = 1 trainer in this process: RSS around STEPS training steps."""
    import gc

    import torch

    from benchmarks.procs import make_config, prewarm
    from distsplat.distributed import DistContext
    from distsplat.render import torch_backend
    from distsplat.train.guards.memory import rss_bytes
    from distsplat.train.trainer import Trainer

    torch.set_num_threads(1)  # as a torchrun rank (OMP_NUM_THREADS=1)
    _unbound(mode)
    spec = {"kind": "builtin", "gaussians": n, "width": width, "height": height, "cameras": 8}
    mb = 2.0 ** -20
    with tempfile.TemporaryDirectory(prefix="distsplat-mem-") as out:
        cfg = make_config(spec, steps + 3, out)
        ctx = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)
        trainer = Trainer(cfg, ctx)
        try:
            trainer.setup()
            prewarm(trainer)
            gc.collect()
            base, setup_peak = rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            t0 = time.perf_counter()
            for step in range(3, 3 + steps):  # SH degree 3 from step 3 (make_config)
                trainer.train_step(step)
            step_s = (time.perf_counter() - t0) / steps
            peak, after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, rss_bytes()
            return {"mode": mode, "gaussians": len(trainer.params["means"]), "width": width, "height": height,
                    "working_bytes": torch_backend.WORKING_BYTES, "steps": steps, "step_s": round(step_s, 2),
                    "rss_base_mb": round(base * mb), "setup_peak_rss_mb": round(setup_peak * mb),
                    "peak_rss_mb": round(peak * mb), "step_over_base_mb": round((peak - base) * mb),
                    "rss_after_steps_mb": round(after * mb),  # what the guard reads between steps
                    "guard_sees_mb": round((after + trainer.memory_guard.working) * mb) if mode == "bounded" else None}
        finally:
            trainer.cleanup()


def cli_rank(mode: str, argv: list) -> None:
    """A torchrun rank: the real CLI (examples/simple_trainer.py) with `mode`'s budget."""
    _unbound(mode)
    sys.argv = [str(REPO / "examples" / "simple_trainer.py")] + argv
    runpy.run_path(sys.argv[0], run_name="__main__")


def run_cli(mode: str, n: int, width: int, height: int, steps: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    with tempfile.TemporaryDirectory(prefix="distsplat-mem-cli-") as out:
        argv = ["default", "--synthetic.kind", "ball", "--synthetic.num_gaussians", str(n),
                "--synthetic.width", str(width), "--synthetic.height", str(height), "--synthetic.num_cameras", "16",
                "--max_steps", str(steps), "--eval_steps", str(steps), "--save_steps", "--disable_viewer",
                "--no-save_ply", "--num_workers", "1", "--result_dir", out]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               __file__, "--cli-rank", mode, *argv]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
        if p.returncode != 0:
            raise RuntimeError(f"the CLI failed ({mode}):\n{p.stderr[-3000:]}")
        ranks = [json.loads((Path(out) / "stats" / f"train_step{steps:04d}_rank{r}.json").read_text())
                 for r in range(2)]
        guard = [line for line in p.stderr.splitlines() if "memory guard:" in line]
    return {"mode": mode, "W": 2, "gaussians_all": n, "width": width, "height": height, "steps": steps,
            "wall_s": round(time.perf_counter() - t0, 1),
            "command": "torchrun --standalone --nproc_per_node=2 examples/simple_trainer.py " + " ".join(argv[:-1]),
            "launched_as": "each rank runs benchmarks/studies/memory/bench_torch_memory.py --cli-rank MODE ARGS: the budget set, then "
                           "examples/simple_trainer.py as __main__",
            "peak_rss_mb_per_rank": [round(r["mem"] * 1024) for r in ranks],
            "gaussians_per_rank": [r["num_GS"] for r in ranks], "guard_log": guard[:2]}


def main() -> None:
    from benchmarks.common import write_result

    sizes = [int(x) for x in os.environ.get("SIZES", "20000,50000,100000").split(",")]
    images = [tuple(int(v) for v in x.split("x")) for x in os.environ.get("IMAGES", "240x135,479x269").split(",")]
    steps, cli_steps = int(os.environ.get("STEPS", 2)), int(os.environ.get("CLI_STEPS", 3))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    step_runs = []
    for width, height in images:
        for n in sizes:
            for mode in ("unbounded", "bounded"):
                cmd = [sys.executable, __file__, "--step", mode, str(n), str(width), str(height), str(steps)]
                p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, check=True)
                step_runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
                print(json.dumps(step_runs[-1]), flush=True)
    cli_runs = []
    for spec in filter(None, os.environ.get("CLI", "100000x479x269").split(",")):
        n, width, height = (int(v) for v in spec.split("x"))
        for mode in ("unbounded", "bounded"):
            cli_runs.append(run_cli(mode, n, width, height, cli_steps))
            print(json.dumps(cli_runs[-1]), flush=True)
    from distsplat.render import torch_backend

    path = write_result("torch_memory", {
        "what": "peak RSS of torch-backend training steps, compositing working memory bounded vs unbounded",
        "working_bytes": torch_backend.WORKING_BYTES, "bytes_per_element": torch_backend.BYTES_PER_ELEMENT,
        "scene": "built-in ball scene, its N points as the initial Gaussians, SH degree 3, batch 1",
        "step": step_runs, "cli": cli_runs})
    big = [r for r in step_runs if r["gaussians"] == max(sizes) and (r["width"], r["height"]) == images[-1]]
    print("peak RSS at %d Gaussians %dx%d: %s -> %s" % (max(sizes), *images[-1], " -> ".join(
        f"{r['mode']} {r['peak_rss_mb']} MB" for r in big), path))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--step"]:
        a = sys.argv[2:]
        print(json.dumps(step_worker(a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4]))))
    elif sys.argv[1:2] == ["--cli-rank"]:
        cli_rank(sys.argv[2], sys.argv[3:])
    else:
        main()
