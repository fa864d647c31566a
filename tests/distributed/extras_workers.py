"""Workers for the training extras of issue 18 (absgrad, depth loss, pose and appearance
optimization): `fn(ctx, *args) -> result`, plain CPU tensors back to the tests."""

from __future__ import annotations

from typing import Any, Dict, List

import torch

from distsplat.distributed import DistContext, distributed_rasterize
from scenes import PARAM_NAMES, case_layout, weighted_loss


def per_gaussian(meta: Dict[str, Any], field: torch.Tensor, n_all: int, offset: int, C: int) -> torch.Tensor:
    """A per-pair meta field ([M, 2] packed, [C, N, 2] dense) as [C, n_all, 2] in global ids."""
    field = field.detach().cpu()
    out = torch.zeros(C, n_all, 2, dtype=field.dtype)
    if meta["packed"]:
        out[meta["camera_ids"].cpu(), meta["gaussian_ids"].cpu() + offset] = field
    else:
        out[:, offset:offset + field.shape[1]] = field
    return out


def absgrad_cases(ctx: DistContext, names: List[str], seed: int) -> Dict[str, Any]:
    """Per case: this rank's absgrad and means2d gradient (global ids) for the weighted
    loss over its own cameras, rendered with absgrad=True."""
    out = {}
    for name in names:
        layout = case_layout(name, ctx.world_size)
        start, end = layout["bounds"][ctx.rank]
        params = [layout["gaussians"][k][start:end].clone().requires_grad_() for k in PARAM_NAMES]
        colors, alphas, meta = distributed_rasterize(
            *params, layout["viewmats"], layout["Ks"], 32, 24, layout["owner"],
            sh_degree=layout["sh_degree"], packed=layout["packed"], backend="torch", absgrad=True,
            **layout["render_kwargs"],
        )
        own = (layout["owner"] == ctx.rank).nonzero()[:, 0]
        weighted_loss(colors, alphas, own, seed).backward()
        n_all, C = layout["gaussians"]["means"].shape[0], layout["viewmats"].shape[0]
        out[name] = {"absgrad": per_gaussian(meta, meta["means2d"].absgrad, n_all, start, C),
                     "grad": per_gaussian(meta, meta["means2d"].grad, n_all, start, C),
                     "fields": meta["comm"]["payload_fields"]}
    return out


def train_count(ctx: DistContext, cfg) -> Dict[str, Any]:
    """Trains cfg (float32, as a user would) and returns the global Gaussian count."""
    import copy

    from distsplat.distributed import gather_counts
    from distsplat.train.trainer import Trainer

    trainer = Trainer(copy.deepcopy(cfg), ctx)
    try:
        trainer.setup()
        metrics = trainer.train()
        return {"n": sum(gather_counts(len(trainer.params["means"]), torch.device("cpu"))),
                "psnr": metrics.get("val_psnr")}
    finally:
        trainer.cleanup()
