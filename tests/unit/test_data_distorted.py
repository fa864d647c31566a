"""Distorted captures end to end through the data layer: a COLMAP scene with two cameras of
different models and sizes, undistorted only by the rank that owns an image, once; and
nerfstudio's transforms.json, which must give the same scene as the COLMAP model it was
converted from (nerfstudio's own conversion, redone in data_helpers), plus its errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from distsplat.data import DataError, ImageCache, load_colmap, load_nerfstudio
from distsplat.data.nerfstudio import read_ply_points
from distsplat.data.synthetic import make_synthetic_scene
from distsplat.data.undistort import Undistortion, plan_undistortion, split_params

from .data_helpers import colmap_to_nerfstudio, make_distorted_colmap

pytestmark = pytest.mark.numerics  # rerun under other numeric paths in CI (docs/testing.md)

pytest.importorskip("pycolmap", reason="pycolmap (dev extra) is the reference camera model")

RADIAL = ("SIMPLE_RADIAL", [60.0, 32.3, 23.8, -0.06], 64, 48)
FISHEYE = ("OPENCV_FISHEYE", [40.0, 41.0, 40.2, 29.7, 0.04, -0.01, 0.003, 0.0], 80, 60)
OPENCV = ("OPENCV", [61.0, 60.0, 32.3, 23.8, -0.05, 0.01, 0.001, -0.001], 64, 48)


@pytest.fixture(scope="module")
def two_cameras(tmp_path_factory):
    return make_distorted_colmap(tmp_path_factory.mktemp("two") / "c", [RADIAL, FISHEYE], num_cameras=6)


def test_two_cameras_of_different_models_become_their_pinhole_cameras(two_cameras):
    scene = load_colmap(two_cameras)
    for i in range(scene.num_cameras):
        model, params, w, h = (RADIAL, FISHEYE)[i % 2]
        K, _ = split_params(model, np.array(params))
        plan = plan_undistortion(model, np.array(params), K, (w, h), "c")
        np.testing.assert_array_equal(scene.Ks[i], plan.K_new)
        assert (scene.widths[i], scene.heights[i]) == plan.size
        assert tuple(scene.source_sizes[i]) == (w, h)
    u = scene.undistort
    assert u[0] is u[2] is u[4] and u[1] is u[3] is u[5] and u[0] is not u[1]  # one plan (and maps) per camera
    assert {u[0].size, u[1].size} == {(63, 47), (79, 59)}
    # The poses are the synthetic scene's the images were rendered from (the helper's
    # quaternions were once transposed rotations, unseen by tests comparing two readers).
    np.testing.assert_allclose(scene.camtoworlds, make_synthetic_scene(num_cameras=6, num_gaussians=400).camtoworlds,
                               atol=1e-9)


def test_a_rank_undistorts_only_its_own_images_once(two_cameras, monkeypatch):
    """Rank owning cameras 0 and 2 (both SIMPLE_RADIAL): the fisheye's maps are never
    computed; each own image is remapped once however often it is read (decoded cache);
    the pixels are the undistortion of a plain Pillow decode."""
    scene = load_colmap(two_cameras)
    calls = []
    original = Undistortion.__call__

    def counting(self, image, where=""):
        calls.append(where)
        return original(self, image, where)

    monkeypatch.setattr(Undistortion, "__call__", counting)
    cache = ImageCache(scene.images, scene.specs(), [0, 2], mode="decoded", budget=1 << 30)
    for _ in range(3):
        for cam in (0, 2):
            out = np.zeros(scene.spec(cam).shape, np.uint8)
            cache.read_into(cam, out)
            raw = np.asarray(Image.open(scene.images.where(cam)).convert("RGB"))
            np.testing.assert_array_equal(out, original(scene.undistort[cam], raw))
    assert sorted(calls) == sorted(scene.images.where(c) for c in (0, 2))
    assert scene.undistort[0]._maps is not None and scene.undistort[1]._maps is None  # fisheye: never computed


def test_undistorted_size_of_images_n_is_planned_at_the_scaled_intrinsics(two_cameras, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(two_cameras, root)
    (root / "images_2").mkdir()
    for p in (root / "images").iterdir():
        im = Image.open(p)
        im.resize((im.width // 2, im.height // 2), Image.LANCZOS).save(root / "images_2" / p.name)
    scene = load_colmap(root, factor=2)
    model, params, w, h = RADIAL
    K, _ = split_params(model, np.array(params))
    K[:2] *= 0.5
    plan = plan_undistortion(model, np.array(params), K, (w // 2, h // 2), "c")
    np.testing.assert_allclose(scene.Ks[0], plan.K_new)
    assert scene.undistort[0].in_size == (32, 24)


# ------------------------------------------------------------------ nerfstudio

@pytest.fixture(scope="module")
def opencv_capture(tmp_path_factory):
    return make_distorted_colmap(tmp_path_factory.mktemp("cv") / "c", [OPENCV], num_cameras=5)


@pytest.mark.parametrize("per_frame", [False, True])
def test_nerfstudio_capture_is_the_colmap_capture_it_came_from(opencv_capture, tmp_path, per_frame):
    ns = colmap_to_nerfstudio(opencv_capture, tmp_path / "ns", per_frame=per_frame)
    a, b = load_colmap(opencv_capture), load_nerfstudio(ns)
    assert [f"images/{n}" for n in a.names] == b.names
    np.testing.assert_allclose(b.camtoworlds, a.camtoworlds, atol=1e-12)  # applied_transform undone, axes OpenCV
    np.testing.assert_allclose(b.Ks, a.Ks, atol=1e-9)
    np.testing.assert_array_equal(b.widths, a.widths)
    np.testing.assert_allclose(b.points, a.points, atol=1e-5)  # the PLY holds 6 decimals
    np.testing.assert_array_equal(b.points_rgb, a.points_rgb)
    np.testing.assert_array_equal(b.test, a.test)
    out_a, out_b = (np.zeros(a.spec(1).shape, np.uint8) for _ in range(2))
    ImageCache(a.images, a.specs(), [1], mode="none").read_into(1, out_a)
    ImageCache(b.images, b.specs(), [1], mode="none").read_into(1, out_b)
    np.testing.assert_array_equal(out_a, out_b)


def test_nerfstudio_two_camera_models_per_frame_and_images_n(tmp_path):
    colmap = make_distorted_colmap(tmp_path / "c", [RADIAL, FISHEYE], num_cameras=4)
    ns = colmap_to_nerfstudio(colmap, tmp_path / "ns", per_frame=True)
    (ns / "images_2").mkdir()
    for p in (ns / "images").iterdir():
        im = Image.open(p)
        im.resize((im.width // 2, im.height // 2), Image.LANCZOS).save(ns / "images_2" / p.name)
    full, half = load_nerfstudio(ns), load_nerfstudio(ns, factor=2)
    assert [u.fisheye for u in full.undistort] == [False, True, False, True]
    assert full.undistort[0] is full.undistort[2]
    np.testing.assert_allclose(full.Ks, load_colmap(colmap).Ks, atol=1e-9)
    assert half.undistort[1].in_size == (40, 30) and half.images.where(0).endswith("images_2/synthetic_00000.png")


def test_ply_binary_matches_plyfile(tmp_path):
    plyfile = pytest.importorskip("plyfile")
    rng = np.random.default_rng(0)
    v = np.zeros(50, dtype=[("x", "f4"), ("y", "f4"), ("z", "f4"), ("nx", "f4"), ("red", "u1"), ("green", "u1"), ("blue", "u1")])
    for k in ("x", "y", "z", "nx"):
        v[k] = rng.normal(size=50)
    for k in ("red", "green", "blue"):
        v[k] = rng.integers(0, 256, 50)
    plyfile.PlyData([plyfile.PlyElement.describe(v, "vertex")], text=False).write(str(tmp_path / "p.ply"))
    xyz, rgb = read_ply_points(tmp_path / "p.ply")
    np.testing.assert_array_equal(xyz, np.stack([v["x"], v["y"], v["z"]], 1))
    np.testing.assert_array_equal(rgb, np.stack([v["red"], v["green"], v["blue"]], 1))


def _edit(ns, change):
    path = ns / "transforms.json"
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))


@pytest.mark.parametrize("change, message", [
    (lambda m: m.pop("fl_y"), r"transforms.json: frame 0 has no 'fl_y'"),
    (lambda m: m.update(camera_model="EQUIRECTANGULAR"), r"transforms.json: frame 0 'camera_model' is 'EQUIRECTANGULAR'"),
    (lambda m: m.update(k4=0.1), r"transforms.json: frame 0 is OPENCV with 'k4'"),
    (lambda m: m["frames"][2].update(fl_x="wide"), r"transforms.json: frame 2 'fl_x' is 'wide', not a number"),
    (lambda m: m["frames"][1].update(transform_matrix=[[1, 0], [0, 1]]), r"frame 1 'transform_matrix' must be 4x4 or 3x4"),
    (lambda m: m["frames"][1].pop("file_path"), r"frame 1 needs 'file_path' and 'transform_matrix'"),
    (lambda m: m.update(ply_file_path="gone.ply"), r"'ply_file_path' .*gone.ply does not exist"),
    (lambda m: m.update(test_filenames=["images/nope.png"]), r"'test_filenames' lists \['images/nope.png'\]"),
    (lambda m: m.update(frames=[]), r"transforms.json: expected an object with a non-empty 'frames' list"),
    # singular (numpy raises), and so near singular that the inverse is inf/nan (numpy does not raise)
    (lambda m: m.update(applied_transform=[[0, 0, 0, 0], [0, 0, 1, 0], [0, -1, 0, 0]]), r"'applied_transform' .* not invertible"),
    (lambda m: m.update(applied_transform=[[1e-310, 0, 0, 0], [0, 0, 1, 0], [0, -1, 0, 0]]), r"'applied_transform' .* not invertible"),
])
def test_nerfstudio_bad_files_name_the_file_and_key(opencv_capture, tmp_path, change, message):
    ns = colmap_to_nerfstudio(opencv_capture, tmp_path / "ns")
    _edit(ns, change)
    with pytest.raises(DataError, match=message):
        load_nerfstudio(ns)


def test_nerfstudio_malformed_json_and_ply(opencv_capture, tmp_path):
    ns = colmap_to_nerfstudio(opencv_capture, tmp_path / "ns")
    (ns / "sparse_pc.ply").write_text("ply\nformat ascii 1.0\nelement vertex 3\nproperty float x\nend_header\n1\n2\n3\n")
    with pytest.raises(DataError, match=r"sparse_pc.ply: the vertex element needs x, y, z"):
        load_nerfstudio(ns)
    for body, message in ((b"end_header", r"no line break after 'end_header'"),
                          (b"end_header\n1 2 3\n", r"the header declares 9 vertices but the file holds at most 2")):
        (ns / "sparse_pc.ply").write_bytes(b"ply\nformat ascii 1.0\nelement vertex 9\nproperty float x\n"
                                           b"property float y\nproperty float z\n" + body)
        with pytest.raises(DataError, match=r"sparse_pc.ply: " + message):
            load_nerfstudio(ns)
    path = ns / "transforms.json"
    path.write_text(path.read_text()[:-30])
    with pytest.raises(DataError, match=r"transforms.json: malformed JSON at line"):
        load_nerfstudio(ns)
