"""The built-in tabletop scene (distsplat/data/tabletop.py): valid Gaussians, surface
Gaussians lying in their surfaces, and ground-truth images showing ground and objects."""

import numpy as np
import torch

from distsplat.data.tabletop import _frames, _quats, make_tabletop_scene
from distsplat.train.scene_setup import render_ground_truth


def quat_to_matrix(q):
    """Reference (w, x, y, z) -> rotation, the textbook formula."""
    w, x, y, z = q.T
    return np.stack([
        np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
        np.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
        np.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1),
    ], 1)


def test_quaternions_put_the_thin_axis_along_the_normal():
    rng = np.random.default_rng(0)
    n = rng.normal(size=(500, 3))
    n = np.concatenate([n, [[0, 0, 1.0], [0, 0, -1.0], [1.0, 0, 0], [0, -1.0, 0]]])
    n /= np.linalg.norm(n, axis=1, keepdims=True)
    R = quat_to_matrix(_quats(_frames(n)))
    assert np.allclose(R[:, :, 2], n, atol=1e-9)  # the third (thin) axis is the normal
    assert np.allclose(R @ R.transpose(0, 2, 1), np.eye(3), atol=1e-9)


def test_scene_is_valid_and_its_images_show_ground_and_objects():
    s = make_tabletop_scene(num_cameras=8, width=48, height=36, detail=0.3)
    g = s.gaussians
    N = len(g["means"])
    assert g["quats"].shape == (N, 4) and np.allclose(np.linalg.norm(g["quats"], axis=1), 1, atol=1e-6)
    assert (g["scales"] > 0).all() and ((0 <= g["colors"]) & (g["colors"] <= 1)).all()
    assert (g["means"][:, 2] >= -1e-6).all()  # nothing below the ground
    assert len(s.test) == 1 and len(s.train) == 7
    img = render_ground_truth(s, 0).astype(float) / 255  # [36, 48, 3]
    assert img.shape == (36, 48, 3)
    # The ground fills the bottom rows (checkered: two tones), the sky above it is empty,
    # and the objects bring saturated colours (the ground is beige/brown).
    bottom = img[-4:].reshape(-1, 3)
    assert bottom.mean() > 0.2 and bottom.std(0).max() > 0.1
    assert img[0].max() < 0.05
    saturation = img.max(2) - img.min(2)
    assert (saturation > 0.5).mean() > 0.05
    assert torch.from_numpy(img).isfinite().all()
