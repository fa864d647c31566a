"""Backend `gsplat`: gsplat 1.5.3's CUDA kernels behind the same two stages as the torch
backend. gsplat's ops are imported inside the functions, so `import distsplat` neither
needs CUDA nor triggers gsplat's JIT build; the first call on CUDA tensors loads them
(a prebuilt extension from $DISTSPLAT_GSPLAT_EXT, else gsplat's JIT: gsplat_ext.py)."""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from .absgrad import KernelBridge
from .gather import gather_rows
from .pairs import Pairs

TILE_SIZE = 16
CHANNEL_CHUNK = 32  # gsplat's kernels are instantiated for a fixed set of channel counts


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
    sh_degree: Optional[int],
    near_plane: float,
    far_plane: float,
    eps2d: float,
    antialiased: bool,
    packed: bool,
    radius_clip: float = 0.0,
) -> Tuple[Pairs, Optional[Dict[str, Tensor]]]:
    C, N = viewmats.shape[0], means.shape[0]
    D = colors.shape[-1]  # SH: 3
    if N == 0 or C == 0:  # gsplat's projection kernels die on these (SIGFPE), not raise
        return _no_pairs(means, quats, scales, opacities, colors, C, N, D, packed)
    ensure_gsplat_ops()
    from gsplat import fully_fused_projection, spherical_harmonics

    out = fully_fused_projection(
        means, None, quats, scales, viewmats, Ks, width, height,
        eps2d=eps2d, near_plane=near_plane, far_plane=far_plane, radius_clip=radius_clip,
        packed=packed, calc_compensations=antialiased, opacities=opacities,
    )
    dense: Optional[Dict[str, Tensor]] = None
    if packed:
        _, cid, gid, radii, means2d, depths, conics, comps = out
    else:
        radii_d, means2d_d, depths_d, conics_d, comps = out  # [C, N, ...]
        dense = {"radii": radii_d, "means2d": means2d_d, "depths": depths_d, "conics": conics_d}
        cid, gid = (radii_d > 0).all(-1).nonzero(as_tuple=True)
        flat = cid * N + gid  # [M] rows of the [C * N, ...] views
        radii, means2d, depths, conics = (
            gather_rows(radii_d.reshape(C * N, 2), flat), gather_rows(means2d_d.reshape(C * N, 2), flat),
            gather_rows(depths_d.reshape(C * N), flat), gather_rows(conics_d.reshape(C * N, 3), flat),
        )
        if comps is not None:
            comps = gather_rows(comps.reshape(C * N), flat)
    cid, gid = cid.long(), gid.long()
    # Per-pair gathers whose backward is an index_add_, not a sorting index_put_ (gather.py)
    opac = gather_rows(opacities, gid)
    if comps is not None:
        opac = opac * comps
    if sh_degree is None:
        pair_colors = gather_rows(colors, gid)
    elif len(gid) == 0:  # nothing visible (a host-known shape): no SH kernel on zero pairs
        pair_colors = colors.new_zeros(0, D) + colors.sum() * 0
    else:
        campos = camera_centers(viewmats)  # [C, 3]
        dirs = gather_rows(means, gid) - gather_rows(campos, cid)  # [M, 3]
        pair_colors = torch.clamp_min(spherical_harmonics(sh_degree, dirs, gather_rows(colors, gid)) + 0.5, 0.0)
    pairs = Pairs(
        camera_ids=cid, gaussian_ids=gid, radii=radii, means2d=means2d,
        depths=depths, conics=conics, opacities=opac, colors=pair_colors,
    )
    return pairs, dense


def _no_pairs(means: Tensor, quats: Tensor, scales: Tensor, opacities: Tensor, colors: Tensor,
              C: int, N: int, D: int, packed: bool) -> Tuple[Pairs, Optional[Dict[str, Tensor]]]:
    """The projection of no Gaussian or into no camera: zero pairs that are still in the
    autograd graph of every input (their gradients come back as zeros of their shapes),
    so the rest of the render and a distributed exchange run as for any other input."""
    zero = (means.sum() + quats.sum() + scales.sum() + opacities.sum() + colors.sum()) * 0
    ids = torch.zeros(0, dtype=torch.int64, device=means.device)
    dense = None
    if not packed:
        dense = {"radii": torch.zeros(C, N, 2, dtype=torch.int32, device=means.device),
                 "means2d": means.new_zeros(C, N, 2) + zero, "depths": means.new_zeros(C, N) + zero,
                 "conics": means.new_zeros(C, N, 3) + zero}
    pairs = Pairs(
        camera_ids=ids, gaussian_ids=ids, radii=torch.zeros(0, 2, dtype=torch.int32, device=means.device),
        means2d=means.new_zeros(0, 2) + zero, depths=means.new_zeros(0) + zero,
        conics=means.new_zeros(0, 3) + zero, opacities=means.new_zeros(0) + zero,
        colors=means.new_zeros(0, D) + zero,
    )
    return pairs, dense


def ensure_gsplat_ops() -> None:
    """gsplat's compiled ops, prebuilt or built once (gsplat_ext.py), before any gsplat CUDA
    call; a dict lookup after the first call. Imported here, not at the top, so that
    `python -m distsplat.render.gsplat_ext` does not find its module already imported."""
    from .gsplat_ext import ensure_gsplat_ops as ensure

    ensure()


def camera_centers(viewmats: Tensor) -> Tensor:  # [C, 4, 4] -> [C, 3]
    """World positions of rigid world-to-camera transforms [R t; 0 1]: -R^T t. Closed
    form instead of `torch.linalg.inv`, whose CUDA kernel checks for singular inputs on
    the host, a sync in every step."""
    R, t = viewmats[:, :3, :3], viewmats[:, :3, 3:]  # [C, 3, 3], [C, 3, 1]
    return -(R.transpose(1, 2) @ t)[:, :, 0]


def rasterize_pairs(
    pairs: Pairs,
    n_cameras: int,
    width: int,
    height: int,
    backgrounds: Optional[Tensor] = None,  # [C, D]
    tile_size: int = 16,
    absgrad_sink: Optional[Tensor] = None,  # [M, 2] (absgrad.py)
) -> Tuple[Tensor, Tensor]:
    ensure_gsplat_ops()
    from gsplat import isect_offset_encode, isect_tiles, rasterize_to_pixels

    C, D = n_cameras, pairs.colors.shape[-1]
    ref = pairs.means2d
    if len(pairs) == 0:  # the kernels do not take empty inputs
        # Sums over zero pairs (= 0) keep the outputs in the autograd graph of the pairs.
        render = ref.new_zeros(C, height, width, D) + pairs.colors.sum()
        if absgrad_sink is not None:
            render = render + absgrad_sink.sum()
        if backgrounds is not None:
            render = render + backgrounds[:, None, None, :]
        return render, ref.new_zeros(C, height, width, 1) + pairs.opacities.sum()
    tiles_x, tiles_y = math.ceil(width / tile_size), math.ceil(height / tile_size)
    _, isect_ids, flatten_ids = isect_tiles(
        pairs.means2d, pairs.radii, pairs.depths, tile_size, tiles_x, tiles_y,
        packed=True, n_images=C, image_ids=pairs.camera_ids, gaussian_ids=pairs.gaussian_ids,
    )
    offsets = isect_offset_encode(isect_ids, C, tiles_x, tiles_y).reshape(C, tiles_y, tiles_x)
    renders, alphas = [], None
    for lo in range(0, D, CHANNEL_CHUNK):
        # No `backgrounds` for the kernel: gsplat 1.5.3's packed wrapper takes the image
        # dims from means2d ([nnz, 2] -> ()) and asserts backgrounds.shape == (D,), so a
        # [C, D] background would raise. Composited below, as the torch backend does.
        # absgrad: the kernel sets .absgrad on the means2d it is given; one bridge per
        # chunk hands it to the sink (more than 32 channels: the chunks' sum, an upper bound).
        means2d = pairs.means2d if absgrad_sink is None else KernelBridge.apply(pairs.means2d, absgrad_sink)
        r, alphas = rasterize_to_pixels(
            means2d, pairs.conics, pairs.colors[:, lo : lo + CHANNEL_CHUNK],
            pairs.opacities, width, height, tile_size, offsets, flatten_ids, packed=True,
            absgrad=absgrad_sink is not None,
        )
        renders.append(r)
    render = torch.cat(renders, dim=-1)  # [C, H, W, D]
    if backgrounds is not None:
        render = render + backgrounds[:, None, None, :] * (1.0 - alphas)
    return render, alphas
