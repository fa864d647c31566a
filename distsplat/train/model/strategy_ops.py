"""CPU paths for the two CUDA-only ops that gsplat's densification strategies call
(`quat_scale_to_covar_preci` in MCMC's position noise, `compute_relocation` in MCMC's
relocate/add), so `gsplat.strategy.DefaultStrategy` and `MCMCStrategy` run unchanged on
CPU ranks. `install()` has gsplat_compat route those names by device: CUDA tensors still
go to gsplat's kernels, others to the PyTorch versions here.

Also the default strategy's two growth ops with persistent Gaussian ids (gaussians.py;
used by strategies.DefaultStrategy): `duplicate_with_ids` (gsplat's duplicate, the copies
named by derived ids) and `split_with_ids` (gsplat's split, with its random offsets drawn
by id instead of from the rank's RNG: W-invariant)."""

from __future__ import annotations

from functools import lru_cache
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ...gsplat_compat import quat_scale_to_covar_preci_torch, route_strategy_ops_by_device, update_param_with_optimizer
from ...render.gsplat_backend import ensure_gsplat_ops
from .gaussians import DUPLICATE, SPLIT_A, SPLIT_B, derive_ids, normal_samples


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


def ids_of(state: dict, n: int, device: Optional[torch.device] = None) -> Tensor:
    """The state's Gaussian ids [n]; a state without them (None or absent: a strategy used
    on its own, one process) numbers its n Gaussians 0..n-1, the W=1 initial ids."""
    if state.get("uid") is None:
        state["uid"] = torch.arange(n, dtype=torch.int64, device=device)
    return state["uid"]


@torch.no_grad()
def duplicate_with_ids(params, optimizers, state: dict, mask: Tensor, step: int) -> None:
    """gsplat's duplicate (copies of the masked Gaussians appended, zero Adam moments, the
    strategy state copied); the originals keep their ids, the copies get derived ones."""
    from gsplat.strategy.ops import duplicate

    ids = state["uid"]  # [N]
    sel = torch.where(mask)[0]
    duplicate(params=params, optimizers=optimizers, state=state, mask=mask)
    state["uid"] = torch.cat([ids, derive_ids(ids[sel], step, DUPLICATE)])  # [N + n_sel]


@torch.no_grad()
def split_with_ids(params, optimizers, state: dict, mask: Tensor, step: int, seed: int,
                   revised_opacity: bool = False) -> None:
    """gsplat's split: each masked Gaussian is replaced by two, centred at its mean plus
    R diag(s) z (z ~ N(0, I), one draw per child), scales / 1.6, other parameters copied,
    zero Adam moments, appended after the kept rows (all first children, then all second).
    z comes from normal_samples(seed, step, id): a function of the Gaussian, not of the rank
    holding it. The children's ids are derived from (parent id, step, SPLIT_A / SPLIT_B)."""
    from gsplat.utils import normalized_quat_to_rotmat

    ids = state["uid"]  # [N]
    sel, rest = torch.where(mask)[0], torch.where(~mask)[0]
    scales = torch.exp(params["scales"][sel])  # [S, 3]
    rotmats = normalized_quat_to_rotmat(F.normalize(params["quats"][sel], dim=-1))  # [S, 3, 3]
    z = normal_samples(seed, step, ids[sel], 6).to(scales)  # [S, 6]: child a's xyz, child b's xyz
    z = z.reshape(-1, 2, 3).transpose(0, 1)  # [2, S, 3]
    offsets = torch.einsum("nij,nj,bnj->bni", rotmats, scales, z)  # [2, S, 3]

    def param_fn(name: str, p: Tensor) -> Tensor:
        if name == "means":
            p_split = (p[sel] + offsets).reshape(-1, 3)  # [2S, 3]
        elif name == "scales":
            p_split = torch.log(scales / 1.6).repeat(2, 1)  # [2S, 3]
        elif name == "opacities" and revised_opacity:  # arXiv:2404.06109: keep the pair's opacity
            p_split = torch.logit(1.0 - torch.sqrt(1.0 - torch.sigmoid(p[sel]))).repeat(2)
        else:
            p_split = p[sel].repeat([2] + [1] * (p.dim() - 1))
        return torch.nn.Parameter(torch.cat([p[rest], p_split]), requires_grad=p.requires_grad)

    def optimizer_fn(key: str, v: Tensor) -> Tensor:
        return torch.cat([v[rest], v.new_zeros((2 * len(sel), *v.shape[1:]))])

    update_param_with_optimizer(param_fn, optimizer_fn, params, optimizers)
    for k, v in state.items():
        if isinstance(v, Tensor) and k != "uid":
            state[k] = torch.cat([v[rest], v[sel].repeat([2] + [1] * (v.dim() - 1))])
    state["uid"] = torch.cat([ids[rest], derive_ids(ids[sel], step, SPLIT_A),
                              derive_ids(ids[sel], step, SPLIT_B)])  # [N + S]


def install() -> None:
    """Idempotent: make gsplat.strategy.ops fall back to PyTorch for non-CUDA tensors
    (gsplat's kernels, when used, prebuilt or built once, never by surprise)."""
    route_strategy_ops_by_device(quat_scale_to_covar_preci_torch, relocation_torch, ensure_gsplat_ops)
