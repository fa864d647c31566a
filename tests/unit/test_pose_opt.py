"""Pose corrections (train/model/pose_opt.py) against their definition: gsplat's CameraOptModule
composes c2w' = c2w @ [R(6D) dx; 0 1], so the corrected world-to-camera matrix must be
inv(inv(viewmat) @ T), computed here with general matrix inverses."""

import math

import pytest
import torch

from distsplat.train.model.pose_opt import PoseCorrections, perturb_poses, rotation_6d_to_matrix

pytestmark = pytest.mark.numerics  # rerun under other numeric paths in CI (docs/testing.md)


def _viewmats(C: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    q = torch.nn.functional.normalize(torch.randn(C, 4, generator=g, dtype=torch.float64), dim=-1)
    w, x, y, z = q.unbind(-1)
    R = torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
                     2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
                     2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1).reshape(C, 3, 3)
    vm = torch.eye(4, dtype=torch.float64).repeat(C, 1, 1)
    vm[:, :3, :3], vm[:, :3, 3] = R, torch.randn(C, 3, generator=g, dtype=torch.float64)
    return vm


def test_correction_is_gsplats_right_composition_on_camera_to_world():
    vm = _viewmats(5)
    pose = PoseCorrections(8, lr=1e-3, reg=0.0, global_batch=1, device=torch.device("cpu"), dtype=torch.float64)
    with torch.no_grad():
        pose.deltas.normal_(std=0.1, generator=torch.Generator().manual_seed(2))
    cams = torch.tensor([0, 3, 7, 2, 5])
    d = pose.deltas.detach()[cams]
    T = torch.eye(4, dtype=torch.float64).repeat(5, 1, 1)
    T[:, :3, :3] = rotation_6d_to_matrix(d[:, 3:] + torch.tensor([1.0, 0, 0, 0, 1, 0], dtype=torch.float64))
    T[:, :3, 3] = d[:, :3]
    expect = torch.linalg.inv(torch.linalg.inv(vm) @ T)
    torch.testing.assert_close(pose.apply(vm, cams), expect, rtol=0, atol=1e-12)
    # zero corrections: the identity
    zero = PoseCorrections(8, 1e-3, 0.0, 1, torch.device("cpu"), torch.float64)
    torch.testing.assert_close(zero.apply(vm, cams), vm, rtol=0, atol=1e-15)


def test_rotation_6d_is_a_rotation():
    R = rotation_6d_to_matrix(torch.randn(10, 6, dtype=torch.float64))
    torch.testing.assert_close(R @ R.transpose(1, 2), torch.eye(3, dtype=torch.float64).expand(10, 3, 3))
    torch.testing.assert_close(torch.linalg.det(R), torch.ones(10, dtype=torch.float64))


def test_pose_noise_is_seeded_and_about_a_degree_at_001():
    vm = _viewmats(200)
    a, b = perturb_poses(vm, 0.01, seed=3), perturb_poses(vm, 0.01, seed=3)
    assert torch.equal(a, b) and not torch.equal(a, perturb_poses(vm, 0.01, seed=4))
    R = a[:, :3, :3] @ vm[:, :3, :3].transpose(1, 2)
    angle = torch.arccos(((R.diagonal(dim1=1, dim2=2).sum(-1) - 1) / 2).clamp(-1, 1))
    # 6D noise of std s on unit vectors tilts each by ~s sqrt(2) rad: the angle ~ s x O(1)
    assert 0.3 < math.degrees(float(angle.mean())) < 2.0
