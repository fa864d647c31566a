"""distsplat at W = 1 against gsplat 1.5.3 on the same Gaussians and cameras, forward +
backward, so the overhead of our layers is a measured ratio (issue 7's goal: <= 1.00x on GPU).

GPU (torch.cuda.is_available()):
    gsplat        gsplat.rasterization(packed=True, sh_degree=3)
    ours_render   distsplat.render.rasterize(backend="gsplat")          the one-process API
    ours_w1       distsplat.distributed.distributed_rasterize(backend="gsplat") with one
                  process (no process group): the trainer's path at W = 1
  ratio = ours / gsplat (median fwd+bwd, torch.cuda.synchronize() around each).

CPU: gsplat.rasterization cannot run (its projection, tile intersection and rasterization
are CUDA kernels; the pure-torch `_rasterization` reference still calls the CUDA
`isect_tiles` and `rasterize_to_indices_in_range`, and gsplat's torch `_isect_tiles` is a
per-Gaussian Python loop, not a baseline). What is compared on CPU:
    projection    ours torch `project` (packed, SH evaluated per visible pair) vs gsplat's
                  pure-torch `_quat_scale_to_covar_preci` + `_fully_fused_projection`
                  (dense [C, N]) + `_spherical_harmonics`, forward + backward
    layers        ours_w1 (distributed_rasterize, one process) vs ours_render (rasterize),
                  torch backend: the cost of the distributed layer at W = 1 on CPU
The full gsplat comparison is recorded as pending until a GPU run writes vs_gsplat_<gpu>_<date>.json.

Environment: N (CPU 10000 / GPU 1000000), WIDTH, HEIGHT (CPU 128x128 / GPU 1297x840),
CAMERAS (1), REPEATS (5), THREADS (CPU: 1). Writes benchmarks/results/vs_gsplat_<device>.json.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import write_result  # noqa: E402

SH_DEGREE = 3


def make_scene(n: int, width: int, height: int, cameras: int, device: str, seed: int = 0):
    """n Gaussians in the view frustum of camera 0 (depth 2..6, 0.3-3 px sizes, as
    bench_render.py) with SH degree 3 colours; extra cameras are small rotations of it."""
    g = torch.Generator().manual_seed(seed)
    f = 0.5 * width / math.tan(math.radians(30))
    z = torch.rand(n, generator=g) * 4 + 2
    x = (torch.rand(n, generator=g) * 2 - 1) * z * (0.5 * width / f)
    y = (torch.rand(n, generator=g) * 2 - 1) * z * (0.5 * height / f)
    viewmats = []
    for c in range(cameras):
        a = 0.05 * c
        V = torch.eye(4)
        V[0, 0], V[0, 2], V[2, 0], V[2, 2] = math.cos(a), math.sin(a), -math.sin(a), math.cos(a)
        viewmats.append(V)
    sh = torch.zeros(n, (SH_DEGREE + 1) ** 2, 3)
    sh[:, 0] = (torch.rand(n, 3, generator=g) - 0.5) / 0.2820948
    sh[:, 1:] = 0.05 * torch.randn(n, (SH_DEGREE + 1) ** 2 - 1, 3, generator=g)
    scene = dict(
        means=torch.stack([x, y, z], -1), quats=torch.randn(n, 4, generator=g),
        scales=torch.exp(torch.rand(n, 3, generator=g) * math.log(10) + math.log(0.005)),
        opacities=torch.rand(n, generator=g) * 0.9 + 0.1, colors=sh,
        viewmats=torch.stack(viewmats),
        Ks=torch.tensor([[f, 0, width / 2], [0, f, height / 2], [0, 0, 1]]).expand(cameras, 3, 3).contiguous(),
    )
    return {k: v.to(device) for k, v in scene.items()}


def timeit(fns: Dict[str, Callable[[Dict[str, torch.Tensor]], torch.Tensor]], scene,
           repeats: int) -> Dict[str, Dict[str, float]]:
    """Median forward / backward / total ms of each fn (returns a scalar loss), the fns
    taking turns in every round so that a drifting machine load hits them alike. On CPU
    also the CPU time of this thread (immune to other processes on the machine)."""
    cuda = scene["means"].is_cuda
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rec = {name: {"fwd": [], "bwd": [], "cpu": []} for name in fns}
    for i in range(repeats + 1):  # round 0 warms up (compiles kernels on GPU)
        for name, fn in fns.items():
            p = {k: v.detach().clone().requires_grad_(k not in ("viewmats", "Ks")) for k, v in scene.items()}
            sync()
            c0, t0 = time.thread_time(), time.perf_counter()
            loss = fn(p)
            sync()
            t1 = time.perf_counter()
            loss.backward()
            sync()
            t2, c2 = time.perf_counter(), time.thread_time()
            if i:
                rec[name]["fwd"].append(t1 - t0)
                rec[name]["bwd"].append(t2 - t1)
                rec[name]["cpu"].append(c2 - c0)
    out = {}
    for name, r in rec.items():
        tot = [a + b for a, b in zip(r["fwd"], r["bwd"])]
        out[name] = {"fwd_ms": 1e3 * statistics.median(r["fwd"]), "bwd_ms": 1e3 * statistics.median(r["bwd"]),
                     "fwd_bwd_ms": 1e3 * statistics.median(tot), "fwd_bwd_min_ms": 1e3 * min(tot)}
        if not cuda:
            out[name]["fwd_bwd_cpu_ms"] = 1e3 * statistics.median(r["cpu"])
    return out


def renderers(width: int, height: int, backend: str):
    from distsplat.distributed import distributed_rasterize
    from distsplat.render import rasterize

    def ours_render(p):
        c, a, _ = rasterize(p["means"], p["quats"], p["scales"], p["opacities"], p["colors"],
                            p["viewmats"], p["Ks"], width, height, sh_degree=SH_DEGREE, backend=backend)
        return c.sum() + a.sum()

    def ours_w1(p):
        owner = torch.zeros(p["viewmats"].shape[0], dtype=torch.int64)
        c, a, _ = distributed_rasterize(p["means"], p["quats"], p["scales"], p["opacities"], p["colors"],
                                        p["viewmats"], p["Ks"], width, height, owner,
                                        sh_degree=SH_DEGREE, backend=backend)
        return c.sum() + a.sum()

    return {"ours_render": ours_render, "ours_w1": ours_w1}


def projection_pair(width: int, height: int):
    """Ours (packed) vs gsplat's pure-torch projection (dense), fwd + bwd, same outputs summed."""
    from gsplat.cuda._torch_impl import _fully_fused_projection, _quat_scale_to_covar_preci, _spherical_harmonics

    from distsplat.render import project

    def ours(p):
        pairs, _ = project(p["means"], p["quats"], p["scales"], p["opacities"], p["colors"],
                           p["viewmats"], p["Ks"], width, height, backend="torch", sh_degree=SH_DEGREE)
        return pairs.means2d.sum() + pairs.conics.sum() + pairs.colors.sum() + pairs.depths.sum()

    def gsplat_torch(p):
        covars, _ = _quat_scale_to_covar_preci(p["quats"], p["scales"], True, False, triu=False)
        radii, means2d, depths, conics, _ = _fully_fused_projection(
            p["means"], covars, p["viewmats"], p["Ks"], width, height)
        valid = (radii > 0).all(-1)  # [C, N]
        campos = torch.inverse(p["viewmats"])[:, :3, 3]
        dirs = p["means"][None] - campos[:, None]  # [C, N, 3]
        colors = torch.clamp_min(_spherical_harmonics(SH_DEGREE, dirs, p["colors"][None].expand(len(campos), -1, -1, -1)) + 0.5, 0.0)
        return means2d[valid].sum() + conics[valid].sum() + colors[valid].sum() + depths[valid].sum()

    return {"ours_project": ours, "gsplat_torch_project": gsplat_torch}


def main() -> None:
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    n = int(os.environ.get("N", 1_000_000 if cuda else 10_000))
    width = int(os.environ.get("WIDTH", 1297 if cuda else 128))
    height = int(os.environ.get("HEIGHT", 840 if cuda else 128))
    cameras = int(os.environ.get("CAMERAS", 1))
    repeats = int(os.environ.get("REPEATS", 5))
    if not cuda:
        torch.set_num_threads(int(os.environ.get("THREADS", 1)))
    scene = make_scene(n, width, height, cameras, device)
    ratios: Dict[str, float] = {}
    if cuda:
        from gsplat import rasterization

        from distsplat.render.gsplat_ext import ensure_gsplat_ops

        print(f"gsplat ops: {ensure_gsplat_ops()}")  # prebuilt or built once, before the first call

        def gsplat_fn(p):
            c, a, _ = rasterization(p["means"], p["quats"], p["scales"], p["opacities"], p["colors"],
                                    p["viewmats"], p["Ks"], width, height, sh_degree=SH_DEGREE, packed=True)
            return c.sum() + a.sum()

        runs = timeit({"gsplat": gsplat_fn, **renderers(width, height, "gsplat")}, scene, repeats)
        for name in ("ours_render", "ours_w1"):
            ratios[f"{name}_over_gsplat"] = runs[name]["fwd_bwd_ms"] / runs["gsplat"]["fwd_bwd_ms"]
        status = "measured on GPU"
    else:
        runs = timeit({**renderers(width, height, "torch"), **projection_pair(width, height)}, scene, repeats)
        for key in ("fwd_bwd_ms", "fwd_bwd_cpu_ms"):
            tag = "" if key == "fwd_bwd_ms" else "_cpu_time"
            ratios["ours_w1_over_ours_render_torch" + tag] = runs["ours_w1"][key] / runs["ours_render"][key]
            ratios["ours_project_over_gsplat_torch_project" + tag] = (
                runs["ours_project"][key] / runs["gsplat_torch_project"][key])
        status = ("GPU comparison PENDING (no GPU here): run `python benchmarks/bench_vs_gsplat.py` on a "
                  "CUDA machine to write vs_gsplat_<gpu>_<date>.json")
    import gsplat

    payload = {
        "device": device, "gsplat": gsplat.__version__, "status": status,
        "scene": {"gaussians": n, "width": width, "height": height, "cameras": cameras,
                  "sh_degree": SH_DEGREE, "generator": "benchmarks/bench_vs_gsplat.py:make_scene"},
        "repeats": repeats, "threads": None if cuda else torch.get_num_threads(),
        "goal": "ours_w1 / gsplat <= 1.00 on GPU (fwd+bwd, same Gaussians and cameras)",
        "runs": runs, "ratios": ratios,
        "note": ("Ratios are medians of fwd+bwd from this one run, the runs taking turns in each "
                 "round; `_cpu_time` ratios use this thread's CPU time (other processes share the "
                 "machine's cores; wall times carry their noise). CPU: gsplat's full rasterization "
                 "needs CUDA, so only its vectorized pure-torch projection is a CPU baseline "
                 "(dense over all C x N pairs; ours is packed)."),
    }
    path = write_result("vs_gsplat", payload)
    print(f"bench_vs_gsplat {device} N={n} {width}x{height} C={cameras}: "
          + ", ".join(f"{k} {v:.3f}x" for k, v in ratios.items()) + f" ({status}) -> {path}")


if __name__ == "__main__":
    main()
