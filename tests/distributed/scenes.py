"""Tiny generated scenes and the loss shared by the distributed workers and the
one-process references they are compared with (float64, so "equal" can be tight)."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from distsplat.distributed import chunk_bounds

DTYPE = torch.float64
WIDTH, HEIGHT = 32, 24
PARAM_NAMES = ("means", "quats", "scales", "opacities", "colors")

# name -> scene and render options. Chosen so that together they cover: C not divisible
# by W (5, 7), C < W ("few"), a rank holding no Gaussian and a rank whose Gaussians are all
# invisible ("edge" at W=4), a camera that sees nothing ("edge"), SH colours with depth,
# packed=False, backgrounds, and camera owners that are not rank-major.
CASES: Dict[str, Dict[str, Any]] = {
    "base": dict(N=120, C=5, seed=1),
    "edge": dict(N=90, C=7, seed=2, invisible=30, blind_camera=True, zero_rank=True),
    "few": dict(N=80, C=None, seed=3, backgrounds=True),  # C = max(1, W - 1)
    "sh_depth": dict(N=100, C=4, seed=4, sh_degree=2, render_mode="RGB+D", backgrounds=True),
    "unpacked": dict(N=100, C=6, seed=5, packed=False, render_mode="RGB+ED", backgrounds=True),
}


def look_at(eye: List[float], target: List[float]) -> Tensor:
    """World-to-camera [4, 4], OpenCV axes (x right, y down, z forward)."""
    eye_t, target_t = torch.tensor(eye, dtype=DTYPE), torch.tensor(target, dtype=DTYPE)
    forward = (target_t - eye_t) / (target_t - eye_t).norm()
    right = torch.linalg.cross(forward, torch.tensor([0.0, 1.0, 0.0], dtype=DTYPE))
    right = right / right.norm()
    down = torch.linalg.cross(forward, right)
    R = torch.stack([right, down, forward])
    V = torch.eye(4, dtype=DTYPE)
    V[:3, :3], V[:3, 3] = R, -R @ eye_t
    return V


def make_cameras(C: int, seed: int, blind_camera: bool = False) -> Tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(1000 + seed)
    angles = torch.rand(C, generator=g, dtype=DTYPE) * 2 * math.pi
    mats = []
    for i, a in enumerate(angles.tolist()):
        eye = [3 * math.cos(a), 0.4 * math.sin(3 * a), 3 * math.sin(a)]
        if blind_camera and i == C // 2:  # looks away from the scene: sees nothing
            mats.append(look_at(eye, [2 * eye[0], eye[1], 2 * eye[2]]))
        else:
            mats.append(look_at(eye, [0.0, 0.0, 0.0]))
    viewmats = torch.stack(mats)  # [C, 4, 4]
    f = 28.0 + 4.0 * torch.rand(C, generator=g, dtype=DTYPE)
    Ks = torch.zeros(C, 3, 3, dtype=DTYPE)
    Ks[:, 0, 0], Ks[:, 1, 1] = f, f
    Ks[:, 0, 2], Ks[:, 1, 2], Ks[:, 2, 2] = WIDTH / 2, HEIGHT / 2, 1.0
    return viewmats, Ks


def make_gaussians(N: int, seed: int, sh_degree: Optional[int] = None,
                   invisible: int = 0) -> Dict[str, Tensor]:
    """Activated parameters; the last `invisible` Gaussians sit far above every camera's
    field of view."""
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(N, 3, generator=g, dtype=DTYPE) * 0.6
    if invisible:
        means[N - invisible:, 1] = -60.0  # y is up in the world: far above the scene
    colors = (torch.randn(N, (sh_degree + 1) ** 2, 3, generator=g, dtype=DTYPE) * 0.3
              if sh_degree is not None else torch.rand(N, 3, generator=g, dtype=DTYPE))
    return {
        "means": means,
        "quats": torch.randn(N, 4, generator=g, dtype=DTYPE),
        "scales": torch.rand(N, 3, generator=g, dtype=DTYPE) * 0.12 + 0.02,
        "opacities": torch.rand(N, generator=g, dtype=DTYPE) * 0.8 + 0.15,
        "colors": colors,
    }


def case_layout(name: str, W: int) -> Dict[str, Any]:
    """Everything a worker with W ranks and the reference need for a case."""
    spec = CASES[name]
    C = spec["C"] if spec["C"] is not None else max(1, W - 1)
    viewmats, Ks = make_cameras(C, spec["seed"], spec.get("blind_camera", False))
    gaussians = make_gaussians(spec["N"], spec["seed"], spec.get("sh_degree"), spec.get("invisible", 0))
    if spec.get("zero_rank") and W > 1:  # rank 0 holds nothing, the others share the rest
        bounds = [(0, 0)] + chunk_bounds(spec["N"], W - 1)
    else:
        bounds = chunk_bounds(spec["N"], W)
    g = torch.Generator().manual_seed(2000 + spec["seed"])
    owner = (torch.arange(C) % W)[torch.randperm(C, generator=g)]  # [C], not rank-major
    render_kwargs: Dict[str, Any] = {"render_mode": spec.get("render_mode", "RGB")}
    if spec.get("backgrounds"):
        render_kwargs["backgrounds"] = torch.rand(C, 3, generator=g, dtype=DTYPE)
    return dict(
        gaussians=gaussians, viewmats=viewmats, Ks=Ks, bounds=bounds, owner=owner,
        sh_degree=spec.get("sh_degree"), packed=spec.get("packed", True),
        render_kwargs=render_kwargs,
    )


def camera_weights(seed: int, cameras: Tensor, shape: Tuple[int, ...]) -> Tensor:
    """[len(cameras), *shape] loss weights, a different random image per camera, so a
    render delivered to the wrong camera (gsplat #871) changes the loss and gradients."""
    return torch.stack([
        torch.rand(shape, generator=torch.Generator().manual_seed(seed * 1000 + int(c)), dtype=DTYPE)
        for c in cameras
    ]) if len(cameras) else torch.zeros((0, *shape), dtype=DTYPE)


def weighted_loss(colors: Tensor, alphas: Tensor, cameras: Tensor, seed: int) -> Tensor:
    """sum over the given cameras of <w_c, colors_c> + <v_c, alphas_c>; `cameras` are the
    batch positions of the rows of colors/alphas."""
    wc = camera_weights(seed, cameras, tuple(colors.shape[1:]))
    wa = camera_weights(seed + 500, cameras, tuple(alphas.shape[1:]))
    return (wc * colors).sum() + (wa * alphas).sum()


def dense_means2d_grad(meta: Dict[str, Any], n_all: int, offset: int, C: int) -> Tensor:
    """meta's means2d.grad as [C, n_all, 2] in global Gaussian ids (zeros elsewhere), on
    the CPU (meta may live on a GPU)."""
    grad = meta["means2d"].grad
    if grad is None:
        grad = torch.zeros_like(meta["means2d"])
    grad = grad.detach().cpu()
    if not meta["packed"]:
        out = torch.zeros(C, n_all, 2, dtype=grad.dtype)
        out[:, offset:offset + grad.shape[1]] = grad
        return out
    out = torch.zeros(C, n_all, 2, dtype=grad.dtype)
    out[meta["camera_ids"].cpu(), meta["gaussian_ids"].cpu() + offset] = grad
    return out


# --------------------------------------------------------------------------- training

TRAIN_SEED, TRAIN_N, TRAIN_POOL = 7, 100, 8


def train_loop(rank: int, W: int, steps: int, batch_size: int, lr: float,
               reference: bool = False, backend: str = "torch", device: str = "cpu",
               dtype: torch.dtype = DTYPE) -> Dict[str, Tensor]:
    """Adam on rank `rank`'s chunk (raw parameters: log scales, logit opacities), no
    densification. Every step draws the same global batch of `batch_size` cameras on every
    W; the loss is the mean over that global batch of each camera's MSE to its own target
    image. reference=True trains all Gaussians in one process with `rasterize`. backend,
    device, dtype: tests/cuda trains with gsplat's kernels in float32 on the GPU."""
    from distsplat.distributed import distributed_rasterize
    from distsplat.render import rasterize

    move = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
    viewmats, Ks = (move(t) for t in make_cameras(TRAIN_POOL, TRAIN_SEED))
    g0 = {k: move(v) for k, v in make_gaussians(TRAIN_N, TRAIN_SEED).items()}
    raw = {"means": g0["means"], "quats": g0["quats"], "log_scales": g0["scales"].log(),
           "logit_opacities": torch.logit(g0["opacities"]), "colors": g0["colors"]}
    start, end = (0, TRAIN_N) if reference else chunk_bounds(TRAIN_N, W)[rank]
    params = {k: v[start:end].clone().requires_grad_() for k, v in raw.items()}
    targets = move(torch.rand(TRAIN_POOL, HEIGHT, WIDTH, 3, generator=torch.Generator().manual_seed(9),
                              dtype=DTYPE))
    opt = torch.optim.Adam(params.values(), lr=lr)
    schedule = torch.Generator().manual_seed(77)
    for _ in range(steps):
        cams = torch.randperm(TRAIN_POOL, generator=schedule)[:batch_size]  # same on every rank
        args = (params["means"], params["quats"], params["log_scales"].exp(),
                torch.sigmoid(params["logit_opacities"]), params["colors"],
                viewmats[cams.to(device)], Ks[cams.to(device)], WIDTH, HEIGHT)
        if reference:
            colors, _, _ = rasterize(*args, backend=backend)
            own = torch.arange(batch_size)
        else:
            owner = torch.arange(batch_size) % W  # round-robin: not rank-major
            colors, _, _ = distributed_rasterize(*args, owner.to(device), backend=backend)
            own = (owner == rank).nonzero()[:, 0]
        per_camera = ((colors - targets[cams[own].to(device)]) ** 2).mean(dim=(1, 2, 3))  # [C_own]
        loss = per_camera.sum() / batch_size  # this rank's share of the global mean
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach().cpu() for k, v in params.items()}


# ------------------------------------------------- a receiver-side colour model (pair_colors)

FEATURES = 5


def pair_color_setup(name: str, W: int, seed: int):
    """A case's layout with per-Gaussian features [N, FEATURES] in place of colours, and a
    fixed toy colour model of (features, camera-to-Gaussian direction, camera): what
    appearance optimization's MLP and per-image embeddings compute, without training them."""
    layout = case_layout(name, W)
    N, C = layout["gaussians"]["means"].shape[0], layout["viewmats"].shape[0]
    g = torch.Generator().manual_seed(seed)
    layout["gaussians"]["colors"] = torch.randn(N, FEATURES, generator=g, dtype=DTYPE)
    A = torch.randn(FEATURES, 3, generator=g, dtype=DTYPE)
    B = torch.randn(3, 3, generator=g, dtype=DTYPE)
    bias = torch.randn(C, 3, generator=g, dtype=DTYPE)  # one "embedding" per batch camera

    def colour_model(features: Tensor, dirs: Tensor, cameras: Tensor) -> Tensor:
        d = dirs / dirs.norm(dim=-1, keepdim=True)
        return torch.sigmoid(features @ A + d @ B + bias[cameras])

    return layout, colour_model
