"""Evaluation on the test cameras: each rank renders (with the distributed render) only
the test cameras it owns and scores them against its own images; per-image PSNR and SSIM
land in a vector indexed by test camera, summed across ranks, and averaged in the same
order on every rank, so the metrics do not depend on the number of ranks."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from ..distributed import DistContext, all_reduce_sum, chunk_bounds, distributed_rasterize
from .losses import psnr, ssim
from .outputs import save_image


def test_owners(n_test: int, world_size: int) -> List[Tuple[int, int]]:
    """Test camera positions [start, end) owned by each rank (fixed for the run)."""
    return chunk_bounds(n_test, world_size)


@torch.no_grad()
def evaluate(
    render_args: Callable[[], Dict[str, Tensor]],  # the activated Gaussians (local chunk)
    viewmats: Tensor,  # [C_test, 4, 4] all test cameras
    Ks: Tensor,  # [C_test, 3, 3]
    width: int,
    height: int,
    read_image: Callable[[int], Tensor],  # test position -> [H, W, 3] float (own cameras only)
    names: Sequence[str],  # [C_test]
    ctx: DistContext,
    sh_degree: int,
    render_kwargs: Dict,
    renders_dir: Path,
    step: int,
    save_renders: int = 4,
) -> Dict[str, float]:
    n_test = viewmats.shape[0]
    if n_test == 0:
        return {}
    t0 = time.perf_counter()
    bounds = test_owners(n_test, ctx.world_size)
    rounds = max(end - start for start, end in bounds)
    scores = torch.zeros(2, n_test, dtype=torch.float64, device=viewmats.device)  # psnr, ssim
    g = render_args()
    for j in range(rounds):
        # One camera per rank per round (ranks whose share ran out render none).
        pos = [start + j for start, end in bounds if start + j < end]
        owner = [r for r, (start, end) in enumerate(bounds) if start + j < end]
        colors, _, _ = distributed_rasterize(
            g["means"], g["quats"], g["scales"], g["opacities"], g["colors"],
            viewmats[pos], Ks[pos], width, height,
            torch.tensor(owner, dtype=torch.int64, device=viewmats.device),
            sh_degree=sh_degree, **render_kwargs,
        )
        if ctx.rank in owner:
            p = pos[owner.index(ctx.rank)]
            render = colors[0].clamp(0, 1)
            gt = read_image(p)
            scores[0, p] = psnr(render[None], gt[None])[0].double()
            scores[1, p] = ssim(render[None], gt[None]).double()
            if p < save_renders:
                save_image(renders_dir / f"val_step{step:04d}_{names[p]}.png", torch.cat([gt, render], 1))
    scores = all_reduce_sum(scores).cpu().numpy()
    return {
        "psnr": float(np.mean(scores[0])),
        "ssim": float(np.mean(scores[1])),
        "eval_time": time.perf_counter() - t0,
        "num_test_images": n_test,
    }
