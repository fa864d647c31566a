"""The measured effects of issue 18's training extras, each with and without, on CPU:

- absgrad: Gaussians grown at the SAME --strategy.grow_grad2d (built-in scene);
- depth loss: error of the rendered expected depth at the SfM points of the test images
  (thermos at --data_factor DEPTH_FACTOR; COLMAP tracks), and PSNR;
- pose optimization: test PSNR with the training poses perturbed by --pose_noise
  POSE_NOISE, with and without --pose_opt (--pose_opt_lr POSE_LR: gsplat's 1e-5 is for
  30k steps), and the pose error before / after the corrections (built-in scene, whose
  true poses are known).

One process (W=1; the W-invariance of each extra is in the tests), the Trainer in-process.

    nice -n 10 python benchmarks/studies/extras/extras_effects.py

Environment (defaults): PARTS ("absgrad depth pose"), STEPS (300), DEPTH_STEPS (300),
DEPTH_FACTOR (8), POSE_NOISE (0.01), POSE_LR (1e-3),
SCENE_DIR ($DISTSPLAT_DATA, default ../shared/data), NAME (extras_effects_cpu).
Writes benchmarks/results/$NAME.json and prints one summary line.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks.common import write_result  # noqa: E402
from benchmarks.paths import data_dir  # noqa: E402
from distsplat.distributed import distributed_rasterize, init_distributed  # noqa: E402
from distsplat.train.config import default_config  # noqa: E402
from distsplat.train.model.depth_loss import DepthTargets  # noqa: E402
from distsplat.train.model.gaussians import activated  # noqa: E402
from distsplat.train.trainer import Trainer  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


def train(ctx, **overrides):
    cfg = default_config()
    cfg.save_ply, cfg.num_workers, cfg.log_every = False, 1, 10_000
    cfg.result_dir = tempfile.mkdtemp(prefix="extras_")
    strategy = overrides.pop("strategy", {})
    for k, v in overrides.items():
        setattr(cfg, k, v)
    cfg.save_steps = [cfg.max_steps]
    cfg.eval_steps = [cfg.max_steps]
    cfg.validate()
    for k, v in strategy.items():  # after validate(): absgrad keeps the threshold given here
        setattr(cfg.strategy, k, v)
    trainer = Trainer(cfg, ctx)
    t0 = time.perf_counter()
    trainer.setup()
    metrics = trainer.train()
    return trainer, metrics, time.perf_counter() - t0


def depth_error(trainer: Trainer) -> dict:
    """Mean |1/d - 1/d_sfm| and |d - d_sfm| / d_sfm at the test images' SfM points."""
    test = trainer.test_idx.tolist()
    targets = DepthTargets(trainer.scene, test, trainer.width, trainer.height, trainer.scene_scale, trainer.device)
    g = activated(trainer.params, trainer.cfg.sh_degree)
    sums = {"abs_disp_sum": 0.0, "abs_rel_sum": 0.0, "n": 0}
    with torch.no_grad():
        for c in test:
            colors, _, _ = distributed_rasterize(
                g["means"], g["quats"], g["scales"], g["opacities"], g["colors"],
                trainer.scene.viewmats([c], trainer.device), trainer.Ks[[c]], trainer.width, trainer.height,
                torch.zeros(1, dtype=torch.int64), sh_degree=trainer.cfg.sh_degree, render_mode="RGB+ED")
            for k, v in targets.disparity_error(colors[..., 3:], [c]).items():
                sums[k] += v
    n = max(sums["n"], 1)
    return {"mean_abs_disparity": sums["abs_disp_sum"] / n, "mean_abs_rel_depth": sums["abs_rel_sum"] / n,
            "points": sums["n"], "scene_scale": trainer.scene_scale}


def pose_error(trainer: Trainer) -> dict:
    """Mean rotation (deg) and translation (fraction of the scene scale) between the true
    training poses and the perturbed ones, before and after the learned corrections."""
    from distsplat.train.model.pose_opt import correction_inverse

    true = torch.from_numpy(np.linalg.inv(trainer.scene.camtoworlds[trainer.train_np]))  # [C_train, 4, 4] float64
    seen = trainer.train_viewmats(np.arange(len(trainer.train_np))).double()  # as rendered: --pose_noise's
    out = {}
    for name, vm in (("before", seen), ("after", None)):
        if vm is None:
            if trainer.pose is None:
                continue
            vm = correction_inverse(trainer.pose.deltas.detach().double()) @ seen
        # camera-to-world difference: rotation angle and centre distance
        R = vm[:, :3, :3] @ true[:, :3, :3].transpose(1, 2)
        angle = torch.rad2deg(torch.arccos(((R.diagonal(dim1=1, dim2=2).sum(-1) - 1) / 2).clamp(-1, 1)))
        c = lambda v: -(v[:, :3, :3].transpose(1, 2) @ v[:, :3, 3:])[:, :, 0]  # noqa: E731
        dist = (c(vm) - c(true)).norm(dim=-1) / trainer.scene_scale
        out[name] = {"rot_deg": float(angle.mean()), "trans_frac_scene": float(dist.mean())}
    return out


def main() -> None:
    ctx = init_distributed()
    parts = os.environ.get("PARTS", "absgrad depth pose").split()
    steps = int(os.environ.get("STEPS", 300))
    env = ("PARTS", "STEPS", "DEPTH_STEPS", "DEPTH_FACTOR", "POSE_NOISE", "POSE_LR", "OMP_NUM_THREADS")
    out: dict = {"env": {k: os.environ[k] for k in env if k in os.environ},
                 "load_avg_1min_before": round(os.getloadavg()[0], 2)}
    line = []
    if "absgrad" in parts:
        runs = {}
        for absgrad in (False, True):
            tr, m, wall = train(ctx, max_steps=steps, strategy=dict(
                absgrad=absgrad, grow_grad2d=0.0002, refine_start_iter=steps // 6, refine_every=steps // 6,
                refine_stop_iter=steps, reset_every=10 * steps))
            runs[f"absgrad={absgrad}"] = {"num_GS": tr.n_all, "psnr": m.get("val_psnr"), "wall_s": round(wall, 1)}
            tr.cleanup()
        out["absgrad"] = {"scene": "builtin", "steps": steps, "grow_grad2d": 0.0002, "initial_GS": 3000,
                          "runs": runs}
        line.append(f"absgrad: {runs['absgrad=False']['num_GS']} -> {runs['absgrad=True']['num_GS']} Gaussians")
    if "depth" in parts:
        dsteps = int(os.environ.get("DEPTH_STEPS", steps))
        factor = int(os.environ.get("DEPTH_FACTOR", 8))
        data = Path(os.environ.get("SCENE_DIR", data_dir())) / "thermos"
        runs = {}
        for depth in (False, True):
            tr, m, wall = train(ctx, max_steps=dsteps, data_dir=str(data), data_factor=factor, depth_loss=depth,
                                strategy=dict(refine_start_iter=dsteps // 6, refine_every=dsteps // 6,
                                              refine_stop_iter=dsteps, reset_every=10 * dsteps))
            runs[f"depth_loss={depth}"] = {**depth_error(tr), "psnr": m.get("val_psnr"), "num_GS": tr.n_all,
                                           "wall_s": round(wall, 1)}
            tr.cleanup()
        out["depth"] = {"scene": "thermos", "data_factor": factor, "steps": dsteps, "depth_lambda": 1e-2, "runs": runs}
        a, b = runs["depth_loss=False"], runs["depth_loss=True"]
        line.append(f"depth: disparity error {a['mean_abs_disparity']:.4f} -> {b['mean_abs_disparity']:.4f}")
    if "pose" in parts:
        noise, lr = float(os.environ.get("POSE_NOISE", 0.01)), float(os.environ.get("POSE_LR", 1e-3))
        runs = {}
        for name, kw in (("true poses", {}), ("perturbed", dict(pose_noise=noise)),
                         ("perturbed + pose_opt", dict(pose_noise=noise, pose_opt=True, pose_opt_lr=lr))):
            tr, m, wall = train(ctx, max_steps=steps, **kw)
            runs[name] = {"psnr": m.get("val_psnr"), "ssim": m.get("val_ssim"), "wall_s": round(wall, 1)}
            if tr.pose is not None:
                runs[name]["mean_abs_correction"] = float(tr.pose.deltas.detach().abs().mean())
            if "pose_noise" in kw:
                runs[name]["perturbation"] = pose_error(tr)
            tr.cleanup()
        out["pose"] = {"scene": "builtin", "steps": steps, "pose_noise": noise, "pose_opt_lr": lr, "runs": runs}
        line.append("pose: PSNR " + ", ".join(f"{k} {v['psnr']:.2f}" for k, v in runs.items()))
    out["load_avg_1min_after"] = round(os.getloadavg()[0], 2)
    path = write_result(os.environ.get("NAME", "extras_effects"), out)
    print("; ".join(line), "->", path)


if __name__ == "__main__":
    main()
