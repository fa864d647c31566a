"""Where the time of a W = 1 training step goes on a CUDA GPU: the trainer's own step, by
range, kernels and host.

Three measurements, one process, one GPU, all of distsplat's Trainer.train_step at W = 1 on a
COLMAP scene (default $DISTSPLAT_DATA/thermos at full resolution), with the trainer's options
(packed, fused-ssim when installed, fused Adam):

  ranges    PROFILE_RANGE_STEPS steps of the `gpu`-cache trainer under torch.profiler, per
            range of the step (benchmarks/step_ranges.py: train/batch ... train/densify and
            the distributed render's distsplat/project, distsplat/rasterize): the step's time
            per range, the host time and the kernel time, and the kernels of each range; the
            profiler's own top-20 table of the same steps as rows (`profiler_top20`: by self
            CUDA time on CUDA, by self CPU time on a CPU; on CUDA also
            `profiler_top20_self_cpu`), and as text with more rows. A range the render does
            not mark is listed as missing.
  trainer   for each image cache mode: steps/s and the share of the step the host spends in
            the image loader's next() (the data-wait share; issue 14's goal < 1% with
            `decoded` or `gpu`), and of that the share blocked until the batch's images were
            ready.
  host      cProfile of the `gpu`-cache trainer's steps: the Python functions the host time
            is in (a GPU step whose kernels are short is bound by the host launching them).

Every `trainer` timing runs before any profiler has attached in this process (a profiler
changes the timing, and torch.profiler's CUDA tracing stays initialised once used): the
profiled variant (`gpu`, dry: the first) is timed last, then profiled (cProfile, then
torch.profiler). Each timing records `timed_without_profiler`; `run_order` is the order run.

    python benchmarks/studies/steps/profile_gpu.py [TABLE_DIR]
Environment: SCENE, DATA_FACTOR (1), CACHES (none,decoded,gpu,gpu-nocheck,gpu-torchssim: the gpu
cache with --max_bad_steps 0, and with --ssim_impl torch), PROFILE_WARM (100), PROFILE_STEPS
(300), PROFILE_RANGE_STEPS (20). DRY_RUN=1: no GPU, the same code on the CPU (torch backend,
the built-in synthetic scene, caches none,decoded; the ranges and cProfile on the `decoded`
one) to check this script's plumbing. Writes the snapshot benchmarks/results/profile_gpu_cuda_<device>_<date>.json
(profile_gpu_dry.json with DRY_RUN=1), the tables to TABLE_DIR (default: a temporary folder),
and prints one summary line.
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
from typing import Any, Dict, List, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks import step_ranges as sr  # noqa: E402
from benchmarks.common import gpu_or_plumbing, write_result  # noqa: E402

TOP_ROWS = 20
# Set once this process has attached a profiler (cProfile or torch.profiler): timings after it
# would not be of the trainer alone.
_profiled = False


def _attaching_profiler() -> None:
    global _profiled
    _profiled = True


def profiler_free() -> bool:
    """No profiler attached now, and none attached before in this process."""
    return not _profiled and not torch.autograd._profiler_enabled() and sys.getprofile() is None


def _us(e, name: str) -> float:
    """An averaged event's time in us (device times: `self_device_time_total` since torch 2.4,
    `self_cuda_time_total` before)."""
    v = getattr(e, name, None)
    if v is None:
        v = getattr(e, name.replace("device", "cuda"), 0.0)
    return float(v or 0.0)


def top_table(key_averages, by: str, steps: int, rows: int = TOP_ROWS) -> Dict[str, Any]:
    """The profiler's table (torch.profiler's key_averages) as rows: its `rows` ops with the
    most self time by `by` ("cpu" or "device"), each with its calls and totals (ms) over the
    `steps` profiled steps, as key_averages().table() prints them."""
    def row(e) -> Dict[str, Any]:
        ms = lambda name: round(_us(e, name) / 1e3, 4)  # noqa: E731
        out = {"name": e.key, "calls": int(e.count), "self_cpu_ms": ms("self_cpu_time_total"),
               "cpu_total_ms": ms("cpu_time_total")}
        if by == "device" or _us(e, "device_time_total"):
            out.update(self_device_ms=ms("self_device_time_total"), device_total_ms=ms("device_time_total"))
        return out

    key = "self_device_time_total" if by == "device" else "self_cpu_time_total"
    ranked = sorted(key_averages, key=lambda e: _us(e, key), reverse=True)[:rows]
    return {"sort_by": key, "steps": steps, "times": "ms, totals over the profiled steps",
            "rows": [row(e) for e in ranked]}


def profile_ranges(trainer, table_dir: Path, first: int, steps: int) -> Dict[str, Any]:
    """`steps` of the trainer's steps under torch.profiler: per range and leaf (median ms of
    the step, host, kernels), the top kernels per leaf, and the profiler's tables."""
    from benchmarks.bench_step_vs_gsplat import ranges_table

    device = trainer.device
    _attaching_profiler()
    records, prof = sr.profile_steps(trainer.train_step, range(first, first + steps), device, kernels=True)
    table = ranges_table(records, device)
    table["ranges_missing"] = sr.missing(records, sr.expected(trainer.ctx.world_size))
    ka = prof.key_averages()
    table["profiler_top20"] = top_table(ka, "device" if device.type == "cuda" else "cpu", steps)
    if device.type == "cuda":  # a step bound by the host launching kernels: where the host's time goes
        table["profiler_top20_self_cpu"] = top_table(ka, "cpu", steps)
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    lines = [f"{steps} steps of Trainer.train_step, {trainer.n_all} Gaussians; median per step (ms): step "
             f"{table['step_ms']:.3f}", "", f"{'range / leaf':40s} {'ms':>9s} {'host ms':>9s} {'kernel ms':>9s}"]
    for name, ms in table["ranges_ms"].items():
        lines.append(f"{name:40s} {ms:9.3f}")
    lines.append("")
    for leaf, ms in table["leaves_ms"].items():
        dev = table.get("leaves_device_ms", {}).get(leaf)
        lines.append(f"{leaf:40s} {ms:9.3f} {table['leaves_cpu_ms'].get(leaf, 0.0):9.3f} "
                     + (f"{dev:9.3f}" if dev is not None else f"{'-':>9s}"))
        for k, kms in table["top_kernels_ms"].get(leaf, {}).items():
            lines.append(f"    {kms:8.3f} ms  {k[:100]}")
    if table["ranges_missing"]:
        lines += ["", f"ranges missing: {', '.join(table['ranges_missing'])}"]
    (table_dir / "trainer_ranges.txt").write_text(
        "\n".join(lines) + "\n\n" + ka.table(sort_by=sort, row_limit=40) + "\n\n"
        + ka.table(sort_by="self_cpu_time_total", row_limit=25))
    return table


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


def profile_trainer(table_dir: Path, scene: Optional[str], data_factor: int, caches, warm: int, steps: int,
                    range_steps: int, device: torch.device, dry: bool = False) -> Dict[str, Any]:
    """Per cache variant: steps/s and data wait; for the `gpu` one (dry: the first), timed
    after the others, the cProfile of `steps` more steps and the ranges of `range_steps` more
    (profile_ranges): no variant is timed after a profiler attached. Returned in `caches`'
    order, with "run_order" (the order run)."""
    from distsplat.distributed import init_distributed
    from distsplat.train.config import Config, SyntheticConfig
    from distsplat.train.trainer import Trainer

    ctx = init_distributed(device=device)
    out: Dict[str, Any] = {}
    detailed = "gpu" if "gpu" in caches else caches[0]
    run_order: List[str] = [c for c in caches if c != detailed] + [detailed]
    for variant in run_order:
        # "gpu-nocheck": the gpu cache without the divergence check (--max_bad_steps 0), whose
        # host read after backward stops the host from running ahead of the GPU;
        # "gpu-torchssim": the gpu cache with the PyTorch SSIM (--ssim_impl torch) where the
        # others take fused-ssim's kernels when it is installed (--ssim_impl auto)
        cache, flags = variant.split("-")[0], variant.split("-")[1:]
        unknown = set(flags) - {"nocheck", "torchssim"}
        if unknown:
            sys.exit(f"profile_gpu.py: CACHES: unknown variant flag(s) {sorted(unknown)} in {variant!r}")
        tmp = tempfile.mkdtemp(prefix=f"profile_{variant}_")
        cfg = Config(data_dir=scene, data_factor=data_factor, result_dir=tmp,
                     max_steps=warm + 2 * steps + range_steps + 10, eval_steps=[], save_steps=[], save_ply=False,
                     backend="torch" if dry else "gsplat",
                     cache=cache, **({"max_bad_steps": 0} if "nocheck" in flags else {}),
                     **({"ssim_impl": "torch"} if "torchssim" in flags else {}))
        if dry:
            cfg.synthetic = SyntheticConfig(kind="ball", num_cameras=8, num_gaussians=300, width=32, height=24)
        cfg.validate()
        trainer = Trainer(cfg, ctx)
        t_setup = time.perf_counter()
        trainer.setup()
        t_setup = time.perf_counter() - t_setup
        try:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)  # this variant's peak
            trainer.loader = TimedLoader(trainer.loader)
            for step in range(warm):
                trainer.train_step(step)
            sr.sync(device)
            trainer.loader.wait = 0.0
            blocked0 = sum(trainer.loader.inner.wait_s)
            free = profiler_free()
            t0 = time.perf_counter()
            for step in range(warm, warm + steps):
                trainer.train_step(step)
            sr.sync(device)
            wall = time.perf_counter() - t0
            rec = {"setup_s": t_setup, "steps": steps, "step_ms": wall / steps * 1e3, "steps_per_s": steps / wall,
                   "timed_without_profiler": free and profiler_free(),
                   "ssim_impl": trainer.ssim_impl,
                   "data_wait_ms_per_step": trainer.loader.wait / steps * 1e3,
                   "data_wait_share": trainer.loader.wait / wall,
                   # of which blocked until the batch's images were ready (ImageLoader.wait_s);
                   # the rest is the loader's bookkeeping on the host (the next batch's submit)
                   "blocked_wait_share": (sum(trainer.loader.inner.wait_s) - blocked0) / wall,
                   "gaussians": trainer.n_all,
                   "image": [trainer.width, trainer.height],
                   "peak_gpu_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None}
            if variant == detailed:  # the host's Python time of the same steps, then the ranges
                _attaching_profiler()
                pr = cProfile.Profile()
                pr.enable()
                for step in range(warm + steps, warm + 2 * steps):
                    trainer.train_step(step)
                sr.sync(device)
                pr.disable()
                s = io.StringIO()
                pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(60)
                s2 = io.StringIO()
                pstats.Stats(pr, stream=s2).sort_stats("tottime").print_stats(40)
                (table_dir / "trainer_cprofile.txt").write_text(
                    f"cache {cache}, {steps} steps, {trainer.n_all} Gaussians\n" + s.getvalue() + s2.getvalue())
                if range_steps:
                    rec["ranges"] = profile_ranges(trainer, table_dir, warm + 2 * steps, range_steps)
            out[variant] = rec
            print(f"trainer {variant}: " + str({k: v for k, v in rec.items() if k != "ranges"}), flush=True)
        finally:
            trainer.cleanup()
    return {**{c: out[c] for c in caches}, "run_order": run_order}


def main() -> None:
    device, dry = gpu_or_plumbing("profile_gpu.py", "DRY_RUN")
    table_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="profile_gpu_"))
    table_dir.mkdir(parents=True, exist_ok=True)
    data = os.environ.get("DISTSPLAT_DATA")
    scene = os.environ.get("SCENE", str(Path(data) / "thermos") if data and not dry else "") or None
    default = "none,decoded" if dry else "none,decoded,gpu,gpu-nocheck,gpu-torchssim"
    caches = os.environ.get("CACHES", default).split(",")
    timed = profile_trainer(table_dir, scene, int(os.environ.get("DATA_FACTOR", 1)), caches,
                            int(os.environ.get("PROFILE_WARM", 100)), int(os.environ.get("PROFILE_STEPS", 300)),
                            int(os.environ.get("PROFILE_RANGE_STEPS", 20)), device, dry)
    run_order = timed.pop("run_order")
    ranges = next((r["ranges"] for r in timed.values() if "ranges" in r), None)
    path = write_result("profile_gpu_dry" if dry else "profile_gpu_cuda", {
        "scene": scene or "built-in synthetic", "dry_run": dry, "trainer": timed, "run_order": run_order,
        "timing": ("steps/s of each variant over PROFILE_STEPS steps after PROFILE_WARM, before any profiler "
                   "attached in this process (timed_without_profiler); the profiled variant is timed last, then "
                   "profiled"),
        "tables": f"{table_dir}: trainer_ranges.txt (per range, the profiler's tables), trainer_cprofile.txt"})
    top = (", ".join(f"{k} {v:.2f}" for k, v in sorted(ranges["ranges_ms"].items(), key=lambda kv: -kv[1])[:4])
           if ranges else "not profiled")
    first = ranges["profiler_top20"]["rows"][0] if ranges and ranges["profiler_top20"]["rows"] else None
    tainted = [c for c, r in timed.items() if not r["timed_without_profiler"]]
    print("profile: trainer " + ", ".join(f"{c} {r['step_ms']:.2f} ms/step wait {100 * r['data_wait_share']:.1f}%"
                                          for c, r in timed.items())
          + (f" (TIMED WITH A PROFILER ATTACHED BEFORE: {', '.join(tainted)})" if tainted else
             " (timed before any profiler)")
          + f"; ranges (ms per step) {top}"
          + (f"; profiler's top op by {ranges['profiler_top20']['sort_by']}: {first['name']}" if first else "")
          + (f"; ranges missing: {', '.join(ranges['ranges_missing'])}" if ranges and ranges["ranges_missing"] else "")
          + f" -> {path}")


if __name__ == "__main__":
    main()
