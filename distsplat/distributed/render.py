"""`distributed_rasterize`: docs/design.md's step, forward and backward, for one batch.

    project local Gaussians into ALL C batch cameras (render stage a, this rank's chunk)
      -> exchange where each rank's rows go (+ status, checksum, layout): 1 collective,
         1 host transfer
      -> one packed payload per direction: 1 collective each way
      -> rasterize this rank's own cameras (render stage b) from the pairs it received

Lean by construction: a step does only the work one process's render does, plus the
exchange. The projection emits pairs sorted by (camera, Gaussian), and the batcher's
cameras are rank-major (owners non-decreasing), so the pairs are already grouped by
destination: the payload is ONE `cat` of the pair fields (no sort, no scatter), and the
rows each rank gets are found by one `searchsorted` of the owners' first cameras in the
pairs' camera ids. What is constant for a batch layout (which cameras are whose, their
positions, the receivers' local camera ids) is built once per layout on the host
(`_layout`, cached), not per step. Integer fields (camera ids, radii) ride in the payload
as raw bits (a view, no conversion) in columns that never travel back: the backward
all-to-all carries only the columns with gradients. Arrivals are (source rank, camera,
Gaussian) and are rasterized in that order, unsorted: both backends order a tile's pairs by
(camera, tile, depth) with a stable sort, and within one camera the arrival order is
(source rank, local Gaussian) = the global Gaussian order of one process, so the images
are those of one process (W-invariance), to the last bit on the CPU backend.

Owners that are not rank-major (a caller's own batches) cost one more step: the sender's
camera blocks are moved into destination order (`_Blocks`, whole blocks, no per-pair
index; the blocks' row ranges come back with the count transfer). A `camera_owner` given
as a device tensor is also handled: it rides in that same transfer.

Host syncs: ONE device->host transfer per forward at W > 1 (the counts), none in backward;
none at W = 1 unless a check on device values was asked for (`check_finite`, a device
`camera_owner`): then one read of the status. The render stages have their own (with
backend gsplat and packed=True, gsplat 1.5.3's projection reads its pair count and the
tile intersection its intersection count). meta["comm"]["host_syncs"] counts this layer's.
Shared-GPU mode (staging.py) adds one sync per staged payload all-to-all in each direction.

Checks. By default (a user's call) every rank validates its inputs, checks them for
NaN/Inf on the device (`check_finite`) and hashes its cameras (`check_cameras`); the status
and hash travel with the counts, and nothing is raised until every rank has seen every
rank's: a bad input on one rank becomes the same error on all ranks, never a hang. The
trainer turns the two device checks off: its parameters are checked where they change
(setup, resume, the divergence guard after each step) and its cameras agreed once at the
start of training (train/trainer.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
from torch import Tensor

from ..profiling import profiled
from ..render import Pairs, check_inputs, make_meta, project, rasterize_pairs
from ..render.absgrad import attach_sink
from ..render.gather import gather_rows
from ..render.gsplat_backend import camera_centers
from . import exchange as ex
from . import staging
from .context import rank as get_rank
from .context import world_size as get_world_size

logger = logging.getLogger(__name__)

FN = "distributed_rasterize"
_RENDER_DEFAULTS: Dict[str, Any] = {
    "near_plane": 0.01, "far_plane": 1e10, "eps2d": 0.3, "backgrounds": None,
    "rasterize_mode": "classic", "render_mode": "RGB", "tile_size": None, "check_finite": True,
}
DEPTH_MODES = ("D", "ED", "RGB+D", "RGB+ED")  # the depths then carry a gradient
DIRS = 3  # with pair_colors: each pair's camera-to-Gaussian vector
# (features [M, F], dirs [M, 3], batch positions of the cameras [M]) -> colours [M, D]
PairColors = Callable[[Tensor, Tensor, Tensor], Tensor]
Owner = Union[Tensor, Sequence[int]]


# ------------------------------------------------------------------------- batch layout


@dataclass(frozen=True)
class _Layout:
    """Which batch cameras are whose, from this rank's point of view; built once per
    (owners, W, rank, device) and cached: a training run has a handful of layouts."""

    owner: Tuple[int, ...]  # [C] owner rank of each batch camera
    rank_major: bool  # owners non-decreasing: pairs in camera order are grouped by rank
    own: Tuple[int, ...]  # [C_own] batch positions of this rank's cameras, in batch order
    own_idx: Tensor  # [C_own] int64 on the device: `own`
    local_of: Tensor  # [C] int64 on the device: index of a camera among its owner's cameras
    bounds: Optional[Tensor]  # [W + 1] int64 on the device: first camera of each rank (rank-major)
    owner_dev: Optional[Tensor]  # [C] int64 on the device (not rank-major: rows per rank)
    by_rank: Tuple[Tuple[int, ...], ...]  # [W] the cameras of each rank, in batch order


@lru_cache(maxsize=64)
def _layout(owner: Tuple[int, ...], W: int, me: int, device: torch.device) -> _Layout:
    """Owners must be in [0, W) (checked before). The device tensors are copied here once."""
    by_rank = tuple(tuple(c for c, o in enumerate(owner) if o == r) for r in range(W))
    local = [0] * len(owner)
    for cams in by_rank:
        for i, c in enumerate(cams):
            local[c] = i
    rank_major = all(a <= b for a, b in zip(owner, owner[1:]))
    first = [sum(len(by_rank[q]) for q in range(r)) for r in range(W + 1)]
    dev = lambda values: torch.tensor(values, dtype=torch.int64).to(device)  # noqa: E731
    return _Layout(owner=owner, rank_major=rank_major, own=by_rank[me], own_idx=dev(list(by_rank[me])),
                   local_of=dev(local), bounds=dev(first) if rank_major else None,
                   owner_dev=None if rank_major else dev(list(owner)), by_rank=by_rank)


@lru_cache(maxsize=64)
def _constant(values: Tuple[int, ...], rows: int, device: torch.device, dtype: torch.dtype = torch.int64) -> Tensor:
    """[rows, len(values)] on `device`, every row `values`: made once (the one host->device
    copy happens at the first call, not in every step). Callers expand or index it, never
    write to it."""
    return torch.tensor([list(values)] * rows, dtype=dtype).to(device)


# ------------------------------------------------------------------------ validation


# Tests only: treat a CPU `camera_owner` tensor as a device tensor, so CPU runs walk the
# path where the owners come to the host with the counts.
_owner_tensor_on_device = False


def _host_owner(camera_owner: Owner, C: int) -> Optional[Tuple[int, ...]]:
    """camera_owner's values when they are on the host (a sequence, a CPU tensor), else
    None (a device tensor: its values come to the host with the counts). Raises ValueError
    naming `camera_owner` for a wrong type, shape or dtype."""
    if isinstance(camera_owner, Tensor):
        if camera_owner.shape != (C,):
            raise ValueError(f"{FN}: `camera_owner` must have shape [C] = [{C}] (one owner rank "
                             f"per batch camera), got {tuple(camera_owner.shape)}")
        if camera_owner.is_floating_point() or camera_owner.is_complex() or camera_owner.dtype == torch.bool:
            raise ValueError(f"{FN}: `camera_owner` must be an integer tensor, got {camera_owner.dtype}")
        on_host = camera_owner.device.type == "cpu" and not _owner_tensor_on_device
        return tuple(camera_owner.tolist()) if on_host else None
    try:
        values = tuple(camera_owner)
    except TypeError:
        values = None
    if values is None or not all(isinstance(o, int) and not isinstance(o, bool) for o in values):
        raise ValueError(f"{FN}: `camera_owner` must be an int64 tensor or a sequence of ints of "
                         f"length {C}, got {type(camera_owner).__name__}")
    if len(values) != C:
        raise ValueError(f"{FN}: `camera_owner` must have shape [C] = [{C}] (one owner rank "
                         f"per batch camera), got {len(values)} values")
    return values


def _validate(
    means: Tensor, quats: Tensor, scales: Tensor, opacities: Tensor, colors: Tensor,
    viewmats: Tensor, Ks: Tensor, width: int, height: int, camera_owner: Owner,
    sh_degree: Optional[int], backend: str, opts: Dict[str, Any], device: torch.device,
    features: bool = False,
) -> Tuple[str, Optional[Tuple[int, ...]]]:
    """This rank's own checks on the host; raises ValueError naming the argument. Returns
    the resolved backend and the owners when they are on the host. features (pair_colors):
    `colors` are features, so the backgrounds' channels are the colour model's, checked
    against its output when it runs."""
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
    owner = _host_owner(camera_owner, viewmats.shape[0])
    if owner is None and camera_owner.device not in (means.device, device):
        raise ValueError(f"{FN}: `camera_owner` is on {camera_owner.device} but `means` is on "
                         f"{means.device}; pass it on the same device or on the host")
    if means.device != device:
        raise ValueError(f"{FN}: `means` is on {means.device} but the process group exchanges "
                         f"tensors on {device} (nccl: this rank's GPU, gloo: CPU, shared-GPU "
                         "mode: the shared GPU); put the Gaussians on ctx.device")
    return resolved, owner


def _device_status(named: List[Tuple[str, Tensor]], owner: Optional[Tensor], W: int,
                   device: torch.device) -> Tensor:
    """int64 scalar on the device: NONFINITE with a bitmask of the arguments holding NaN/Inf
    (`named`; empty: not checked), else OWNER_RANGE for a device `owner`, else OK. No sync."""
    status = torch.zeros((), dtype=torch.int64, device=device)
    if owner is not None:  # Python scalars, not torch.tensor(..., device): no host->device copy
        status = ((owner < 0) | (owner >= W)).any().long() * ex.encode(ex.OWNER_RANGE)
    if named:
        # One float64 sum per argument: NaN and Inf propagate through a sum, and float32
        # values summed in float64 cannot overflow, so a sum is finite iff its tensor is.
        sums = torch.stack([t.detach().sum(dtype=torch.float64).to(device) for _, t in named])  # [A]
        weights = _constant(tuple(1 << ex.FINITE_ARGS.index(name) for name, _ in named), 1, device)[0]  # [A]
        bits = torch.where(torch.isfinite(sums), 0, weights).sum()
        status = torch.where(bits != 0, bits + ex.encode(ex.NONFINITE), status)
    return status


# ----------------------------------------------------------------------------- stage a


@dataclass
class _Local:
    """This rank's side before the exchange; `error` set means `status` reports it."""

    status: Union[int, Tensor]  # the status code: on the host, or [] int64 on the device (device checks)
    checksum: Optional[Tensor] = None  # [] int64 (check_cameras, W > 1)
    owner: Optional[Tuple[int, ...]] = None  # [C] on the host; None: `owner_dev` only
    owner_dev: Optional[Tensor] = None  # [C] int64 on the device (a device camera_owner)
    needs_grad: bool = False
    backend: str = "torch"
    pairs: Optional[Pairs] = None  # the projection's pairs, sorted by (camera, Gaussian)
    dense: Optional[Dict[str, Tensor]] = None
    sink: Optional[Tensor] = None  # [M, 2] absgrad sink of `pairs` (absgrad)
    dirs: Optional[Tensor] = None  # [M, 3] camera centre -> Gaussian (pair_colors)
    error: Optional[BaseException] = None


def _prepare(
    means: Tensor, quats: Tensor, scales: Tensor, opacities: Tensor, colors: Tensor,
    viewmats: Tensor, Ks: Tensor, width: int, height: int, camera_owner: Owner,
    sh_degree: Optional[int], packed: bool, backend: str, check_cameras: bool,
    opts: Dict[str, Any], unknown: List[str], group: Optional[dist.ProcessGroup],
    absgrad: bool = False, pair_colors: Optional[PairColors] = None,
) -> _Local:
    """Validate and project. Never raises: a failure becomes a status that the count
    exchange carries to every rank (or, at W = 1, is raised by the caller)."""
    W, me = get_world_size(group), get_rank(group)
    device = ex.comm_device(group, means.device if isinstance(means, Tensor) else torch.device("cpu"))
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
        resolved, owner = _validate(means, quats, scales, opacities, colors, viewmats, Ks, width,
                                    height, camera_owner, sh_degree, backend, opts, device, pair_colors is not None)
    except ValueError as e:
        return _Local(status=ex.encode(ex.INVALID, ex.argument_index(str(e))), error=e)
    if owner is not None and not all(0 <= o < W for o in owner):
        status = ex.encode(ex.OWNER_RANGE)
        return _Local(status=status, error=ValueError(f"{FN}: " + ex.describe_status([me], status, W)))
    try:
        # non_blocking: no stream sync for a device owner on another stream's device
        owner_dev = None if owner is not None else camera_owner.to(device=device, dtype=torch.int64,
                                                                   non_blocking=True)  # [C]
        finite_args = (means, quats, scales, opacities, colors, viewmats, Ks, opts["backgrounds"])
        named = [(n, t) for n, t in zip(ex.FINITE_ARGS, finite_args) if t is not None] if opts["check_finite"] else []
        status: Union[int, Tensor] = ex.OK
        if named or owner_dev is not None:
            status = _device_status(named, owner_dev, W, device)
        checksum = None
        if check_cameras and W > 1:
            cams = [viewmats, Ks] + ([owner_dev] if owner is None else [])
            checksum = ex.camera_checksum(cams, device)
            if owner is not None:  # the host's owners folded in: Python ints hash alike in every process
                checksum = checksum + (hash(owner) & (2**62 - 1))
        pairs, dense = project(
            means, quats, scales, opacities, colors, viewmats, Ks, width, height,
            backend=resolved, sh_degree=sh_degree, near_plane=opts["near_plane"],
            far_plane=opts["far_plane"], eps2d=opts["eps2d"], packed=packed,
            rasterize_mode=opts["rasterize_mode"],
        )
        needs_grad = any(t.requires_grad for t in (pairs.means2d, pairs.depths, pairs.conics,
                                                   pairs.opacities, pairs.colors))
        dirs = None
        if pair_colors is not None:  # [M, 3] from each pair's camera centre to its Gaussian
            dirs = gather_rows(means, pairs.gaussian_ids) - gather_rows(camera_centers(viewmats), pairs.camera_ids)
            needs_grad = needs_grad or dirs.requires_grad
        sink = None
        if absgrad and needs_grad:  # two zero columns whose gradient is the absgrad
            sink = attach_sink(pairs, dense, pairs.means2d if dense is None else dense["means2d"])
    except Exception as e:  # never leave the peers waiting in the count exchange
        logger.exception("%s: projection failed on rank %d", FN, me)
        return _Local(status=ex.encode(ex.INTERNAL), error=e)
    return _Local(status=status, checksum=checksum, owner=owner, owner_dev=owner_dev, needs_grad=needs_grad,
                  backend=resolved, pairs=pairs, dense=dense, sink=sink, dirs=dirs)


# -------------------------------------------------------------------------- the payload


@dataclass(frozen=True)
class _Columns:
    """The payload's columns: [means2d 2 | conics 3 | opacities 1 | colors D | dirs 3 |
    absgrad sink 2 | depths 1 | (pad) | camera ids | radii]; the first `n_grad` carry
    gradients (the depths too in depth render modes). Camera ids (int64) and radii
    (int32 x 2) ride as their raw bits, 8 bytes each: 2 float32 columns or 1 float64 one,
    after a zero pad column where needed to start them on an 8-byte boundary."""

    D: int  # colour channels (features with pair_colors)
    dirs: int  # 3 with pair_colors, else 0
    sink: int  # 2 with absgrad and gradients, else 0
    depth_grad: bool
    int_cols: int  # columns of each 8-byte integer field: 8 / the payload's itemsize

    @property
    def n_float(self) -> int:
        return 7 + self.D + self.dirs + self.sink

    @property
    def n_grad(self) -> int:
        return self.n_float - 1 + int(self.depth_grad)

    @property
    def pad(self) -> int:
        return -self.n_float % self.int_cols

    @property
    def total(self) -> int:
        return self.n_float + self.pad + 2 * self.int_cols


def _as_columns(t: Tensor, dtype: torch.dtype) -> Tensor:
    """An integer tensor [M] or [M, k] (8 bytes per row) as [M, 8 / itemsize] of `dtype`:
    the same bytes, no conversion (a view of a contiguous tensor)."""
    t = t.contiguous()
    return (t[:, None] if t.dim() == 1 else t).view(dtype)


def _pack(local: _Local, cols: _Columns, dtype: torch.dtype) -> Tensor:
    """The projection's pairs (camera order) -> one [M, F] payload: one cat."""
    p = local.pairs
    depths = p.depths if cols.depth_grad else p.depths.detach()
    fields = [p.means2d, p.conics, p.opacities[:, None], p.colors, local.dirs, local.sink, depths[:, None]]
    pad = [_constant((0,), 1, p.means2d.device, dtype).expand(len(p), cols.pad)] if cols.pad else []
    return torch.cat([f.to(dtype) for f in fields if f is not None] + pad
                     + [_as_columns(p.camera_ids, dtype), _as_columns(p.radii, dtype)], dim=1)


def _unpack(head: Tensor, tail: Tensor, cols: _Columns, layout: _Layout
            ) -> Tuple[Pairs, Optional[Tensor], Optional[Tensor]]:
    """Received rows -> Pairs of this rank's own cameras (camera ids local to them), the
    senders' absgrad sinks and the pairs' dirs (or None), in arrival order. The Gaussian
    ids are unknown here (-1): stage (b) never reads them."""
    sizes = [2, 3, 1, cols.D] + ([DIRS] if cols.dirs else []) + ([2] if cols.sink else []) \
        + ([1] if cols.depth_grad else [])
    parts = list(torch.split(head, sizes, 1))
    means2d, conics, opac, colors = parts[:4]
    dirs = parts[4] if cols.dirs else None
    sink = parts[4 + bool(cols.dirs)] if cols.sink else None
    depths = parts[-1] if cols.depth_grad else tail[:, :1]
    k, at = cols.int_cols, cols.n_float + cols.pad - cols.n_grad  # the integers' first column in `tail`
    cam = tail[:, at:at + k].view(torch.int64)[:, 0]  # [M] batch positions
    pairs = Pairs(
        camera_ids=layout.local_of.index_select(0, cam),
        gaussian_ids=_constant((-1,), 1, head.device)[0].expand(head.shape[0]),
        radii=tail[:, at + k:at + 2 * k].view(torch.int32), means2d=means2d, depths=depths[:, 0], conics=conics,
        opacities=opac[:, 0], colors=colors,
    )
    return pairs, sink, dirs


class _Blocks(torch.autograd.Function):
    """Rows of x reordered by whole blocks: out = cat(x[a:b] for (a, b) in `spans`);
    backward puts the gradient's blocks back (`back`: the spans of the output in x's order).
    Used when the owners are not rank-major; both directions copy every row once."""

    @staticmethod
    def forward(ctx, x: Tensor, spans: List[Tuple[int, int]], back: List[Tuple[int, int]]) -> Tensor:
        ctx.back = back
        return torch.cat([x[a:b] for a, b in spans]) if spans else x[:0]

    @staticmethod
    def backward(ctx, grad: Tensor):
        return (torch.cat([grad[a:b] for a, b in ctx.back]) if ctx.back else grad[:0]), None, None


def _block_spans(starts: List[int], layout: _Layout) -> Tuple[List[Tuple[int, int]], List[Tuple[int, int]]]:
    """starts [C + 1]: the first pair of each camera (pairs in camera order). Returns the
    camera blocks in destination order, and the same blocks' places in the output in
    camera order (the backward), adjacent blocks merged."""
    order = [c for cams in layout.by_rank for c in cams]
    spans, placed, pos = [], {}, 0
    for c in order:
        a, b = starts[c], starts[c + 1]
        placed[c] = (pos, pos + b - a)
        pos += b - a
        spans.append((a, b))
    back = [placed[c] for c in range(len(order))]

    def merge(s):
        out = []
        for a, b in s:
            if a == b:
                continue
            if out and out[-1][1] == a:
                out[-1] = (out[-1][0], b)
            else:
                out.append((a, b))
        return out
    return merge(spans), merge(back)


# ----------------------------------------------------------------------- the forward


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
    camera_owner: Owner,  # [C] ints: the rank that renders each batch camera
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

    camera_owner: a sequence of ints or an int tensor. Owners on the host (a sequence, a
    CPU tensor) cost nothing; rank-major owners ([0]*k + [1]*k + ..., what CameraBatcher
    draws) need no reordering of the pairs at all. A device tensor's values come to the
    host with the counts.

    render_kwargs: near_plane, far_plane, eps2d, backgrounds ([C, D], every batch
    camera's, like `rasterize`), rasterize_mode, render_mode, tile_size, check_finite
    (default on: NaN/Inf inputs are an error on every rank; off in the trainer, which checks
    its parameters where they change). check_cameras (default on) folds a checksum of
    viewmats, Ks and camera_owner into the count exchange, so ranks passing different
    cameras get an error, not wrong images (off in the trainer: agreed once per run).
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
    with profiled("distsplat/project"):
        local = _prepare(means, quats, scales, opacities, colors, viewmats, Ks, width, height,
                         camera_owner, sh_degree, packed, backend, check_cameras, opts,
                         sorted(set(render_kwargs) - set(_RENDER_DEFAULTS)), group, absgrad, pair_colors)
    C = viewmats.shape[0] if local.error is None else 0
    device = ex.comm_device(group, means.device if isinstance(means, Tensor) else torch.device("cpu"))
    if W == 1:
        with profiled("distsplat/rasterize"):
            layout, colors_out, alphas_out = _render_single(local, C, width, height, opts, pair_colors, device)
        stats = _comm_stats([len(local.pairs)], [len(local.pairs)], 0, 1, 0, 0, local.needs_grad,
                            staging.host_syncs() - syncs_before, False)
    else:
        dtype = torch.float32 if local.error else torch.promote_types(means.dtype, torch.float32)  # the payload's
        cols = _Columns(D=local.pairs.colors.shape[-1] if local.error is None else 0,
                        dirs=DIRS if pair_colors is not None else 0,
                        sink=2 if absgrad and local.needs_grad else 0,
                        depth_grad=opts["render_mode"] in DEPTH_MODES and local.needs_grad,
                        int_cols=8 // dtype.itemsize)
        with profiled("distsplat/count_exchange"):
            layout, counts, spans = _exchange_counts(local, cols, C, W, me, group, device, check_cameras)
        with profiled("distsplat/pack"):
            payload = _pack(local, cols, dtype)
            if not layout.rank_major:  # camera blocks into destination order
                payload = _Blocks.apply(payload, *spans)
        with profiled("distsplat/payload_exchange"):
            head, tail = ex.all_to_all(payload, cols.n_grad, counts.send_splits, counts.recv_splits, group)
        with profiled("distsplat/rasterize"):
            pairs, sink, dirs = _unpack(head, tail, cols, layout)
            colors_out, alphas_out = _rasterize_own(pairs, sink, dirs, layout, width, height, local.backend,
                                                    opts, pair_colors)
        itemsize = dtype.itemsize
        stats = _comm_stats(counts.send_splits, counts.recv_splits, me, W, cols.total, itemsize,
                            local.needs_grad, staging.host_syncs() - syncs_before, staging.staged(group),
                            cols.n_grad)
    meta = make_meta(local.pairs, local.dense, width, height, C)
    meta.update(camera_owner=layout.owner, own_cameras=layout.own_idx, rank=me, world_size=W, comm=stats)
    return colors_out, alphas_out, meta


def _render_single(local: _Local, C: int, width: int, height: int, opts: Dict[str, Any],
                   pair_colors: Optional[PairColors], device: torch.device) -> Tuple[_Layout, Tensor, Tensor]:
    """W = 1: every camera is this rank's, so the projection's pairs are rendered as they
    are. No collective; a host read only for a check on device values."""
    if local.error is not None:  # nobody else to agree with: the detailed error
        raise local.error
    if isinstance(local.status, Tensor):  # check_finite or a device owner: one read
        staging.count_sync()
        status = int(local.status.item())
        if status != ex.OK:
            raise ValueError(f"{FN}: " + ex.describe_status([0], status, 1))
    layout = _layout(local.owner or (0,) * C, 1, 0, device)
    colors, alphas = _rasterize_own(local.pairs, local.sink, local.dirs, layout, width, height, local.backend,
                                    opts, pair_colors)
    return layout, colors, alphas


def _exchange_counts(local: _Local, cols: _Columns, C: int, W: int, me: int, group: Optional[dist.ProcessGroup],
                     device: torch.device, check_cameras: bool
                     ) -> Tuple[_Layout, ex.Counts, Tuple[List[Tuple[int, int]], List[Tuple[int, int]]]]:
    """Where this rank's rows go, exchanged with status, checksum and layout: one
    all-to-all, one host transfer. Raises the same error on every rank if any failed."""
    ok = local.error is None
    layout = _layout(local.owner, W, me, device) if ok and local.owner is not None else None
    buffer = ex.count_buffer(W, device)  # rows [0, W): what goes to each rank
    code = ex.encode_layout(local.needs_grad, cols.sink > 0, cols.total, cols.n_grad)
    tail = _constant((local.status if isinstance(local.status, int) else 0, 0, code), W, device)  # [W, 3]
    if isinstance(local.status, Tensor) or local.checksum is not None:
        tail = tail.clone()
        if isinstance(local.status, Tensor):
            tail[:, 0] += local.status
        if local.checksum is not None:
            tail[:, 1] += local.checksum
    extra = None
    if not ok:  # nothing to send; the status says why
        torch.cat([_constant((0, 0), W, device), tail], 1, out=buffer[:W])
    elif layout is not None and layout.rank_major:
        # Pairs in camera order, cameras rank-major: rank q's rows start at its first camera.
        first = torch.searchsorted(local.pairs.camera_ids, layout.bounds)  # [W + 1]
        torch.cat([first[:-1, None], first[1:, None], tail], 1, out=buffer[:W])
    else:  # the rows per rank, summed over each rank's cameras; the camera blocks come to the host
        cameras = _constant(tuple(range(C + 1)), 1, local.pairs.camera_ids.device)[0]  # [C + 1]
        starts = torch.searchsorted(local.pairs.camera_ids, cameras)  # [C + 1] first pair of each camera
        owner = layout.owner_dev if layout is not None else local.owner_dev.clamp(0, W - 1)  # bad owners: reported
        per_rank = torch.zeros(W, dtype=torch.int64, device=device).index_add_(0, owner, starts.diff())  # [W]
        end = per_rank.cumsum(0)
        torch.cat([(end - per_rank)[:, None], end[:, None], tail], 1, out=buffer[:W])
        extra = starts if local.owner is not None else torch.cat([starts, local.owner_dev])
    counts = ex.exchange_counts(buffer, group, extra)  # the one device -> host transfer
    _raise_if_failed(counts, W, check_cameras, local.error)
    spans: Tuple[List[Tuple[int, int]], List[Tuple[int, int]]] = ([], [])
    if layout is None:  # a device owner: its values came with the counts
        layout = _layout(tuple(counts.extra[C + 1:]), W, me, device)
    if not layout.rank_major:
        spans = _block_spans(counts.extra[:C + 1], layout)
    return layout, counts, spans


def _raise_if_failed(counts: ex.Counts, W: int, check_cameras: bool,
                     local_error: Optional[BaseException]) -> None:
    """Every rank holds the same (status, checksum, layout) of every rank, so every rank
    raises the same error here, or none does."""
    statuses = counts.column(ex.STATUS)
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
    layouts = [ex.decode_layout(v) for v in counts.column(ex.LAYOUT)]
    if len({g for g, _, _, _ in layouts}) > 1 or len({a for _, a, _, _ in layouts}) > 1:
        raise ValueError(
            f"{FN}: ranks disagree on whether gradients flow or on `absgrad` (per rank: "
            f"{['absgrad' if a else 'grad' if g else 'no grad' for g, a, _, _ in layouts]}); "
            "the backward all-to-all needs every rank, so render under the same "
            "torch.no_grad()/requires_grad setting and absgrad everywhere"
        )
    if len({(f, n) for _, _, f, n in layouts}) > 1:
        raise ValueError(
            f"{FN}: ranks disagree on the pairs' fields (payload columns per rank: "
            f"{[f for _, _, f, _ in layouts]}): pass colours with the same channels and SH degree, "
            "the same render_mode and `pair_colors` on every rank"
        )


# ----------------------------------------------------------------------------- stage b


def _rasterize_own(
    pairs: Pairs,  # camera_ids index the own cameras
    sink: Optional[Tensor],  # [M, 2] absgrad sink of `pairs`, or None
    dirs: Optional[Tensor],  # [M, 3] with pair_colors
    layout: _Layout, width: int, height: int, backend: str, opts: Dict[str, Any],
    pair_colors: Optional[PairColors] = None,
) -> Tuple[Tensor, Tensor]:
    """Stage (b) on this rank's cameras: colors [C_own, H, W, D'], alphas [C_own, H, W, 1].
    Also with C_own = 0 or no pair received: the render layer then returns empty or
    background images that stay in the autograd graph of the received payload, so this
    rank's backward still runs the reverse all-to-all its peers wait in."""
    own_idx = layout.own_idx
    backgrounds = opts["backgrounds"]
    if pair_colors is not None:
        pairs = pairs.with_colors(_call_pair_colors(pair_colors, pairs.colors, dirs,
                                                    own_idx.index_select(0, pairs.camera_ids), backgrounds))
    return rasterize_pairs(
        pairs, len(layout.own), width, height, backend=backend,
        backgrounds=None if backgrounds is None else backgrounds[own_idx],
        render_mode=opts["render_mode"], tile_size=opts["tile_size"], absgrad_sink=sink,
    )


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


def _comm_stats(send_splits: List[int], recv_splits: List[int], me: int, W: int, F: int,
                itemsize: int, needs_grad: bool, host_syncs: int, staged: bool,
                grad_columns: int = 0) -> Dict[str, int]:
    """What this call moved (the own-rank share of the all-to-all is a local copy, not
    counted as sent). Backward adds `backward_collectives`, `backward_bytes_sent` (the
    gradient columns only) and `backward_host_syncs` (1 for the staged reverse all-to-all
    in shared-GPU mode)."""
    backward = 1 if W > 1 and needs_grad else 0
    pairs_sent = sum(send_splits) - send_splits[me]
    pairs_received = sum(recv_splits) - recv_splits[me]
    count_bytes = (W - 1) * ex.N_COLUMNS * 8 if W > 1 else 0
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
        "backward_bytes_sent": backward * pairs_received * grad_columns * itemsize,
    }
