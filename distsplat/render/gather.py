"""Per-pair gathers whose backward does not sort.

Projection turns per-Gaussian tensors into per-pair ones by indexing with the pairs'
Gaussian (or camera) ids: `x[ids]`. Autograd's backward of that indexing is an accumulating
`index_put_`, which on CUDA sorts the indices first (a radix sort of M int64 keys, every
step, for every gathered tensor). `gather_rows` gives the same forward with a backward that
is one `index_add_` into zeros (atomic adds on CUDA; on the CPU it adds in index order, as
`index_put_` does).
"""

from __future__ import annotations

import torch
from torch import Tensor


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, index: Tensor) -> Tensor:
        ctx.save_for_backward(index)
        ctx.rows = x.shape[0]
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (index,) = ctx.saved_tensors
        out = grad.new_zeros((ctx.rows,) + tuple(grad.shape[1:]))
        return out.index_add_(0, index, grad), None


def gather_rows(
    x: Tensor,  # [N, ...]
    index: Tensor,  # [M] int64 row ids into x
) -> Tensor:  # [M, ...]
    """x[index] along the first dimension; backward: index_add_ of the gradient rows."""
    if not (x.requires_grad and torch.is_grad_enabled()):
        return x.index_select(0, index)
    return _GatherRows.apply(x, index)
