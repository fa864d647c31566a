"""The colour-corrected scores gsplat reports with a bilateral grid (cc_psnr, cc_ssim, cc_lpips):
a test render has no grid (no test image has one), so its colours are first fitted to the
ground truth's, as mip-NeRF 360's evaluation (Barron et al. 2022) and gsplat do, and scored
after that fit: what the scores then measure is the geometry and the colours up to the
per-image transform a camera's ISP would apply.

The fit: each output channel is a quadratic polynomial of the render's three channels (their 6
products, the 3 channels, a constant), solved by least squares over the pixels that are
unclipped (within [eps, 1 - eps]) in the render, in the current estimate and in the ground truth
for that channel; the estimate is replaced by the fitted colours, clipped to [0, 1], and the fit
repeated (5 times) as its clipped set changes. Solved in float64 (gsplat solves in float32)."""

from __future__ import annotations

import torch
from torch import Tensor


def _expansion(x: Tensor) -> Tensor:
    """[P, 3] -> [P, 10]: x_i x_j (i <= j), x, 1."""
    quad = [x[:, i:i + 1] * x[:, i:] for i in range(x.shape[1])]
    return torch.cat(quad + [x, torch.ones_like(x[:, :1])], 1)


def color_correct(img: Tensor, ref: Tensor, num_iters: int = 5, eps: float = 0.5 / 255) -> Tensor:
    """`img` [..., 3] in [0, 1] with its colours fitted to `ref` [..., 3] (module doc)."""
    if img.shape != ref.shape:
        raise ValueError(f"color_correct: img {tuple(img.shape)} and ref {tuple(ref.shape)} differ")
    C = img.shape[-1]
    x = img.reshape(-1, C).double()
    y = ref.reshape(-1, C).double()

    def unclipped(z: Tensor) -> Tensor:
        return (z >= eps) & (z <= 1 - eps)

    first = unclipped(x)
    for _ in range(num_iters):
        A = _expansion(x)  # [P, 10]
        warp = []
        for c in range(C):
            keep = first[:, c] & unclipped(x[:, c]) & unclipped(y[:, c])
            Am = torch.where(keep[:, None], A, torch.zeros_like(A))
            ym = torch.where(keep, y[:, c], torch.zeros_like(y[:, c]))
            warp.append(torch.linalg.lstsq(Am, ym[:, None], driver="gelsd").solution[:, 0])
        x = (A @ torch.stack(warp, 1)).clamp(0, 1)
    return x.reshape(img.shape).to(img.dtype)
