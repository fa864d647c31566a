"""An independent dense reference renderer for tests: no tiles, no packing, no code shared
with distsplat.render. It projects with gsplat's own torch reference
(`gsplat.cuda._torch_impl._fully_fused_projection`), evaluates every Gaussian at every
pixel and composites front to back one Gaussian at a time exactly as gsplat's CUDA kernel
loops (skip alpha < 1/255, stop before transmittance reaches 1e-4). Costs N x pixels, so
only for tiny scenes; differentiable by autograd, so it also gives reference gradients."""

from typing import Optional, Tuple

import torch
from gsplat.cuda._torch_impl import (
    _fully_fused_projection,
    _quat_scale_to_covar_preci,
    _spherical_harmonics,
)
from torch import Tensor


def dense_render(
    means: Tensor,  # [N, 3]
    quats: Tensor,  # [N, 4]
    scales: Tensor,  # [N, 3]
    opacities: Tensor,  # [N]
    colors: Tensor,  # [N, D] or SH [N, K, 3]
    viewmats: Tensor,  # [C, 4, 4]
    Ks: Tensor,  # [C, 3, 3]
    width: int,
    height: int,
    sh_degree: Optional[int] = None,
    backgrounds: Optional[Tensor] = None,  # [C, D]
    antialiased: bool = False,
    eps2d: float = 0.3,
) -> Tuple[Tensor, Tensor]:
    covars, _ = _quat_scale_to_covar_preci(quats, scales, compute_preci=False)
    radii, means2d, depths, conics, comps = _fully_fused_projection(
        means, covars, viewmats, Ks, width, height, eps2d=eps2d, calc_compensations=antialiased
    )  # [C, N, ...]
    C = viewmats.shape[0]
    ys, xs = torch.meshgrid(
        torch.arange(height, dtype=means.dtype) + 0.5,
        torch.arange(width, dtype=means.dtype) + 0.5,
        indexing="ij",
    )
    out_colors, out_alphas = [], []
    for c in range(C):
        if sh_degree is None:
            col = colors  # [N, D]
        else:
            campos = torch.linalg.inv(viewmats[c])[:3, 3]
            col = torch.clamp_min(_spherical_harmonics(sh_degree, means - campos, colors) + 0.5, 0)
        opac = opacities * comps[c] if antialiased else opacities
        T = torch.ones(height, width, dtype=means.dtype)
        done = torch.zeros(height, width, dtype=torch.bool)
        img = torch.zeros(height, width, col.shape[-1], dtype=means.dtype)
        valid = (radii[c] > 0).all(-1)
        order = torch.sort(depths[c].detach().float(), stable=True).indices
        for g in order.tolist():
            if not valid[g]:
                continue
            dx, dy = xs - means2d[c, g, 0], ys - means2d[c, g, 1]
            a, b, cc = conics[c, g]
            sigma = 0.5 * (a * dx * dx + cc * dy * dy) + b * dx * dy
            alpha = torch.clamp_max(opac[g] * torch.exp(-sigma), 0.999)
            use = ~done & (sigma >= 0) & (alpha >= 1.0 / 255.0)
            next_T = T * (1 - alpha)
            stop = use & (next_T <= 1e-4)
            done = done | stop
            use = use & ~stop
            img = img + torch.where(use, alpha * T, 0)[..., None] * col[g]
            T = torch.where(use, next_T, T)
        alpha_img = 1 - T
        if backgrounds is not None:
            img = img + backgrounds[c] * T[..., None]
        out_colors.append(img)
        out_alphas.append(alpha_img[..., None])
    return torch.stack(out_colors), torch.stack(out_alphas)
