"""Outputs in known coordinates, end to end (issue 32): a normalised COLMAP capture trained
by the real CLI on 2 ranks writes cameras.json and transform.json, and the checkpoint's meta
holds the transform; with --ply_frame capture the merged PLY and cameras.json are in the
capture's own world (COLMAP's camera centres), the Gaussians moved there exactly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from distsplat.data import colmap_io
from distsplat.train.files.coords import to_capture
from distsplat.viewer import read_ply_chunk
from tests.unit.data_helpers import make_colmap_dataset
from torchrun_cli import torchrun

pytestmark = pytest.mark.slow

COMMON = ["--max_steps", "2", "--save_steps", "2", "--eval_steps", "2", "--num_workers", "1", "--prefetch", "1",
          "--sh_degree", "1", "--data_factor", "1", "--disable_viewer"]


@pytest.fixture(scope="module")
def colmap(tmp_path_factory) -> Path:
    return make_colmap_dataset(tmp_path_factory.mktemp("colmap") / "scene", num_cameras=10, width=32, height=24,
                               factors=())


def colmap_centres(root: Path) -> dict:
    """{image file stem (cameras.json's img_name, as 3DGS's): camera centre} in COLMAP's world."""
    model = colmap_io.read_model(root / "sparse" / "0")
    out = {}
    for im in model.images.values():
        R = colmap_io.qvec_to_rotmat(im.qvec)
        out[Path(im.name).stem] = -R.T @ im.tvec
    return out


def train(colmap: Path, out: Path, *more: str) -> None:
    p = torchrun(["default", *COMMON, "--data_dir", str(colmap), "--result_dir", str(out), *more], nproc=2)
    assert p.returncode == 0, p.stderr[-3000:]


def test_cameras_transform_and_ply_in_known_coordinates(colmap, tmp_path):
    centres = colmap_centres(colmap)
    train(colmap, tmp_path / "norm")
    train(colmap, tmp_path / "capt", "--ply_frame", "capture")
    for run, frame in ((tmp_path / "norm", "normalized"), (tmp_path / "capt", "capture")):
        info = json.loads((run / "transform.json").read_text())
        T = np.array(info["normalized_from_capture"])
        assert info["ply_frame"] == frame and info["scale"] == pytest.approx(np.linalg.norm(T[:3, 0]))
        assert not np.allclose(T, np.eye(4))  # the capture was normalised: the test means something
        meta = json.loads((run / "ckpts" / "step_000002" / "meta.json").read_text())
        assert meta["state"]["frame"]["normalized_from_capture"] == info["normalized_from_capture"]
        assert meta["state"]["frame"]["ply_frame"] == "normalized"  # a checkpoint is always normalised
        cams = json.loads((run / "cameras.json").read_text())
        assert len(cams) == 10 and {c["img_name"] for c in cams} == set(centres)
        got = np.array([c["position"] for c in cams])
        want = np.array([centres[c["img_name"]] for c in cams])
        if frame == "normalized":
            want = want @ T[:3, :3].T + T[:3, 3]
        np.testing.assert_allclose(got, want, atol=1e-6 * max(1.0, np.abs(want).max()))
    # The PLY: the checkpoint's Gaussians (normalised), moved into the capture's world
    meta = json.loads((tmp_path / "capt" / "ckpts" / "step_000002" / "meta.json").read_text())
    shards = [torch.load(tmp_path / "capt" / "ckpts" / "step_000002" / s["file"])["params"] for s in meta["shards"]]
    params = {k: torch.cat([s[k] for s in shards]) for k in shards[0]}
    want = to_capture(params, np.array(meta["state"]["frame"]["normalized_from_capture"]))
    ply, n = read_ply_chunk(tmp_path / "capt" / "ply" / "point_cloud_0002.ply", 0, 1)
    assert n == len(params["means"])
    for k in ("means", "scales", "quats", "opacities", "sh0", "shN"):
        torch.testing.assert_close(ply[k].reshape(want[k].shape), want[k].float(), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(ply["means"], params["means"], atol=1e-3)  # not the normalised ones
    plain, _ = read_ply_chunk(tmp_path / "norm" / "ply" / "point_cloud_0002.ply", 0, 1)
    assert plain["means"].shape == ply["means"].shape
