"""The real point cloud of $DISTSPLAT_DATA/test_garden.npz (tests/conftest.py) made into
Gaussians the way gsplat's own tests do (crop to [-2, 2]^3, random scales in [1e-4, 0.02],
random unit quaternions, random opacities, colours / 255)."""

from pathlib import Path
from typing import Dict, Optional

import numpy as np
import pytest
import torch

from tests.conftest import SHARED_DATA


def load_garden(
    device: str = "cpu",
    max_points: Optional[int] = None,
    downscale: int = 1,
    seed: int = 42,
    path: Path = SHARED_DATA / "test_garden.npz",
) -> Dict:
    if not path.is_file():
        pytest.skip(f"{path} not found (set DISTSPLAT_DATA to the folder holding it; see tests/conftest.py)")
    data = np.load(path)
    means = torch.from_numpy(data["means3d"]).float()
    colors = torch.from_numpy(data["colors"]).float() / 255.0
    keep = (means.abs() <= 2).all(-1)
    means, colors = means[keep], colors[keep]
    g = torch.Generator().manual_seed(seed)
    if max_points is not None and max_points < len(means):
        idx = torch.randperm(len(means), generator=g)[:max_points]
        means, colors = means[idx], colors[idx]
    n = len(means)
    scales = torch.rand(n, 3, generator=g) * (0.02 - 1e-4) + 1e-4
    quats = torch.nn.functional.normalize(torch.randn(n, 4, generator=g), dim=-1)
    opacities = torch.rand(n, generator=g)
    Ks = torch.from_numpy(data["Ks"]).float()
    Ks[:, :2] /= downscale
    out = dict(
        means=means, quats=quats, scales=scales, opacities=opacities, colors=colors,
        viewmats=torch.from_numpy(data["viewmats"]).float(), Ks=Ks,
    )
    out = {k: v.to(device) for k, v in out.items()}
    out.update(width=int(data["width"]) // downscale, height=int(data["height"]) // downscale, sh_degree=None)
    return out
