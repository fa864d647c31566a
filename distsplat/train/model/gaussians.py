"""Gaussian parameters of one rank and their optimizers (docs/design.md: each rank holds a
contiguous chunk of the Gaussians, its parameters and optimizer state, nothing else).

Parameters are stored raw, as gsplat's simple_trainer stores them: means, log scales,
unnormalized quats, logit opacities, SH DC `sh0` [N, 1, 3] and rest `shN` [N, K-1, 3]; with
--app_opt (app_opt.py), as gsplat, appearance `features` [N, 32] and logit base `colors`
[N, 3] instead of sh0 and shN.
Initialization draws every random number for ALL Gaussians from one seeded generator and
then keeps this rank's rows, so W ranks start from exactly the W=1 model.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from ...render.checks import nonfinite

SH_C0 = 0.28209479177387814  # Y_0^0: colour = SH_C0 * sh0 + 0.5


def rgb_to_sh(rgb: Tensor) -> Tensor:
    return (rgb - 0.5) / SH_C0


def knn_mean_distance(points: np.ndarray, k: int = 3) -> np.ndarray:
    """sqrt of the mean squared distance of each point to its k nearest other points."""
    from scipy.spatial import cKDTree

    if len(points) < 2:
        return np.full(len(points), 0.01, dtype=np.float64)
    k_eff = min(k, len(points) - 1)
    d, _ = cKDTree(points).query(points, k=k_eff + 1)  # the first neighbour is the point
    d = d.reshape(len(points), -1)[:, 1:]
    return np.sqrt(np.maximum((d**2).mean(1), 1e-14))


def init_gaussians(
    points: Tensor,  # [N_all, 3] every initial point (SfM or random), same on every rank
    rgbs: Tensor,  # [N_all, 3] in [0, 1]
    sh_degree: int,
    bounds: Tuple[int, int],  # this rank's rows [start, end) of the N_all Gaussians
    *,
    init_opacity: float = 0.1,
    init_scale: float = 1.0,
    seed: int = 0,
    device: Optional[torch.device] = None,
    feature_dim: Optional[int] = None,
) -> torch.nn.ParameterDict:
    """gsplat's initialization (scales from the 3 nearest neighbours, random quats,
    constant opacity, colour in the SH DC term), of this rank's chunk only. feature_dim
    (--app_opt): uniform features [N, feature_dim] and logit colours instead of SH."""
    n_all = points.shape[0]
    start, end = bounds
    g = torch.Generator().manual_seed(seed)
    quats = torch.rand(n_all, 4, generator=g)[start:end]  # drawn for all, kept for ours
    dist = knn_mean_distance(points.double().cpu().numpy())[start:end]
    scales = torch.log(torch.from_numpy(dist).float() * init_scale)[:, None].repeat(1, 3)
    n = end - start
    k = (sh_degree + 1) ** 2
    params = {
        # a copy: a view would let Adam move the caller's points (on CPU, the Scene's own)
        "means": points[start:end].float().clone(),
        "scales": scales,
        "quats": quats,
        "opacities": torch.logit(torch.full((n,), init_opacity)),
    }
    if feature_dim is None:
        params.update(sh0=rgb_to_sh(rgbs[start:end].float())[:, None, :], shN=torch.zeros(n, k - 1, 3))
    else:  # drawn for all after the quats (the same values whatever W)
        params["features"] = torch.rand(n_all, feature_dim, generator=g)[start:end]
        # gsplat takes logit(rgb) as is: an SfM colour of 0 or 255 gives +-inf; 1e-3 keeps it finite
        params["colors"] = torch.logit(rgbs[start:end].float(), eps=1e-3)
    return torch.nn.ParameterDict(
        {name: torch.nn.Parameter(t.to(device) if device is not None else t) for name, t in params.items()}
    )


def random_points(n: int, extent: float, seed: int = 0) -> Tuple[Tensor, Tensor]:
    """gsplat's `--init_type random`: n points uniform in a cube of half-size extent."""
    g = torch.Generator().manual_seed(seed)
    points = extent * (torch.rand(n, 3, generator=g) * 2 - 1)
    return points, torch.rand(n, 3, generator=g)


def init_kind(init_type: str, num_points: int) -> str:
    """The initialisation to run, "sfm" or "random": --init_type, with auto resolved by whether
    the scene has sparse points; ValueError for an explicit sfm on a scene without them (the
    same on every rank)."""
    if init_type == "sfm" and num_points == 0:
        raise ValueError("--init_type sfm: the scene has no sparse points; use --init_type random (or auto, the "
                         "default: random points when the scene has none)")
    if init_type == "auto":
        return "sfm" if num_points else "random"
    return init_type


def init_line(init: str, num: int, extent: float, scale: float) -> str:
    """The log line of --init_type auto's choice."""
    if init == "sfm":
        return f"init: the scene's {num} SfM points (--init_type auto)"
    return (f"init: the scene has no SfM points: {num} random points in a cube of half-size {extent * scale:.3f} "
            f"(--init_extent {extent:g} x the cameras' extent {scale:.3f}; --init_type auto, --init_num_pts sets how many)")


# Base learning rates of gsplat's simple_trainer (means scaled by the scene size).
BASE_LRS = {
    "means": 1.6e-4, "scales": 5e-3, "quats": 1e-3, "opacities": 5e-2,
    "sh0": 2.5e-3, "shN": 2.5e-3 / 20,
    "features": 2.5e-3, "colors": 2.5e-3,  # --app_opt: gsplat gives both sh0's lr
}


def scaled_betas(B: int, betas: Tuple[float, float] = (0.9, 0.999)) -> Tuple[float, float]:
    """Adam's betas for a global batch of B images (create_optimizers)."""
    if 1 - B * (1 - betas[0]) > 1e-6:  # gsplat's scaling while it is a valid beta (0.1 at B = 9)
        return (1 - B * (1 - betas[0]), 1 - B * (1 - betas[1]))
    return (betas[0] ** B, betas[1] ** B)


def create_optimizers(
    params: torch.nn.ParameterDict,
    global_batch: int,
    scene_scale: float = 1.0,
    lrs: Optional[Dict[str, float]] = None,
    fused: Optional[bool] = None,
) -> Dict[str, torch.optim.Adam]:
    """One Adam per parameter (strategies replace rows of each), scaled with the GLOBAL
    batch size as gsplat does: lr * sqrt(B), eps 1e-15 / sqrt(B), betas 1 - B (1 - beta).
    Using the global batch keeps the update identical whatever W splits it. From B = 10,
    where that formula gives beta1 <= 0 (torch refuses it, and gsplat's own trainer stops),
    each beta is beta ** B instead: the decay of B one-image steps (Grendel-GS's scaling);
    4 GPUs x --batch_size 4 is B = 16.

    fused (default: on every device): torch's fused Adam, one kernel per parameter and step
    where the default (foreach) launches about seven; the same update up to rounding (on
    CPU about 1 ulp per step from torch's single-tensor loop). It is the one Adam that takes
    a `found_inf` on the device (adam_step: the divergence check skips a step without a
    host read). Its step counter lives on the parameter's device (checkpoint.load_rows_into
    puts it there). fused=False: torch's own choice (foreach on CUDA, the loop on CPU)."""
    lrs = {**BASE_LRS, **(lrs or {})}
    B = global_batch
    out = {}
    for name, p in params.items():
        lr = lrs[name] * (scene_scale if name == "means" else 1.0)
        use_fused = True if fused is None else fused
        out[name] = torch.optim.Adam(
            [{"params": [p], "lr": lr * math.sqrt(B), "name": name}],
            eps=1e-15 / math.sqrt(B),
            betas=scaled_betas(B),
            **({"fused": True} if use_fused else {}),  # not fused=False: that also turns foreach off
        )
    return out


def adam_step(optimizer: torch.optim.Optimizer, found_inf: Optional[Tensor] = None) -> None:
    """optimizer.step(), skipped on the device when `found_inf` ([] float32 on the params'
    device) is 1.0: GradScaler's protocol, which torch's fused Adam honours in its kernel
    (no update, moments untouched, its step count not advanced) without a host read. The
    optimizer must be fused when found_inf is given (torch's other Adams refuse it)."""
    if found_inf is None:
        optimizer.step()
        return
    optimizer.found_inf = found_inf
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf


def activated(params: torch.nn.ParameterDict, sh_degree: Optional[int] = None) -> Dict[str, Tensor]:
    """The renderer's inputs: positive scales, opacities in (0, 1), SH [N, K, 3], or with
    --app_opt features and base colour logits [N, 32 + 3] for app_opt.py's pair colours."""
    if "features" in params:
        colors = torch.cat([params["features"], params["colors"]], dim=1)  # [N, 35]
    else:
        colors = torch.cat([params["sh0"], params["shN"]], dim=1)  # [N, K, 3]
        if sh_degree is not None:
            colors = colors[:, : (sh_degree + 1) ** 2]
    return {
        "means": params["means"],
        "quats": params["quats"],
        "scales": torch.exp(params["scales"]),
        "opacities": torch.sigmoid(params["opacities"]),
        "colors": colors,
    }


# ------------------------------------------------------------------ Gaussian identities
# Every Gaussian carries a persistent int64 id (the strategy state's "uid" [N], with its
# chunk): its global index at initialization, and for a Gaussian born by densification
# a 64-bit hash of (parent id, step, child index). Ids are what makes densification
# W-invariant: the global ORDER of Gaussians depends on W (each rank appends its newborns
# at the end of its chunk, rebalancing moves rows), their ids do not. The split's random
# offsets are drawn from a counter-based hash of (seed, step, id, sample index), so they
# are the same whichever rank holds the Gaussian, in whatever order, on CPU or CUDA.
#
# The hash is splitmix64 (Steele et al., "Fast splittable pseudorandom number generators",
# 2014) on int64 tensors: torch's int64 add and multiply wrap modulo 2^64 on CPU and CUDA
# alike, which is the arithmetic splitmix64 is defined in; right shifts are made logical
# by masking (torch's >> on int64 is arithmetic).

def _i64(c: int) -> int:
    """A 64-bit unsigned constant as the int64 with the same bits."""
    return c - (1 << 64) if c >= 1 << 63 else c


_GOLDEN, _MIX1, _MIX2 = _i64(0x9E3779B97F4A7C15), _i64(0xBF58476D1CE4E5B9), _i64(0x94D049BB133111EB)
_CHILD_KEY, _NORMAL_KEY = 1, 2  # domain keys: ids and samples never share a hash stream
# Child indices of derive_ids, one per way a Gaussian is born (unique within one event).
DUPLICATE, SPLIT_A, SPLIT_B, RELOCATED, ADDED = 0, 1, 2, 3, 4


def _srl(x: Tensor, k: int) -> Tensor:
    """Logical right shift of int64 x by k (0 < k < 64)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def splitmix64(x: Tensor) -> Tensor:
    """splitmix64's output function of state x + golden gamma, elementwise on int64."""
    z = x + _GOLDEN
    z = (z ^ _srl(z, 30)) * _MIX1
    z = (z ^ _srl(z, 27)) * _MIX2
    return z ^ _srl(z, 31)


def hash_keys(*keys, device: Optional[torch.device] = None) -> Tensor:
    """One 64-bit hash per broadcast element of the int keys (ints or int64 tensors):
    h = splitmix64(... splitmix64(splitmix64(k0) ^ k1) ... ^ kn)."""
    h = None
    for k in keys:
        k = torch.as_tensor(k, dtype=torch.int64, device=device)
        h = splitmix64(k if h is None else h ^ k)
    return h


def initial_ids(bounds: Tuple[int, int], device: Optional[torch.device] = None) -> Tensor:
    """Ids of this rank's initial Gaussians [N]: their global indices [start, end)."""
    return torch.arange(bounds[0], bounds[1], dtype=torch.int64, device=device)


def derive_ids(parent: Tensor, step: int, child: int) -> Tensor:
    """Ids [N] of the Gaussians born at `step` from `parent` [N] as child number `child`:
    a function of (parent id, step, child) only, so every W names them alike."""
    return hash_keys(_CHILD_KEY, parent, step, child)


def normal_samples(seed: int, step: int, ids: Tensor, n: int) -> Tensor:
    """[N, n] float64 standard normal samples, sample j of row i a function of (seed, step,
    ids[i], j) only: two 53-bit uniforms from the hash, one Box-Muller normal."""
    j = torch.arange(n, dtype=torch.int64, device=ids.device)
    base = hash_keys(_NORMAL_KEY, seed, step, ids[:, None], device=ids.device)  # [N, 1]
    u1 = (_srl(hash_keys(base, 2 * j), 11) + 1).double() * 2.0**-53  # [N, n] in (0, 1]: log is finite
    u2 = _srl(hash_keys(base, 2 * j + 1), 11).double() * 2.0**-53  # [N, n] in [0, 1)
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)


def to_float_rows(v: Tensor) -> Tensor:
    """Per-Gaussian state [N, ...] as float32 rows that travel exactly with float payloads
    (rebalancing's move_rows): floats as float32, int64 ids as four 16-bit pieces [N, 4]
    (exact in float32 and float64)."""
    if v.dtype != torch.int64:
        return v.float()
    return torch.stack([_srl(v, 16 * i) & 0xFFFF for i in range(4)], dim=-1).float()


def from_float_rows(x: Tensor, dtype: torch.dtype) -> Tensor:
    """Inverse of to_float_rows for state of `dtype`."""
    if dtype != torch.int64:
        return x.to(dtype)
    pieces = x.round().long()  # [N, 4]
    return sum(pieces[:, i] << (16 * i) for i in range(4))


def check_finite_params(params: Dict[str, Tensor], source: str) -> None:
    """Raises ValueError naming the parameters that hold NaN or Inf and where they came from
    (`source`: the initial points, a checkpoint). The trainer checks its parameters where
    they change (here at setup and resume; after each step the divergence guard), not in
    every render. One host read."""
    bad = nonfinite(list(params.items()))
    if bad:
        raise ValueError(f"{source} holds NaN or Inf values in {', '.join(bad)}; "
                         "check the input (a damaged file, or a diverged run's state)")
