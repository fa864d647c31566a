"""The measured effect of --app_opt (issue 18) on a scene with per-image appearance changes.

The built-in tabletop scene, whose TRAINING images are each scaled by a known per-image,
per-channel gain (brightness b_i log-uniform in [1/B, B], white balance w_ic uniform in
[1 - WB, 1 + WB], the product clipped to 8 bits; seeded), while the test images are the
unscaled ground truth. Trained with and without --app_opt under 2-rank torchrun (the
Trainer in each rank, W=2 through torch.distributed): test PSNR (with --app_opt at a zero
embedding, as gsplat evaluates) and train PSNR on the scaled training images (with
--app_opt each at its own embedding; also at a zero embedding).

    nice -n 10 python benchmarks/studies/extras/bench_app_opt.py

Environment (defaults): STEPS (300), BRIGHT (1.5), WB (0.1), APP_LR (gsplat's 1e-3, tuned for
30k steps), NAME (app_opt_cpu).
Writes benchmarks/results/$NAME.json and prints one summary line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))


def gains(n: int, bright: float, wb: float, seed: int = 5) -> np.ndarray:
    """[n, 3] per-image, per-channel gains."""
    rng = np.random.default_rng(seed)
    b = np.exp(rng.uniform(-np.log(bright), np.log(bright), size=(n, 1)))
    return b * rng.uniform(1 - wb, 1 + wb, size=(n, 3))


def worker(app_opt: bool, steps: int, bright: float, wb: float, app_lr: float, out: str) -> None:
    """One torchrun rank: trains on the scaled scene, writes metrics (rank 0)."""
    from distsplat.distributed import all_reduce_sum, distributed_rasterize, init_distributed
    from distsplat.data.synthetic import attach_images
    from distsplat.train import trainer as trainer_mod
    from distsplat.train.config import default_config
    from distsplat.train.model.gaussians import activated
    from distsplat.train.scoring.losses import psnr
    from distsplat.train.scene_setup import load_scene, render_ground_truth

    def scaled_scene(cfg):
        scene = load_scene(cfg)
        g = gains(scene.num_cameras, bright, wb)
        train = set(int(i) for i in scene.train)

        def image(i: int) -> np.ndarray:
            img = render_ground_truth(scene, i)
            if i not in train:
                return img
            return np.clip(np.round(img.astype(np.float64) * g[i]), 0, 255).astype(np.uint8)

        images.append(image)
        return attach_images(scene, image)

    images = []
    trainer_mod.load_scene = scaled_scene
    ctx = init_distributed()
    cfg = default_config()
    cfg.save_ply, cfg.num_workers, cfg.log_every = False, 1, 10_000
    cfg.result_dir = out + ".run"  # the same on every rank
    cfg.max_steps, cfg.save_steps, cfg.eval_steps = steps, [], [steps]
    cfg.strategy.refine_start_iter, cfg.strategy.refine_every = steps // 6, steps // 6
    cfg.strategy.refine_stop_iter, cfg.strategy.reset_every = steps, 10 * steps
    cfg.app_opt, cfg.app_opt_lr = app_opt, app_lr
    cfg.validate()
    tr = trainer_mod.Trainer(cfg, ctx)
    t0 = time.perf_counter()
    tr.setup()
    metrics = tr.train()
    wall = time.perf_counter() - t0

    # Train PSNR: rank r renders its own training images (its embeddings), one per round.
    W, r = ctx.world_size, ctx.rank
    owns = [tr.batcher.own_cameras(q).tolist() for q in range(W)]
    n_train = len(tr.train_idx)
    scores = torch.zeros(2, n_train, dtype=torch.float64)
    g = activated(tr.params, cfg.sh_degree)
    with torch.no_grad():
        for j in range(max(len(o) for o in owns)):
            pos = [o[j] for o in owns if j < len(o)]
            owner = torch.tensor([q for q, o in enumerate(owns) if j < len(o)])
            cams = tr.train_idx[pos]
            for k, cameras in enumerate((torch.tensor(pos), None)):  # own embedding, zero embedding
                colors, _, _ = distributed_rasterize(
                    g["means"], g["quats"], g["scales"], g["opacities"], g["colors"], tr.train_viewmats(pos),
                    tr.Ks[cams], tr.width, tr.height, owner, **tr._render_kwargs(sh=cfg.sh_degree, cameras=cameras))
                if r in owner.tolist():
                    p = pos[owner.tolist().index(r)]
                    gt = torch.from_numpy(images[0](int(tr.train_idx[p]))).float() / 255.0  # the scaled image
                    scores[k, p] = psnr(colors[0].clamp(0, 1)[None], gt[None])[0].double()
    scores = all_reduce_sum(scores)
    if ctx.is_main:
        res = {"app_opt": app_opt, "test_psnr": metrics.get("val_psnr"), "test_ssim": metrics.get("val_ssim"),
               "train_psnr": float(scores[0].mean()), "num_GS": tr.n_all, "wall_s": round(wall, 1)}
        if app_opt:
            res["train_psnr_zero_embedding"] = float(scores[1].mean())
        Path(out).write_text(json.dumps(res))
    tr.cleanup()


def main() -> None:
    from benchmarks.common import write_result

    steps = int(os.environ.get("STEPS", 300))
    bright, wb = float(os.environ.get("BRIGHT", 1.5)), float(os.environ.get("WB", 0.1))
    app_lr = float(os.environ.get("APP_LR", 1e-3))
    result = {"scene": "builtin tabletop (32 cameras, 96x72), training images scaled per image",
              "steps": steps, "world_size": 2, "app_opt_lr": app_lr, "brightness_range": [1 / bright, bright],
              "white_balance": wb,
              "load_avg_1min_before": round(os.getloadavg()[0], 2), "runs": {}}
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    for app_opt in (False, True):
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                   __file__, "--worker", str(int(app_opt)), str(steps), str(bright), str(wb), str(app_lr), f.name]
            subprocess.run(cmd, check=True, env=env, cwd=REPO)
            shutil.rmtree(f.name + ".run", ignore_errors=True)
            result["runs"][f"app_opt={app_opt}"] = json.loads(Path(f.name).read_text())
    result["load_avg_1min_after"] = round(os.getloadavg()[0], 2)
    path = write_result(os.environ.get("NAME", "app_opt"), result)
    a, b = result["runs"]["app_opt=False"], result["runs"]["app_opt=True"]
    print(f"test PSNR {a['test_psnr']:.2f} -> {b['test_psnr']:.2f}; train PSNR {a['train_psnr']:.2f} -> "
          f"{b['train_psnr']:.2f} (zero embedding {b['train_psnr_zero_embedding']:.2f}) -> {path}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        a = sys.argv[2:]
        worker(bool(int(a[0])), int(a[1]), float(a[2]), float(a[3]), float(a[4]), a[5])
    else:
        main()
