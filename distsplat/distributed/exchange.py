"""The wire between the two render stages: the count exchange and the packed all-to-all.

docs/design.md's step, seen from one rank: after projecting its Gaussians into every batch
camera, a rank knows which rows of its payload go to each rank, but not how many it will
receive. `exchange_counts` swaps those row ranges in ONE all-to-all of a tiny int64 matrix
(W rows of N_COLUMNS, written into a buffer kept for the process) and brings it to the host
in ONE transfer (the one host sync this layer adds to a forward; in shared-GPU mode the
transfer happens before the collective, which then runs on the host, so it is still one);
the same matrix carries each rank's validation status, a checksum of its camera tensors
and its payload layout (whether it will run backward, its columns), so that a bad input on
one rank becomes the same error on every rank instead of a hang in the next collective.
`all_to_all` then moves one packed payload, and its backward is the reverse all-to-all of
the payload's gradient columns only (one collective; in shared-GPU mode each of the two is
staged through host memory: one more sync each, see staging.py).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from ..profiling import profiled
from ..transfer import to_device
from . import staging
from .context import world_size

logger = logging.getLogger(__name__)

# Status codes: (kind << 32) | detail. 0 means the rank is fine.
OK = 0
INVALID = 1  # the rank's own checks raised ValueError; detail = index into ARGUMENTS
NONFINITE = 2  # detail = bitmask over the FINITE_ARGS that hold NaN or Inf
OWNER_RANGE = 3  # camera_owner holds a rank outside [0, W)
INTERNAL = 4  # an unexpected exception while projecting; detail unused
_KIND_SHIFT = 32

# Arguments an INVALID status can name. Append only: the index is what goes on the wire.
ARGUMENTS = (
    "inputs", "means", "quats", "scales", "opacities", "colors", "viewmats", "Ks", "width",
    "height", "sh_degree", "near_plane", "far_plane", "eps2d", "backgrounds", "rasterize_mode",
    "render_mode", "backend", "camera_owner", "packed", "tile_size", "render_kwargs",
)
FINITE_ARGS = ("means", "quats", "scales", "opacities", "colors", "viewmats", "Ks", "backgrounds")

# Columns of the count matrix each rank sends to every rank: the rows [BEGIN, END) of its
# payload that go to that rank, its status, its camera checksum, and LAYOUT: whether
# gradients flow (bit 0), absgrad (bit 1), the payload's columns (bits 8-23) and how many
# of them carry gradients (bits 24-39), which must agree for the all-to-all to line up.
BEGIN, END, STATUS, CHECKSUM, LAYOUT = range(5)
N_COLUMNS = 5


def encode_layout(needs_grad: bool, absgrad: bool, columns: int, grad_columns: int) -> int:
    return int(needs_grad) | int(absgrad) << 1 | columns << 8 | grad_columns << 24


def decode_layout(value: int) -> Tuple[bool, bool, int, int]:
    """(needs_grad, absgrad, payload columns, gradient columns)."""
    return bool(value & 1), bool(value >> 1 & 1), value >> 8 & 0xFFFF, value >> 24 & 0xFFFF


def encode(kind: int, detail: int = 0) -> int:
    return (kind << _KIND_SHIFT) | detail


def argument_index(message: str) -> int:
    """The argument a validation message is about: the first `name` in backticks that is
    one of ARGUMENTS, else the first ARGUMENTS word in it, else 0 ('inputs')."""
    for name in re.findall(r"`(\w+)`", message):
        if name in ARGUMENTS:
            return ARGUMENTS.index(name)
    words = re.findall(r"\w+", message)
    for word in words[1:]:  # words[0] is the function name
        if word in ARGUMENTS:
            return ARGUMENTS.index(word)
    return 0


def describe_status(ranks: List[int], status: int, world: int) -> str:
    """The same sentence on every rank (only the integer status crossed the wire) for the
    ranks that reported `status`."""
    who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
    kind, detail = status >> _KIND_SHIFT, status & ((1 << _KIND_SHIFT) - 1)
    if kind == INVALID:
        arg = ARGUMENTS[detail] if detail < len(ARGUMENTS) else "inputs"
        return (f"{who} rejected their inputs: invalid `{arg}` (shape, dtype, device or value; "
                f"the detailed error is raised on {who} as the cause of this one)")
    if kind == NONFINITE:
        names = [f"`{n}`" for i, n in enumerate(FINITE_ARGS) if detail >> i & 1]
        return (f"{who}: {', '.join(names)} contain NaN or Inf values; check the parameters "
                "(a diverged optimizer step or a bad input file)")
    if kind == OWNER_RANGE:
        return f"{who}: `camera_owner` holds ranks outside [0, {world})"
    if kind == INTERNAL:
        return (f"{who} failed while projecting their Gaussians (the traceback is raised on "
                f"{who} as the cause of this error)")
    return f"{who} sent an unknown status {status}"


def status_kind(status: int) -> int:
    return status >> _KIND_SHIFT


def camera_checksum(tensors: Sequence[Tensor], device: torch.device) -> Tensor:
    """An int64 on `device` built from the bit patterns (not the values: -0.0 != 0.0, and
    a 1-ulp difference counts) of `tensors`, weighted by position so that reordered
    cameras differ too. Integer overflow wraps, which keeps it independent of the order of
    the reduction. Costs a few elementwise kernels and no host sync."""
    h = torch.zeros((), dtype=torch.int64, device=device)
    for t in tensors:
        t = t.detach().to(device).contiguous().reshape(-1)
        if t.is_floating_point():
            t = t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])
        bits = t.long()
        weights = torch.arange(1, 2 * bits.numel() + 1, 2, device=device, dtype=torch.int64)
        shape_tag = bits.numel() * 31 + t.element_size()
        h = h * 1_000_003 + (bits * weights).sum() + shape_tag
    return h


@dataclass
class Counts:
    """The count matrix on the host after the one transfer."""

    sent: List[List[int]]  # [W][N_COLUMNS] what this rank sent to each rank
    received: List[List[int]]  # [W][N_COLUMNS] what each rank sent to this rank
    extra: List[int]  # host copy of the extra int64 values carried along

    @property
    def send_splits(self) -> List[int]:
        return [row[END] - row[BEGIN] for row in self.sent]

    @property
    def recv_splits(self) -> List[int]:
        return [row[END] - row[BEGIN] for row in self.received]

    def column(self, c: int) -> List[int]:
        """Every rank's value of a per-rank column (status, checksum, layout)."""
        return [row[c] for row in self.received]


@lru_cache(maxsize=8)
def count_buffer(W: int, device: torch.device) -> Tensor:
    """[2W, N_COLUMNS] int64 on `device`, one per (W, device) for the process: rows [0, W)
    take what this rank sends (written in place by the caller, e.g. `torch.cat(..., out=)`),
    rows [W, 2W) what it receives. Reused by every call: no allocation per step, and the
    host reads both halves in one transfer. A call is done with it once `exchange_counts`
    returns (the transfer waited for the collective)."""
    return torch.zeros(2 * W, N_COLUMNS, dtype=torch.int64, device=device)


def exchange_counts(
    buffer: Tensor,  # [2W, N_COLUMNS] int64 from count_buffer; rows [0, W) filled
    group: Optional[dist.ProcessGroup] = None,
    extra: Optional[Tensor] = None,  # [E] int64 on the same device, brought to the host too
) -> Counts:
    """One all-to-all of the count matrix and ONE device->host transfer of (sent,
    received, extra) together, counted in staging.host_syncs(). Shared-GPU mode moves
    (sent, extra) to the host first and exchanges there: still one transfer."""
    W = buffer.shape[0] // 2
    n = W * N_COLUMNS
    send, recv = buffer[:W], buffer[W:]
    if staging.staged(group):
        flat = send.reshape(-1) if extra is None else torch.cat([send.reshape(-1), extra])
        host = staging.to_host(flat)  # the one transfer
        got = torch.empty_like(host[:n])
        dist.all_to_all_single(got, host[:n], group=group)  # W rows of N_COLUMNS each
        values = host[:n].tolist() + got.tolist() + host[n:].tolist()  # host memory: no sync
    else:
        dist.all_to_all_single(recv, send, group=group)
        staging.count_sync()
        both = buffer if extra is None else torch.cat([buffer.reshape(-1), extra])
        values = both.reshape(-1).tolist()  # the one transfer
    rows = lambda f: [f[i * N_COLUMNS:(i + 1) * N_COLUMNS] for i in range(W)]  # noqa: E731
    return Counts(rows(values[:n]), rows(values[n:2 * n]), values[2 * n:])


def exchange_rows(x: Tensor, in_splits: List[int], out_splits: List[int],
                  group: Optional[dist.ProcessGroup] = None) -> Tensor:
    """Rows out by in_splits, rows in by out_splits (not differentiable); `x` itself with
    one process."""
    return x if world_size(group) == 1 else _exchange_rows(x, in_splits, out_splits, group)


def _exchange_rows(x: Tensor, in_splits: List[int], out_splits: List[int],
                   group: Optional[dist.ProcessGroup]) -> Tensor:
    """[sum(in_splits), ...] rows out by in_splits, [sum(out_splits), ...] rows in: one
    collective, through host memory in shared-GPU mode (one counted sync)."""
    shape = (sum(out_splits),) + tuple(x.shape[1:])
    if not staging.staged(group):
        out = x.new_empty(shape)
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=out_splits,
                               input_split_sizes=in_splits, group=group)
        return out
    src = staging.to_host(x.contiguous())
    out = staging.host_empty(shape, x.dtype, x.device)
    dist.all_to_all_single(out, src, output_split_sizes=out_splits,
                           input_split_sizes=in_splits, group=group)
    return to_device(out, x.device)


class _AllToAll(torch.autograd.Function):
    """Rows of `payload` go to ranks by `send_splits`; rows arrive by `recv_splits`, returned
    as (the first `n_grad` columns, the rest). Only the first part is differentiable:
    backward sends its gradient rows home by the reverse splits (one collective, n_grad
    columns: integer fields and other columns without a gradient never travel back)."""

    @staticmethod
    def forward(ctx, payload: Tensor, n_grad: int, send_splits: List[int], recv_splits: List[int], group):
        ctx.splits, ctx.group, ctx.columns = (send_splits, recv_splits), group, payload.shape[1]
        out = _exchange_rows(payload, send_splits, recv_splits, group)  # [M_recv, F]
        head, tail = out[:, :n_grad], out[:, n_grad:]
        ctx.mark_non_differentiable(tail)
        return head, tail

    @staticmethod
    def backward(ctx, grad_head: Tensor, grad_tail: Optional[Tensor]):
        send_splits, recv_splits = ctx.splits
        with profiled("distsplat/payload_exchange_backward"):
            grad = _exchange_rows(grad_head, recv_splits, send_splits, ctx.group)  # [M, n_grad]
            grad = F.pad(grad, (0, ctx.columns - grad.shape[1]))  # [M, F]: zeros for the rest
        return grad, None, None, None, None


def all_to_all(
    payload: Tensor,  # [M, F], rows grouped by destination rank
    n_grad: int,  # the leading columns that carry gradients back
    send_splits: List[int],  # [W] rows for each rank
    recv_splits: List[int],  # [W] rows from each rank
    group: Optional[dist.ProcessGroup] = None,
) -> Tuple[Tensor, Tensor]:
    """Differentiable all-to-all of rows: ([M_recv, n_grad], [M_recv, F - n_grad]) views of
    the received rows, the second without gradient."""
    return _AllToAll.apply(payload, n_grad, send_splits, recv_splits, group)


def comm_device(group: Optional[dist.ProcessGroup], fallback: torch.device) -> torch.device:
    """Where the tensors of `group`'s collectives live: CUDA for nccl, CPU for gloo, the
    shared GPU in shared-GPU mode (collectives staged through the host); `fallback`
    without a process group."""
    if world_size(group) == 1:
        return fallback
    shared = staging.shared_device()
    if shared is not None and dist.get_backend(group) == "gloo":
        return shared
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
