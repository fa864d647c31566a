"""Host time per step of the image loader on the trainer's own path (issue 35: "the loader
never makes a GPU wait"): what the main thread spends in `next(trainer.loader)` and in
taking the batch's images, in microseconds per step, while the consumer "computes" STEP_MS
a step, so the wait is measured when decoding keeps up. STEP_MODES: `sleep` (the host is
free during a GPU step: the loader's code then runs with cold CPU caches after each sleep,
the pessimistic case) and `busy` (the host thread issues small torch ops for the whole
step, as a trainer launching kernels does: hot caches, and the GIL is released inside each
op as torch's bindings do, so the decode threads run in between).

The loader is the one `Trainer.setup()` builds (the trainer's own arguments: cache, own
cameras' schedule, --num_workers, --prefetch, device), on one process. Timed from the
outside, the trainer's code unchanged:
    wait         next()'s block on a batch not ready yet (Batch.wait_s, measured by the loader)
    issue        ImageLoader._submit of the step `prefetch` ahead: the schedule
                 (Trainer._own_cameras), ownership checks, queueing the batch's decode work
                 (the host->device copy is issued by the worker that finishes the batch)
    bookkeeping  the rest of next(): the pending queue, gpu-mode claims, the Batch
    take         train_step's group_images() of the batch (the stacked view of the images)
    total        next() + take, per step (wall time)
    total_cpu    the main thread's CPU time over the same span (time.thread_time_ns): total
                 minus what the thread spent descheduled or waiting (on 2 shared cores
                 that gap is large and noisy)
Steady state: epochs after the first (every own image cached); first epoch: images read
from the disk (page cache: the files are read once before) or, for the built-in scene,
rendered on first read. The perf_counter_ns() brackets add ~0.1 us per component.

Scenes (SCENES, comma-separated): `builtin` (the trainer's scene without --data_dir) and
`thermos` ($DISTSPLAT_DATA/thermos, default ../shared/data/thermos; DATA_FACTOR 4). Environment: SCENES (builtin,thermos),
BATCHES (1,4), STEP_MS (10), STEP_MODES (sleep,busy), MIN_STEADY (300: steady-state steps at least), DATA_FACTOR (4).
Writes the snapshot benchmarks/results/loader_host_<device>_<date>.json (LABEL=x: loader_host_x_...) and
prints one summary line. archive/loader_host_cpu2_2026-11-26.json is the loader before issue 35's
changes (commit 8c3fb79), run just before.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks.common import write_result  # noqa: E402
from benchmarks.paths import data_dir  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
THERMOS = data_dir() / "thermos"
SCENES = os.environ.get("SCENES", "builtin,thermos").split(",")
BATCHES = [int(b) for b in os.environ.get("BATCHES", "1,4").split(",")]
STEP_MS = float(os.environ.get("STEP_MS", 10))
STEP_MODES = os.environ.get("STEP_MODES", "sleep,busy").split(",")
MIN_STEADY = int(os.environ.get("MIN_STEADY", 300))
DATA_FACTOR = int(os.environ.get("DATA_FACTOR", 4))
LABEL = os.environ.get("LABEL", "")
COMPONENTS = ("wait", "issue", "bookkeeping", "take", "total", "total_cpu")


def make_trainer(scene: str, batch: int, result_dir: str):
    """A Trainer set up as `simple_trainer.py default` would be (defaults; --batch_size)."""
    from distsplat.distributed import init_distributed
    from distsplat.train.config import default_config
    from distsplat.train.trainer import Trainer

    cfg = default_config()
    if scene == "thermos":
        cfg.data_dir, cfg.data_factor = str(THERMOS), DATA_FACTOR
    elif scene != "builtin":
        cfg.data_dir, cfg.data_factor = scene, DATA_FACTOR
    cfg.batch_size = batch
    cfg.result_dir, cfg.save_ply = result_dir, False
    cfg.max_steps = 10 ** 6  # the loader's end; run() times whole epochs of it
    cfg.validate()
    trainer = Trainer(cfg, init_distributed())
    return trainer, cfg


def simulated_step(mode: str, x) -> None:
    if mode == "sleep":
        time.sleep(STEP_MS / 1000)
        return

    end = time.perf_counter() + STEP_MS / 1000
    while time.perf_counter() < end:  # busy
        torch.add(x, 1.0, out=x)


def run(scene: str, batch: int, mode: str) -> Dict[str, Any]:
    from distsplat.train.model.size_groups import group_images, image_sizes, size_groups

    with tempfile.TemporaryDirectory(prefix="distsplat-loader-host-") as tmp:
        trainer, cfg = make_trainer(scene, batch, tmp)
        probe = None
        try:
            trainer.setup()  # its loader's end_step (--max_steps) lies past the epochs timed here
            spe = trainer.batcher.steps_per_epoch
            epochs = 1 + max(1, math.ceil(MIN_STEADY / spe))
            loader = trainer.loader
            times: Dict[str, List[int]] = {k: [] for k in COMPONENTS}
            issue_ns = [0]
            submit = loader._submit

            def timed_submit(step: int) -> None:
                t = time.perf_counter_ns()
                try:
                    submit(step)
                finally:
                    issue_ns[0] += time.perf_counter_ns() - t

            loader._submit = timed_submit  # instance attribute: next() calls it through self
            probe = loader
            scratch = torch.zeros(64)  # the busy step's operand
            for step in range(epochs * spe):
                issue_ns[0] = 0
                b = trainer._batch(step)  # train_step's batch (host bookkeeping, not the loader's)
                scene_np = trainer.train_np[b.host_cameras()]
                groups = size_groups(trainer.widths[scene_np], trainer.heights[scene_np], b.host_owners(), 0)
                c0 = time.thread_time_ns()
                t0 = time.perf_counter_ns()
                images = next(loader)
                t1 = time.perf_counter_ns()
                for g in groups:
                    group_images(images, g)
                t2 = time.perf_counter_ns()
                c2 = time.thread_time_ns()
                wait = int(images.wait_s * 1e9)
                times["wait"].append(wait)
                times["issue"].append(issue_ns[0])
                times["bookkeeping"].append(t1 - t0 - wait - issue_ns[0])
                times["take"].append(t2 - t1)
                times["total"].append(t2 - t0)
                times["total_cpu"].append(c2 - c0)
                simulated_step(mode, scratch)
            first = {k: v[:spe] for k, v in times.items()}
            steady = {k: v[spe:] for k, v in times.items()}
            return {
                "scene": scene, "batch_size": batch, "step_mode": mode, "cache": trainer.cache.mode,
                "num_workers": cfg.num_workers, "prefetch": cfg.prefetch, "device": str(trainer.device),
                "train_cameras": len(trainer.train_idx), "image": list(image_sizes(trainer.widths, trainer.heights)[0]),
                "steps_per_epoch": spe, "epochs": epochs,
                "steady_us": summarize(steady), "first_epoch_us": summarize(first),
            }
        finally:
            if probe is not None:
                probe.__dict__.pop("_submit", None)
            trainer.cleanup()


def summarize(times: Dict[str, List[int]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {"steps": len(times["total"])}
    for k in COMPONENTS:
        us = np.asarray(times[k], dtype=np.float64) / 1e3
        out[k] = {"median": round(float(np.median(us)), 2), "p90": round(float(np.percentile(us, 90)), 2),
                  "mean": round(float(us.mean()), 2), "max": round(float(us.max()), 2)}
    return out


def main() -> None:
    import logging

    logging.basicConfig(level=logging.WARNING)
    t_start = time.perf_counter()
    load0 = os.getloadavg()
    if "thermos" in SCENES:  # the first epoch's reads come from the page cache, as in a rerun
        for p in THERMOS.glob("images*/*"):
            p.read_bytes()
    rows = [run(scene, batch, mode) for scene in SCENES for batch in BATCHES for mode in STEP_MODES]
    payload = {
        "what": "main-thread host time per step in the image loader on the trainer's path (us)",
        "step_ms_simulated": STEP_MS, "components": list(COMPONENTS),
        "load_average_at_start": load0, "runs": rows, "runtime_s": time.perf_counter() - t_start,
    }
    path = write_result("loader_host" + (f"_{LABEL}" if LABEL else ""), payload)
    parts = [f"{r['scene']} b{r['batch_size']} {r['step_mode']} {r['steady_us']['total']['median']:.0f}/"
             f"{r['steady_us']['total']['p90']:.0f}" for r in rows]
    print(f"loader host us/step, steady median/p90: {', '.join(parts)} (at {STEP_MS:.0f} ms steps) -> {path}")


if __name__ == "__main__":
    main()
