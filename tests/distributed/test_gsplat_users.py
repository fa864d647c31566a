"""A gsplat user's flags on 2 gloo ranks (issue 46, point 3): `--ply_steps` (PLYs at their own
steps), `--tb_save_image` (rank 0's training images in TensorBoard every --tb_every steps) and
`--no-disable-video` (gsplat's trajectory video after each evaluation, here the spiral of
`--render_traj_path spiral`); the flags themselves: tests/unit/test_gsplat_flags.py."""

from __future__ import annotations

import importlib.util

import pytest

import numpy as np

from trainer_workers import tiny_config


def test_ply_steps_train_images_and_videos_as_gsplat(run_workers, tmp_path):
    from distsplat.train.files.export import ply_fields
    from distsplat.viewer.model import read_ply_header

    out = tmp_path / "run"
    cfg = tiny_config(str(out), max_steps=6, save_steps=[5], ply_steps=[3], eval_steps=[4], save_ply=True,
                      tb_save_image=True, tb_every=2, disable_video=False, render_traj_path="spiral",
                      render_traj_frames=4)
    r0, r1 = run_workers("gsplat_user_workers:train_outputs", 2, cfg)
    # PLYs at --ply_steps and the last step only; checkpoints at --save_steps and the last step
    assert sorted(p.name for p in (out / "ply").iterdir()) == ["point_cloud_0003.ply", "point_cloud_0006.ply"]
    assert sorted(p.name for p in (out / "ckpts").iterdir()) == ["step_000005", "step_000006"]
    n, names, _ = read_ply_header(out / "ply" / "point_cloud_0003.ply")
    assert n == r0["n_all"] and names == ply_fields(3)  # SH degree 1: 3 coefficients past the DC per channel
    # rank 0's training images of steps 2, 4, 6 (tb_every 2): its own camera's ground truth | the render
    imgs = [i for i in r0["images"] if i["tag"].startswith("train/")]  # (the evaluations': val/NAME)
    assert [(i["tag"], i["step"], i["dataformats"]) for i in imgs] == [("train/render", s, "HWC") for s in (2, 4, 6)]
    for rec in imgs:
        canvas = rec["image"]
        assert canvas.shape == (24, 64, 3)
        gt = np.round(canvas[:, :32] * 255).astype(np.uint8)
        assert any(np.array_equal(gt, own) for own in r0["own"].values())  # one of rank 0's images, exactly
        assert not any(np.array_equal(gt, own) for own in r1["own"].values())
        assert 0.0 <= canvas[:, 32:].min() and canvas[:, 32:].max() <= 1.0 and canvas[:, 32:].std() > 0.01
    assert r1["images"] == []  # rank 1 writes no TensorBoard
    # gsplat's trajectory video after each evaluation (steps 4 and 6): 4 spiral frames each
    for step in (4, 6):
        frames = out / "videos" / f"traj_spiral_step{step:04d}"
        assert sorted(p.name for p in frames.iterdir()) == [f"{i:05d}.png" for i in range(4)]
        if importlib.util.find_spec("imageio_ffmpeg") is not None:
            assert frames.with_suffix(".mp4").stat().st_size > 0


@pytest.mark.slow  # a torchrun of 2 ranks and two single processes, ~20 s
def test_gsplats_default_command_lines_run_and_their_model_converts(tmp_path):
    """gsplat's README command lines, as typed for gsplat (only --steps_scaler 0.001, a gsplat flag,
    cuts 30000 steps to 30, and --disable_viewer): `default` on 2 ranks under torchrun, `mcmc` on
    one process, on a COLMAP capture; then `python -m distsplat.convert` writes the mcmc model in
    gsplat's layout, which gsplat's --ckpt reading gives back as the checkpoint's Gaussians."""
    import json
    import subprocess
    import sys

    import torch

    from tests.unit.data_helpers import make_colmap_dataset
    from torchrun_cli import REPO, TRAINER, torchrun, torchrun_env

    data = make_colmap_dataset(tmp_path / "garden", num_cameras=10, factors=(4,))
    gsplat_args = ["--data_dir", str(data), "--data_factor", "4", "--steps_scaler", "0.001", "--disable_viewer"]
    p = torchrun(["default", *gsplat_args, "--result_dir", str(tmp_path / "default")])
    assert p.returncode == 0, p.stderr[-3000:]
    p = subprocess.run([sys.executable, str(TRAINER), "mcmc", *gsplat_args, "--result_dir", str(tmp_path / "mcmc")],
                       capture_output=True, text=True, env=torchrun_env(), cwd=REPO, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    for name in ("default", "mcmc"):  # gsplat's schedule x 0.001: evaluations at 7 and 30, saves at 7 and 30
        stats = json.loads((tmp_path / name / "stats" / "val_step0030.json").read_text())
        assert stats["psnr"] > 10 and (tmp_path / name / "stats" / "val_step0007.json").is_file()
        assert sorted(q.name for q in (tmp_path / name / "ckpts").iterdir()) == ["step_000007", "step_000030"]
    p = subprocess.run([sys.executable, "-m", "distsplat.convert", str(tmp_path / "mcmc" / "ckpts"),
                        str(tmp_path / "out")], capture_output=True, text=True, env=torchrun_env(), cwd=REPO,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "(gsplat's layout)" in p.stdout
    ckpt = torch.load(tmp_path / "out" / "ckpt_30_rank0.pt", weights_only=True)
    shard = torch.load(tmp_path / "mcmc" / "ckpts" / "step_000030" / "rank_0000.pt", weights_only=True)
    assert ckpt["step"] == 30 and set(ckpt["splats"]) == set(shard["params"])
    for k, v in shard["params"].items():
        assert torch.equal(ckpt["splats"][k], v), k
