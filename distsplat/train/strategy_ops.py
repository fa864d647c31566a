"""CPU paths for the two CUDA-only ops that gsplat's densification strategies call
(`quat_scale_to_covar_preci` in MCMC's position noise, `compute_relocation` in MCMC's
relocate/add), so `gsplat.strategy.DefaultStrategy` and `MCMCStrategy` run unchanged on
CPU ranks. `install()` swaps the names gsplat.strategy.ops looks up for dispatchers:
CUDA tensors still go to gsplat's kernels, others to the PyTorch versions here."""

from __future__ import annotations

from functools import lru_cache
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..render.gsplat_backend import ensure_gsplat_ops

_installed = False


def relocation_torch(
    opacities: Tensor,  # [N]
    scales: Tensor,  # [N, 3]
    ratios: Tensor,  # [N] how many Gaussians share the old one's mass
    binoms: Tensor,  # [n_max, n_max] binomial coefficients
) -> Tuple[Tensor, Tensor]:
    """Eq. 9 of 3DGS-as-MCMC (2404.09591), as gsplat's relocation kernel computes it:
    new opacity 1 - (1 - o)^(1/n), scales rescaled by o / sum_{i<=n} sum_{k<i}
    C(i-1, k) (-1)^k / sqrt(k+1) new_o^(k+1). Computed in float64."""
    n_max = binoms.shape[0]
    n = ratios.clamp(1, n_max).long()  # [N]
    o = opacities.double()
    new_o = 1.0 - torch.pow(1.0 - o, 1.0 / n.double())  # [N]
    # Swap the sums: sum_k (sum_{i=k+1..n} C(i-1, k)) (-1)^k / sqrt(k+1) new_o^(k+1).
    table = _binom_suffix_table(binoms.detach().double().cpu().numpy().tobytes(), n_max).to(o.device)
    k = torch.arange(n_max, dtype=torch.float64, device=o.device)
    sign = torch.where(k.long() % 2 == 0, 1.0, -1.0).to(o)
    terms = table[n] * sign / torch.sqrt(k + 1) * new_o[:, None] ** (k + 1)  # [N, n_max]
    coeff = o / terms.sum(1)
    return new_o.to(opacities.dtype), (coeff[:, None] * scales.double()).to(scales.dtype)


@lru_cache(maxsize=4)
def _binom_suffix_table(binoms_bytes: bytes, n_max: int) -> Tensor:
    """T[n, k] = sum_{i=k+1..n} C(i-1, k) for n in 0..n_max, k in 0..n_max-1."""
    import numpy as np

    binoms = torch.from_numpy(np.frombuffer(binoms_bytes, dtype=np.float64).reshape(n_max, n_max).copy())
    rows = torch.zeros(n_max + 1, n_max, dtype=torch.float64)
    for n in range(1, n_max + 1):
        rows[n] = rows[n - 1]
        rows[n, :n] += binoms[n - 1, :n]  # the i = n term: C(n-1, k) for k < n
    return rows


def _covar_preci_torch(
    quats: Tensor, scales: Tensor, compute_covar: bool = True, compute_preci: bool = True,
    triu: bool = False,
) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    from gsplat.cuda._torch_impl import _quat_scale_to_covar_preci

    return _quat_scale_to_covar_preci(quats, scales, compute_covar, compute_preci, triu)


def install() -> None:
    """Idempotent: make gsplat.strategy.ops fall back to PyTorch for non-CUDA tensors."""
    global _installed
    if _installed:
        return
    import gsplat.strategy.ops as ops

    cuda_covar, cuda_relocation = ops.quat_scale_to_covar_preci, ops.compute_relocation

    def quat_scale_to_covar_preci(quats, scales, *args, **kwargs):
        if quats.is_cuda:
            ensure_gsplat_ops()  # gsplat's kernels: prebuilt or built once, never by surprise
        fn = cuda_covar if quats.is_cuda else _covar_preci_torch
        return fn(quats, scales, *args, **kwargs)

    def compute_relocation(opacities, scales, ratios, binoms):
        if opacities.is_cuda:
            ensure_gsplat_ops()
        fn = cuda_relocation if opacities.is_cuda else relocation_torch
        return fn(opacities, scales, ratios, binoms)

    ops.quat_scale_to_covar_preci = quat_scale_to_covar_preci
    ops.compute_relocation = compute_relocation
    _installed = True
