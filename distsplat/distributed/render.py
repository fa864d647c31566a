"""`distributed_rasterize`: DESIGN.md's step, forward and backward, for one batch.

    project local Gaussians into ALL C batch cameras (render stage a, this rank's chunk)
      -> count pairs per destination rank (the camera's owner), on the device
      -> exchange counts (+ status, camera checksum, grad flag): 1 collective, 1 host sync
      -> one packed float payload per direction: 1 collective (backward: 1, reversed)
      -> rasterize this rank's own cameras (render stage b) from the pairs it received

Host syncs: this layer adds exactly ONE device->host sync per forward (the count
transfer) and none in backward, and no pageable host->device copy: the own-camera
indices are built on the device from the owners it already holds. The render stages have
their own; with backend gsplat and packed=True, in gsplat 1.5.3's C++ behind its
_wrapper.py: `fully_fused_projection(packed=True)` -> `_FullyFusedProjectionPacked.forward`
-> `projection_ewa_3dgs_packed_fwd` (csrc/Projection.cpp: `block_accum[-1].item<int32_t>()`,
the pair count) and `isect_tiles` -> `intersect_tile` (csrc/Intersect.cpp:
`cum_tiles_per_gauss[-1].item<int64_t>()`, the intersection count), each skipped when there
is nothing to project or intersect. CUDA's sync debug mode reports the first only (H100,
torch 2.11: tests/cuda/test_distributed_cuda.py, benchmarks/count_syncs.py).

One rank (W=1) packs no payload: its pairs are rendered as they are. At W > 1 the pairs
are packed into one payload whose rows move to their destination's block by per-camera
arithmetic (no sort) and are put in camera order on arrival by one sort of camera ids;
each direction moves every row once, forward and backward (no indexing backward, which
on CUDA sorts its indices).
(packed=False: the dense projection has none, the render layer's `nonzero` has one.)
Shared-GPU mode (staging.py) adds one sync per staged payload all-to-all, forward and
backward, at W > 1. meta["comm"]["host_syncs"] counts this layer's syncs of the forward
call (staging.host_syncs()); a `camera_owner` passed on the CPU is copied without one.

Validation happens on every rank before the first collective, but nothing is raised
until every rank has seen every rank's status in the count exchange: a bad input on one
rank becomes the same error on all ranks, never a hang in the next collective.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from ..render import Pairs, check_inputs, make_meta, project, rasterize_pairs
from ..render.absgrad import attach_sink
from ..render.gsplat_backend import camera_centers
from . import exchange as ex
from . import staging
from .context import rank as get_rank
from .context import world_size as get_world_size

logger = logging.getLogger(__name__)

FN = "distributed_rasterize"
# Integers ride in the float payload; float32 holds every integer below 2^24 exactly.
FLOAT_EXACT_INT = (1 << 24) - 1
_RENDER_DEFAULTS: Dict[str, Any] = {
    "near_plane": 0.01, "far_plane": 1e10, "eps2d": 0.3, "backgrounds": None,
    "rasterize_mode": "classic", "render_mode": "RGB", "tile_size": None, "check_finite": True,
}


def _validate(
    means: Tensor, quats: Tensor, scales: Tensor, opacities: Tensor, colors: Tensor,
    viewmats: Tensor, Ks: Tensor, width: int, height: int, camera_owner: Tensor,
    sh_degree: Optional[int], backend: str, opts: Dict[str, Any], device: torch.device,
    features: bool = False,
) -> str:
    """This rank's own checks; raises ValueError naming the argument. No host sync: the
    value checks (finite, owner range) run on the device and travel with the counts.
    features (pair_colors): `colors` are features, so the backgrounds' channels are the
    colour model's, checked against its output when it runs."""
    backgrounds = opts["backgrounds"]
    if features and backgrounds is not None:
        if not isinstance(backgrounds, Tensor) or backgrounds.dim() != 2 or backgrounds.shape[0] != viewmats.shape[0]:
            raise ValueError(f"{FN}: `backgrounds` must have shape [C, D] (D: the channels `pair_colors` "
                             f"returns), got {tuple(getattr(backgrounds, 'shape', ()))}")
        backgrounds = None
    resolved = check_inputs(
        FN, means, quats, scales, opacities, colors, viewmats, Ks, width, height,
        sh_degree=sh_degree, near_plane=opts["near_plane"], far_plane=opts["far_plane"],
        eps2d=opts["eps2d"], backgrounds=backgrounds,
        rasterize_mode=opts["rasterize_mode"], render_mode=opts["render_mode"],
        backend=backend, finite=False,
    )
    C = viewmats.shape[0]
    if not isinstance(camera_owner, Tensor):
        raise ValueError(f"{FN}: `camera_owner` must be an int64 tensor of shape [{C}], "
                         f"got {type(camera_owner).__name__}")
    if camera_owner.shape != (C,):
        raise ValueError(f"{FN}: `camera_owner` must have shape [C] = [{C}] (one owner rank "
                         f"per batch camera), got {tuple(camera_owner.shape)}")
    if camera_owner.is_floating_point() or camera_owner.is_complex() or camera_owner.dtype == torch.bool:
        raise ValueError(f"{FN}: `camera_owner` must be an integer tensor, got {camera_owner.dtype}")
    if camera_owner.device not in (means.device, torch.device("cpu")):
        raise ValueError(f"{FN}: `camera_owner` is on {camera_owner.device} but `means` is on "
                         f"{means.device}; pass it on the same device or on the CPU")
    if means.device != device:
        raise ValueError(f"{FN}: `means` is on {means.device} but the process group exchanges "
                         f"tensors on {device} (nccl: this rank's GPU, gloo: CPU, shared-GPU "
                         "mode: the shared GPU); put the Gaussians on ctx.device")
    if C > FLOAT_EXACT_INT:
        raise ValueError(f"{FN}: `viewmats` holds {C} cameras, more than one batch can carry")
    return resolved


def _local_camera_ids(owner: Tensor, W: int) -> Tensor:
    """[C] index of each camera among its owner's cameras, in batch order: the camera
    id the receiving rank sees. owner [C] must be clamped into [0, W)."""
    onehot = (owner[:, None] == torch.arange(W, device=owner.device)).long()  # [C, W]
    return (torch.cumsum(onehot, 0) - 1).gather(1, owner[:, None])[:, 0]


PAYLOAD_FIXED = 10  # payload columns besides the D colour channels (and 2 absgrad ones)
DIRS = 3  # with pair_colors: each pair's camera-to-Gaussian vector, after the fixed columns
# (features [M, F], dirs [M, 3], batch positions of the cameras [M]) -> colours [M, D]
PairColors = Callable[[Tensor, Tensor, Tensor], Tensor]


class _ScatterRows(torch.autograd.Function):
    """out[position[i]] = x[i] for a permutation `position` of x's rows; backward gathers
    each gradient row from where its row went. Both directions move every row once:
    indexing's own backward (an accumulating index_put) sorts the indices on CUDA."""

    @staticmethod
    def forward(ctx, x: Tensor, position: Tensor) -> Tensor:
        ctx.save_for_backward(position)
        return torch.empty_like(x).index_copy_(0, position, x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (position,) = ctx.saved_tensors
        return grad.index_select(0, position), None


class _GatherRows(torch.autograd.Function):
    """x[order] for a permutation `order` of x's rows; backward: index_copy_ (no sort)."""

    @staticmethod
    def forward(ctx, x: Tensor, order: Tensor) -> Tensor:
        ctx.save_for_backward(order)
        return x.index_select(0, order)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (order,) = ctx.saved_tensors
        return torch.empty_like(grad).index_copy_(0, order, grad), None


def _destinations(camera_ids: Tensor, owner: Tensor, W: int) -> Tuple[Tensor, Tensor]:
    """Pairs sorted by camera (the projection's order), owners [C] in [0, W) ->
    counts [W] int64 (pairs for each rank) and position [M] int64: where each pair goes
    when the payload is grouped by destination rank, cameras in batch order within a rank
    (the order of a stable sort by owner). Per-camera arithmetic, no sort, no atomics:
    a camera's block of pairs moves as a whole."""
    C, M = owner.shape[0], camera_ids.shape[0]
    device = camera_ids.device
    cam_start = torch.searchsorted(camera_ids, torch.arange(C + 1, device=device))  # [C + 1]
    per_cam = cam_start[1:] - cam_start[:-1]  # [C]
    onehot = (owner[:, None] == torch.arange(W, device=device)).long()  # [C, W]
    by_rank = onehot * per_cam[:, None]  # [C, W]
    counts = by_rank.sum(0)  # [W]
    # A camera's block starts after every lower rank's pairs and after the earlier
    # cameras of its own rank.
    earlier_same = (torch.cumsum(by_rank, 0) - by_rank).gather(1, owner[:, None])[:, 0]  # [C]
    new_start = (torch.cumsum(counts, 0) - counts)[owner] + earlier_same  # [C]
    position = torch.arange(M, device=device) + (new_start - cam_start[:-1])[camera_ids]  # [M]
    return counts, position


def _pack(pairs: Pairs, local_cam: Tensor, dtype: torch.dtype) -> Tensor:
    """Pairs -> one [M, F] float payload: means2d(2) depths(1) conics(3) opacities(1)
    colors(D) local camera(1) radii(2). F = PAYLOAD_FIXED + D."""
    radii = pairs.radii.clamp_max(FLOAT_EXACT_INT)  # a >16M px radius already covers any image
    return torch.cat([
        pairs.means2d.to(dtype), pairs.depths[:, None].to(dtype), pairs.conics.to(dtype),
        pairs.opacities[:, None].to(dtype), pairs.colors.to(dtype),
        local_cam[pairs.camera_ids][:, None].to(dtype), radii.to(dtype),
    ], dim=1)


def _unpack(payload: Tensor, D: int, dtype: torch.dtype, absgrad: bool = False, dirs: int = 0
            ) -> Tuple[Pairs, Optional[Tensor], Optional[Tensor]]:
    """[M, F] payload -> Pairs of the receiving rank's own cameras, sorted by camera,
    (absgrad) the senders' sinks and (dirs = 3, pair_colors) the pairs' directions, in the
    same order. The Gaussian ids are unknown here (-1): stage (b) never reads them."""
    # Arrivals are ordered (source rank, camera, Gaussian); a stable sort by camera gives
    # (camera, source rank, Gaussian) = (camera, global Gaussian id) for contiguous chunks,
    # the order of the one-process render. int32 keys: half the radix passes of int64.
    cam_col = payload[:, PAYLOAD_FIXED - 3 + D].detach()
    order = torch.argsort(cam_col.to(torch.int32), stable=True)
    rows = _GatherRows.apply(payload, order)
    parts = list(torch.split(rows, [2, 1, 3, 1, D, 1, 2] + ([dirs] if dirs else []) + ([2] if absgrad else []), 1))
    means2d, depths, conics, opac, colors, cam, radii = parts[:7]
    pair_dirs = parts.pop(7).to(dtype) if dirs else None
    pairs = Pairs(
        camera_ids=cam[:, 0].long(), gaussian_ids=torch.full_like(cam[:, 0], -1, dtype=torch.int64),
        radii=radii.to(torch.int32), means2d=means2d.to(dtype),
        depths=depths[:, 0].to(dtype), conics=conics.to(dtype),
        opacities=opac[:, 0].to(dtype), colors=colors.to(dtype),
    )
    return pairs, (parts[7].to(dtype) if absgrad else None), pair_dirs


@lru_cache(maxsize=32)
def _arg_bits(indices: Tuple[int, ...], device: torch.device) -> Tensor:
    """[A] int64 1 << index on `device`, made once per argument set (the one host->device
    copy happens at the first call, not in every step)."""
    return torch.tensor([1 << i for i in indices], dtype=torch.int64).to(device)


def _device_status(
    named: List[Tuple[str, Tensor]], owner: Tensor, W: int, check_finite: bool
) -> Tensor:
    """int64 scalar on the device: NONFINITE with a bitmask of the arguments holding
    NaN/Inf, else OWNER_RANGE, else OK. No host sync."""
    device = owner.device
    # Python scalars, not torch.tensor(..., device): that would be a host->device copy.
    status = ((owner < 0) | (owner >= W)).any().long() * ex.encode(ex.OWNER_RANGE)  # OK = 0
    if check_finite:
        # One float64 sum per argument: NaN and Inf propagate through a sum, and float32
        # values summed in float64 cannot overflow, so a sum is finite iff its tensor is.
        # (A dozen kernels; an isfinite mask per argument took four times the launches.)
        sums = torch.stack([t.detach().sum(dtype=torch.float64) for _, t in named]).to(device)  # [A]
        weights = _arg_bits(tuple(ex.FINITE_ARGS.index(name) for name, _ in named), device)  # [A]
        bits = torch.where(torch.isfinite(sums), 0, weights).sum()
        status = torch.where(bits != 0, bits + ex.encode(ex.NONFINITE), status)
    return status


def _raise_if_failed(counts: ex.Counts, W: int, check_cameras: bool,
                     local_error: Optional[BaseException]) -> None:
    """Every rank holds the same (status, checksum, grad flag) of every rank, so every
    rank raises the same error here, or none does."""
    statuses = counts.column(ex.STATUS)
    if W == 1 and local_error is not None:  # nobody else to agree with: the detailed error
        raise local_error
    if any(statuses):
        by_status: Dict[int, List[int]] = {}
        for r, s in enumerate(statuses):
            if s != ex.OK:
                by_status.setdefault(s, []).append(r)
        msg = f"{FN}: " + "; ".join(ex.describe_status(rs, s, W) for s, rs in by_status.items())
        internal = any(ex.status_kind(s) == ex.INTERNAL for s in statuses)
        raise (RuntimeError if internal else ValueError)(msg) from local_error
    if check_cameras and len(set(counts.column(ex.CHECKSUM))) > 1:
        groups: Dict[int, List[int]] = {}
        for r, h in enumerate(counts.column(ex.CHECKSUM)):
            groups.setdefault(h, []).append(r)
        raise ValueError(
            f"{FN}: the batch cameras (viewmats, Ks, camera_owner) differ across ranks; "
            f"ranks agreeing with each other: {sorted(groups.values())}. Every rank must pass "
            "the same cameras in the same order (draw them with the shared-seed CameraBatcher)"
        )
    grads = counts.column(ex.NEEDS_GRAD)
    if len(set(grads)) > 1:
        raise ValueError(
            f"{FN}: ranks disagree on whether gradients flow or on `absgrad` (per rank: "
            f"{['absgrad' if g >= 2 else 'grad' if g else 'no grad' for g in grads]}); "
            "the backward all-to-all needs every rank, so render under the same "
            "torch.no_grad()/requires_grad setting and absgrad everywhere"
        )


def distributed_rasterize(
    means: Tensor,  # [N, 3] this rank's chunk of the Gaussians
    quats: Tensor,  # [N, 4]
    scales: Tensor,  # [N, 3]
    opacities: Tensor,  # [N]
    colors: Tensor,  # [N, D] or SH [N, K, 3]
    viewmats: Tensor,  # [C, 4, 4] ALL batch cameras, identical on every rank
    Ks: Tensor,  # [C, 3, 3]
    width: int,
    height: int,
    camera_owner: Tensor,  # [C] int, the rank that renders each batch camera
    *,
    sh_degree: Optional[int] = None,
    packed: bool = True,
    backend: str = "auto",
    group: Optional[dist.ProcessGroup] = None,
    check_cameras: bool = True,
    absgrad: bool = False,
    pair_colors: Optional[PairColors] = None,
    **render_kwargs: Any,
) -> Tuple[Tensor, Tensor, Dict[str, Any]]:
    """Renders this rank's cameras from every rank's Gaussians; call it on every rank of
    `group` (default: the default group, or one process without one).

    Returns render_colors [C_own, H, W, D'], render_alphas [C_own, H, W, 1] for the
    cameras with camera_owner == rank, in batch order (C_own may be 0), and meta:
    this rank's pre-exchange pairs as `rasterize` gives them (means2d with .grad after
    backward, radii, gaussian_ids local to the chunk, camera_ids into the C batch
    cameras; dense [C, N, ...] tensors with packed=False), n_cameras = C (the whole batch:
    with a loss that averages over the global batch, gsplat's strategies rescale
    means2d.grad by n_cameras exactly as in one process), own_cameras (batch positions of
    the rendered cameras) and comm (collectives, host syncs, pairs and bytes of this call).

    render_kwargs: near_plane, far_plane, eps2d, backgrounds ([C, D], every batch
    camera's, like `rasterize`), rasterize_mode, render_mode, tile_size, check_finite.
    check_cameras (default on) folds a checksum of viewmats, Ks and camera_owner into the
    count exchange, so ranks passing different cameras get an error, not wrong images.
    absgrad (gsplat's): with gradients, meta["means2d"].absgrad is set during backward,
    each pair's absolute 2D-mean gradient from its owner's rasterizer; it rides home in
    two more payload columns of the reverse all-to-all (render/absgrad.py).

    pair_colors (a receiver-side colour model, e.g. appearance optimization): `colors` are
    then per-Gaussian features [N, F] (sh_degree None), and the rank that renders a pair
    computes its colour as pair_colors(features [M, F], dirs [M, 3], cameras [M]) -> [M, D]:
    the pair's Gaussian features, the vector from its camera's centre to the Gaussian
    (unnormalised, as gsplat's SH directions), and the batch position of its camera. Gradients
    flow back to the features and, through dirs, to the means. The payload carries the F
    features and dirs instead of colours; no extra collective.

    Every rank must call backward on a loss built from its returned renders (also a rank
    with C_own = 0: `render_colors.sum()` is then 0 but still reaches the exchange),
    because the backward all-to-all needs every rank; scale each rank's loss by the global
    batch (e.g. sum over own cameras / C), since the ranks' gradients add up.
    """
    W, me = get_world_size(group), get_rank(group)
    syncs_before = staging.host_syncs()
    opts = dict(_RENDER_DEFAULTS)
    opts.update(render_kwargs)
    # One rank: its pairs are its own cameras' pairs already; no payload is packed, moved
    # or unpacked (stage b reads the projection's pairs as they are).
    direct = W == 1
    local = _prepare(means, quats, scales, opacities, colors, viewmats, Ks, width, height,
                     camera_owner, sh_degree, packed, backend, check_cameras, opts,
                     sorted(set(render_kwargs) - set(_RENDER_DEFAULTS)), group, absgrad,
                     pack=not direct, pair_colors=pair_colors)
    # The grad column also says whether the payload carries absgrad columns (bit 1).
    grad_flag = int(local.needs_grad) + 2 * int(local.needs_grad and absgrad)
    send = torch.stack([
        local.counts, local.status.expand(W), local.checksum.expand(W),
        torch.full_like(local.counts, grad_flag),
    ], dim=1)  # [W, 4]
    host = ex.exchange_counts(send, local.owner, group)  # the one device -> host transfer
    _raise_if_failed(host, W, check_cameras, local.error)

    send_splits, recv_splits = host.send_splits, host.recv_splits
    n_own = sum(1 for o in host.extra if o == me)
    # Batch positions of the own cameras, in order, built on the device from the owners
    # already there (a stable sort puts them first): no host->device copy, no sync.
    own_idx = torch.argsort((local.owner != me).long(), stable=True)[:n_own]  # [C_own]
    if direct:  # every camera is this rank's, in batch order: camera_ids are own ids
        pairs = local.pairs
        if pair_colors is not None:
            pairs = pairs.with_colors(_call_pair_colors(pair_colors, pairs.colors, local.dirs,
                                                        own_idx[pairs.camera_ids], opts["backgrounds"]))
        render_colors, render_alphas = _rasterize_own(pairs, local.sink, own_idx, width, height,
                                                      local.backend, opts)
    else:
        received = ex.all_to_all(local.payload, send_splits, recv_splits, group)  # [M_recv, F]
        render_colors, render_alphas = _render_own(received, own_idx, means.dtype, width, height,
                                                   local.backend, opts, grad_flag >= 2, pair_colors)

    meta = make_meta(local.pairs, local.dense, width, height, viewmats.shape[0])
    meta.update(camera_owner=local.owner, own_cameras=own_idx, rank=me, world_size=W)
    F = (PAYLOAD_FIXED + local.pairs.colors.shape[-1] + (DIRS if pair_colors is not None else 0)
         + (2 if grad_flag >= 2 else 0))
    itemsize = torch.promote_types(means.dtype, torch.float32).itemsize
    meta["comm"] = _comm_stats(send_splits, recv_splits, me, W, F, itemsize, local.needs_grad,
                               staging.host_syncs() - syncs_before, staging.staged(group))
    return render_colors, render_alphas, meta


@dataclass
class _Local:
    """This rank's side before the exchange; `error` set means `status` reports it."""

    status: Tensor  # [] int64 status code (device value checks included)
    checksum: Tensor  # [] int64
    counts: Tensor  # [W] int64 pairs for each destination rank
    owner: Tensor  # [C] int64 camera_owner on the communication device
    needs_grad: bool = False
    backend: str = "torch"
    pairs: Optional[Pairs] = None  # pre-exchange pairs, for meta
    dense: Optional[Dict[str, Tensor]] = None
    payload: Optional[Tensor] = None  # [M, F] rows grouped by destination rank (pack=True)
    sink: Optional[Tensor] = None  # [M, 2] absgrad sink of `pairs` (pack=False, absgrad)
    dirs: Optional[Tensor] = None  # [M, 3] camera centre -> Gaussian (pack=False, pair_colors)
    error: Optional[BaseException] = None


def _prepare(
    means: Tensor, quats: Tensor, scales: Tensor, opacities: Tensor, colors: Tensor,
    viewmats: Tensor, Ks: Tensor, width: int, height: int, camera_owner: Tensor,
    sh_degree: Optional[int], packed: bool, backend: str, check_cameras: bool,
    opts: Dict[str, Any], unknown: List[str], group: Optional[dist.ProcessGroup],
    absgrad: bool = False, pack: bool = True, pair_colors: Optional[PairColors] = None,
) -> _Local:
    """Validate, project, count and (pack=True) pack. Never raises: a failure becomes a
    status that the count exchange carries to every rank. pack=False (one rank): no
    payload; the pairs (and the absgrad sink) are rendered as they are."""
    W, me = get_world_size(group), get_rank(group)
    device = ex.comm_device(group, means.device if isinstance(means, Tensor) else torch.device("cpu"))

    def failed(status: int, error: BaseException) -> _Local:
        zero = torch.zeros((), dtype=torch.int64, device=device)
        return _Local(status=zero + status, checksum=zero, counts=zero.expand(W).clone(),
                      owner=zero.new_zeros(0), error=error)

    try:
        if unknown:
            raise ValueError(f"{FN}: unknown keyword arguments {unknown} (`render_kwargs` takes "
                             f"{', '.join(_RENDER_DEFAULTS)})")
        if pair_colors is not None and not callable(pair_colors):
            raise ValueError(f"{FN}: `pair_colors` must be a function (features, dirs, cameras) -> "
                             f"colours, got {type(pair_colors).__name__}")
        if pair_colors is not None and sh_degree is not None:
            raise ValueError(f"{FN}: with `pair_colors`, `colors` are per-Gaussian features [N, F], "
                             f"not SH coefficients: pass sh_degree=None (got {sh_degree})")
        resolved = _validate(means, quats, scales, opacities, colors, viewmats, Ks, width,
                             height, camera_owner, sh_degree, backend, opts, device, pair_colors is not None)
    except ValueError as e:
        return failed(ex.encode(ex.INVALID, ex.argument_index(str(e))), e)
    try:
        # non_blocking: a CPU camera_owner (allowed) is copied without a stream sync.
        owner = camera_owner.to(device=device, dtype=torch.int64, non_blocking=True)  # [C]
        finite_args = (means, quats, scales, opacities, colors, viewmats, Ks, opts["backgrounds"])
        status = _device_status(
            [(n, t) for n, t in zip(ex.FINITE_ARGS, finite_args) if t is not None],
            owner, W, opts["check_finite"])
        checksum = (ex.camera_checksum([viewmats, Ks, owner], device) if check_cameras and W > 1
                    else torch.zeros((), dtype=torch.int64, device=device))  # one rank: nobody to differ from
        pairs, dense = project(
            means, quats, scales, opacities, colors, viewmats, Ks, width, height,
            backend=resolved, sh_degree=sh_degree, near_plane=opts["near_plane"],
            far_plane=opts["far_plane"], eps2d=opts["eps2d"], packed=packed,
            rasterize_mode=opts["rasterize_mode"],
        )
        safe_owner = owner.clamp(0, W - 1)  # a bad owner is reported, never indexed with
        needs_grad = any(t.requires_grad for t in (pairs.means2d, pairs.depths, pairs.conics,
                                                   pairs.opacities, pairs.colors))
        dirs = None
        if pair_colors is not None:  # [M, 3] from each pair's camera centre to its Gaussian
            dirs = means[pairs.gaussian_ids] - camera_centers(viewmats)[pairs.camera_ids]
            needs_grad = needs_grad or dirs.requires_grad
        sink = None
        if absgrad and needs_grad:  # two zero columns whose gradient is the absgrad
            sink = attach_sink(pairs, dense, pairs.means2d if dense is None else dense["means2d"])
        if not pack:
            counts = torch.full((W,), len(pairs), dtype=torch.int64, device=device)  # W = 1
            return _Local(status=status, checksum=checksum, counts=counts, owner=owner,
                          needs_grad=needs_grad, backend=resolved, pairs=pairs, dense=dense,
                          sink=sink, dirs=dirs)
        counts, position = _destinations(pairs.camera_ids, safe_owner, W)
        payload_dtype = torch.promote_types(means.dtype, torch.float32)
        payload = _pack(pairs, _local_camera_ids(safe_owner, W), payload_dtype)
        if dirs is not None:
            payload = torch.cat([payload, dirs.to(payload_dtype)], dim=1)  # [M, F + 3]
        if sink is not None:
            payload = torch.cat([payload, sink.to(payload_dtype)], dim=1)  # [M, F + 2]
        # Grouped by destination rank: every row moves once, to its own position.
        payload = _ScatterRows.apply(payload, position)
    except Exception as e:  # never leave the peers waiting in the count exchange
        logger.exception("%s: projection failed on rank %d", FN, me)
        return failed(ex.encode(ex.INTERNAL), e)
    return _Local(status=status, checksum=checksum, counts=counts, owner=owner,
                  needs_grad=payload.requires_grad, backend=resolved, pairs=pairs,
                  dense=dense, payload=payload)


def _render_own(
    received: Tensor,  # [M_recv, F] payload rows from every rank
    own_idx: Tensor,  # [C_own] batch positions of this rank's cameras
    dtype: torch.dtype, width: int, height: int, backend: str, opts: Dict[str, Any],
    absgrad: bool = False, pair_colors: Optional[PairColors] = None,
) -> Tuple[Tensor, Tensor]:
    """Stage (b) on this rank's cameras: colors [C_own, H, W, D'], alphas [C_own, H, W, 1].
    absgrad: the payload's last two columns are the senders' absgrad sinks; pair_colors:
    the colour columns are features, followed by the pairs' dirs."""
    # Also with C_own = 0 or no pair received: the render layer then returns empty or
    # background images that stay in the autograd graph of the received payload, so this
    # rank's backward still runs the reverse all-to-all its peers wait in.
    extra = DIRS if pair_colors is not None else 0
    D = received.shape[1] - PAYLOAD_FIXED - extra - (2 if absgrad else 0)
    pairs, sink, dirs = _unpack(received, D, dtype, absgrad, extra)
    if pair_colors is not None:
        pairs = pairs.with_colors(_call_pair_colors(pair_colors, pairs.colors, dirs, own_idx[pairs.camera_ids],
                                                    opts["backgrounds"]))
    return _rasterize_own(pairs, sink, own_idx, width, height, backend, opts)


def _call_pair_colors(fn: PairColors, features: Tensor, dirs: Tensor, cameras: Tensor,
                      backgrounds: Optional[Tensor]) -> Tensor:
    """fn's colours [M, D], checked: a wrong shape would otherwise fail deep in a kernel.
    Raised on the rendering rank only (its peers are then in the backward exchange or done):
    the same model on every rank fails alike."""
    out = fn(features, dirs, cameras)
    if not isinstance(out, Tensor) or out.dim() != 2 or out.shape[0] != features.shape[0]:
        raise ValueError(f"{FN}: `pair_colors` must return a tensor [M, D] with M = {features.shape[0]} "
                         f"pairs, got {tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__}")
    if backgrounds is not None and backgrounds.shape[1] != out.shape[1]:
        raise ValueError(f"{FN}: `backgrounds` has {backgrounds.shape[1]} channels but `pair_colors` "
                         f"returns {out.shape[1]}")
    return out


def _rasterize_own(
    pairs: Pairs,  # camera_ids index the own cameras
    sink: Optional[Tensor],  # [M, 2] absgrad sink of `pairs`, or None
    own_idx: Tensor,  # [C_own] batch positions of this rank's cameras
    width: int, height: int, backend: str, opts: Dict[str, Any],
) -> Tuple[Tensor, Tensor]:
    backgrounds = opts["backgrounds"]
    return rasterize_pairs(
        pairs, len(own_idx), width, height, backend=backend,
        backgrounds=None if backgrounds is None else backgrounds[own_idx],
        render_mode=opts["render_mode"], tile_size=opts["tile_size"], absgrad_sink=sink,
    )


def _comm_stats(send_splits: List[int], recv_splits: List[int], me: int, W: int, F: int,
                itemsize: int, needs_grad: bool, host_syncs: int, staged: bool) -> Dict[str, int]:
    """What this call moved (the own-rank share of the all-to-all is a local copy, not
    counted as sent). Backward adds `backward_collectives` and the same bytes reversed,
    and `backward_host_syncs` (1 for the staged reverse all-to-all in shared-GPU mode)."""
    backward = 1 if W > 1 and needs_grad else 0
    pairs_sent = sum(send_splits) - send_splits[me]
    pairs_received = sum(recv_splits) - recv_splits[me]
    count_bytes = (W - 1) * ex.N_COLUMNS * 8
    return {
        "collectives": 2 if W > 1 else 0,
        "host_syncs": host_syncs,
        "backward_collectives": backward,
        "backward_host_syncs": backward if staged else 0,
        "payload_fields": F,
        "bytes_per_pair": F * itemsize,
        "pairs_projected": sum(send_splits),
        "pairs_sent": pairs_sent,
        "pairs_received": pairs_received,
        "pairs_rendered": sum(recv_splits),
        "bytes_sent": pairs_sent * F * itemsize + count_bytes,
        "bytes_received": pairs_received * F * itemsize + count_bytes,
    }
