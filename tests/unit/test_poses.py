"""data/poses.py: the scene's poses stored once, compactly, and the renderer's viewmats
computed per batch (Scene.viewmats), against the arrays they replace (issue 20). Every
comparison is exact: reading the poses back and inverting a subset are meant to be bit for bit."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.spatial.transform import Rotation

from distsplat.data.poses import CameraPoses, compact_poses
from distsplat.data.synthetic import make_synthetic_scene
from distsplat.train.model.pose_opt import perturb_poses, setup_pose_opt


def rigid_poses(n: int, seed: int = 0) -> np.ndarray:
    """[n, 4, 4] float64 camera-to-world matrices as colmap.py makes them: inv of w2c."""
    rng = np.random.default_rng(seed)
    w2c = np.zeros((n, 4, 4))
    w2c[:, :3, :3] = Rotation.random(n, random_state=seed).as_matrix()
    w2c[:, :3, 3] = rng.normal(scale=3.0, size=(n, 3))
    w2c[:, 3, 3] = 1.0
    return np.linalg.inv(w2c)


def test_compact_poses_read_back_bit_for_bit():
    full = rigid_poses(50)
    poses = compact_poses(full)
    assert isinstance(poses, CameraPoses)
    assert poses.shape == (50, 4, 4) and len(poses) == 50 and poses.nbytes == full.nbytes * 3 // 4
    np.testing.assert_array_equal(np.asarray(poses), full)
    idx = np.array([7, 0, 49, 7])
    for key in [3, -1, idx, torch.tensor(idx), slice(2, 9), [1, 2], (slice(None), slice(None, 3), 3),
                (slice(None), 3), (slice(None), -1), (idx, slice(None, 3), slice(None, 3)), (4, 1),
                (slice(None), slice(1, 4)), (Ellipsis, 3), (slice(None), 2, slice(None))]:
        ref_key = key.numpy() if isinstance(key, torch.Tensor) else key
        np.testing.assert_array_equal(poses[key], full[ref_key], err_msg=str(key))
        assert poses[key].dtype == np.float64
    assert np.asarray(poses, dtype=np.float32).dtype == np.float32
    np.testing.assert_array_equal(np.linalg.inv(poses), np.linalg.inv(full))
    assert [m.shape for m in poses][:2] == [(4, 4), (4, 4)] and len(list(poses)) == 50
    with pytest.raises(TypeError, match="read-only"):
        poses[0] = np.eye(4)


def test_compact_poses_keeps_what_it_cannot_read_back_exactly():
    full = rigid_poses(4)
    for bad in (1e-17, -0.0):  # a bottom row off by rounding, or a signed zero
        a = full.copy()
        a[2, 3, 0] = bad
        assert compact_poses(a) is a
    f32 = full.astype(np.float32)
    assert compact_poses(f32) is f32
    assert isinstance(compact_poses(full), CameraPoses)


def test_scene_viewmats_equal_the_full_float32_tensor():
    full = rigid_poses(40, seed=3)
    old = torch.as_tensor(np.linalg.inv(full), dtype=torch.float32)  # what the trainer held: [C, 4, 4]
    signed = full.copy()
    signed[2, 3, 0] = -0.0  # kept as a plain [C, 4, 4] array (compact_poses), inverted the same
    base = make_synthetic_scene(num_cameras=40, num_gaussians=50)
    for c2w, kind in ((full, CameraPoses), (signed, np.ndarray)):
        scene = dataclasses.replace(base, camtoworlds=c2w)
        assert isinstance(scene.camtoworlds, kind)
        idx = np.array([5, 0, 39, 5, 12])
        v = scene.viewmats(idx)
        assert torch.equal(v, old[idx]) and v.dtype == torch.float32 and v.shape == (5, 4, 4)
        assert torch.equal(scene.viewmats([7]), old[[7]]) and torch.equal(scene.viewmats(slice(None)), old)
        assert torch.equal(scene.viewmats(idx, torch.device("cpu")), old[idx])


def test_pose_noise_perturbs_the_training_poses_as_before():
    """--pose_noise's poses are the float32 values the trainer rendered with when it wrote
    perturb_poses(viewmats[train]) into its dense [C_all, 4, 4] viewmats."""
    scene = make_synthetic_scene(num_cameras=12, num_gaussians=50)
    train = np.asarray(scene.train)
    dense = torch.as_tensor(np.linalg.inv(np.asarray(scene.camtoworlds)), dtype=torch.float32)  # [C_all, 4, 4]
    dense[train] = perturb_poses(dense[train], 0.01, seed=3)
    cfg = SimpleNamespace(pose_noise=0.01, seed=3, pose_opt=False)
    noisy, pose = setup_pose_opt(cfg, scene, train, 1, torch.device("cpu"))
    assert pose is None and noisy.dtype == torch.float32 and torch.equal(noisy, dense[train])
    assert setup_pose_opt(SimpleNamespace(pose_noise=0.0, pose_opt=False), scene, train, 1, "cpu") == (None, None)


def test_scene_holds_one_compact_copy():
    scene = make_synthetic_scene(num_cameras=6, num_gaussians=50)
    assert isinstance(scene.camtoworlds, CameraPoses)
    assert set(scene.camera_tensors()) == {"Ks", "widths", "heights"}  # no [C_all, 4, 4] of poses
