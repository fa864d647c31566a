"""--render_only's MP4 (distsplat/train/files/video.py): written by the ffmpeg of imageio-ffmpeg, a
dependency, and read back by ffmpeg's own demuxer and decoder; a failing ffmpeg leaves the
frames and one log line, never a failed run."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import imageio_ffmpeg  # a dependency: missing, this file fails rather than skips
import numpy as np
import pytest
from PIL import Image

from distsplat.train.files.video import write_mp4

REPO = Path(__file__).resolve().parents[2]


def write_frames(folder: Path, n: int, w: int, h: int) -> np.ndarray:
    """n flat-coloured frames (colour i is distinguishable after H.264), as render_frames names them."""
    folder.mkdir(parents=True)
    colors = np.stack([np.linspace(30, 220, n), np.linspace(220, 30, n), np.full(n, 128)], 1).astype(np.uint8)
    for i, c in enumerate(colors):
        Image.fromarray(np.broadcast_to(c, (h, w, 3)).copy()).save(folder / f"{i:05d}.png")
    return colors  # [n, 3]


def test_imageio_ffmpeg_is_a_dependency_not_an_extra():
    text = (REPO / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M)
    assert deps and '"imageio-ffmpeg' in deps.group(1), "imageio-ffmpeg must be in [project] dependencies"


def test_mp4_holds_every_frame_in_order_at_the_frame_rate(tmp_path):
    n, w, h, fps = 7, 33, 21, 10  # odd sizes: padded by one pixel for yuv420p
    colors = write_frames(tmp_path / "f", n, w, h)
    out = write_mp4(tmp_path / "f", n, tmp_path / "f.mp4", fps)
    assert out == tmp_path / "f.mp4" and not (tmp_path / "f.tmp.mp4").exists()
    frames, secs = imageio_ffmpeg.count_frames_and_secs(str(out))
    assert frames == n and secs == pytest.approx(n / fps, abs=1.1 / fps)
    reader = imageio_ffmpeg.read_frames(str(out))
    meta = next(reader)
    assert meta["size"] == (w + 1, h + 1) and meta["fps"] == pytest.approx(fps)
    got = np.stack([np.frombuffer(f, np.uint8).reshape(h + 1, w + 1, 3) for f in reader])
    assert got.shape[0] == n
    # H.264 (quality 8, 4:2:0) of flat colours: within a few levels; neighbours are ~30 apart
    mean = got[:, :h, :w].reshape(n, -1, 3).mean(1)
    assert np.abs(mean - colors).max() < 8, (mean, colors)


def test_a_failing_ffmpeg_leaves_the_frames_and_one_line(tmp_path, monkeypatch, caplog):
    write_frames(tmp_path / "f", 2, 8, 8)

    def no_ffmpeg(*args, **kwargs):
        raise RuntimeError("No ffmpeg exe could be found. Install ffmpeg on your system, "
                           "or set the IMAGEIO_FFMPEG_EXE environment variable.")

    monkeypatch.setattr(imageio_ffmpeg, "write_frames", no_ffmpeg)
    with caplog.at_level(logging.WARNING, logger="distsplat.train.files.video"):
        assert write_mp4(tmp_path / "f", 2, tmp_path / "f.mp4", 30) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"no MP4: ffmpeg failed (RuntimeError: No ffmpeg exe could be found. Install ffmpeg on your system, or set "
        f"the IMAGEIO_FFMPEG_EXE environment variable.); the frames are in {tmp_path / 'f'}"]
    assert not (tmp_path / "f.mp4").exists() and not (tmp_path / "f.tmp.mp4").exists()
    assert len(list((tmp_path / "f").glob("*.png"))) == 2
