"""Blender/NeRF-synthetic: a generated scene written in the layout parses back to the same
cameras, and its RGBA images decode as Pillow composites them; the synthetic generator."""

import json
import math

import numpy as np
import pytest
from PIL import Image

from distsplat.data import DataError, ImageCache, load_blender, write_blender
from distsplat.data.synthetic import attach_images, make_synthetic_scene, splat_points

from .data_helpers import pillow_decode


@pytest.fixture
def blender_dir(tmp_path):
    scene = make_synthetic_scene(num_cameras=10, num_gaussians=400, width=40, height=40)
    images = [splat_points(scene, i, alpha=True) for i in range(scene.num_cameras)]
    write_blender(tmp_path / "lego", scene.camtoworlds, scene.Ks[0, 0, 0], images, scene.train, scene.test)
    return scene, tmp_path / "lego"


def test_blender_round_trip(blender_dir):
    ref, root = blender_dir
    scene = load_blender(root, background=(10, 200, 30))
    order = np.concatenate([ref.train, ref.test])
    assert scene.names == [f"train/r_{j}.png" for j in range(len(ref.train))] + [f"test/r_{j}.png" for j in range(len(ref.test))]
    np.testing.assert_allclose(scene.camtoworlds, ref.camtoworlds[order], atol=1e-12)
    np.testing.assert_allclose(scene.Ks, ref.Ks[order], rtol=1e-12)
    assert scene.train.tolist() == list(range(len(ref.train)))
    assert (scene.widths == 40).all() and (scene.heights == 40).all()
    for mode in ("none", "decoded"):
        cache = ImageCache(scene.images, scene.specs(), range(scene.num_cameras), mode=mode)
        out = np.empty((40, 40, 3), np.uint8)
        for i in range(scene.num_cameras):
            cache.read_into(i, out)
            np.testing.assert_array_equal(out, pillow_decode(root / scene.names[i], background=(10, 200, 30)))
    rgba = np.asarray(Image.open(root / scene.names[0]))
    assert (rgba[..., 3] == 0).any(), "the fixture must have transparent pixels to test compositing"
    out = np.empty((40, 40, 3), np.uint8)
    ImageCache(scene.images, scene.specs(), [0], mode="none").read_into(0, out)
    np.testing.assert_array_equal(out[rgba[..., 3] == 0], np.tile([10, 200, 30], ((rgba[..., 3] == 0).sum(), 1)))


def test_blender_opengl_axes(blender_dir):
    _, root = blender_dir
    meta = json.loads((root / "transforms_train.json").read_text())
    M = np.array(meta["frames"][0]["transform_matrix"])
    scene = load_blender(root)
    np.testing.assert_allclose(scene.camtoworlds[0][:3, 1:3], -M[:3, 1:3])  # y, z flipped
    fx = 0.5 * 40 / math.tan(0.5 * meta["camera_angle_x"])
    assert math.isclose(scene.Ks[0, 0, 0], fx)


@pytest.mark.parametrize("text,match", [
    ("{not json", "malformed JSON at line 1"),
    ('{"camera_angle_x": 0.7}', "non-empty 'frames'"),
    ('{"frames": [{"file_path": "./train/r_0", "transform_matrix": [[1]]}]}', "camera_angle_x"),
    ('{"camera_angle_x": 0.7, "frames": [{"file_path": "./train/r_0", "transform_matrix": [[1, 0], [0, 1]]}]}', "4x4"),
    ('{"camera_angle_x": 0.7, "frames": [{"transform_matrix": []}]}', "file_path"),
    ('{"camera_angle_x": 0.7, "frames": [{"file_path": "./train/r_0", "transform_matrix": '
     '[[1, 0, 0, NaN], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]}]}',
     r"frame 0 \(train/r_0.png\) transform_matrix\[0\]\[3\] is nan, not a finite number"),
])
def test_malformed_transforms(blender_dir, text, match):
    _, root = blender_dir
    (root / "transforms_train.json").write_text(text)
    with pytest.raises(DataError, match=match) as e:
        load_blender(root)
    assert "transforms_train.json" in str(e.value)


def test_synthetic_scene_and_in_memory_images():
    scene = make_synthetic_scene(num_cameras=12, num_gaussians=100, width=32, height=24, seed=3)
    assert scene.images is None and scene.gaussians["means"].shape == (100, 3)
    assert scene.test.tolist() == [0, 8]
    R = scene.camtoworlds[:, :3, :3]
    np.testing.assert_allclose(R @ R.transpose(0, 2, 1), np.tile(np.eye(3), (12, 1, 1)), atol=1e-12)
    # every camera looks at the origin: its optical axis passes through it
    centres, fwd = scene.camtoworlds[:, :3, 3], R[:, :, 2]
    np.testing.assert_allclose(np.cross(fwd, -centres), 0, atol=1e-9)
    calls = []
    attach_images(scene, lambda i: calls.append(i) or splat_points(scene, i))
    cache = ImageCache(scene.images, scene.specs(), [1, 5], mode="decoded")
    out = np.empty((24, 32, 3), np.uint8)
    cache.read_into(5, out)
    cache.read_into(5, out)
    assert calls == [5]
    np.testing.assert_array_equal(out, splat_points(scene, 5))
    assert out.any()
    t = scene.camera_tensors()
    assert scene.viewmats(np.arange(12)).shape == (12, 4, 4) and t["Ks"].shape == (12, 3, 3)
