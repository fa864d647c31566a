"""AbsGS's absolute 2D-mean gradient (arXiv:2404.10484; gsplat's `absgrad=True`): per
visible pair, the sum over pixels of |dL/d means2d| taken pixel by pixel, which, unlike
the summed gradient, does not cancel where a Gaussian's pixels pull in opposite directions.

Both backends report it the same way, as the gradient of a *sink*: an [M, 2] tensor of
zeros, handed to stage (b) next to the pairs, that the forward never reads. Its gradient
is the absgrad. Because the sink is an ordinary tensor in the autograd graph, the
distributed render carries it like any other payload field: two more columns forward
(zeros) and their gradient home in the same reverse all-to-all, no extra collective.
`attach_sink` builds the sink for the pairs of `project` and sets `.absgrad` on the
tensor a densification strategy reads (meta["means2d"]) during backward, as gsplat does.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import Tensor

from .pairs import Pairs


class PixelTap(torch.autograd.Function):
    """means2d [..., 2] -> [..., 2, P] broadcast over P pixels. Backward: the gradient of
    means2d is the sum over pixels (what broadcasting gives), the gradient of `sink` is the
    sum over pixels of its absolute value per component."""

    @staticmethod
    def forward(ctx, means2d: Tensor, sink: Tensor, pixels: int) -> Tensor:
        return means2d[..., None].expand(*means2d.shape, pixels).clone()

    @staticmethod
    def backward(ctx, grad: Tensor):  # grad [..., 2, P]
        return grad.sum(-1), grad.abs().sum(-1), None


class KernelBridge(torch.autograd.Function):
    """For gsplat's rasterize_to_pixels(absgrad=True), which sets `.absgrad` on the means2d
    it was given during its backward: the identity on means2d whose backward (run after the
    kernel's, which consumes its output) hands that attribute to `sink` as its gradient."""

    @staticmethod
    def forward(ctx, means2d: Tensor, sink: Tensor) -> Tensor:
        out = means2d.clone()
        ctx.holder = [out]  # keeps the Python object the kernel's backward sets .absgrad on
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        out = ctx.holder.pop()
        absgrad = getattr(out, "absgrad", None)
        return grad, (torch.zeros_like(grad) if absgrad is None else absgrad)


def attach_sink(
    pairs: Pairs, dense: Optional[Dict[str, Tensor]], meta_means2d: Tensor
) -> Tensor:
    """The [M, 2] zero sink of `pairs` (pairs of `project`; with packed=False, `dense` is
    its [C, N] projection). During backward its gradient lands as `meta_means2d.absgrad`
    ([M, 2] packed, [C, N, 2] dense), the shape of meta_means2d.grad. Starts at zero so a
    render whose pairs touch no pixel still has one."""
    ref = pairs.means2d
    meta_means2d.absgrad = torch.zeros_like(meta_means2d)

    def store(g: Tensor) -> None:
        meta_means2d.absgrad = g.detach()

    if dense is None:
        sink = ref.new_zeros(len(pairs), 2, requires_grad=True)  # [M, 2]
        sink.register_hook(store)
        return sink
    full = ref.new_zeros(meta_means2d.shape, requires_grad=True)  # [C, N, 2]
    full.register_hook(store)
    return full[pairs.camera_ids, pairs.gaussian_ids]  # [M, 2]
