"""Evaluation on the test cameras: each rank renders (with the distributed render) only
the test cameras it owns and scores them against its own images; per-image PSNR, SSIM
(as gsplat reports it: losses.ssim_eval) and LPIPS land in a matrix indexed by test
camera, summed across ranks (every other entry is zero, so the sum is exact), and
averaged in the same order on every rank, so the metrics do not depend on the number of
ranks."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from ...distributed import DistContext, all_reduce_sum, chunk_bounds, distributed_rasterize
from .color_correct import color_correct
from .losses import psnr, ssim_eval
from .metrics import CC_METRICS, METRICS, render_name, report_eval
from .lpips import load_lpips, ready_lpips, short_lpips_note
from ..files.atomic import write_json
from ..files.outputs import memory_gb, save_image
from ..model.size_groups import size_groups

log = logging.getLogger("distsplat.train.trainer")  # the trainer's log lines, as before the split

NUM_RENDERS = 4  # test images saved side by side (ground truth | render) at each evaluation


def test_owners(n_test: int, world_size: int) -> List[Tuple[int, int]]:
    """Test camera positions [start, end) owned by each rank (fixed for the run)."""
    return chunk_bounds(n_test, world_size)


@torch.no_grad()
def evaluate(
    render_args: Callable[[], Dict[str, Tensor]],  # the activated Gaussians (local chunk)
    viewmats: Tensor,  # [C_test, 4, 4] all test cameras
    Ks: Tensor,  # [C_test, 3, 3]
    width: Union[int, Sequence[int]],  # the test images' width, or each one's [C_test]
    height: Union[int, Sequence[int]],
    read_image: Callable[[int], Tensor],  # test position -> [H, W, 3] float (own cameras only)
    names: Sequence[str],  # [C_test]
    ctx: DistContext,
    sh_degree: int,
    render_kwargs: Dict,  # may hold sh_degree / pair_colors (--app_opt), which win
    renders_dir: Path,
    step: int,
    save_renders: int = 4,
    lpips: Optional[Callable[[Tensor, Tensor], Tensor]] = None,  # [B, H, W, 3] x2 -> [B]
    color_corrected: bool = False,  # also CC_METRICS (--use_bilateral_grid, as gsplat)
) -> Tuple[Dict[str, float], Dict[str, np.ndarray]]:
    """Returns the mean metrics and the per-image ones ({metric: [C_test]}, on every rank).
    Without `lpips`, its mean and per-image values are NaN."""
    n_test = viewmats.shape[0]
    if n_test == 0:
        return {}, {}
    t0 = time.perf_counter()
    bounds = test_owners(n_test, ctx.world_size)
    rounds = max(end - start for start, end in bounds)
    names_ = METRICS + (CC_METRICS if color_corrected else ())
    scores = torch.zeros(len(names_), n_test, dtype=torch.float64, device=viewmats.device)
    g = render_args()
    widths = np.broadcast_to(np.asarray(width, dtype=np.int64), (n_test,))
    heights = np.broadcast_to(np.asarray(height, dtype=np.int64), (n_test,))
    for j in range(rounds):
        # One camera per rank per round (ranks whose share ran out render none), one render
        # per image size among them, in the same order on every rank (size_groups.py).
        pos = [start + j for start, end in bounds if start + j < end]
        owner = [r for r, (start, end) in enumerate(bounds) if start + j < end]
        for grp in size_groups(widths[pos], heights[pos], owner, ctx.rank):
            at = [pos[i] for i in grp.positions.tolist()]
            colors, _, _ = distributed_rasterize(
                g["means"], g["quats"], g["scales"], g["opacities"], g["colors"],
                viewmats[at], Ks[at], grp.width, grp.height,
                grp.owner,  # host ints: no device copy
                **{"sh_degree": sh_degree, **render_kwargs},  # render_kwargs may set the colour model
            )
            if not grp.own:
                continue
            p = pos[owner.index(ctx.rank)]
            render = colors[0].clamp(0, 1)
            gt = read_image(p)
            scores[0, p] = psnr(render[None], gt[None])[0].double()
            scores[1, p] = ssim_eval(render[None], gt[None])[0].double()
            if lpips is not None:
                scores[2, p] = lpips(render[None], gt[None])[0].double()
            if color_corrected:  # the render's colours fitted to the ground truth's, then scored alike
                cc = color_correct(render, gt)
                scores[3, p] = psnr(cc[None], gt[None])[0].double()
                scores[4, p] = ssim_eval(cc[None], gt[None])[0].double()
                if lpips is not None:
                    scores[5, p] = lpips(cc[None], gt[None])[0].double()
            if p < save_renders:
                save_image(render_name(renders_dir, step, names[p]), torch.cat([gt, render], 1))
    scores = all_reduce_sum(scores).cpu().numpy()  # [3 or 6, C_test]
    if lpips is None:
        scores[2::3] = np.nan
    stats = {k: float(np.mean(scores[i])) for i, k in enumerate(names_)}
    stats.update(eval_time=time.perf_counter() - t0, num_test_images=n_test)
    return stats, {k: scores[i] for i, k in enumerate(names_)}


class Evaluator:
    """A run's evaluation at a step (every rank calls it): LPIPS loaded in setup (bad
    --lpips_* files are setup's errors), its missing weights fetched once before the first
    evaluation (`ready`: a download waits on the node's other ranks), then `evaluate` of the
    Gaussians it is given on this rank's test cameras, the rank's train stats and rank 0's report
    (metrics.py). It holds what it scores against (the scene, the test cameras, this rank's
    images), never the trainer."""

    def __init__(self, cfg: Any, ctx: DistContext, device: torch.device, scene: Any, test_idx: Tensor,
                 Ks: Tensor, cache: Any, result_dir: Path):
        self.cfg, self.ctx, self.device = cfg, ctx, device
        self.scene, self.test_idx, self.Ks, self.cache = scene, test_idx, Ks, cache  # [C_test], [C_all, 3, 3]
        self.result_dir = Path(result_dir)
        self.min_side = int(min(scene.widths.min(), scene.heights.min()))
        self.lpips, self.lpips_note = load_lpips(cfg.lpips_net, cfg.lpips_weights, cfg.lpips_heads, device,
                                                 min_side=self.min_side)
        self.lpips_skipped = None if self.lpips is not None else self.lpips_note
        self._ready = False

    def ready(self) -> None:
        """Once, before the first evaluation (every rank calls it): lpips.ready_lpips fetches
        missing weights and agrees on every rank whether LPIPS is computed; rank 0 says so."""
        if self._ready or len(self.test_idx) == 0:  # no test cameras: nothing to score
            return
        self._ready = True
        cfg = self.cfg
        self.lpips, note = ready_lpips(self.ctx, cfg.lpips_net, cfg.lpips_weights, cfg.lpips_heads, self.device,
                                       self.min_side, self.lpips, self.lpips_note, log.info)
        self.lpips_skipped = None if self.lpips is not None else note
        if self.ctx.is_main:  # a skip's full advice goes into val_stepNNNN.json; the log keeps one short line
            log.info("%s", note if self.lpips is not None else short_lpips_note(note))

    def __call__(self, step: int, elapsed: Optional[float], gaussians: Callable[[], Dict[str, Tensor]],
                 render_kwargs: Dict[str, Any], n_all: int, n_local: int, tb: Any = None,
                 train_metrics: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """The stats at `step` (elapsed None: --eval_only) of `gaussians` (this rank's activated
        chunk of `n_local` of the `n_all` Gaussians), rendered with `render_kwargs` (colour model
        included); `train_metrics`: the run's work balance, copied into the rank's train stats."""
        ctx, device, sh, scene, test_idx = self.ctx, self.device, self.cfg.sh_degree, self.scene, self.test_idx
        self.ready()
        test = test_idx.to(device)
        idx = test_idx.numpy()

        def read(pos: int) -> Tensor:
            cam = int(test_idx[pos])
            out = np.empty((scene.heights[cam], scene.widths[cam], 3), dtype=np.uint8)
            self.cache.read_into(cam, out)
            return torch.from_numpy(out).to(device).float() / 255.0

        names = [scene.names[i] for i in test_idx.tolist()]
        stats, per_image = evaluate(
            gaussians, scene.viewmats(idx, device).to(self.Ks.dtype), self.Ks[test],
            scene.widths[idx], scene.heights[idx], read, names, ctx,
            sh, render_kwargs, self.result_dir / "renders", step, save_renders=NUM_RENDERS, lpips=self.lpips,
            color_corrected=self.cfg.use_bilateral_grid,
        )
        stats.update(num_GS=n_all, elapsed=elapsed, step=step)
        if elapsed is None:  # eval only: no training time to report
            stats.pop("elapsed")
        else:
            train_metrics = train_metrics or {}
            write_json(self.result_dir / "stats" / f"train_step{step:04d}_rank{ctx.rank}.json", {
                "mem": memory_gb(device), "ellipse_time": elapsed, "num_GS": n_local, "step": step,
                **{k: train_metrics[k] for k in ("projected_max_over_mean", "rasterized_max_over_mean",
                                                 "pairs_projected", "pairs_rasterized") if k in train_metrics},
            })
        if ctx.is_main:
            stats = report_eval(self.result_dir, step, stats, per_image, names, self.lpips_skipped, tb, NUM_RENDERS)
        return stats
