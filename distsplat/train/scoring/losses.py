"""Photometric losses and metrics of the trainer: L1, SSIM (3DGS's 11x11 Gaussian window,
sigma 1.5, zero padding, mean over all pixels) and PSNR. Images are [B, H, W, 3] in [0, 1],
as the renderer returns them. Sums are returned alongside means where the distributed
trainer needs exact reductions across ranks (a mean of per-rank means is not W-invariant).

The training loss's SSIM has two implementations of the same definition (--ssim_impl):
`torch` (ssim_map below: two batched convolutions and a few dozen elementwise kernels, each
with its backward) and `fused`, fused-ssim's CUDA kernels (rahul-goel/fused-ssim, the loss
gsplat's own trainer uses: one kernel forward, one backward; an optional package, CUDA and
float32 only). On a GPU step bound by the host launching kernels, the fused one launches far
fewer. tests/cuda checks that both give the same loss and gradient."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

SSIM_WINDOW = 11
SSIM_SIGMA = 1.5
SSIM_C1 = 0.01**2
SSIM_C2 = 0.03**2


@lru_cache(maxsize=8)
def _gauss_1d(dtype: torch.dtype, device: torch.device) -> Tensor:
    x = torch.arange(SSIM_WINDOW, dtype=torch.float64) - SSIM_WINDOW // 2
    g = torch.exp(-(x**2) / (2 * SSIM_SIGMA**2))
    return (g / g.sum()).to(dtype=dtype, device=device)


def _blur(x: Tensor) -> Tensor:
    """Separable Gaussian blur with zero padding; x [B*3, 1, H, W]."""
    g = _gauss_1d(x.dtype, x.device)
    pad = SSIM_WINDOW // 2
    x = F.conv2d(x, g.view(1, 1, 1, -1), padding=(0, pad))
    return F.conv2d(x, g.view(1, 1, -1, 1), padding=(pad, 0))


def ssim_map(img1: Tensor, img2: Tensor) -> Tensor:
    """Per-pixel SSIM of [B, H, W, C] images -> [B, H, W, C]."""
    if img1.shape != img2.shape or img1.dim() != 4:
        raise ValueError(f"ssim: images must both be [B, H, W, C], got {tuple(img1.shape)} and {tuple(img2.shape)}")
    B, H, W, C = img1.shape
    a = img1.permute(0, 3, 1, 2).reshape(B * C, 1, H, W)
    b = img2.permute(0, 3, 1, 2).reshape(B * C, 1, H, W)
    # The five blurs in one batch: two convolutions instead of ten (and their backward).
    mu1, mu2, e11, e22, e12 = _blur(torch.cat([a, b, a * a, b * b, a * b])).chunk(5)
    s11 = e11 - mu1 * mu1
    s22 = e22 - mu2 * mu2
    s12 = e12 - mu1 * mu2
    num = (2 * mu1 * mu2 + SSIM_C1) * (2 * s12 + SSIM_C2)
    den = (mu1 * mu1 + mu2 * mu2 + SSIM_C1) * (s11 + s22 + SSIM_C2)
    return (num / den).reshape(B, C, H, W).permute(0, 2, 3, 1)


def ssim(img1: Tensor, img2: Tensor) -> Tensor:
    """Mean SSIM over all pixels and channels of [B, H, W, C] images."""
    return ssim_map(img1, img2).mean()


def ssim_eval(img1: Tensor, img2: Tensor) -> Tensor:
    """SSIM per image of [B, H, W, C] images -> [B], as gsplat reports it (torchmetrics'
    StructuralSimilarityIndexMeasure(data_range=1.0)): the same window, but the images are
    reflect-padded instead of zero-padded, so the border pixels are not pulled towards 0
    (zero padding is what the training loss uses, as 3DGS does). Padding by half the window
    and cropping it again leaves every kept pixel's window inside the reflected image."""
    pad = SSIM_WINDOW // 2
    if min(img1.shape[1:3]) <= pad:
        raise ValueError(f"ssim_eval: images of {tuple(img1.shape[1:3])} pixels are too small to reflect-pad by {pad}")
    a, b = (F.pad(x.permute(0, 3, 1, 2), (pad, pad, pad, pad), mode="reflect").permute(0, 2, 3, 1)
            for x in (img1, img2))
    return ssim_map(a, b)[:, pad:-pad, pad:-pad].flatten(1).mean(1)


def psnr(img1: Tensor, img2: Tensor) -> Tensor:
    """PSNR per image of [B, H, W, C] images in [0, 1] -> [B]."""
    mse = ((img1 - img2) ** 2).flatten(1).mean(1)
    return -10.0 * torch.log10(mse.clamp_min(1e-20))


FUSED_SSIM_INSTALL = "pip install git+https://github.com/rahul-goel/fused-ssim"


def fused_ssim_fn() -> Optional[Callable[..., Tensor]]:
    """fused-ssim's `fused_ssim(img1, img2, padding, train)` ([B, C, H, W] float32 CUDA images
    -> the mean of the SSIM map; padding "same": zero padding, as ssim_map), or None when the
    package (or its compiled extension) cannot be imported."""
    try:
        from fused_ssim import fused_ssim
    except (ImportError, OSError):
        return None
    return fused_ssim


def resolve_ssim_impl(choice: str, device: torch.device, note: Optional[Callable[..., None]] = None) -> str:
    """--ssim_impl -> "fused" or "torch". auto: fused on a CUDA device when fused-ssim is
    installed, else torch; fused where it cannot run is a ValueError naming the flag. On a
    CUDA device, `note` (e.g. rank 0's log.info) is told which one trains."""
    if choice not in ("auto", "fused", "torch"):
        raise ValueError(f"--ssim_impl: must be auto, fused or torch, got {choice!r}")
    on_cuda = torch.device(device).type == "cuda"
    impl = "fused" if choice != "torch" and on_cuda and fused_ssim_fn() is not None else "torch"
    if choice == "fused" and impl != "fused":
        why = (f"fused-ssim is not installed ({FUSED_SSIM_INSTALL})" if on_cuda
               else f"fused-ssim's kernels need a CUDA device, this rank trains on {device}")
        raise ValueError(f"--ssim_impl fused: {why}; use --ssim_impl torch (or auto, which picks fused where it can)")
    if note is not None and on_cuda:
        note("training SSIM: %s", "fused-ssim's CUDA kernels" if impl == "fused" else
             "PyTorch convolutions (--ssim_impl torch)" if choice == "torch" else
             f"PyTorch convolutions: fused-ssim is not installed (with it a step launches fewer kernels: "
             f"{FUSED_SSIM_INSTALL})")
    return impl


def photometric_loss(render: Tensor, target: Tensor, ssim_lambda: float, ssim_impl: str = "torch") -> Tensor:
    """3DGS's loss for [B, H, W, 3] images, summed over the B images (each image's loss is
    its own mean), so that dividing by the global batch gives the mean over the batch
    whatever rank holds which image: (1 - l) L1 + l (1 - SSIM). ssim_impl "fused"
    (resolve_ssim_impl) takes the SSIM from fused-ssim (float32 CUDA images): the B images
    have one size, so the sum of their means is B times the mean over all of them."""
    if render.shape[0] == 0:
        return render.sum()  # keeps the graph: the distributed backward needs every rank
    l1 = (render - target).abs().flatten(1).mean(1)  # [B]
    if ssim_impl == "fused":
        mean = fused_ssim_fn()(render.permute(0, 3, 1, 2), target.permute(0, 3, 1, 2), padding="same")
        return (1.0 - ssim_lambda) * l1.sum() + ssim_lambda * render.shape[0] * (1.0 - mean)
    dssim = 1.0 - ssim_map(render, target).flatten(1).mean(1)  # [B]
    return ((1.0 - ssim_lambda) * l1 + ssim_lambda * dssim).sum()


def psnr_from_mse(mse: float) -> float:
    return -10.0 * math.log10(max(mse, 1e-20))
