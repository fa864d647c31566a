"""Forward + backward time of the single-process render.

CPU: backend `torch` on one thread (the goal of the foundation issue: 10k Gaussians at
128x128 in <= 1 s) and, with DENSE_BASELINE=1, the same maths without tiling (one tile
covering the whole image: every Gaussian at every pixel) so the speedup is a ratio from
one run. With CUDA: both backends on the GPU.

Environment: N (10000), WIDTH (128), HEIGHT (128), REPEATS (5), THREADS (1),
DENSE_BASELINE (0). Writes benchmarks/results/render_<device>.json; prints one line.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks.common import write_result  # noqa: E402
from distsplat.render import rasterize  # noqa: E402


def make_scene(n: int, width: int, height: int, device: str, seed: int = 0):
    """n Gaussians filling the view frustum between depths 2 and 6, log-uniform sizes
    (0.005 .. 0.05 world units, i.e. about 0.3 to 3 pixels of standard deviation)."""
    g = torch.Generator().manual_seed(seed)
    f = 0.5 * width / math.tan(math.radians(30))
    z = torch.rand(n, generator=g) * 4 + 2
    x = (torch.rand(n, generator=g) * 2 - 1) * z * (0.5 * width / f)
    y = (torch.rand(n, generator=g) * 2 - 1) * z * (0.5 * height / f)
    scene = dict(
        means=torch.stack([x, y, z], -1),
        quats=torch.randn(n, 4, generator=g),
        scales=torch.exp(torch.rand(n, 3, generator=g) * math.log(10) + math.log(0.005)),
        opacities=torch.rand(n, generator=g) * 0.9 + 0.1,
        colors=torch.rand(n, 3, generator=g),
        viewmats=torch.eye(4)[None],
        Ks=torch.tensor([[[f, 0, width / 2], [0, f, height / 2], [0, 0, 1]]]),
    )
    return {k: v.to(device) for k, v in scene.items()}


def time_fwd_bwd(scene, width, height, backend, repeats, tile_size=None):
    def sync():
        if scene["means"].is_cuda:
            torch.cuda.synchronize()

    fwd, bwd, total = [], [], []
    for i in range(repeats + 1):  # the first run warms up (and on GPU compiles kernels)
        params = {k: v.detach().clone().requires_grad_(k not in ("viewmats", "Ks")) for k, v in scene.items()}
        sync()
        t0 = time.perf_counter()
        colors, alphas, meta = rasterize(
            params["means"], params["quats"], params["scales"], params["opacities"], params["colors"],
            params["viewmats"], params["Ks"], width, height, backend=backend, tile_size=tile_size,
        )
        sync()
        t1 = time.perf_counter()
        (colors.sum() + alphas.sum()).backward()
        sync()
        t2 = time.perf_counter()
        if i > 0:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            total.append(t2 - t0)
    return {
        "fwd_s": statistics.median(fwd),
        "bwd_s": statistics.median(bwd),
        "fwd_bwd_s": statistics.median(total),
        "fwd_bwd_min_s": min(total),
        "visible_pairs": len(meta["camera_ids"]),
        "mean_alpha": float(alphas.detach().mean()),
    }


def main() -> None:
    n = int(os.environ.get("N", 10000))
    width = int(os.environ.get("WIDTH", 128))
    height = int(os.environ.get("HEIGHT", 128))
    repeats = int(os.environ.get("REPEATS", 5))
    threads = int(os.environ.get("THREADS", 1))
    dense = os.environ.get("DENSE_BASELINE", "0") == "1"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(threads)

    scene = make_scene(n, width, height, device)
    runs = {}
    if device == "cpu":
        runs["torch"] = time_fwd_bwd(scene, width, height, "torch", repeats)
        if dense:
            # Untiled and without early stops: one tile over the whole image, the whole
            # depth list at once (every Gaussian at every pixel).
            from distsplat.render import torch_backend

            chunk, torch_backend.DEPTH_CHUNK = torch_backend.DEPTH_CHUNK, 1 << 62
            try:
                runs["torch_dense_baseline"] = time_fwd_bwd(
                    scene, width, height, "torch", 1, tile_size=max(width, height)
                )
            finally:
                torch_backend.DEPTH_CHUNK = chunk
    else:
        runs["gsplat"] = time_fwd_bwd(scene, width, height, "gsplat", repeats)
        runs["torch"] = time_fwd_bwd(scene, width, height, "torch", repeats)

    payload = {
        "scene": {"gaussians": n, "width": width, "height": height, "cameras": 1,
                  "generator": "benchmarks/studies/render/bench_render.py:make_scene"},
        "device": device,
        "threads": threads,
        "repeats": repeats,
        "goal": "torch backend fwd+bwd <= 1 s for 10k Gaussians at 128x128 on one CPU thread",
        "runs": runs,
    }
    if "torch_dense_baseline" in runs:
        payload["tiled_speedup_vs_dense"] = runs["torch_dense_baseline"]["fwd_bwd_s"] / runs["torch"]["fwd_bwd_s"]
    if "gsplat" in runs:
        payload["gsplat_speedup_vs_torch"] = runs["torch"]["fwd_bwd_s"] / runs["gsplat"]["fwd_bwd_s"]
    path = write_result("render", payload)
    summary = ", ".join(f"{k} fwd+bwd {v['fwd_bwd_s']:.3f}s" for k, v in runs.items())
    print(f"bench_render {device} N={n} {width}x{height} threads={threads}: {summary} "
          f"(pairs {runs[next(iter(runs))]['visible_pairs']}) -> {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")


if __name__ == "__main__":
    main()
