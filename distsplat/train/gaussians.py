"""Gaussian parameters of one rank and their optimizers (DESIGN.md: each rank holds a
contiguous chunk of the Gaussians, its parameters and optimizer state, nothing else).

Parameters are stored raw, as gsplat's simple_trainer stores them: means, log scales,
unnormalized quats, logit opacities, SH DC `sh0` [N, 1, 3] and rest `shN` [N, K-1, 3].
Initialization draws every random number for ALL Gaussians from one seeded generator and
then keeps this rank's rows, so W ranks start from exactly the W=1 model.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

SH_C0 = 0.28209479177387814  # Y_0^0: colour = SH_C0 * sh0 + 0.5


def rgb_to_sh(rgb: Tensor) -> Tensor:
    return (rgb - 0.5) / SH_C0


def knn_mean_distance(points: np.ndarray, k: int = 3) -> np.ndarray:
    """sqrt of the mean squared distance of each point to its k nearest other points."""
    from scipy.spatial import cKDTree

    if len(points) < 2:
        return np.full(len(points), 0.01, dtype=np.float64)
    k_eff = min(k, len(points) - 1)
    d, _ = cKDTree(points).query(points, k=k_eff + 1)  # the first neighbour is the point
    d = d.reshape(len(points), -1)[:, 1:]
    return np.sqrt(np.maximum((d**2).mean(1), 1e-14))


def init_gaussians(
    points: Tensor,  # [N_all, 3] every initial point (SfM or random), same on every rank
    rgbs: Tensor,  # [N_all, 3] in [0, 1]
    sh_degree: int,
    bounds: Tuple[int, int],  # this rank's rows [start, end) of the N_all Gaussians
    *,
    init_opacity: float = 0.1,
    init_scale: float = 1.0,
    seed: int = 0,
    device: Optional[torch.device] = None,
) -> torch.nn.ParameterDict:
    """gsplat's initialization (scales from the 3 nearest neighbours, random quats,
    constant opacity, colour in the SH DC term), of this rank's chunk only."""
    n_all = points.shape[0]
    start, end = bounds
    g = torch.Generator().manual_seed(seed)
    quats = torch.rand(n_all, 4, generator=g)[start:end]  # drawn for all, kept for ours
    dist = knn_mean_distance(points.double().cpu().numpy())[start:end]
    scales = torch.log(torch.from_numpy(dist).float() * init_scale)[:, None].repeat(1, 3)
    n = end - start
    k = (sh_degree + 1) ** 2
    params = {
        "means": points[start:end].float(),
        "scales": scales,
        "quats": quats,
        "opacities": torch.logit(torch.full((n,), init_opacity)),
        "sh0": rgb_to_sh(rgbs[start:end].float())[:, None, :],
        "shN": torch.zeros(n, k - 1, 3),
    }
    return torch.nn.ParameterDict(
        {name: torch.nn.Parameter(t.to(device) if device is not None else t) for name, t in params.items()}
    )


def random_points(n: int, extent: float, seed: int = 0) -> Tuple[Tensor, Tensor]:
    """gsplat's `--init_type random`: n points uniform in a cube of half-size extent."""
    g = torch.Generator().manual_seed(seed)
    points = extent * (torch.rand(n, 3, generator=g) * 2 - 1)
    return points, torch.rand(n, 3, generator=g)


# Base learning rates of gsplat's simple_trainer (means scaled by the scene size).
BASE_LRS = {
    "means": 1.6e-4, "scales": 5e-3, "quats": 1e-3, "opacities": 5e-2,
    "sh0": 2.5e-3, "shN": 2.5e-3 / 20,
}


def create_optimizers(
    params: torch.nn.ParameterDict,
    global_batch: int,
    scene_scale: float = 1.0,
    lrs: Optional[Dict[str, float]] = None,
) -> Dict[str, torch.optim.Adam]:
    """One Adam per parameter (strategies replace rows of each), scaled with the GLOBAL
    batch size as gsplat does: lr * sqrt(B), eps 1e-15 / sqrt(B), betas 1 - B (1 - beta).
    Using the global batch keeps the update identical whatever W splits it."""
    lrs = {**BASE_LRS, **(lrs or {})}
    B = global_batch
    out = {}
    for name, p in params.items():
        lr = lrs[name] * (scene_scale if name == "means" else 1.0)
        out[name] = torch.optim.Adam(
            [{"params": [p], "lr": lr * math.sqrt(B), "name": name}],
            eps=1e-15 / math.sqrt(B),
            betas=(1 - B * (1 - 0.9), 1 - B * (1 - 0.999)),
        )
    return out


def activated(params: torch.nn.ParameterDict, sh_degree: Optional[int] = None) -> Dict[str, Tensor]:
    """The renderer's inputs: positive scales, opacities in (0, 1), SH [N, K, 3]."""
    colors = torch.cat([params["sh0"], params["shN"]], dim=1)  # [N, K, 3]
    if sh_degree is not None:
        colors = colors[:, : (sh_degree + 1) ** 2]
    return {
        "means": params["means"],
        "quats": params["quats"],
        "scales": torch.exp(params["scales"]),
        "opacities": torch.sigmoid(params["opacities"]),
        "colors": colors,
    }
