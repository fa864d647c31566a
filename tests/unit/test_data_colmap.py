"""COLMAP parsing against pycolmap (the independent reference) on the real thermos capture,
text round trips, data factors, splits, normalization and camera models."""

import math

import numpy as np
import pytest

from distsplat.data import DataError, load_colmap
from distsplat.data import colmap_io
from distsplat.data.normalize import similarity_from_cameras

from .data_helpers import make_colmap_dataset, pillow_decode, scene_to_model

pytestmark = pytest.mark.numerics  # rerun under other numeric paths in CI (docs/testing.md)

pycolmap = pytest.importorskip("pycolmap", reason="pycolmap (dev extra) is the reference COLMAP reader")


@pytest.fixture
def thermos(shared_data):
    path = shared_data / "thermos"
    if not path.is_dir():
        pytest.skip(f"{path} not found")
    return path


def pycolmap_cameras(sparse):
    """(names sorted, w2c [C, 3, 4], K [C, 3, 3], (w, h)) as pycolmap reports them."""
    rec = pycolmap.Reconstruction(str(sparse))
    ims = sorted(rec.images.values(), key=lambda im: im.name)
    w2c = np.stack([np.asarray(im.cam_from_world().matrix()) for im in ims])
    K = np.stack([np.asarray(rec.cameras[im.camera_id].calibration_matrix()) for im in ims])
    sizes = [(rec.cameras[im.camera_id].width, rec.cameras[im.camera_id].height) for im in ims]
    return rec, [im.name for im in ims], w2c, K, sizes


def test_thermos_matches_pycolmap(thermos):
    scene = load_colmap(thermos, factor=1)
    rec, names, w2c, K, sizes = pycolmap_cameras(thermos / "sparse" / "0")
    assert scene.num_cameras == 101 == len(names)
    assert scene.names == names
    viewmats = np.linalg.inv(scene.camtoworlds)  # [C, 4, 4] float64 world-to-camera
    np.testing.assert_allclose(viewmats[:, :3, :], w2c, atol=1e-12)
    np.testing.assert_allclose(viewmats[:, 3, :], np.tile([0, 0, 0, 1.0], (101, 1)), atol=1e-12)
    np.testing.assert_allclose(scene.Ks, K, rtol=1e-12)
    assert [tuple(s) for s in zip(scene.widths, scene.heights)] == sizes
    pts = rec.points3D
    ids = sorted(pts)
    order = np.argsort(np.array([int(i) for i in ids]))
    assert len(scene.points) == len(ids) == 6885
    ref_xyz = np.stack([pts[i].xyz for i in ids])[order]
    ref_rgb = np.stack([pts[i].color for i in ids])[order]
    ours = np.argsort(colmap_io.read_points_bin(thermos / "sparse" / "0" / "points3D.bin").ids)
    np.testing.assert_allclose(scene.points[ours], ref_xyz.astype(np.float32))
    np.testing.assert_array_equal(scene.points_rgb[ours], ref_rgb)


def test_thermos_images_2_scales_intrinsics(thermos):
    full, half = load_colmap(thermos, factor=1), load_colmap(thermos, factor=2)
    assert (half.widths == 473).all() and (half.heights == 266).all()
    np.testing.assert_allclose(half.Ks[:, :2, :], full.Ks[:, :2, :] * 473 / 946)
    np.testing.assert_array_equal(half.Ks[:, 2, :], full.Ks[:, 2, :])
    assert str(half.images.where(0)).endswith("images_2/input_0001.jpg")
    np.testing.assert_array_equal(half.camtoworlds, full.camtoworlds)


def test_thermos_split_from_files(thermos):
    scene = load_colmap(thermos, factor=2)
    test_names = (thermos / "test.txt").read_text().split()
    assert [scene.names[i] for i in scene.test] == sorted(test_names)
    assert len(scene.train) == 88 and len(scene.test) == 13
    assert not set(scene.train) & set(scene.test)


def test_every_8th_split_without_files(tmp_path):
    root = make_colmap_dataset(tmp_path / "d", num_cameras=20)
    scene = load_colmap(root)
    assert scene.test.tolist() == [0, 8, 16]
    assert scene.train.tolist() == [i for i in range(20) if i % 8]


def test_text_round_trip_with_pycolmap_writer(thermos, tmp_path):
    rec = pycolmap.Reconstruction(str(thermos / "sparse" / "0"))
    (tmp_path / "sparse" / "0").mkdir(parents=True)
    rec.write_text(str(tmp_path / "sparse" / "0"))
    (tmp_path / "images").symlink_to(thermos / "images")
    a, b = load_colmap(thermos, factor=1), load_colmap(tmp_path, factor=1)
    assert a.names == b.names
    np.testing.assert_allclose(b.camtoworlds, a.camtoworlds, atol=1e-9)
    np.testing.assert_allclose(b.Ks, a.Ks, rtol=1e-9)
    assert len(b.points) == len(a.points)


def test_text_round_trip_with_our_writer(thermos, tmp_path):
    model = colmap_io.read_model(thermos / "sparse" / "0")
    colmap_io.write_model_txt(model, tmp_path / "txt")
    back = colmap_io.read_model(tmp_path / "txt")
    assert {k: (c.model, c.width, c.height) for k, c in back.cameras.items()} == {
        k: (c.model, c.width, c.height) for k, c in model.cameras.items()}
    for k, im in model.images.items():
        assert back.images[k].name == im.name and back.images[k].camera_id == im.camera_id
        np.testing.assert_array_equal(back.images[k].qvec, im.qvec)
        np.testing.assert_array_equal(back.images[k].tvec, im.tvec)
    np.testing.assert_array_equal(back.points.xyz, model.points.xyz)
    np.testing.assert_array_equal(back.points.rgb, model.points.rgb)
    # and pycolmap reads our text the same way
    rec = pycolmap.Reconstruction(str(tmp_path / "txt"))
    assert sorted(im.name for im in rec.images.values()) == sorted(im.name for im in model.images.values())


def test_on_the_fly_downscale_matches_images_2(thermos, tmp_path):
    (tmp_path / "sparse").symlink_to(thermos / "sparse")
    (tmp_path / "images").symlink_to(thermos / "images")
    fly, pre = load_colmap(tmp_path, factor=2), load_colmap(thermos, factor=2)
    assert (fly.widths == 473).all() and (fly.heights == 266).all()
    np.testing.assert_allclose(fly.Ks, pre.Ks)
    from distsplat.data import ImageCache

    cache = ImageCache(fly.images, fly.specs(), [0], mode="none")
    out = np.empty(fly.spec(0).shape, np.uint8)
    cache.read_into(0, out)
    np.testing.assert_array_equal(out, pillow_decode(thermos / "images" / fly.names[0], (473, 266)))


def test_normalize_properties(thermos):
    raw, norm = load_colmap(thermos, factor=2), load_colmap(thermos, factor=2, normalize=True)
    T1 = similarity_from_cameras(raw.camtoworlds)
    s = np.cbrt(np.linalg.det(T1[:3, :3]))
    R1 = T1[:3, :3] / s
    up = -raw.camtoworlds[:, :3, 1].mean(0)
    np.testing.assert_allclose(R1 @ up / np.linalg.norm(up), [0, -1, 0], atol=1e-12)  # gsplat's up axis
    rotated = raw.camtoworlds[:, :3, 3] @ R1.T
    fwd = raw.camtoworlds[:, :3, 2] @ R1.T
    nearest = rotated + ((-rotated * fwd).sum(-1, keepdims=True)) * fwd  # optical axes' closest points to the origin
    np.testing.assert_allclose(s * np.median(nearest, 0) + T1[:3, 3], 0, atol=1e-9)  # their median becomes the origin
    centres = raw.camtoworlds[:, :3, 3] @ T1[:3, :3].T + T1[:3, 3]
    assert math.isclose(np.median(np.linalg.norm(centres, axis=1)), 1.0, rel_tol=1e-9)
    # the whole transform maps raw to normalized cameras and points; rotations stay rotations
    T = norm.transform
    np.testing.assert_allclose(raw.points @ T[:3, :3].T + T[:3, 3], norm.points, atol=1e-4)
    R = norm.camtoworlds[:, :3, :3]
    np.testing.assert_allclose(R @ R.transpose(0, 2, 1), np.tile(np.eye(3), (101, 1, 1)), atol=1e-9)
    cov = np.cov(norm.points.T.astype(np.float64))
    assert abs(cov[0, 1]) < 1e-3 * cov[0, 0] and cov[0, 0] >= cov[1, 1] >= cov[2, 2]
    # same pixels project to the same place: K @ viewmat @ point is invariant up to scale
    p = np.append(raw.points[0], 1.0)
    q = np.append(norm.points[0], 1.0)
    a = raw.Ks[3] @ (np.linalg.inv(raw.camtoworlds[3]) @ p)[:3]
    b = norm.Ks[3] @ (np.linalg.inv(norm.camtoworlds[3]) @ q)[:3]
    np.testing.assert_allclose(a[:2] / a[2], b[:2] / b[2], atol=1e-3)


@pytest.mark.parametrize("model,params", [
    ("SIMPLE_PINHOLE", [50.0, 32.0, 24.0]),
    ("SIMPLE_RADIAL", [50.0, 32.0, 24.0, 0.0]),
    ("RADIAL", [50.0, 32.0, 24.0, 0.0, 0.0]),
    ("OPENCV", [50.0, 51.0, 32.0, 24.0, 0.0, 0.0, 0.0, 0.0]),
])
def test_undistorted_models_accepted(tmp_path, model, params):
    root = make_colmap_dataset(tmp_path / "d", num_cameras=3)
    from distsplat.data.synthetic import make_synthetic_scene

    colmap_io.write_model_bin(scene_to_model(make_synthetic_scene(num_cameras=3, num_gaussians=300, width=64, height=48),
                                             model, params), root / "sparse" / "0")
    scene = load_colmap(root)
    fx, fy = (params[0], params[1]) if model == "OPENCV" else (params[0], params[0])
    np.testing.assert_allclose(scene.Ks[0], [[fx, 0, 32], [0, fy, 24], [0, 0, 1]])


@pytest.mark.parametrize("model,params", [
    ("FOV", [50.0, 51.0, 32.0, 24.0, 0.1]),
    ("THIN_PRISM_FISHEYE", [50.0, 51.0, 32.0, 24.0] + [0.01] * 8),
])
def test_unsupported_models_refused_with_how_to(tmp_path, model, params):
    root = make_colmap_dataset(tmp_path / "d", num_cameras=3)
    from distsplat.data.synthetic import make_synthetic_scene

    colmap_io.write_model_bin(scene_to_model(make_synthetic_scene(num_cameras=3, num_gaussians=300, width=64, height=48),
                                             model, params), root / "sparse" / "0")
    with pytest.raises(DataError, match="colmap image_undistorter") as e:
        load_colmap(root)
    assert "cameras.bin" in str(e.value) and model in str(e.value)


def test_own_parser_matches_pycolmap_on_generated_model(tmp_path):
    root = make_colmap_dataset(tmp_path / "d", num_cameras=6)
    scene = load_colmap(root)
    _, names, w2c, K, _ = pycolmap_cameras(root / "sparse" / "0")
    assert scene.names == names
    np.testing.assert_allclose(np.linalg.inv(scene.camtoworlds)[:, :3], w2c, atol=1e-12)
    np.testing.assert_allclose(scene.Ks, K)
