"""Where the time of a W = 1 step goes on a CUDA GPU: ours against gsplat, kernels and host.

Three measurements, one process, one GPU:

  render    bench_vs_gsplat's scene (N Gaussians, 1297x840, SH 3): torch.profiler over
            REPS forward+backward passes of gsplat.rasterization(packed=True), our
            one-process `rasterize` and our `distributed_rasterize` at W = 1; the tables
            (self CUDA time, self CPU time) name the kernels and ops the extra time is in.
  trainer   distsplat's Trainer.train_step at W = 1 on a COLMAP scene (default
            $DISTSPLAT_DATA/thermos at full resolution), for each image cache mode: steps/s
            and the share of the step the host spends in the image loader's next() (the
            data-wait share; issue 14's goal < 1% with `decoded` or `gpu`), and of that the
            share blocked until the batch's images were ready.
  host      cProfile of the `gpu`-cache trainer's steps: the Python functions the host time
            is in (a GPU step whose kernels are short is bound by the host launching them).

    python benchmarks/profile_gpu.py [TABLE_DIR]
Environment: N (1000000), REPS (5), SCENE, DATA_FACTOR (1), CACHES (none,decoded,gpu,gpu-nocheck,
gpu-torchssim: the gpu cache with --max_bad_steps 0, and with --ssim_impl torch),
PROFILE_WARM (100), PROFILE_STEPS (300). Writes benchmarks/results/profile_gpu_cuda.json, the tables to
TABLE_DIR (default: a temporary folder), and prints one summary line.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_vs_gsplat import SH_DEGREE, make_scene, renderers  # noqa: E402
from benchmarks.common import write_result  # noqa: E402


def profile_render(table_dir: Path, n: int, reps: int) -> Dict[str, Any]:
    from gsplat import rasterization
    from torch.profiler import ProfilerActivity, profile

    width, height = 1297, 840
    scene = make_scene(n, width, height, 1, "cuda")

    def gsplat_fn(p):
        c, a, _ = rasterization(p["means"], p["quats"], p["scales"], p["opacities"], p["colors"],
                                p["viewmats"], p["Ks"], width, height, sh_degree=SH_DEGREE, packed=True)
        return c.sum() + a.sum()

    fns = {"gsplat": gsplat_fn, **renderers(width, height, "gsplat")}
    out: Dict[str, Any] = {}
    for name, fn in fns.items():
        def one():
            p = {k: v.detach().clone().requires_grad_(k not in ("viewmats", "Ks")) for k, v in scene.items()}
            fn(p).backward()

        for _ in range(2):
            one()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            one()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / reps
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                one()
            torch.cuda.synchronize()
        ka = prof.key_averages()
        cuda_us = sum(e.self_device_time_total for e in ka) / reps
        cpu_us = sum(e.self_cpu_time_total for e in ka) / reps
        (table_dir / f"render_{name}.txt").write_text(
            f"{name}: wall {wall * 1e3:.3f} ms per fwd+bwd (no profiler), kernels {cuda_us / 1e3:.3f} ms, "
            f"host ops {cpu_us / 1e3:.3f} ms (profiled, per pass)\n\n"
            + ka.table(sort_by="self_cuda_time_total", row_limit=35) + "\n\n"
            + ka.table(sort_by="self_cpu_time_total", row_limit=25))
        top = sorted(ka, key=lambda e: -e.self_device_time_total)[:12]
        out[name] = {"wall_ms": wall * 1e3, "kernel_ms": cuda_us / 1e3, "host_ops_ms": cpu_us / 1e3,
                     "top_device_ops_ms": {e.key[:80]: e.self_device_time_total / reps / 1e3 for e in top}}
        del prof
    return {"scene": {"gaussians": n, "width": width, "height": height, "sh_degree": SH_DEGREE}, "reps": reps,
            "runs": out}


class TimedLoader:
    """Wraps the trainer's image loader: host seconds spent inside next()."""

    def __init__(self, inner):
        self.inner, self.wait = inner, 0.0

    def __next__(self):
        t0 = time.perf_counter()
        try:
            return next(self.inner)
        finally:
            self.wait += time.perf_counter() - t0

    def __iter__(self):
        return self

    def close(self):
        self.inner.close()


def profile_trainer(table_dir: Path, scene: str, data_factor: int, caches, warm: int, steps: int) -> Dict[str, Any]:
    from distsplat.distributed import init_distributed
    from distsplat.train.config import Config
    from distsplat.train.trainer import Trainer

    ctx = init_distributed()
    out: Dict[str, Any] = {}
    for variant in caches:
        # "gpu-nocheck": the gpu cache without the divergence check (--max_bad_steps 0), whose
        # host read after backward stops the host from running ahead of the GPU;
        # "gpu-torchssim": the gpu cache with the PyTorch SSIM (--ssim_impl torch) where the
        # others take fused-ssim's kernels when it is installed (--ssim_impl auto)
        cache, flags = variant.split("-")[0], variant.split("-")[1:]
        unknown = set(flags) - {"nocheck", "torchssim"}
        if unknown:
            sys.exit(f"profile_gpu.py: CACHES: unknown variant flag(s) {sorted(unknown)} in {variant!r}")
        tmp = tempfile.mkdtemp(prefix=f"profile_{variant}_")
        cfg = Config(data_dir=scene, data_factor=data_factor, result_dir=tmp, max_steps=warm + 2 * steps + 10,
                     eval_steps=[], save_steps=[], save_ply=False, disable_viewer=True, backend="gsplat",
                     cache=cache, **({"max_bad_steps": 0} if "nocheck" in flags else {}),
                     **({"ssim_impl": "torch"} if "torchssim" in flags else {}))
        cfg.validate()
        trainer = Trainer(cfg, ctx)
        t_setup = time.perf_counter()
        trainer.setup()
        t_setup = time.perf_counter() - t_setup
        try:
            trainer.loader = TimedLoader(trainer.loader)
            for step in range(warm):
                trainer.train_step(step)
            torch.cuda.synchronize()
            trainer.loader.wait = 0.0
            blocked0 = sum(trainer.loader.inner.wait_s)
            t0 = time.perf_counter()
            for step in range(warm, warm + steps):
                trainer.train_step(step)
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            rec = {"setup_s": t_setup, "steps": steps, "step_ms": wall / steps * 1e3, "steps_per_s": steps / wall,
                   "ssim_impl": trainer.ssim_impl,
                   "data_wait_ms_per_step": trainer.loader.wait / steps * 1e3,
                   "data_wait_share": trainer.loader.wait / wall,
                   # of which blocked until the batch's images were ready (ImageLoader.wait_s);
                   # the rest is the loader's bookkeeping on the host (the next batch's submit)
                   "blocked_wait_share": (sum(trainer.loader.inner.wait_s) - blocked0) / wall,
                   "gaussians": trainer.n_all,
                   "image": [trainer.width, trainer.height],
                   "peak_gpu_mem_gib": torch.cuda.max_memory_allocated() / 2**30}
            if variant == "gpu":  # the host's Python time of the same steps
                pr = cProfile.Profile()
                pr.enable()
                for step in range(warm + steps, warm + 2 * steps):
                    trainer.train_step(step)
                torch.cuda.synchronize()
                pr.disable()
                s = io.StringIO()
                pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(60)
                s2 = io.StringIO()
                pstats.Stats(pr, stream=s2).sort_stats("tottime").print_stats(40)
                (table_dir / "trainer_cprofile.txt").write_text(
                    f"cache {cache}, {steps} steps, {trainer.n_all} Gaussians\n" + s.getvalue() + s2.getvalue())
            out[variant] = rec
            print(f"trainer {variant}: {rec}", flush=True)
        finally:
            trainer.cleanup()
    return out


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("profile_gpu.py needs a CUDA GPU")
    from distsplat.render.gsplat_ext import ensure_gsplat_ops

    print(f"gsplat ops: {ensure_gsplat_ops()}", flush=True)
    table_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="profile_gpu_"))
    table_dir.mkdir(parents=True, exist_ok=True)
    data = os.environ.get("DISTSPLAT_DATA")
    scene = os.environ.get("SCENE", str(Path(data) / "thermos") if data else "")
    caches = os.environ.get("CACHES", "none,decoded,gpu,gpu-nocheck,gpu-torchssim").split(",")
    render = profile_render(table_dir, int(os.environ.get("N", 1_000_000)), int(os.environ.get("REPS", 5)))
    print("render: " + ", ".join(f"{k} {v['wall_ms']:.2f} ms" for k, v in render["runs"].items()), flush=True)
    trainer = profile_trainer(table_dir, scene, int(os.environ.get("DATA_FACTOR", 1)), caches,
                              int(os.environ.get("PROFILE_WARM", 100)), int(os.environ.get("PROFILE_STEPS", 300)))
    path = write_result("profile_gpu_cuda", {"scene": scene, "render": render, "trainer": trainer,
                                             "tables": "printed by the run (key_averages, cProfile)"})
    print("profile: render " + ", ".join(f"{k} {v['wall_ms']:.2f} ms" for k, v in render["runs"].items())
          + "; trainer " + ", ".join(f"{c} {r['step_ms']:.2f} ms/step wait {100 * r['data_wait_share']:.1f}%"
                                     for c, r in trainer.items()) + f" -> {path}")


if __name__ == "__main__":
    main()
