"""Workers for the staged path of shared-GPU mode (distsplat/distributed/staging.py).

One worker serves two tests: on CPU ranks it forces staging (tests/distributed/
test_shared_gpu.py), on ranks that share one GPU in shared-GPU mode it stages for real
(tests/cuda/test_shared_gpu_cuda.py). Everything returned is on the CPU; the tests compare
it with one-process references computed in the parent.
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch

from distsplat.distributed import (
    DistContext, all_reduce_max, all_reduce_sum, broadcast, chunk_bounds, distributed_rasterize,
    gather_counts, move_rows, raise_together, staging,
)
from scenes import PARAM_NAMES, WIDTH, HEIGHT, camera_weights, case_layout, dense_means2d_grad

DTYPES = {"float64": torch.float64, "float32": torch.float32}


def device_loss(colors: torch.Tensor, alphas: torch.Tensor, cameras: torch.Tensor, seed: int) -> torch.Tensor:
    """scenes.weighted_loss with its weights on the renders' device and dtype."""
    wc = camera_weights(seed, cameras, tuple(colors.shape[1:])).to(colors)
    wa = camera_weights(seed + 500, cameras, tuple(alphas.shape[1:])).to(alphas)
    return (wc * colors).sum() + (wa * alphas).sum()


def case_inputs(name: str, W: int, device: torch.device, dtype: torch.dtype) -> Dict[str, Any]:
    """case_layout on `device` in `dtype` (the parent's reference uses the same)."""
    layout = case_layout(name, W)
    move = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
    layout["gaussians"] = {k: move(v) for k, v in layout["gaussians"].items()}
    layout["viewmats"], layout["Ks"] = move(layout["viewmats"]), move(layout["Ks"])
    kw = dict(layout["render_kwargs"])
    if "backgrounds" in kw:
        kw["backgrounds"] = move(kw["backgrounds"])
    layout["render_kwargs"] = kw
    return layout


def _case(ctx: DistContext, name: str, seed: int, backend: str, dtype: torch.dtype) -> Dict[str, Any]:
    W, me = ctx.world_size, ctx.rank
    layout = case_inputs(name, W, ctx.device, dtype)
    start, end = layout["bounds"][me]
    params = [layout["gaussians"][k][start:end].clone().requires_grad_() for k in PARAM_NAMES]
    owner = layout["owner"].to(ctx.device)
    s0 = staging.host_syncs()
    colors, alphas, meta = distributed_rasterize(
        *params, layout["viewmats"], layout["Ks"], WIDTH, HEIGHT, owner,
        sh_degree=layout["sh_degree"], packed=layout["packed"], backend=backend,
        **layout["render_kwargs"],
    )
    s1 = staging.host_syncs()
    own = (layout["owner"] == me).nonzero()[:, 0]
    device_loss(colors, alphas, own, seed).backward()
    s2 = staging.host_syncs()
    n_all, C = layout["gaussians"]["means"].shape[0], layout["viewmats"].shape[0]
    return {
        "own": own, "colors": colors.detach().cpu(), "alphas": alphas.detach().cpu(),
        "grads": [p.grad.cpu() if p.grad is not None else torch.zeros_like(p).cpu() for p in params],
        "means2d_grad": dense_means2d_grad(meta, n_all, start, C),
        "syncs": (s1 - s0, s2 - s1), "comm": meta["comm"],
        "devices": {"colors": str(colors.device), "grad": str(params[0].grad.device)
                    if params[0].grad is not None else None},
    }


def _helpers(ctx: DistContext) -> Dict[str, Any]:
    """The context helpers, raise_together and move_rows through the same path."""
    W, me, dev = ctx.world_size, ctx.rank, ctx.device
    v = torch.arange(4, dtype=torch.float64, device=dev) + 10.0 * me  # [4]
    out: Dict[str, Any] = {
        "sum": all_reduce_sum(v).cpu(), "max": all_reduce_max(v).cpu(),
        "broadcast": broadcast(v.clone(), src=W - 1).cpu(), "v_after": v.cpu(),
    }
    raise_together(ctx, None)  # nobody failed: returns
    try:
        raise_together(ctx, ValueError("bad flag on rank 0") if me == 0 else None)
        out["raised"] = None
    except ValueError as e:
        out["raised"] = str(e)
    n_all = 10
    start, end = chunk_bounds(n_all, W)[me]
    rows = {"x": torch.arange(start, end, dtype=torch.float32, device=dev)[:, None].repeat(1, 2)}
    counts = gather_counts(end - start, dev)
    target = [(0, n_all)] + [(n_all, n_all)] * (W - 1)  # everything to rank 0
    moved = move_rows(rows, counts, target)
    out["counts"], out["moved"] = counts, moved["x"].cpu()
    out["moved_device"] = str(moved["x"].device)
    return out


def staged_cases(ctx: DistContext, names: List[str], seed: int, backend: str, dtype: str) -> Dict[str, Any]:
    """Each case's renders, gradients and host-sync counts through the staged path, then
    the helpers. On CPU ranks staging is forced (there is no shared GPU)."""
    forced = ctx.device.type == "cpu"
    staging._force_staging = forced
    try:
        assert staging.staged(), "the collectives must go through host memory here"
        out: Dict[str, Any] = {name: _case(ctx, name, seed, backend, DTYPES[dtype]) for name in names}
        out["_helpers"] = _helpers(ctx)
        out["_context"] = {"device": str(ctx.device), "backend": ctx.backend,
                           "shared_gpu": ctx.shared_gpu, "forced": forced}
    finally:
        staging._force_staging = False
    return out
