"""The one-process render: `rasterize()` and its two stages, `project()` and
`rasterize_pairs()`, each dispatching to backend `torch` or `gsplat`.

The distributed render (distsplat/distributed/) calls the same two stages with a packed
all-to-all in between, so everything about render modes and validation lives here once.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor

from . import gsplat_backend, torch_backend
from .absgrad import attach_sink
from .checks import (
    RASTERIZE_MODES,
    RENDER_MODES,
    ShapeChecker,
    check_choice,
    check_colors,
    check_finite,
    check_image_size,
    resolve_backend,
)
from .pairs import Pairs

_BACKENDS = {"torch": torch_backend, "gsplat": gsplat_backend}


def check_inputs(
    fn: str,
    means: Tensor,
    quats: Tensor,
    scales: Tensor,
    opacities: Tensor,
    colors: Tensor,
    viewmats: Tensor,
    Ks: Tensor,
    width: int,
    height: int,
    *,
    sh_degree: Optional[int],
    near_plane: float,
    far_plane: float,
    eps2d: float,
    backgrounds: Optional[Tensor],
    rasterize_mode: str,
    render_mode: str,
    backend: str,
    finite: bool = True,
) -> str:
    """Validates everything `rasterize` takes; returns the resolved backend name.
    Raises ValueError naming the argument and what was expected."""
    check = ShapeChecker(fn)
    check("means", means, ("N", 3))
    check("quats", quats, ("N", 4))
    check("scales", scales, ("N", 3))
    check("opacities", opacities, ("N",))
    check_colors(check, colors, sh_degree)
    check("viewmats", viewmats, ("C", 4, 4))
    check("Ks", Ks, ("C", 3, 3))
    if backgrounds is not None:
        channels = 3 if sh_degree is not None else check.dim("D")
        check("backgrounds", backgrounds, ("C", channels))
    check_image_size(fn, width, height)
    check_choice(fn, "rasterize_mode", rasterize_mode, RASTERIZE_MODES)
    check_choice(fn, "render_mode", render_mode, RENDER_MODES)
    if not (0 < near_plane < far_plane):
        raise ValueError(
            f"{fn}: need 0 < near_plane < far_plane, got near_plane={near_plane}, "
            f"far_plane={far_plane}"
        )
    if eps2d < 0:
        raise ValueError(f"{fn}: `eps2d` must be >= 0, got {eps2d}")
    resolved = resolve_backend(fn, backend, means.device)
    if resolved == "gsplat" and means.dtype.itemsize != 4:
        raise ValueError(f"{fn}: backend 'gsplat' needs float32 tensors, got {means.dtype}")
    if finite:
        named = [("means", means), ("quats", quats), ("scales", scales),
                 ("opacities", opacities), ("colors", colors), ("viewmats", viewmats), ("Ks", Ks)]
        if backgrounds is not None:
            named.append(("backgrounds", backgrounds))
        check_finite(fn, named)
    return resolved


def project(
    means: Tensor,  # [N, 3]
    quats: Tensor,  # [N, 4]
    scales: Tensor,  # [N, 3]
    opacities: Tensor,  # [N]
    colors: Tensor,  # [N, D] or SH [N, K, 3]
    viewmats: Tensor,  # [C, 4, 4]
    Ks: Tensor,  # [C, 3, 3]
    width: int,
    height: int,
    *,
    backend: str,
    sh_degree: Optional[int] = None,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    eps2d: float = 0.3,
    packed: bool = True,
    rasterize_mode: str = "classic",
) -> Tuple[Pairs, Optional[Dict[str, Tensor]]]:
    """Stage (a): visible pairs (and, with packed=False, the dense [C, N] projection).
    `backend` must be resolved ('torch' or 'gsplat'); inputs are assumed checked."""
    return _BACKENDS[backend].project(
        means, quats, scales, opacities, colors, viewmats, Ks, width, height,
        sh_degree=sh_degree, near_plane=near_plane, far_plane=far_plane, eps2d=eps2d,
        antialiased=rasterize_mode == "antialiased", packed=packed,
    )


def rasterize_pairs(
    pairs: Pairs,
    n_cameras: int,
    width: int,
    height: int,
    *,
    backend: str,
    backgrounds: Optional[Tensor] = None,  # [C, D]
    render_mode: str = "RGB",
    tile_size: Optional[int] = None,
    absgrad_sink: Optional[Tensor] = None,  # [M, 2] (absgrad.py)
) -> Tuple[Tensor, Tensor]:
    """Stage (b): pairs whose camera_ids index C = n_cameras cameras -> images
    (colors [C, H, W, D'], alphas [C, H, W, 1]). The pairs may come from any process.
    `absgrad_sink`'s gradient becomes each pair's absolute 2D-mean gradient."""
    if render_mode in ("RGB+D", "RGB+ED"):
        pairs = pairs.with_colors(cat_depth(pairs.colors, pairs.depths))
        if backgrounds is not None:
            backgrounds = cat_depth(backgrounds, backgrounds.new_zeros(n_cameras))
    elif render_mode in ("D", "ED"):
        pairs = pairs.with_colors(pairs.depths[:, None])
        if backgrounds is not None:
            backgrounds = backgrounds.new_zeros(n_cameras, 1)
    module = _BACKENDS[backend]
    colors, alphas = module.rasterize_pairs(
        pairs, n_cameras, width, height, backgrounds, tile_size or module.TILE_SIZE,
        absgrad_sink=absgrad_sink,
    )
    if render_mode in ("ED", "RGB+ED"):
        # Expected depth: the alpha-weighted depth normalized by the accumulated alpha.
        colors = cat_depth(colors[..., :-1], colors[..., -1] / alphas[..., 0].clamp_min(1e-10))
    return colors, alphas


def cat_depth(x: Tensor, depth: Tensor) -> Tensor:
    """x [..., D], depth [...] -> [..., D + 1]."""
    return torch.cat([x, depth[..., None]], dim=-1)


def make_meta(
    pairs: Pairs, dense: Optional[Dict[str, Tensor]], width: int, height: int, n_cameras: int
) -> Dict[str, Any]:
    """What densification strategies read (gsplat's `info`): means2d whose .grad is kept
    after backward, radii, and the packed ids."""
    means2d = pairs.means2d if dense is None else dense["means2d"]
    if means2d.requires_grad:
        means2d.retain_grad()
    meta: Dict[str, Any] = {
        "camera_ids": pairs.camera_ids,
        "gaussian_ids": pairs.gaussian_ids,
        "radii": pairs.radii if dense is None else dense["radii"],
        "means2d": means2d,
        "depths": pairs.depths if dense is None else dense["depths"],
        "conics": pairs.conics if dense is None else dense["conics"],
        "opacities": pairs.opacities,
        "width": width,
        "height": height,
        "n_cameras": n_cameras,
        "packed": dense is None,
    }
    return meta


def rasterize(
    means: Tensor,  # [N, 3]
    quats: Tensor,  # [N, 4] (w, x, y, z), need not be normalized
    scales: Tensor,  # [N, 3] activated (positive)
    opacities: Tensor,  # [N] activated, in [0, 1]
    colors: Tensor,  # [N, D], or SH coefficients [N, K, 3] with sh_degree set
    viewmats: Tensor,  # [C, 4, 4] world-to-camera, OpenCV axes
    Ks: Tensor,  # [C, 3, 3] pinhole intrinsics
    width: int,
    height: int,
    *,
    sh_degree: Optional[int] = None,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    eps2d: float = 0.3,
    packed: bool = True,
    backgrounds: Optional[Tensor] = None,  # [C, D]
    rasterize_mode: str = "classic",
    render_mode: str = "RGB",
    backend: str = "auto",
    tile_size: Optional[int] = None,
    check_finite: bool = True,
    absgrad: bool = False,
) -> Tuple[Tensor, Tensor, Dict[str, Any]]:
    """Render N Gaussians into C cameras in this process, with the semantics of
    `gsplat.rasterization`.

    Returns render_colors [C, H, W, D'] (D' = D, 1 or D + 1 by render_mode), render_alphas
    [C, H, W, 1] and meta (means2d with .grad after backward, radii, gaussian_ids,
    camera_ids, width, height, n_cameras). backend 'auto' uses gsplat's CUDA kernels for
    CUDA tensors and the pure-PyTorch reference otherwise. `check_finite` costs one host
    sync to reject NaN/Inf parameters with a clear error. `tile_size` only changes speed
    (None: 8 for torch, whose cost is tiles x pixels, 16 for gsplat's kernels). `absgrad`
    (as gsplat's) also sets meta["means2d"].absgrad during backward (absgrad.py).
    """
    resolved = check_inputs(
        "rasterize", means, quats, scales, opacities, colors, viewmats, Ks, width, height,
        sh_degree=sh_degree, near_plane=near_plane, far_plane=far_plane, eps2d=eps2d,
        backgrounds=backgrounds, rasterize_mode=rasterize_mode, render_mode=render_mode,
        backend=backend, finite=check_finite,
    )
    C = viewmats.shape[0]
    pairs, dense = project(
        means, quats, scales, opacities, colors, viewmats, Ks, width, height,
        backend=resolved, sh_degree=sh_degree, near_plane=near_plane, far_plane=far_plane,
        eps2d=eps2d, packed=packed, rasterize_mode=rasterize_mode,
    )
    meta = make_meta(pairs, dense, width, height, C)
    sink = attach_sink(pairs, dense, meta["means2d"]) if absgrad and meta["means2d"].requires_grad else None
    render_colors, render_alphas = rasterize_pairs(
        pairs, C, width, height, backend=resolved, backgrounds=backgrounds,
        render_mode=render_mode, tile_size=tile_size, absgrad_sink=sink,
    )
    return render_colors, render_alphas, meta
