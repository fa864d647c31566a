"""Scoring and rendering a finished run without training, through the real CLI under
torchrun: a 2-rank training of the built-in scene, then --eval_only on 1 and 3 ranks
(the same metrics as the training's final evaluation) and --render_only (a camera-path video)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from distsplat.train.scoring.lpips import LPIPS
from torchrun_cli import TINY_FLAGS, torchrun

STEPS = 40


def lpips_flags(folder: Path) -> list:
    """Random VGG LPIPS weights (ImageNet's cannot be downloaded here), in torchvision's and
    lpips' file layouts: LPIPS then runs, so its reduction over ranks is checked too (VGG,
    since the tiny scene's 24 px images are below AlexNet's 31)."""
    torch.manual_seed(0)
    net = LPIPS("vgg")
    torch.save({f"features.{k}": v for k, v in net.features.state_dict().items()}, folder / "vgg16.pth")
    torch.save({f"lin{k}.model.1.weight": torch.rand_like(lin.weight) for k, lin in enumerate(net.lins)},
               folder / "heads.pth")
    return ["--lpips_net", "vgg", "--lpips_weights", str(folder / "vgg16.pth"),
            "--lpips_heads", str(folder / "heads.pth")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "r"
    out.mkdir()
    p = torchrun(["default", "--max_steps", str(STEPS), "--eval_steps", str(STEPS), "--save_steps", str(STEPS),
                  "--result_dir", str(out), *TINY_FLAGS, *lpips_flags(out)])
    assert p.returncode == 0, p.stderr[-3000:]
    return out


def read_csv(path: Path) -> dict:
    with open(path, newline="") as f:
        return {row["name"]: row for row in csv.DictReader(f)}


@pytest.mark.slow
def test_eval_only_on_1_and_3_ranks_gives_the_training_final_metrics(trained, tmp_path):
    final = json.loads((trained / "stats" / f"val_step{STEPS:04d}.json").read_text())
    rows = read_csv(trained / "stats" / f"val_step{STEPS:04d}.csv")
    assert len(rows) == final["num_test_images"] == 2  # 12 cameras, every 8th a test camera
    for w in (1, 3):
        out = tmp_path / f"eval{w}"
        p = torchrun(["default", "--eval_only", "--ckpt", str(trained / "ckpts"), "--result_dir", str(out),
                      *TINY_FLAGS, *lpips_flags(trained)], nproc=w)
        assert p.returncode == 0, p.stderr[-3000:]
        assert "(eval only)" in p.stdout
        got = json.loads((out / "stats" / f"val_step{STEPS:04d}.json").read_text())
        assert got["step"] == STEPS and got["num_GS"] == final["num_GS"]
        # Each test image is scored by one rank; the summed matrix holds one non-zero per entry,
        # so the reduction is exact. A render on another W composites the same depth-sorted
        # pairs, received in another rank order: at most a few float32 roundings per pixel
        # (~1e-6 of a value <= 1), which moves PSNR (~22 dB, RMSE ~0.08) by
        # 20/ln10 * 1e-6 / 0.08 ~ 1e-4 dB and SSIM by ~1e-6 (test_trainer's W tolerances).
        assert got["psnr"] == pytest.approx(final["psnr"], abs=1e-4)
        assert got["ssim"] == pytest.approx(final["ssim"], abs=1e-5)
        assert final["lpips"] is not None and "lpips_skipped" not in final
        assert got["lpips"] == pytest.approx(final["lpips"], rel=1e-4)  # a float32 net of ~1e-6 pixel changes
        got_rows = read_csv(out / "stats" / f"val_step{STEPS:04d}.csv")
        assert got_rows.keys() == rows.keys()
        for name, row in rows.items():  # the CSV keeps 6 decimals
            assert float(got_rows[name]["psnr"]) == pytest.approx(float(row["psnr"]), abs=1e-4)
            assert float(got_rows[name]["ssim"]) == pytest.approx(float(row["ssim"]), abs=1e-5)
            assert float(got_rows[name]["lpips"]) == pytest.approx(float(row["lpips"]), rel=1e-4, abs=1e-6)
        renders = sorted(p.name for p in (out / "renders").glob(f"val_step{STEPS:04d}_*.png"))
        assert renders == sorted(p.name for p in (trained / "renders").glob(f"val_step{STEPS:04d}_*.png"))
        assert renders and not (out / "ckpts").exists()  # nothing trained, nothing saved



@pytest.mark.slow
def test_render_only_writes_the_camera_path_as_frames_and_mp4(trained, tmp_path):
    import imageio_ffmpeg  # a dependency (pyproject.toml): the MP4 is written out of the box
    from PIL import Image

    frames = 13  # not a multiple of the 2 ranks: one renders a frame more
    out = tmp_path / "video"
    p = torchrun(["default", "--render_only", "--render_traj_path", "ellipse", "--render_traj_frames", str(frames),
                  "--render_fps", "10", "--ckpt", str(trained / "ckpts"), "--result_dir", str(out), *TINY_FLAGS])
    assert p.returncode == 0, p.stderr[-3000:]
    folder = out / "videos" / f"traj_ellipse_step{STEPS:04d}"
    pngs = sorted(folder.glob("*.png"))
    assert [q.name for q in pngs] == [f"{i:05d}.png" for i in range(frames)]
    assert {Image.open(q).size for q in pngs} == {(2 * 32, 24)}  # RGB | depth of a 32 x 24 scene
    # ffmpeg reads the file back (its own demuxer and decoder, not our writer)
    n, secs = imageio_ffmpeg.count_frames_and_secs(str(folder.with_suffix(".mp4")))
    meta = next(imageio_ffmpeg.read_frames(str(folder.with_suffix(".mp4"))))
    assert n == frames and meta["size"] == (64, 24) and secs == pytest.approx(frames / 10, abs=0.11)
    assert f"and {folder.with_suffix('.mp4')}" in p.stdout + p.stderr and "no MP4" not in p.stdout + p.stderr
    assert not (out / "ckpts").exists() and not (out / "stats").exists()
