"""Backend `torch`: the pure-PyTorch reference renderer (CPU or any device, autograd).

It follows the semantics of gsplat 1.5.3's CUDA kernels (EWA projection with eps2d blur,
opacity-aware bounding boxes, alpha = min(0.999, o * exp(-sigma)), pairs under 1/255
skipped, front-to-back compositing that stops before transmittance falls to 1e-4, pixel
centres at +0.5), so that CPU runs and tests check the same maths the GPU runs.

Rasterization is tile-binned: each visible pair is only evaluated on the pixels of the
tiles its bounding box touches, so cost grows with Gaussian-pixel overlaps, not N x pixels.
Tiles are grouped by how many pairs they hold and each group is padded into a dense
[T, L, P] block (T tiles, L pairs per tile in depth order, P pixels per tile) where the
compositing is a cumprod along L and a bmm; gradients come from autograd.

Memory: autograd keeps ~51 bytes per element of a [T, L, P] block until backward (dx, dy,
sigma, alpha, the transmittances, masks), ~82 at a block's backward. A rasterize_pairs call
whose blocks would hold more than WORKING_BYTES in all runs each *unit* (a block, or one
depth chunk of it) under activation checkpointing: the forward keeps only the unit's inputs
(its [T, L] pair ids, views of the pair tensors), and backward recomputes one unit at a time,
so the compositing's working memory stays under WORKING_BYTES whatever N and the image size
(issue 34; ~1/3 more compute for the recomputed forward). Images are those of the plain
path bit for bit, gradients up to the order of their sums (a unit gathers its own pairs; the
plain path gathers a block once, the order that keeps W = 1 and W = 2 training alike).
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .absgrad import PixelTap
from .pairs import Pairs

ALPHA_THRESHOLD = 1.0 / 255.0  # gsplat's ALPHA_THRESHOLD
ALPHA_MAX = 0.999
TRANSMITTANCE_MIN = 1e-4
EXTEND_MAX = 3.33  # sigma extent of the bounding box, as gsplat
# Elements of one [T, L, P] compositing block (fewer when WORKING_BYTES asks for it).
BLOCK_ELEMENTS = 1 << 22
# Working memory per element of a block through its forward and backward: 82 bytes measured
# (tests/unit/test_render.py), with room for the unit's gathered pairs.
BYTES_PER_ELEMENT = 88
# What the compositing of one rasterize_pairs call may hold at once with autograd on (the
# module docstring): the renderer's per-step working memory that the memory guard counts.
WORKING_BYTES = 256 << 20
# Smaller tiles than gsplat's 16: a pair costs (tiles it touches) x (pixels per tile) here,
# and 8x8 tiles cut that ~3x for the few-pixel Gaussians of real scenes. Images do not
# depend on the tile size: a pair's box covers every pixel where its alpha >= 1/255.
TILE_SIZE = 8
# Pairs per tile composited at once; longer depth lists go in chunks so that tiles whose
# pixels have all stopped (transmittance <= 1e-4) are dropped from the rest of the list.
DEPTH_CHUNK = 64


# ----------------------------------------------------------------------------- projection


def quat_scale_to_covar(quats: Tensor, scales: Tensor) -> Tensor:
    """quats [N, 4] (w, x, y, z, unnormalized), scales [N, 3] -> covariances [N, 3, 3]."""
    w, x, y, z = F.normalize(quats, dim=-1).unbind(-1)
    R = torch.stack(
        [
            1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
            2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
            2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
        ],
        dim=-1,
    ).reshape(-1, 3, 3)
    M = R * scales[:, None, :]  # [N, 3, 3]
    return M @ M.transpose(-1, -2)


def eval_sh_colors(
    sh_degree: int,
    means: Tensor,  # [N, 3]
    shs: Tensor,  # [N, K, 3]
    viewmats: Tensor,  # [C, 4, 4]
    camera_ids: Tensor,  # [M]
    gaussian_ids: Tensor,  # [M]
) -> Tensor:
    """View-dependent colour of each pair: SH at the camera->Gaussian direction, +0.5,
    clamped at 0 (gsplat's convention). Returns [M, 3]."""
    from ..gsplat_compat import spherical_harmonics_torch  # gsplat's torch SH; nothing compiled

    campos = torch.linalg.inv(viewmats)[:, :3, 3]  # [C, 3]
    dirs = means[gaussian_ids] - campos[camera_ids]  # [M, 3]
    colors = spherical_harmonics_torch(sh_degree, dirs, shs[gaussian_ids])
    return torch.clamp_min(colors + 0.5, 0.0)


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
    """Stage (a): Gaussians x cameras -> visible pairs. With packed=False also returns the
    dense [C, N, ...] projection (radii 0 where invisible), as gsplat's unpacked mode."""
    C, N = viewmats.shape[0], means.shape[0]
    R = viewmats[:, :3, :3]  # [C, 3, 3]
    t = viewmats[:, :3, 3]  # [C, 3]
    with torch.no_grad():
        z = means @ R[:, 2, :].T + t[:, 2]  # [N, C]
        cid, gid = ((z >= near_plane) & (z <= far_plane)).T.nonzero(as_tuple=True)

    # Full projection only for pairs in front of the camera.
    Rc = R[cid]  # [M0, 3, 3]
    mean_c = (Rc @ means[gid][:, :, None])[:, :, 0] + t[cid]  # [M0, 3]
    covar_c = Rc @ quat_scale_to_covar(quats, scales)[gid] @ Rc.transpose(-1, -2)
    K = Ks[cid]
    fx, fy, cx, cy = K[:, 0, 0], K[:, 1, 1], K[:, 0, 2], K[:, 1, 2]
    mx, my, mz = mean_c.unbind(-1)
    rz = 1.0 / mz
    # The Jacobian is taken at a point clamped to 1.3x the field of view (gsplat, 3DGS).
    lim_x_pos = (width - cx) / fx + 0.3 * (0.5 * width / fx)
    lim_x_neg = cx / fx + 0.3 * (0.5 * width / fx)
    lim_y_pos = (height - cy) / fy + 0.3 * (0.5 * height / fy)
    lim_y_neg = cy / fy + 0.3 * (0.5 * height / fy)
    tx = mz * torch.minimum(lim_x_pos, torch.maximum(-lim_x_neg, mx * rz))
    ty = mz * torch.minimum(lim_y_pos, torch.maximum(-lim_y_neg, my * rz))
    zero = torch.zeros_like(mz)
    J = torch.stack(
        [fx * rz, zero, -fx * tx * rz * rz, zero, fy * rz, -fy * ty * rz * rz], dim=-1
    ).reshape(-1, 2, 3)
    cov2d = J @ covar_c @ J.transpose(-1, -2)  # [M0, 2, 2]
    a, b, c = cov2d[:, 0, 0], 0.5 * (cov2d[:, 0, 1] + cov2d[:, 1, 0]), cov2d[:, 1, 1]
    det_orig = a * c - b * b
    a, c = a + eps2d, c + eps2d
    det = a * c - b * b
    det_safe = det.clamp_min(1e-10)  # invalid pairs are dropped; keep their grads finite
    conics = torch.stack([c / det_safe, -b / det_safe, a / det_safe], dim=-1)  # [M0, 3]
    means2d = torch.stack([fx * mx * rz + cx, fy * my * rz + cy], dim=-1)  # [M0, 2]
    opac = opacities[gid]
    if antialiased:
        opac = opac * torch.sqrt(torch.clamp_min(det_orig / det_safe, 0.0))

    with torch.no_grad():
        # Opacity-aware box: where o * exp(-sigma) >= 1/255 (gsplat 1.5.3, 2402.00525 B.2).
        o = opac.detach()
        visible = (det > 0) & (o >= ALPHA_THRESHOLD)
        extend = torch.sqrt(2.0 * torch.log(o.clamp_min(ALPHA_THRESHOLD) / ALPHA_THRESHOLD))
        extend = extend.clamp_max(EXTEND_MAX)
        radii = torch.stack(
            [torch.ceil(extend * a.detach().sqrt()), torch.ceil(extend * c.detach().sqrt())], -1
        )  # [M0, 2]
        visible &= (radii > radius_clip).any(-1)
        m2 = means2d.detach()
        visible &= (m2 + radii > 0).all(-1)
        visible &= (m2[:, 0] - radii[:, 0] < width) & (m2[:, 1] - radii[:, 1] < height)
        keep = visible.nonzero()[:, 0]
        radii = radii.to(torch.int32)

    cid, gid = cid[keep], gid[keep]
    dense: Optional[Dict[str, Tensor]] = None
    means2d, depths, conics = means2d[keep], mz[keep], conics[keep]
    if not packed:
        # gsplat's unpacked layout; the pairs are read back out of it so that gradients
        # (densification reads means2d.grad) land in the dense tensor.
        dense = {
            "radii": means.new_zeros((C, N, 2), dtype=torch.int32).index_put((cid, gid), radii[keep]),
            "means2d": means.new_zeros((C, N, 2)).index_put((cid, gid), means2d),
            "depths": means.new_zeros((C, N)).index_put((cid, gid), depths),
            "conics": means.new_zeros((C, N, 3)).index_put((cid, gid), conics),
        }
        means2d, depths, conics = (dense[k][cid, gid] for k in ("means2d", "depths", "conics"))
    if sh_degree is None:
        pair_colors = colors[gid]
    else:
        pair_colors = eval_sh_colors(sh_degree, means, colors, viewmats, cid, gid)
    pairs = Pairs(
        camera_ids=cid,
        gaussian_ids=gid,
        radii=radii[keep],
        means2d=means2d,
        depths=depths,
        conics=conics,
        opacities=opac[keep],
        colors=pair_colors,
    )
    return pairs, dense


# -------------------------------------------------------------------------- rasterization


def _tile_intersections(
    pairs: Pairs, n_cameras: int, tile_size: int, tiles_x: int, tiles_y: int
) -> Tuple[Tensor, Tensor]:
    """Every (pair, tile) overlap, sorted by (camera, tile, depth) as gsplat sorts its
    intersection keys. Returns tile ids [E] (global over cameras) and pair ids [E]."""
    device = pairs.means2d.device
    m2 = pairs.means2d.detach().float() / tile_size  # [M, 2] in tile units
    r = pairs.radii.float() / tile_size
    lo, hi = torch.floor(m2 - r), torch.ceil(m2 + r)
    limit = torch.tensor([tiles_x, tiles_y], device=device, dtype=torch.float32)
    lo = torch.minimum(lo.clamp_min(0), limit).long()  # [M, 2] inclusive
    hi = torch.minimum(hi.clamp_min(0), limit).long()  # [M, 2] exclusive
    span = hi - lo  # [M, 2]
    n_tiles = span[:, 0] * span[:, 1] * (pairs.radii > 0).all(-1)  # [M]

    pair_ids = torch.repeat_interleave(torch.arange(len(pairs), device=device), n_tiles)  # [E]
    first = torch.cumsum(n_tiles, 0) - n_tiles
    k = torch.arange(pair_ids.shape[0], device=device) - first[pair_ids]
    row = span[pair_ids, 0]
    tx = lo[pair_ids, 0] + k % row
    ty = lo[pair_ids, 1] + k // row
    tile_ids = (pairs.camera_ids[pair_ids] * tiles_y + ty) * tiles_x + tx  # [E]
    # Same key as gsplat: tile in the high bits, the float32 depth's bit pattern below.
    depths = pairs.depths.detach()
    depth_bits = depths.float().view(torch.int32).long() & 0xFFFFFFFF
    if depths.dtype == torch.float64:
        # Equal float32 depths (about one pair of overlapping Gaussians a run on a small scene)
        # in the depth order of their float64 ones: a stable sort by the float64 depth first.
        # Left to the pair order, the tie is broken by the Gaussians' global order, which after
        # densification depends on W (each rank appends its newborns), and W ranks would no
        # longer train like one process (docs/determinism.md). Float32 depths: gsplat's order.
        by_depth = torch.sort(depths[pair_ids], stable=True).indices  # [E]
        tile_ids, pair_ids = tile_ids[by_depth], pair_ids[by_depth]
    order = torch.sort((tile_ids << 32) | depth_bits[pair_ids], stable=True).indices
    return tile_ids[order], pair_ids[order]


def unit_elements() -> int:
    """Most elements of one block: BLOCK_ELEMENTS, or fewer so that a unit fits WORKING_BYTES."""
    return max(1, min(BLOCK_ELEMENTS, WORKING_BYTES // BYTES_PER_ELEMENT))


def _tile_groups(counts: List[int], pixels: int, max_elements: int) -> List[Tuple[int, int, int]]:
    """Split tiles (sorted by decreasing pair count) into (begin, end, L) groups padded to
    L pairs each, keeping padding under ~1/3 and each block's T x L x pixels under
    max_elements (a block of one tile may pass it: _composite_block then works through it in
    depth chunks of DEPTH_CHUNK x pixels elements)."""
    groups, begin = [], 0
    while begin < len(counts):
        L = counts[begin]
        end = begin + 1
        while (
            end < len(counts)
            and 3 * counts[end] >= 2 * L
            and (end + 1 - begin) * L * pixels <= max_elements
        ):
            end += 1
        groups.append((begin, end, L))
        begin = end
    return groups


def _composite_chunk(
    px: Tensor,  # [T, 1, P] pixel centre x
    py: Tensor,  # [T, 1, P] pixel centre y
    means2d: Tensor,  # [T, L, 2]
    conics: Tensor,  # [T, L, 3]
    opacities: Tensor,  # [T, L]
    colors: Tensor,  # [T, L, D]
    trans_in: Optional[Tensor] = None,  # [T, P] transmittance before these pairs (None: 1)
    sink: Optional[Tensor] = None,  # [T, L, 2] absgrad sink (absgrad.py)
) -> Tuple[Tensor, Tensor, Tensor]:
    """Front-to-back compositing of T tiles through L depth-sorted pairs. Returns colors
    [T, P, D], alphas [T, P] and the transmittance after them [T, P] (0 where a pixel
    stopped: it takes no further pair)."""
    if sink is None:
        dx = px - means2d[..., 0:1]  # [T, L, P]
        dy = py - means2d[..., 1:2]
    else:  # the per-pixel means2d gradients, summed in absolute value into the sink's
        m = PixelTap.apply(means2d, sink, px.shape[-1])  # [T, L, 2, P]
        dx, dy = px - m[..., 0, :], py - m[..., 1, :]
    ca, cb, cc = conics[..., 0:1], conics[..., 1:2], conics[..., 2:3]
    sigma = 0.5 * (ca * dx * dx + cc * dy * dy) + cb * dx * dy
    alpha = torch.clamp_max(opacities[..., None] * torch.exp(-sigma), ALPHA_MAX)
    with torch.no_grad():
        used = (sigma >= 0) & (alpha >= ALPHA_THRESHOLD)
    alpha = alpha * used
    trans = torch.cumprod(1.0 - alpha, dim=1)  # transmittance after each pair
    first = torch.ones_like(trans[:, :1]) if trans_in is None else trans_in[:, None, :]
    if trans_in is not None:
        trans = trans * first
    with torch.no_grad():
        # Monotone in L, so this keeps a prefix: gsplat stops at the first pair that
        # would bring transmittance to <= 1e-4, without adding it.
        alive = trans > TRANSMITTANCE_MIN
    trans_before = torch.cat([first, trans[:, :-1]], dim=1)
    weights = alpha * trans_before * alive  # [T, L, P]
    trans_out = trans[:, -1] * alive[:, -1]
    return torch.bmm(weights.transpose(1, 2), colors), weights.sum(dim=1), trans_out


def _composite_pairs(
    px: Tensor,  # [T, 1, P]
    py: Tensor,  # [T, 1, P]
    idx: Tensor,  # [T, L] rows of the padded pair tensors
    trans_in: Optional[Tensor],  # [T, P] or None
    means2d: Tensor,  # [M + 1, 2]
    conics: Tensor,  # [M + 1, 3]
    opacities: Tensor,  # [M + 1]
    colors: Tensor,  # [M + 1, D]
    sink: Optional[Tensor],  # [M + 1, 2] or None
) -> Tuple[Tensor, Tensor, Tensor]:
    """One unit: _composite_chunk of the pairs idx. The gathers are inside, so a recomputed
    unit keeps only idx and views of the pair tensors between forward and backward."""
    return _composite_chunk(px, py, means2d[idx], conics[idx], opacities[idx], colors[idx], trans_in,
                            None if sink is None else sink[idx])


def _recomputed_pairs(*args) -> Tuple[Tensor, Tensor, Tensor]:
    """_composite_pairs whose intermediates backward recomputes instead of keeping."""
    return checkpoint(_composite_pairs, *args, use_reentrant=False, preserve_rng_state=False)


def _composite_block(
    px: Tensor,  # [T, 1, P]
    py: Tensor,  # [T, 1, P]
    idx: Tensor,  # [T, L]
    pad: Tuple[Optional[Tensor], ...],  # means2d, conics, opacities, colors, sink: [M + 1, ...]
    recompute: bool,
) -> Tuple[Tensor, Tensor]:
    """The pairs idx [T, L] composited over L in DEPTH_CHUNK steps, dropping the tiles whose
    pixels have all stopped: behind opaque surfaces most of a long depth list is never
    evaluated (gsplat's kernel stops per pixel the same way). Each step is one unit, with
    `recompute` checkpointed. Returns colors [T, P, D], alphas [T, P]."""
    T, L = idx.shape

    def take(t: Tensor, rows: Optional[Tensor], cols: Optional[slice]) -> Tensor:
        return t if rows is None else t[rows, cols]  # the block, or its live tiles' depth slice

    if recompute:  # each unit gathers its own pairs: backward recomputes it from its ids alone
        def run(px_, py_, rows, cols, trans_in):
            return _recomputed_pairs(px_, py_, take(idx, rows, cols), trans_in, *pad)
    else:
        # The plain path gathers the block's pairs once, as it always has: each pair's gradient
        # is then summed in one scatter per block, in the same order at any world size (a
        # gather per depth chunk sums it in another order, and W = 1 and W = 2 drift apart).
        block = [None if p is None else p[idx] for p in pad]  # [T, L, ...] each

        def run(px_, py_, rows, cols, trans_in):
            g = [None if t is None else take(t, rows, cols) for t in block]
            return _composite_chunk(px_, py_, *g[:4], trans_in, g[4])
    if L <= DEPTH_CHUNK:
        c, a, _ = run(px, py, None, None, None)
        return c, a
    colors = pad[3]
    out = colors.new_zeros(T, px.shape[-1], colors.shape[-1])
    acc = colors.new_zeros(T, px.shape[-1])
    trans = colors.new_ones(T, px.shape[-1])
    live = torch.arange(T, device=idx.device)  # tiles with a pixel still open
    for lo in range(0, L, DEPTH_CHUNK):
        c, a, t = run(px[live], py[live], live, slice(lo, lo + DEPTH_CHUNK), trans[live])
        out, acc = out.index_add(0, live, c), acc.index_add(0, live, a)
        trans = trans.index_copy(0, live, t)
        with torch.no_grad():
            live = live[(t > 0).any(dim=1)]
        if len(live) == 0:
            break
    return out, acc


def _past_budget(groups: List[Tuple[int, int, int]], pixels: int, pad: Tuple[Optional[Tensor], ...]) -> bool:
    """Whether autograd would keep more than WORKING_BYTES of this call's blocks: then each
    unit is recomputed in backward (an upper bound: early-stopped tiles hold less)."""
    if not (torch.is_grad_enabled() and any(p is not None and p.requires_grad for p in pad)):
        return False
    elements = sum((end - begin) * L for begin, end, L in groups) * pixels
    return elements * BYTES_PER_ELEMENT > WORKING_BYTES


def rasterize_pairs(
    pairs: Pairs,
    n_cameras: int,
    width: int,
    height: int,
    backgrounds: Optional[Tensor] = None,  # [C, D]
    tile_size: int = 16,
    absgrad_sink: Optional[Tensor] = None,  # [M, 2] (absgrad.py)
) -> Tuple[Tensor, Tensor]:
    """Stage (b): packed pairs of C cameras -> colors [C, H, W, D], alphas [C, H, W, 1].
    With `absgrad_sink`, its gradient is each pair's absolute 2D-mean gradient."""
    C, D = n_cameras, pairs.colors.shape[-1]
    ref = pairs.means2d
    tiles_x, tiles_y = math.ceil(width / tile_size), math.ceil(height / tile_size)
    P = tile_size * tile_size
    n_tiles_all = C * tiles_y * tiles_x

    tile_ids, pair_ids = _tile_intersections(pairs, C, tile_size, tiles_x, tiles_y)
    counts = torch.bincount(tile_ids, minlength=n_tiles_all)  # [C * TY * TX]
    tiles = torch.argsort(counts, descending=True, stable=True)
    tiles = tiles[: int((counts > 0).sum())]  # non-empty tiles, fullest first
    starts = (torch.cumsum(counts, 0) - counts)[tiles]
    tile_counts = counts[tiles]

    # Padding slot M: a pair with zero opacity that contributes nothing.
    M = len(pairs)
    means2d = torch.cat([pairs.means2d, ref.new_zeros(1, 2)])
    conics = torch.cat([pairs.conics, ref.new_zeros(1, 3)])
    opacities = torch.cat([pairs.opacities, ref.new_zeros(1)])
    colors = torch.cat([pairs.colors, ref.new_zeros(1, D)])
    sink = None if absgrad_sink is None else torch.cat([absgrad_sink, ref.new_zeros(1, 2)])
    local = torch.arange(P, device=ref.device)
    pix_x = (local % tile_size).to(ref.dtype) + 0.5  # [P]
    pix_y = (local // tile_size).to(ref.dtype) + 0.5

    pad = (means2d, conics, opacities, colors, sink)
    groups = _tile_groups(tile_counts.tolist(), P, unit_elements())
    recompute = _past_budget(groups, P, pad)
    out_colors, out_alphas = [], []
    for begin, end, L in groups:
        t = tiles[begin:end]  # [T]
        slot = torch.arange(L, device=ref.device)
        idx = starts[begin:end, None] + slot  # [T, L] position in the sorted list
        valid = slot < tile_counts[begin:end, None]
        idx = torch.where(valid, pair_ids[idx.clamp_max(max(len(pair_ids) - 1, 0))], M)
        tx = (t % tiles_x).to(ref.dtype) * tile_size
        ty = ((t // tiles_x) % tiles_y).to(ref.dtype) * tile_size
        c, a = _composite_block(
            (tx[:, None] + pix_x)[:, None, :], (ty[:, None] + pix_y)[:, None, :], idx, pad, recompute,
        )
        out_colors.append(c)
        out_alphas.append(a)

    if not out_colors:
        # Nothing visible: still return tensors in the autograd graph of the pairs, so a
        # loss on them can backward (and the distributed exchange's backward is reached).
        out_colors = [pairs.colors[:0, None, :].expand(0, P, D)]
        out_alphas = [pairs.opacities[:0, None].expand(0, P)]
    render = ref.new_zeros(n_tiles_all, P, D).index_copy(0, tiles, torch.cat(out_colors))
    alpha = ref.new_zeros(n_tiles_all, P).index_copy(0, tiles, torch.cat(out_alphas))

    def to_image(x: Tensor) -> Tensor:  # [C*TY*TX, P, D] -> [C, H, W, D]
        d = x.shape[-1]  # explicit: C may be 0 (a rank that owns no camera this step)
        x = x.reshape(C, tiles_y, tiles_x, tile_size, tile_size, d).permute(0, 1, 3, 2, 4, 5)
        return x.reshape(C, tiles_y * tile_size, tiles_x * tile_size, d)[:, :height, :width]

    render, alpha = to_image(render), to_image(alpha[..., None])
    if backgrounds is not None:
        render = render + backgrounds[:, None, None, :] * (1.0 - alpha)
    return render, alpha
