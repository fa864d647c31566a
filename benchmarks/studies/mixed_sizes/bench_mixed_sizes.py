"""Cost of mixed image sizes (issue 16): one training step's render + loss + backward for a
batch of 4 cameras whose sizes differ, against a single-size batch of the same pixels.

Configurations (every batch 4 cameras, 9216 pixels, but the padded ones; sides x SCALE):
  single   4 x 48x48, one `distributed_rasterize` call (the single-size scene)
  mixed2   2 x 64x48 + 2 x 48x32: one call per size (train/size_groups.py), 2 calls
  mixed4   64x36, 48x48, 36x64, 72x32 (2304 px each): 4 calls, the worst case of 4
  padded2  mixed2 rendered as one call at the bounding 64x48 with a masked loss (the
           alternative design: 12288 px)
  padded4  mixed4 padded to 72x64 (18432 px)

Every camera has the same focal length in pixels, so a camera's pixels see a proportional
area of the scene and the same pixels mean about the same projected pairs (reported); a
padded image sees its padding too (the naive padding renders it). W gloo CPU processes
(W=1 and W=2 by default); each rank holds its chunk of one seeded
random scene (N Gaussians), owners rank-major as the batcher's. Steps of the
configurations are interleaved (round robin) so that the machine's load hits them alike;
the median per configuration is reported.

    NGAUSS=5000 STEPS=15 WORLD="1,2" python benchmarks/studies/mixed_sizes/bench_mixed_sizes.py     # -> mixed_sizes_<device>_<date>.json
    SCALE=2 NGAUSS=20000 STEPS=6 python benchmarks/studies/mixed_sizes/bench_mixed_sizes.py        # -> mixed_sizes_x2_<device>_<date>.json
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from benchmarks.common import viewmat_towards_origin, write_result  # noqa: E402
from benchmarks.procs import run_ranks  # noqa: E402

SCALE = int(os.environ.get("SCALE", 1))  # image sides and focal length x SCALE
CONFIGS: Dict[str, List[Tuple[int, int]]] = {  # (w, h) per batch camera, in batch order
    "single": [(48, 48)] * 4,
    "mixed2": [(64, 48), (48, 32), (64, 48), (48, 32)],  # each rank of W=2 owns one of each size
    "mixed4": [(64, 36), (48, 48), (36, 64), (72, 32)],
}
CONFIGS = {k: [(w * SCALE, h * SCALE) for w, h in v] for k, v in CONFIGS.items()}
PADDED = {"padded2": "mixed2", "padded4": "mixed4"}


FOCAL = 40.0 * SCALE  # px, every camera: the same pixel density, so the same pixels see the same area


def _K(w: int, h: int) -> torch.Tensor:
    return torch.tensor([[FOCAL, 0.0, w / 2], [0.0, FOCAL, h / 2], [0.0, 0.0, 1.0]])


def worker(ctx, n_all: int, steps: int) -> Dict[str, List[float]]:
    from distsplat.distributed import barrier, chunk_bounds, distributed_rasterize
    from distsplat.train.losses import photometric_loss
    from distsplat.train.size_groups import size_groups

    W, r = ctx.world_size, ctx.rank
    g = torch.Generator().manual_seed(0)
    full = {"means": torch.randn(n_all, 3, generator=g) * 0.6, "quats": torch.randn(n_all, 4, generator=g),
            "scales": torch.rand(n_all, 3, generator=g) * 0.03 + 0.005,
            "opacities": torch.rand(n_all, generator=g) * 0.8 + 0.1, "colors": torch.rand(n_all, 3, generator=g)}
    a, b = chunk_bounds(n_all, W)[r]
    params = {k: v[a:b].clone().requires_grad_(True) for k, v in full.items()}
    viewmats = torch.stack([viewmat_towards_origin([3 * math.cos(t), 0.3, 3 * math.sin(t)])
                            for t in (0.0, 1.6, 3.2, 4.8)])  # [4, 4, 4]
    owner = torch.arange(W).repeat_interleave(4 // W)  # [4] rank-major

    def step(sizes: List[Tuple[int, int]], pad: bool) -> int:
        ws, hs = [w for w, _ in sizes], [h for _, h in sizes]
        if pad:  # one call at the bounding size; each image's loss over its own pixels only
            groups = size_groups([max(ws)] * 4, [max(hs)] * 4, owner.tolist(), r)
        else:
            groups = size_groups(ws, hs, owner.tolist(), r)
        loss, pairs = 0.0, 0
        for grp in groups:
            Ks = torch.stack([_K(ws[p], hs[p]) for p in grp.positions.tolist()])  # [C_g, 3, 3]
            colors, _, meta = distributed_rasterize(
                params["means"], params["quats"], params["scales"], params["opacities"], params["colors"],
                grp.select(viewmats), Ks, grp.width, grp.height, grp.select(owner), backend="torch")
            pairs += len(meta["gaussian_ids"])
            target = torch.full_like(colors, 0.5)
            if pad:
                mask = torch.zeros_like(colors[..., :1])
                own = [p for p in grp.positions.tolist() if owner[p] == r]
                for i, p in enumerate(own):
                    mask[i, : hs[p], : ws[p]] = 1.0
                colors, target = colors * mask, target * mask
            loss = loss + photometric_loss(colors, target, 0.2) / 4
        loss.backward()
        for v in params.values():
            v.grad = None
        return pairs

    names = list(CONFIGS) + list(PADDED)
    times: Dict[str, List[float]] = {n: [] for n in names}
    pairs = {}
    for i in range(steps + 2):  # 2 warm-up rounds
        for n in names:
            sizes = CONFIGS[PADDED.get(n, n)]
            barrier()
            t0 = time.perf_counter()
            pairs[n] = step(sizes, n in PADDED)  # this rank's projected pairs
            barrier()
            if i >= 2:
                times[n].append(time.perf_counter() - t0)
    return {"times": times, "pairs": pairs}


def main() -> None:
    n_all = int(os.environ.get("NGAUSS", 5000))
    steps = int(os.environ.get("STEPS", 15))
    worlds = [int(w) for w in os.environ.get("WORLD", "1,2").split(",")]
    results = {}
    for W in worlds:
        out = run_ranks(worker, W, n_all, steps)
        times = out[0]["times"]  # rank 0's: the barriers make them the step's
        med = {n: statistics.median(t) for n, t in times.items()}
        results[f"W{W}"] = {
            "median_step_s": {n: round(v, 5) for n, v in med.items()},
            "relative_to_single": {n: round(v / med["single"], 3) for n, v in med.items()},
            "visible_pairs": {n: sum(o["pairs"][n] for o in out) for n in med},
        }
        print(f"W={W}: " + ", ".join(f"{n} {v * 1e3:.1f} ms ({v / med['single']:.2f}x)" for n, v in med.items()))
    pixels = {n: sum(w * h for w, h in s) for n, s in CONFIGS.items()}
    pixels.update({p: 4 * max(w for w, _ in CONFIGS[m]) * max(h for _, h in CONFIGS[m]) for p, m in PADDED.items()})
    path = write_result("mixed_sizes" + (f"_x{SCALE}" if SCALE != 1 else ""), {
        "what": "render + photometric loss + backward of one 4-camera batch, torch backend, gloo CPU ranks",
        "gaussians": n_all, "steps_timed": steps, "scale": SCALE, "batch_sizes_wh": CONFIGS,
        "padded_from": PADDED, "pixels_per_batch": pixels, "results": results,
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
