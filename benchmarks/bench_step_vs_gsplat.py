"""One training step (forward, loss, backward, Adam) of distsplat at W = 1 against the same
step written with `gsplat.rasterization()`, on real scenes (issue 14): the time ratio, and
how far the first step's image and gradients are apart.

Both steps start from the same Gaussians (SfM / point-cloud initialisation, as the trainer
makes it, optionally replicated with jitter to REPLICATE x the points so that the kernels,
not the host, dominate) and the same camera, and share everything but the render: the loss
(distsplat.train.losses.photometric_loss, 3DGS's L1 + 0.2 D-SSIM against a fixed target
image), the six Adam optimizers (distsplat.train.gaussians.create_optimizers) and
zero_grad. So the ratio is the cost of `distributed_rasterize` (validation, the count
transfer, the W = 1 direct path) over gsplat's `rasterization(packed=True)` within a step.

    python benchmarks/bench_step_vs_gsplat.py
Environment: SCENES (thermos,garden: $DISTSPLAT_DATA/thermos at DATA_FACTOR 1, i.e.
946x532, and $DISTSPLAT_DATA/test_garden.npz), REPLICATE (1), REPS (20), WARMUP (3),
FAKE_GSPLAT=1 (no GPU: gsplat.rasterization is replaced by distsplat's torch backend, to
check this script's plumbing; the numbers then mean nothing). Writes
benchmarks/results/step_vs_gsplat_<device>.json and prints one summary line.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Tuple

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import write_result  # noqa: E402

SH_DEGREE = 3


def thermos(device: torch.device) -> Tuple[Dict[str, Any], str]:
    from distsplat.data import load_colmap

    root = Path(os.environ.get("DISTSPLAT_DATA", "/work/shared/data")) / "thermos"
    scene = load_colmap(root, factor=int(os.environ.get("DATA_FACTOR", 1)), normalize=True)
    c = 0
    viewmat = torch.from_numpy(np.linalg.inv(scene.camtoworlds[c])).float()[None]
    K = torch.from_numpy(scene.Ks[c]).float()[None]
    W, H = int(scene.widths[c]), int(scene.heights[c])
    pts = torch.from_numpy(scene.points).float()
    rgb = torch.from_numpy(scene.points_rgb).float() / 255.0
    return dict(points=pts, rgbs=rgb, viewmat=viewmat, K=K, width=int(W), height=int(H)), str(root)


def garden(device: torch.device) -> Tuple[Dict[str, Any], str]:
    path = Path(os.environ.get("DISTSPLAT_DATA", "/work/shared/data")) / "test_garden.npz"
    d = np.load(path)
    return dict(points=torch.from_numpy(d["means3d"]).float(),
                rgbs=torch.from_numpy(d["colors"]).float() / 255.0,
                viewmat=torch.from_numpy(d["viewmats"][:1]).float(), K=torch.from_numpy(d["Ks"][:1]).float(),
                width=int(d["width"]), height=int(d["height"])), str(path)


def replicate(pts: torch.Tensor, rgbs: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    if k <= 1:
        return pts, rgbs
    g = torch.Generator().manual_seed(0)
    spread = 0.01 * (pts.max(0).values - pts.min(0).values).norm()
    out = pts.repeat_interleave(k, 0) + spread * torch.randn(len(pts) * k, 3, generator=g)
    return out, rgbs.repeat_interleave(k, 0)


def main() -> None:
    fake = os.environ.get("FAKE_GSPLAT") == "1"
    cuda = torch.cuda.is_available() and not fake
    device = torch.device("cuda" if cuda else "cpu")
    if not cuda and not fake:
        sys.exit("bench_step_vs_gsplat.py needs a CUDA GPU (FAKE_GSPLAT=1 checks the plumbing on CPU)")
    from distsplat.distributed import distributed_rasterize
    from distsplat.render import rasterize
    from distsplat.train.gaussians import activated, create_optimizers, init_gaussians
    from distsplat.train.losses import photometric_loss

    if cuda:
        from gsplat import rasterization

        from distsplat.render.gsplat_ext import ensure_gsplat_ops

        print(f"gsplat ops: {ensure_gsplat_ops()}", flush=True)
        backend = "gsplat"
        sync: Callable[[], None] = torch.cuda.synchronize
    else:
        def rasterization(*args, sh_degree=None, packed=True):  # the plumbing check only
            return rasterize(*args, sh_degree=sh_degree, packed=packed, backend="torch")

        backend = "torch"
        sync = lambda: None  # noqa: E731

    reps, warmup = int(os.environ.get("REPS", 20)), int(os.environ.get("WARMUP", 3))
    k = int(os.environ.get("REPLICATE", 1))
    results: Dict[str, Any] = {}
    for name in os.environ.get("SCENES", "thermos,garden").split(","):
        s, source = {"thermos": thermos, "garden": garden}[name](device)
        pts, rgbs = replicate(s["points"], s["rgbs"], k)
        W, H = s["width"], s["height"]
        viewmat, K = s["viewmat"].to(device), s["K"].to(device)
        gt = torch.rand(1, H, W, 3, generator=torch.Generator().manual_seed(1)).to(device)
        owner = torch.zeros(1, dtype=torch.int64, device=device)

        def ours_render(g):
            c, _, _ = distributed_rasterize(g["means"], g["quats"], g["scales"], g["opacities"], g["colors"],
                                            viewmat, K, W, H, owner, sh_degree=SH_DEGREE, backend=backend)
            return c

        def gsplat_render(g):
            c, _, _ = rasterization(g["means"], g["quats"], g["scales"], g["opacities"], g["colors"],
                                    viewmat, K, W, H, sh_degree=SH_DEGREE, packed=True)
            return c

        states = {}
        for who in ("ours", "gsplat"):
            params = init_gaussians(pts, rgbs, sh_degree=SH_DEGREE, bounds=(0, len(pts)), device=device)
            states[who] = (params, create_optimizers(params, global_batch=1))
        renders = {"ours": ours_render, "gsplat": gsplat_render}

        def step(who: str, keep: bool = False):
            params, opts = states[who]
            img = renders[who](activated(params, SH_DEGREE))
            loss = photometric_loss(img, gt, 0.2)
            loss.backward()
            kept = (img.detach().clone(), {k2: p.grad.detach().clone() for k2, p in params.items()}) if keep else None
            for o in opts.values():
                o.step()
                o.zero_grad(set_to_none=True)
            return kept

        # The first step of each, from the same parameters: image and gradient differences.
        first = {who: step(who, keep=True) for who in ("ours", "gsplat")}
        (img_o, gr_o), (img_g, gr_g) = first["ours"], first["gsplat"]
        grads = {}
        for k2 in gr_o:
            a, b = gr_o[k2].flatten().double(), gr_g[k2].flatten().double()
            grads[k2] = {"rel_l2": float((a - b).norm() / b.norm().clamp_min(1e-30)),
                         "cosine": float(torch.nn.functional.cosine_similarity(a, b, dim=0))}
        for _ in range(warmup):
            for who in ("ours", "gsplat"):
                step(who)
        times = {"ours": [], "gsplat": []}
        for _ in range(reps):  # taking turns, so a drifting machine hits both alike
            for who in ("ours", "gsplat"):
                sync()
                t0 = time.perf_counter()
                step(who)
                sync()
                times[who].append(time.perf_counter() - t0)
        med = {who: 1e3 * statistics.median(t) for who, t in times.items()}
        results[name] = {
            "source": source, "gaussians": len(pts), "replicate": k, "image": [W, H],
            "step_ms": med, "step_min_ms": {who: 1e3 * min(t) for who, t in times.items()},
            "ratio_ours_over_gsplat": med["ours"] / med["gsplat"],
            "first_step": {"image_max_abs_diff": float((img_o - img_g).abs().max()),
                           "image_mean_abs_diff": float((img_o - img_g).abs().mean()), "grads": grads},
        }
        print(f"{name}: {len(pts)} Gaussians {W}x{H}: ours {med['ours']:.2f} ms, gsplat {med['gsplat']:.2f} ms "
              f"({med['ours'] / med['gsplat']:.3f}x); image max diff {results[name]['first_step']['image_max_abs_diff']:.2e}",
              flush=True)
    payload = {
        "device": str(device), "fake_gsplat": fake, "reps": reps, "warmup": warmup, "scenes": results,
        "goal": "ours / gsplat <= 1.00 per training step (issue 14)",
        "note": ("Median step time over REPS steps taken in turns, torch.cuda.synchronize() around each; the "
                 "differences are of the first step, from identical parameters. Everything but the render is "
                 "shared code."),
    }
    path = write_result(f"step_vs_gsplat_{'fake' if fake else device.type}", payload)
    print("step_vs_gsplat: " + ", ".join(f"{n} {r['ratio_ours_over_gsplat']:.3f}x" for n, r in results.items())
          + f" -> {path}")


if __name__ == "__main__":
    main()
