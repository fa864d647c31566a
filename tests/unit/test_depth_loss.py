"""The depth loss's data (COLMAP tracks -> per-image SfM points) and its maths (gsplat's
disparity L1 at the projected points), against hand-built values."""

from pathlib import Path

import numpy as np
import pytest
import torch

from distsplat.data import colmap_io, load_colmap
from distsplat.train.model.depth_loss import DepthTargets
from tests.unit.data_helpers import make_colmap_dataset

pytestmark = pytest.mark.numerics  # rerun under other numeric paths in CI (docs/testing.md)


def _with_tracks(root: Path, fmt: str):
    """A COLMAP dataset whose point i is seen by images 1 + (i % 3) and 1 + (i % 5)."""
    make_colmap_dataset(root, num_cameras=6, width=32, height=24, factors=())
    model = colmap_io.read_model(root / "sparse" / "0")
    n = len(model.points.ids)
    tracks = [sorted({1 + i % 3, 1 + i % 5}) for i in range(n)]
    model.points.track_offsets = np.concatenate([[0], np.cumsum([len(t) for t in tracks])]).astype(np.int64)
    model.points.track_images = np.array([v for t in tracks for v in t], dtype=np.int64)
    for f in (root / "sparse" / "0").iterdir():
        f.unlink()
    (colmap_io.write_model_bin if fmt == "bin" else colmap_io.write_model_txt)(model, root / "sparse" / "0")
    return model, tracks


@pytest.mark.parametrize("fmt", ["bin", "txt"])
def test_colmap_tracks_give_each_image_its_points(tmp_path, fmt):
    model, tracks = _with_tracks(tmp_path, fmt)
    scene = load_colmap(tmp_path, check=False)
    id_of = {im.name: im.id for im in model.images.values()}
    for c, name in enumerate(scene.names):
        expect = [i for i, t in enumerate(tracks) if id_of[name] in t]
        assert scene.point_tracks[c].tolist() == expect, name
    assert sum(len(t) for t in scene.point_tracks) == sum(len(t) for t in tracks) > 0


def _scene_one_camera(points, width=8, height=6):
    class S:  # the fields DepthTargets reads
        pass

    s = S()
    s.points = np.asarray(points, dtype=np.float32)
    s.point_tracks = None
    s.camtoworlds = np.eye(4)[None]
    s.Ks = np.array([[[4.0, 0, 3.5], [0, 4.0, 2.5], [0, 0, 1]]])
    return s


def test_targets_are_the_points_camera_depths_at_their_pixels():
    # (x, y, z) projects to (4x/z + 3.5, 4y/z + 2.5): pixels (1, 1), (5, 4); one behind, one outside.
    pts = [[-2.5 * 2 / 4, -1.5 * 2 / 4, 2.0], [1.5 * 4 / 4, 1.5 * 4 / 4, 4.0], [0, 0, -1.0], [10.0, 0, 1.0]]
    t = DepthTargets(_scene_one_camera(pts), [0], 8, 6, scene_scale=2.0, device=torch.device("cpu"))
    assert t.points_of(0) == 2
    assert t.targets[0]["depth"].tolist() == pytest.approx([2.0, 4.0])
    depths = torch.rand(1, 6, 8, 1, dtype=torch.float64) + 0.5
    # A point at integer pixel coordinates reads that pixel exactly (gsplat's align_corners).
    sampled = t.sample(depths, [0])[0]
    torch.testing.assert_close(sampled, torch.stack([depths[0, 1, 1, 0], depths[0, 4, 5, 0]]), rtol=1e-12, atol=0)
    expect = 2.0 * ((1 / sampled - torch.tensor([1 / 2.0, 1 / 4.0], dtype=torch.float64)).abs().mean())
    torch.testing.assert_close(t.loss(depths, [0]), expect)
    # zero depth (no Gaussian there) counts as disparity 0, as in gsplat
    assert t.loss(torch.zeros_like(depths), [0]).item() == pytest.approx(2.0 * (1 / 2.0 + 1 / 4.0) / 2)


def test_depth_loss_needs_points():
    s = _scene_one_camera(np.zeros((0, 3)))
    with pytest.raises(ValueError, match="--depth_loss"):
        DepthTargets(s, [0], 8, 6, 1.0, torch.device("cpu"))
