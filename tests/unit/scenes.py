"""Tiny generated scenes for render tests."""

import math
from typing import Dict, Optional

import torch
from torch import Tensor


def look_at_viewmat(eye, target=(0.0, 0.0, 0.0), up=(0.0, -1.0, 0.0), dtype=torch.float32) -> Tensor:
    """World-to-camera matrix (OpenCV axes: x right, y down, z forward) looking at target."""
    eye, target, up = (torch.tensor(v, dtype=torch.float64) for v in (eye, target, up))
    z = target - eye
    z = z / z.norm()
    x = torch.linalg.cross(z, up)
    x = x / x.norm()
    y = torch.linalg.cross(z, x)
    R = torch.stack([x, y, z])  # rows: camera axes in world coordinates
    V = torch.eye(4, dtype=torch.float64)
    V[:3, :3] = R
    V[:3, 3] = -R @ eye
    return V.to(dtype)


def intrinsics(width: int, height: int, fov_deg: float = 60.0, dtype=torch.float32) -> Tensor:
    f = 0.5 * width / math.tan(math.radians(fov_deg) / 2)
    return torch.tensor([[f, 0, width / 2], [0, f, height / 2], [0, 0, 1]], dtype=dtype)


def random_scene(
    n: int = 60,
    n_cameras: int = 2,
    width: int = 40,
    height: int = 30,
    sh_degree: Optional[int] = None,
    channels: int = 3,
    scale: float = 0.12,
    seed: int = 0,
    dtype=torch.float32,
) -> Dict:
    """n Gaussians in a unit ball seen by n_cameras cameras on a circle of radius 4."""
    g = torch.Generator().manual_seed(seed)
    means = (torch.rand(n, 3, generator=g) * 2 - 1).to(dtype)
    quats = torch.randn(n, 4, generator=g).to(dtype)
    scales = (torch.rand(n, 3, generator=g) * scale + 0.02).to(dtype)
    opacities = (torch.rand(n, generator=g) * 0.8 + 0.15).to(dtype)
    if sh_degree is None:
        colors = torch.rand(n, channels, generator=g).to(dtype)
    else:
        colors = (torch.randn(n, (sh_degree + 1) ** 2, 3, generator=g) * 0.3).to(dtype)
    viewmats = torch.stack(
        [
            look_at_viewmat(
                (4 * math.sin(2 * math.pi * i / max(n_cameras, 1)), 0.5 * i, -4 * math.cos(2 * math.pi * i / max(n_cameras, 1))),
                dtype=dtype,
            )
            for i in range(n_cameras)
        ]
    )
    Ks = intrinsics(width, height, dtype=dtype)[None].repeat(n_cameras, 1, 1)
    return dict(
        means=means, quats=quats, scales=scales, opacities=opacities, colors=colors,
        viewmats=viewmats, Ks=Ks, width=width, height=height, sh_degree=sh_degree,
    )


GAUSSIAN_KEYS = ("means", "quats", "scales", "opacities", "colors")


def with_grad(scene: Dict) -> Dict:
    out = dict(scene)
    for k in GAUSSIAN_KEYS:
        out[k] = scene[k].detach().clone().requires_grad_(True)
    return out


def render_args(scene: Dict):
    return [scene[k] for k in ("means", "quats", "scales", "opacities", "colors", "viewmats", "Ks", "width", "height")]
