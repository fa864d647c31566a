"""Cost of the divergence check (distsplat/train/guards/faults.py, issue 21) per training step.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 benchmarks/studies/divergence_check/bench_divergence_check.py

Each rank holds N Gaussians (SH degree 3) with gradients, as after a backward; the check
(one finiteness test of the loss and every gradient's sum, one all-reduce of W flags, the
flags queued for the host) and the loop's lazy read of them (`poll`, which on CUDA reads only
copies that have landed) are timed REPS times, and next to them the all-reduce + a blocking
read alone (what the check did per step before it moved onto the device) and the gradient
sums alone, and Adam's update of the same tensors for scale. Environment:
N (default 200000 per rank), REPS (200). Writes the snapshot benchmarks/results/divergence_check_<device>_<date>.json
(or _cuda) on rank 0 and prints one summary line.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks.common import write_result  # noqa: E402
from distsplat.distributed import all_reduce_sum, destroy, init_distributed  # noqa: E402
from distsplat.train.guards.faults import DivergenceGuard  # noqa: E402


def timed(fn, reps: int, device: torch.device) -> float:
    """Median seconds of fn()."""
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ctx = init_distributed()
    n, reps = int(os.environ.get("N", 200_000)), int(os.environ.get("REPS", 200))
    shapes = {"means": (n, 3), "scales": (n, 3), "quats": (n, 4), "opacities": (n,), "sh0": (n, 1, 3), "shN": (n, 15, 3)}
    params = {}
    for k, s in shapes.items():
        p = torch.nn.Parameter(torch.randn(*s, device=ctx.device))
        p.grad = torch.randn(*s, device=ctx.device)
        params[k] = p
    loss = torch.tensor(0.5, device=ctx.device)
    guard = DivergenceGuard(ctx, ctx.device, max_bad_steps=10)
    check = timed(lambda: (guard.check(0, loss, params), guard.poll(1, flush=False)), reps, ctx.device)
    flags = torch.zeros(ctx.world_size, device=ctx.device)
    collective = timed(lambda: all_reduce_sum(flags).tolist(), reps, ctx.device)
    sums = timed(lambda: torch.stack([p.grad.sum() for p in params.values()]).isfinite().all(), reps, ctx.device)
    adam = torch.optim.Adam(list(params.values()), lr=1e-9)  # the update the check can skip, for scale
    adam_step = timed(adam.step, reps // 4 or 1, ctx.device)
    if ctx.is_main:
        kind = ctx.device.type
        result = {"command": "OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node="
                             f"{ctx.world_size} benchmarks/studies/divergence_check/bench_divergence_check.py",
                  "world_size": ctx.world_size, "gaussians_per_rank": n, "reps": reps,
                  "check_ms_median": round(check * 1e3, 3), "all_reduce_and_read_ms_median": round(collective * 1e3, 3),
                  "grad_sums_ms_median": round(sums * 1e3, 3), "adam_step_ms_median": round(adam_step * 1e3, 3),
                  "note": "the check per step and the loop's lazy read of its flags (no wait on CUDA); "
                          "--max_bad_steps 0 removes both. all_reduce_and_read: the blocking read it replaced."}
        path = write_result("divergence_check", {"device": kind, **result})
        print(f"divergence check: {check * 1e3:.3f} ms per step ({collective * 1e3:.3f} ms all-reduce + read, "
              f"{sums * 1e3:.3f} ms gradient sums; Adam's step {adam_step * 1e3:.1f} ms) at W={ctx.world_size}, {n} Gaussians per rank -> {path}")
    destroy(ctx)


if __name__ == "__main__":
    main()
