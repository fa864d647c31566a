"""Outputs in known coordinates (train/files/coords.py, issue 32): SH rotation exact for every
degree, Gaussians moved into the capture's world render the same images through the
cameras moved with them, cameras.json in the 3DGS layout."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from gsplat.cuda._torch_impl import _spherical_harmonics

from distsplat.data.normalize import transform_cameras
from distsplat.data.synthetic import make_synthetic_scene
from distsplat.render import rasterize
from distsplat.train.files.coords import (frame_info, matrix_to_quat, sh_rotation, to_capture,
                                    write_frame_files)
from distsplat.train.model.gaussians import activated

pytestmark = pytest.mark.numerics  # rerun under other numeric paths in CI (docs/testing.md)


def random_rotation(seed: int) -> np.ndarray:
    q, r = np.linalg.qr(np.random.default_rng(seed).normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


def similarity(seed: int, scale: float = 0.37) -> np.ndarray:
    T = np.eye(4)
    T[:3, :3] = scale * random_rotation(seed)
    T[:3, 3] = np.random.default_rng(seed + 1).normal(size=3)
    return T


@pytest.mark.parametrize("degree", [0, 1, 2, 3, 4])
def test_sh_rotation_equals_evaluating_at_rotated_directions(degree):
    """Coefficients X c evaluated at d give what c gives at R d, for directions the
    solver never saw, to float64 rounding."""
    K = (degree + 1) ** 2
    gen = torch.Generator().manual_seed(degree)
    R = random_rotation(degree + 10)
    X = torch.from_numpy(sh_rotation(R, degree))
    coeffs = torch.randn(500, K, 3, generator=gen, dtype=torch.float64)
    dirs = torch.randn(500, 3, generator=gen, dtype=torch.float64)
    want = _spherical_harmonics(degree, dirs @ torch.from_numpy(R).T, coeffs)  # f(R d)
    got = _spherical_harmonics(degree, dirs, torch.einsum("jk,nkc->njc", X, coeffs))
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    # ... and is not the identity (the test can fail): unrotated coefficients differ at R d
    if degree > 0:
        assert (_spherical_harmonics(degree, dirs, coeffs) - want).abs().max() > 1e-2


def test_matrix_to_quat_round_trips_every_pivot():
    from distsplat.render.torch_backend import quat_scale_to_covar

    for R in [random_rotation(s) for s in range(20)] + [np.diag([1.0, -1, -1]), np.diag([-1.0, 1, -1]),
                                                         np.diag([-1.0, -1, 1]), np.eye(3)]:
        q = torch.from_numpy(matrix_to_quat(R))[None]
        back = quat_scale_to_covar(q, torch.ones(1, 3, dtype=torch.float64))[0]  # R I R^T: not enough
        rot = quat_scale_to_covar(q, torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64))[0]
        want = R @ np.diag([1.0, 4.0, 9.0]) @ R.T
        np.testing.assert_allclose(rot.numpy(), want, atol=1e-12)
        np.testing.assert_allclose(back.numpy(), np.eye(3), atol=1e-12)


def render(params, c2w, K, size=(48, 36)):
    g = activated(params)
    viewmats = torch.linalg.inv(torch.from_numpy(c2w))
    colors, _, _ = rasterize(g["means"], g["quats"], g["scales"], g["opacities"], g["colors"], viewmats,
                             torch.from_numpy(K).expand(len(c2w), 3, 3), *size, sh_degree=3,
                             near_plane=1e-4, backend="torch")
    return colors


def test_gaussians_in_the_capture_world_render_the_same_images():
    """The model moved by T^-1 through the cameras moved by T^-1 gives the trained model's
    images through the trained cameras: means, scales, rotations and view-dependent SH
    colours all moved consistently. The unrotated SH would not (checked: the test can fail)."""
    scene = make_synthetic_scene(num_cameras=4, num_gaussians=150, width=48, height=36, seed=3)
    gen = torch.Generator().manual_seed(0)
    n = len(scene.gaussians["means"])
    params = {
        "means": torch.from_numpy(scene.gaussians["means"]).double(),
        "scales": torch.log(torch.from_numpy(scene.gaussians["scales"]).double()),
        "quats": torch.randn(n, 4, generator=gen, dtype=torch.float64) * 2,  # unnormalised, as trained
        "opacities": torch.logit(torch.from_numpy(scene.gaussians["opacities"]).double().clamp(0.05, 0.95)),
        "sh0": torch.randn(n, 1, 3, generator=gen, dtype=torch.float64) * 0.5,
        "shN": torch.randn(n, 15, 3, generator=gen, dtype=torch.float64) * 0.5,  # strongly view-dependent
    }
    T = similarity(7)
    c2w_n = np.asarray(scene.camtoworlds, dtype=np.float64)
    c2w_c = transform_cameras(np.linalg.inv(T), c2w_n)
    want = render(params, c2w_n, scene.Ks[0])
    moved = to_capture(params, T)
    got = render(moved, c2w_c, scene.Ks[0])
    assert want.abs().max() > 0.1  # something is drawn
    torch.testing.assert_close(got, want, atol=1e-9, rtol=0)
    assert torch.equal(moved["opacities"], params["opacities"])
    np.testing.assert_allclose(torch.exp(moved["scales"] - params["scales"]).numpy(), 1 / 0.37, rtol=1e-12)
    unrotated = {**moved, "sh0": params["sh0"], "shN": params["shN"]}
    assert (render(unrotated, c2w_c, scene.Ks[0]) - want).abs().max() > 1e-2


def test_frame_files(tmp_path):
    """cameras.json: the 3DGS keys, train cameras then test, positions and rotations the
    cameras' in the PLY's world; transform.json: T, its scale and inverse."""
    scene = make_synthetic_scene(num_cameras=10, num_gaussians=50, width=32, height=24)
    scene.transform = similarity(5, scale=2.5)
    scene.names = [f"cam{i % 2}/frame_{i:04d}.jpg" for i in range(10)]  # as loaders name images in folders
    for frame in ("normalized", "capture"):
        info = write_frame_files(tmp_path, scene, frame)
        cams = json.loads((tmp_path / "cameras.json").read_text())
        assert json.loads((tmp_path / "transform.json").read_text()) == json.loads(json.dumps(info))
        assert info["scale"] == pytest.approx(2.5) and info["ply_frame"] == info["cameras_frame"] == frame
        np.testing.assert_allclose(np.array(info["capture_from_normalized"]) @ scene.transform, np.eye(4),
                                   atol=1e-12)
        order = list(scene.train) + list(scene.test)
        assert [c["id"] for c in cams] == list(range(10))
        assert [c["img_name"] for c in cams] == [f"frame_{i:04d}" for i in order]  # 3DGS' stem
        assert set(cams[0]) == {"id", "img_name", "width", "height", "position", "rotation", "fx", "fy"}
        c2w = np.asarray(scene.camtoworlds)[order]
        if frame == "capture":  # the capture's camera centres: T^-1 of the trained ones
            c2w = transform_cameras(np.linalg.inv(scene.transform), c2w)
            centres = (np.linalg.inv(scene.transform) @ np.c_[np.asarray(scene.camtoworlds)[order][:, :3, 3],
                                                               np.ones(10)].T).T[:, :3]
            np.testing.assert_allclose([c["position"] for c in cams], centres, atol=1e-12)
        np.testing.assert_allclose([c["position"] for c in cams], c2w[:, :3, 3], atol=1e-12)
        np.testing.assert_allclose([c["rotation"] for c in cams], c2w[:, :3, :3], atol=1e-12)
        assert cams[0]["fx"] == scene.Ks[order[0]][0, 0] and cams[0]["width"] == 32


def test_frame_info_identity_for_an_unnormalised_scene():
    info = frame_info(np.eye(4), "normalized")
    assert info["scale"] == 1.0 and info["normalized_from_capture"] == np.eye(4).tolist()
    assert math.isclose(np.linalg.det(np.array(info["capture_from_normalized"])), 1.0)


def test_the_viewers_open_at_the_first_training_camera(tmp_path):
    """examples/simple_viewer.py's first view: a checkpoint's (normalised) or a PLY's (in
    transform.json's ply_frame) first training camera; None for a PLY with no run around it."""
    from distsplat.viewer import training_view

    scene = make_synthetic_scene(num_cameras=10, num_gaussians=50, width=32, height=24)
    scene.transform = similarity(5, scale=2.5)
    trained = np.asarray(scene.camtoworlds)[scene.train[0]]  # normalised, as the model trained
    for frame in ("normalized", "capture"):
        write_frame_files(tmp_path, scene, frame)
        position, look_at, up = training_view(str(tmp_path / "ckpts" / "step_000002"))
        np.testing.assert_allclose(position, trained[:3, 3], atol=1e-12)
        forward = (look_at - position) / np.linalg.norm(look_at - position)
        np.testing.assert_allclose(forward, trained[:3, 2], atol=1e-12)
        position, _, _ = training_view(str(tmp_path / "ply" / "point_cloud_0002.ply"))
        cams = json.loads((tmp_path / "cameras.json").read_text())
        np.testing.assert_allclose(position, cams[0]["position"], atol=1e-12)  # the PLY's world
        if frame == "capture":
            assert not np.allclose(position, trained[:3, 3])
    assert training_view(str(tmp_path / "elsewhere" / "deeper" / "model.ply")) is None


def test_cameras_json_chunks_are_one_file(tmp_path, monkeypatch):
    """cameras.json written chunk by chunk (bounded temporaries at a million cameras): ids
    run across chunks, the entries are those of one chunk, no temporary file is left."""
    import distsplat.train.files.coords as coords

    scene = make_synthetic_scene(num_cameras=23, num_gaussians=50, width=32, height=24)
    scene.transform = similarity(3, scale=0.5)
    write_frame_files(tmp_path / "a", scene, "capture")
    monkeypatch.setattr(coords, "CHUNK", 5)  # 23 cameras in 5 chunks
    write_frame_files(tmp_path / "b", scene, "capture")
    for name in ("cameras.json", "transform.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    cams = json.loads((tmp_path / "b" / "cameras.json").read_text())
    assert [c["id"] for c in cams] == list(range(23))
    assert not list((tmp_path / "b").glob("*.tmp"))
