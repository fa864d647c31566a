"""gsplat's private API behind one seam (issue 31, point 6; docs/design.md, layers).

distsplat uses gsplat's public API (`gsplat.fully_fused_projection`, `gsplat.strategy`'s
strategies and ops, ...) anywhere, and gsplat's internals only here:

- its pure-torch reference pieces (`gsplat.cuda._torch_impl`): SH, SH bases, covariances;
- the strategies' private steps, which our strategies replace (train/model/strategies.py): the
  default strategy's `_update_state` / `_grow_gs` and MCMC's `_add_new_gs` call public-named
  hooks here, and the rules of gsplat's own steps we must predict (MCMC's growth, its dead
  Gaussians) are written here;
- the CPU fallbacks of `gsplat.strategy.ops` (its two CUDA-only names, rebound per device)
  and its `_update_param_with_optimizer`;
- the module of gsplat's compiled ops, `gsplat.cuda._backend` (render/gsplat_ext.py).

These change between gsplat versions (gsplat's main branch already changed `_grow_gs`'s
signature), so the versions they were written against are pinned in pyproject.toml and
listed in SUPPORTED_GSPLAT (a test holds the two equal): importing this module with any
other gsplat raises ImportError naming both. A new gsplat version is supported by checking
this module against it, then adding it to both lists.

Below every layer, as profiling.py: any layer may import it; it imports nothing of distsplat.
Importing gsplat needs no CUDA and builds nothing."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import gsplat
import torch
from torch import Tensor

SUPPORTED_GSPLAT = ("1.5.3",)  # == the pin of pyproject.toml


def check_gsplat_version(installed: str) -> None:
    """ImportError unless `installed` (gsplat.__version__; a local suffix such as
    "+pt24cu124" of a prebuilt wheel ignored) is a supported version."""
    if installed.split("+")[0] not in SUPPORTED_GSPLAT:
        supported = " or ".join(SUPPORTED_GSPLAT)
        raise ImportError(
            f"distsplat supports gsplat {supported} (pinned in pyproject.toml), but gsplat {installed} "
            f"is installed; distsplat relies on gsplat internals (distsplat/gsplat_compat.py) that other "
            f"versions change. Install a supported one: pip install gsplat=={SUPPORTED_GSPLAT[-1]}")


check_gsplat_version(getattr(gsplat, "__version__", "unknown"))

# Only after the check: another version may lack these names.
from gsplat.cuda._torch_impl import _eval_sh_bases_fast, _quat_scale_to_covar_preci, _spherical_harmonics  # noqa: E402
from gsplat.strategy import DefaultStrategy as _GsplatDefaultStrategy  # noqa: E402
from gsplat.strategy import MCMCStrategy as _GsplatMCMCStrategy  # noqa: E402
from gsplat.strategy.ops import _update_param_with_optimizer  # noqa: E402

__all__ = [
    "SUPPORTED_GSPLAT", "check_gsplat_version",
    "spherical_harmonics_torch", "sh_bases_torch", "quat_scale_to_covar_preci_torch",
    "update_param_with_optimizer", "route_strategy_ops_by_device",
    "DefaultStrategyBase", "MCMCStrategyBase",
    "BACKEND_MODULE", "loaded_backend", "install_backend", "backend_ops",
]


# ---- gsplat's pure-torch reference pieces (gsplat.cuda._torch_impl) ----

def spherical_harmonics_torch(
    degree: int,
    dirs: Tensor,  # [..., 3] unnormalised
    coeffs: Tensor,  # [..., K, 3]
) -> Tensor:
    """[..., 3] the SH colour of each direction, as gsplat's kernels evaluate it (no +0.5)."""
    return _spherical_harmonics(degree, dirs, coeffs)


def sh_bases_torch(
    K: int,
    dirs: Tensor,  # [..., 3] unit
) -> Tensor:
    """[..., K] gsplat's real SH bases (row vectors) of unit directions."""
    return _eval_sh_bases_fast(K, dirs)


def quat_scale_to_covar_preci_torch(
    quats: Tensor,  # [N, 4]
    scales: Tensor,  # [N, 3]
    compute_covar: bool = True,
    compute_preci: bool = True,
    triu: bool = False,
) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """Covariances and precisions [N, 3, 3] (or [N, 6] triu), gsplat's CUDA op's signature."""
    return _quat_scale_to_covar_preci(quats, scales, compute_covar, compute_preci, triu)


# ---- gsplat.strategy.ops ----

def update_param_with_optimizer(
    param_fn: Callable[[str, Tensor], Tensor],
    optimizer_fn: Callable[[str, Tensor], Tensor],
    params: Dict[str, torch.nn.Parameter],
    optimizers: Dict[str, torch.optim.Optimizer],
) -> None:
    """gsplat's helper: every parameter replaced by param_fn(name, p), its optimizer state
    tensors by optimizer_fn(key, v) (rows kept in step)."""
    _update_param_with_optimizer(param_fn, optimizer_fn, params, optimizers)


_routed = False


def route_strategy_ops_by_device(
    covar_torch: Callable[..., Tuple[Optional[Tensor], Optional[Tensor]]],
    relocation_torch: Callable[[Tensor, Tensor, Tensor, Tensor], Tuple[Tensor, Tensor]],
    before_cuda: Callable[[], Any],
) -> None:
    """Idempotent: the two CUDA-only names gsplat.strategy.ops calls (`quat_scale_to_covar_preci`
    in MCMC's position noise, `compute_relocation` in its relocate/add) become dispatchers:
    CUDA tensors go to gsplat's kernels (after `before_cuda()`, which loads them), others to
    the given torch functions of the same signatures. gsplat 1.5.3's ops look these names up
    in their module's globals at each call, which is what makes rebinding them work."""
    global _routed
    if _routed:
        return
    import gsplat.strategy.ops as ops

    cuda_covar, cuda_relocation = ops.quat_scale_to_covar_preci, ops.compute_relocation

    def quat_scale_to_covar_preci(quats, scales, *args, **kwargs):
        if quats.is_cuda:
            before_cuda()
        fn = cuda_covar if quats.is_cuda else covar_torch
        return fn(quats, scales, *args, **kwargs)

    def compute_relocation(opacities, scales, ratios, binoms):
        if opacities.is_cuda:
            before_cuda()
        fn = cuda_relocation if opacities.is_cuda else relocation_torch
        return fn(opacities, scales, ratios, binoms)

    ops.quat_scale_to_covar_preci = quat_scale_to_covar_preci
    ops.compute_relocation = compute_relocation
    _routed = True


# ---- the strategies' private steps, under our names ----

@dataclass
class DefaultStrategyBase(_GsplatDefaultStrategy):
    """gsplat's DefaultStrategy whose private steps, called by its `step_post_backward`, call
    hooks a subclass overrides: `update_state` (the running statistics) and `grow` (duplicate
    and split). The hooks' defaults are gsplat's own steps."""

    def update_state(self, params, state: Dict[str, Any], info: Dict[str, Any], packed: bool = False) -> None:
        _GsplatDefaultStrategy._update_state(self, params, state, info, packed=packed)

    def grow(self, params, optimizers, state: Dict[str, Any], step: int) -> Tuple[int, int]:
        """(Gaussians duplicated, Gaussians split)."""
        return _GsplatDefaultStrategy._grow_gs(self, params, optimizers, state, step)

    def _update_state(self, params, state, info, packed=False):
        return self.update_state(params, state, info, packed=packed)

    def _grow_gs(self, params, optimizers, state, step):
        return self.grow(params, optimizers, state, step)


@dataclass
class MCMCStrategyBase(_GsplatMCMCStrategy):
    """gsplat's MCMCStrategy whose private adding step calls the hook `add_new` (default:
    gsplat's), and the rules of its refine step a subclass predicts: how many Gaussians it
    adds (`n_to_add`) and which it relocates (`dead_mask`)."""

    def n_to_add(self, n: int) -> int:
        """Gaussians gsplat's adding step appends to n: up to 5% more, capped at cap_max."""
        return max(0, min(self.cap_max, int(1.05 * n)) - n)

    def dead_mask(self, params) -> Tensor:
        """[N] the Gaussians gsplat's relocation moves (opacity at most min_opacity)."""
        return torch.sigmoid(params["opacities"].flatten()) <= self.min_opacity

    def add_new(self, params, optimizers, binoms: Tensor) -> int:
        """Gaussians added (gsplat's: n_to_add of them, sampled by opacity)."""
        return _GsplatMCMCStrategy._add_new_gs(self, params, optimizers, binoms)

    def _add_new_gs(self, params, optimizers, binoms):
        return self.add_new(params, optimizers, binoms)


# ---- the module of gsplat's compiled ops (render/gsplat_ext.py) ----

BACKEND_MODULE = "gsplat.cuda._backend"  # gsplat's `_wrapper` imports `_C` from it, lazily, per call


def loaded_backend() -> Optional[types.ModuleType]:
    """gsplat's ops module if something imported or installed it, else None."""
    return sys.modules.get(BACKEND_MODULE)


def install_backend(ext: Any, file: str, doc: str) -> None:
    """Makes gsplat's `from ._backend import _C` return `ext`, without running gsplat's
    _backend.py (whose import starts the JIT build)."""
    existing = loaded_backend()
    if existing is not None:
        # gsplat's _backend already ran (and found no ops): its `_C` is read per call.
        existing._C = ext
        return
    mod = types.ModuleType(BACKEND_MODULE, doc)
    mod._C = ext
    mod.__file__ = file
    mod.__all__ = ["_C"]
    sys.modules[BACKEND_MODULE] = mod
    import gsplat.cuda  # does not import _backend (its ops are imported lazily)

    gsplat.cuda._backend = mod


def backend_ops() -> Any:
    """gsplat's compiled ops (`_C`, None when it could not build them), by gsplat's own route:
    importing _backend, which JIT-builds them (or finds the cached build) the first time."""
    import gsplat.cuda._backend as backend

    return backend._C
