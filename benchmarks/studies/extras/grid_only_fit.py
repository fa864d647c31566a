"""How far gsplat's bilateral-grid optimizer gets on its own (issue 46): the built-in scene's
training images with the known exposure and white-balance change as targets, the clean
ground truth as a perfect render (the Gaussians held at the truth), and only the grids
learned, with the trainer's own BilateralGrids (lr, warm-up, decay, total variation, Adam)
and its visiting order (each step a global batch of B images, every grid stepping every
step). What the grid reaches here bounds what it can do while the Gaussians learn too.

    nice -n 10 python benchmarks/studies/extras/grid_only_fit.py
    CKPT=R python benchmarks/studies/extras/grid_only_fit.py   # R: a bench run's --result_dir

Environment (defaults): STEPS ("1500 6000"), SHAPES ("16,16,8"), B (2), EXPOSURE (1.5), WB (0.1).
Prints one line per (steps, shape): the targets' PSNR against the identity grid and after the fit,
and the worst image's; writes nothing (a study, not a result). With CKPT (the built-in scene's
default seed and split): instead, what the grids a training run learned do to gray inputs against
the known gains: their slope and correlation in log space (1 and 1: the grids hold the whole change)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from distsplat.data.synthetic import appearance_gains, apply_gains  # noqa: E402
from distsplat.data.tabletop import make_tabletop_scene  # noqa: E402
from distsplat.train.model.bilateral_grid import BilateralGrids, WARMUP_STEPS, slice_grids  # noqa: E402
from distsplat.train.scoring.losses import photometric_loss  # noqa: E402
from distsplat.train.scene_setup import render_ground_truth  # noqa: E402


def psnr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[C] per image."""
    return -10 * torch.log10(((a.clamp(0, 1) - b) ** 2).mean((1, 2, 3)))


def fit(clean: torch.Tensor, target: torch.Tensor, steps: int, shape, B: int, scaler: float) -> torch.Tensor:
    n = len(clean)
    grids = BilateralGrids(n, torch.arange(n), shape, B, steps, max(1, int(WARMUP_STEPS * scaler)),
                           torch.device("cpu"))
    rng = np.random.default_rng(0)
    order = np.array([], np.int64)
    for step in range(steps):
        if len(order) < B:
            order = np.concatenate([order, rng.permutation(n)])
        at, order = order[:B], order[B:]
        idx = torch.from_numpy(at)
        out = slice_grids(grids.grids[idx], clean[idx])
        loss = photometric_loss(out, target[idx], 0.2) / B + grids.tv_loss()
        loss.backward()
        grids.step(step)
    with torch.no_grad():
        return slice_grids(grids.grids, clean)


def learned_gains(result_dir: str, E: float, wb: float) -> None:
    """The grids of a run's newest checkpoint on gray inputs v: their per-channel gain against the known one."""
    shard = sorted(Path(result_dir).glob("ckpts/step_*/rank_0000.pt"))[-1]
    grids = torch.load(shard, map_location="cpu", weights_only=True)["bilateral_grid"]["grids"].double()
    idx = np.arange(32)
    train = idx[idx % 8 != 0]  # the built-in scene's split (32 cameras, --test_every 8)
    lg = np.log(appearance_gains(32, E, wb, 0, train=train)[train])  # [n_train, 3]
    for v in (0.2, 0.4, 0.6):
        rgb = torch.full((len(grids), 8, 8, 3), v, dtype=torch.float64)
        le = np.log(slice_grids(grids, rgb).mean((1, 2)).numpy() / v)
        print(f"{shard.parent.name}, gray {v}: learned gain's slope on the known one (log) "
              f"{(lg * le).sum() / (lg * lg).sum():.3f}, correlation {np.corrcoef(lg.ravel(), le.ravel())[0, 1]:.3f}, "
              f"geometric mean {np.exp(le.mean(0)).round(3).tolist()}")


def main() -> None:
    torch.set_num_threads(1)
    if os.environ.get("CKPT"):
        return learned_gains(os.environ["CKPT"], float(os.environ.get("EXPOSURE", 1.5)), float(os.environ.get("WB", 0.1)))
    E, wb, B = float(os.environ.get("EXPOSURE", 1.5)), float(os.environ.get("WB", 0.1)), int(os.environ.get("B", 2))
    scene = make_tabletop_scene(num_cameras=32, width=96, height=72, detail=1.0, test_every=8, seed=0)
    train = scene.train.tolist()
    gains = appearance_gains(scene.num_cameras, E, wb, 0, train=train)
    gt = [render_ground_truth(scene, i) for i in train]
    clean = torch.from_numpy(np.stack(gt)).float() / 255
    target = torch.from_numpy(np.stack([apply_gains(g, gains[i]) for g, i in zip(gt, train)])).float() / 255
    unclipped = torch.from_numpy(np.stack([np.clip(g.astype(np.float64) * gains[i], 0, None) for g, i in zip(gt, train)]))
    print(f"{len(train)} training images; pixels clipped by the change: "
          f"{float((unclipped > 255.5).float().mean()) * 100:.2f}% of values; "
          f"identity grid PSNR {float(psnr(clean, target).mean()):.2f} dB", flush=True)
    for steps in (int(s) for s in os.environ.get("STEPS", "1500 6000").split()):
        for shape in os.environ.get("SHAPES", "16,16,8").split():
            xyl = tuple(int(v) for v in shape.split(","))
            out = fit(clean, target, steps, xyl, B, steps / 30000)
            p = psnr(out, target)
            print(f"steps {steps} shape {shape}: fitted PSNR mean {float(p.mean()):.2f} dB, worst {float(p.min()):.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
