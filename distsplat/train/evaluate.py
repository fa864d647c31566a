"""Evaluation on the test cameras: each rank renders (with the distributed render) only
the test cameras it owns and scores them against its own images; per-image PSNR, SSIM
(as gsplat reports it: losses.ssim_eval) and LPIPS land in a matrix indexed by test
camera, summed across ranks (every other entry is zero, so the sum is exact), and
averaged in the same order on every rank, so the metrics do not depend on the number of
ranks."""

from __future__ import annotations

import logging
import time
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from ..distributed import DistContext, all_reduce_sum, chunk_bounds, distributed_rasterize
from .gaussians import activated
from .color_correct import color_correct
from .losses import psnr, ssim_eval
from .lpips import load_lpips, ready_lpips, short_lpips_note
from .outputs import memory_gb, save_image, write_json
from .size_groups import size_groups

if TYPE_CHECKING:
    from .trainer import Trainer

log = logging.getLogger("distsplat.train.trainer")  # the trainer's log lines, as before the split

METRICS = ("psnr", "ssim", "lpips")  # rows of the per-image score matrix
CC_METRICS = ("cc_psnr", "cc_ssim", "cc_lpips")  # with a bilateral grid: after color_correct.py's fit, as gsplat
NUM_RENDERS = 4  # test images saved side by side (ground truth | render) at each evaluation


def test_owners(n_test: int, world_size: int) -> List[Tuple[int, int]]:
    """Test camera positions [start, end) owned by each rank (fixed for the run)."""
    return chunk_bounds(n_test, world_size)


def render_stem(name: str) -> str:
    """A test image's name as render files and TensorBoard tags show it: without its
    extension (the file is a PNG whatever the image was), without a leading images/ or
    images_N/ folder (nerfstudio names carry it, COLMAP names are inside it, so both loaders
    give one name), its subfolders joined by "_" (renders/ stays one flat folder):
    images/robot/000.jpg -> robot_000."""
    parts = PurePosixPath(name.replace("\\", "/")).with_suffix("").parts
    if len(parts) > 1 and (parts[0] == "images" or (parts[0].startswith("images_") and parts[0][7:].isdigit())):
        parts = parts[1:]
    return "_".join(p for p in parts if p not in ("", ".", ".."))


def render_name(renders_dir: Path, step: int, name: str) -> Path:
    """The side-by-side PNG of one test image, ground truth left, render right, as its name
    says: image `images/input_0001.jpg` at step 300 -> val_step0300_input_0001_gt-vs-render.png."""
    return renders_dir / f"val_step{step:04d}_{render_stem(name)}_gt-vs-render.png"


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
    """The trainer's evaluation at a step (every rank calls it): LPIPS loaded in setup (bad
    --lpips_* files are setup's errors), its missing weights fetched once before the first
    evaluation (`ready`: a download waits on the node's other ranks), then `evaluate` of the
    trainer's Gaussians, the rank's train stats and rank 0's report (metrics.py)."""

    def __init__(self, cfg: Any, ctx: DistContext, device: torch.device, min_side: int):
        self.cfg, self.ctx, self.device, self.min_side = cfg, ctx, device, min_side
        self.lpips, self.lpips_note = load_lpips(cfg.lpips_net, cfg.lpips_weights, cfg.lpips_heads, device,
                                                 min_side=min_side)
        self.lpips_skipped = None if self.lpips is not None else self.lpips_note
        self._ready = False

    def ready(self, n_test: int) -> None:
        """Once, before the first evaluation (every rank calls it): lpips.ready_lpips fetches
        missing weights and agrees on every rank whether LPIPS is computed; rank 0 says so."""
        if self._ready or n_test == 0:  # no test cameras: nothing to score
            return
        self._ready = True
        cfg = self.cfg
        self.lpips, note = ready_lpips(self.ctx, cfg.lpips_net, cfg.lpips_weights, cfg.lpips_heads, self.device,
                                       self.min_side, self.lpips, self.lpips_note, log.info)
        self.lpips_skipped = None if self.lpips is not None else note
        if self.ctx.is_main:  # a skip's full advice goes into val_stepNNNN.json; the log keeps one short line
            log.info("%s", note if self.lpips is not None else short_lpips_note(note))

    def __call__(self, t: "Trainer", step: int, elapsed: Optional[float]) -> Dict[str, Any]:
        """The stats of trainer `t`'s Gaussians at `step` (elapsed None: --eval_only)."""
        ctx, device, sh = self.ctx, self.device, self.cfg.sh_degree
        self.ready(len(t.test_idx))
        test = t.test_idx.to(device)

        def read(pos: int) -> Tensor:
            cam = int(t.test_idx[pos])
            out = np.empty((t.heights[cam], t.widths[cam], 3), dtype=np.uint8)
            t.cache.read_into(cam, out)
            return torch.from_numpy(out).to(device).float() / 255.0

        names = [t.scene.names[i] for i in t.test_idx.tolist()]
        stats, per_image = evaluate(
            lambda: activated(t.params, sh), t.scene.viewmats(t.test_idx.numpy(), device).to(t.Ks.dtype), t.Ks[test],
            t.widths[t.test_idx.numpy()], t.heights[t.test_idx.numpy()], read, names, ctx,
            sh, t._render_kwargs(sh=sh), t.result_dir / "renders", step, save_renders=NUM_RENDERS, lpips=self.lpips,
            color_corrected=self.cfg.use_bilateral_grid,
        )
        stats.update(num_GS=t.n_all, elapsed=elapsed, step=step)
        if elapsed is None:  # eval only: no training time to report
            stats.pop("elapsed")
        else:
            write_json(t.result_dir / "stats" / f"train_step{step:04d}_rank{ctx.rank}.json", {
                "mem": memory_gb(device), "ellipse_time": elapsed,
                "num_GS": len(t.params["means"]), "step": step,
                **{k: t.metrics[k] for k in ("projected_max_over_mean", "rasterized_max_over_mean",
                                             "pairs_projected", "pairs_rasterized") if k in t.metrics},
            })
        if ctx.is_main:
            from .metrics import report_eval  # metrics.py reads this module's names

            stats = report_eval(t.result_dir, step, stats, per_image, names, self.lpips_skipped, t.tb, NUM_RENDERS)
        return stats
