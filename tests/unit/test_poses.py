"""data/poses.py: the scene's poses stored once, compactly, and the renderer's viewmats
computed per batch, against the arrays they replace (issue 20). Every comparison is exact:
reading the poses back and inverting a subset are meant to be bit for bit."""

import numpy as np
import pytest
import torch
from scipy.spatial.transform import Rotation

from distsplat.data.poses import CameraPoses, Viewmats, compact_poses
from distsplat.data.synthetic import make_synthetic_scene


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


def test_viewmats_equal_the_full_float32_tensor():
    full = rigid_poses(40, seed=3)
    old = torch.as_tensor(np.linalg.inv(full), dtype=torch.float32)  # what the trainer held: [C, 4, 4]
    for c2w in (full, compact_poses(full)):
        v = Viewmats(c2w)
        assert v.shape == (40, 4, 4) and len(v) == 40 and v.held_nbytes() == 0
        idx = torch.tensor([5, 0, 39, 5, 12])
        assert torch.equal(v[idx], old[idx]) and v[idx].dtype == torch.float32
        assert torch.equal(v[7], old[7]) and torch.equal(v[:], old) and torch.equal(v[[3, 4]], old[[3, 4]])
        d = v.double()  # tests render in float64 from the float32 poses, as .double() of the tensor did
        assert d.dtype == torch.float64 and torch.equal(d[idx], old.double()[idx])
        assert v.to(torch.float64).dtype == torch.float64 and v.detach().cpu().float().dtype == torch.float32


def test_viewmats_index_assignment_makes_them_dense():
    """--pose_noise writes perturbed poses into the viewmats (pose_opt.setup_pose_opt)."""
    full = rigid_poses(10, seed=5)
    old = torch.as_tensor(np.linalg.inv(full), dtype=torch.float32)
    v = Viewmats(compact_poses(full))
    idx = torch.tensor([1, 4, 6])
    new = old[idx] * 2
    v[idx] = new
    old[idx] = new
    assert torch.equal(v[:], old) and v.held_nbytes() == old.nbytes
    assert torch.equal(v.double()[idx], old.double()[idx])


def test_scene_holds_one_compact_copy():
    scene = make_synthetic_scene(num_cameras=6, num_gaussians=50)
    assert isinstance(scene.camtoworlds, CameraPoses)
    cams = scene.camera_tensors()
    ref = torch.as_tensor(np.linalg.inv(np.asarray(scene.camtoworlds)), dtype=torch.float32)
    assert isinstance(cams["viewmats"], Viewmats) and torch.equal(cams["viewmats"][:], ref)
    np.testing.assert_array_equal(scene.viewmats, np.linalg.inv(np.asarray(scene.camtoworlds)))
