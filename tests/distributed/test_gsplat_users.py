"""A gsplat user's flags on 2 gloo ranks (issue 46, point 3): `--ply_steps` (PLYs at their own
steps), `--tb_save_image` (rank 0's training images in TensorBoard every --tb_every steps) and
`--no-disable-video` (gsplat's trajectory video after each evaluation, here the spiral of
`--render_traj_path spiral`); the flags themselves: tests/unit/test_gsplat_flags.py."""

from __future__ import annotations

import importlib.util

import numpy as np

from trainer_workers import tiny_config


def test_ply_steps_train_images_and_videos_as_gsplat(run_workers, tmp_path):
    from distsplat.train.export import ply_fields
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
