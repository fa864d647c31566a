"""Camera paths of --render_only (distsplat/train/files/trajectory.py) on the built-in scene's ring
of cameras, whose centre and plane are known."""

import numpy as np
import pytest

from distsplat.data import make_synthetic_scene
from distsplat.train.files.trajectory import camera_path, ellipse_path, focus_depth, focus_point, interpolated_path

pytestmark = pytest.mark.numerics  # rerun under other numeric paths in CI (docs/testing.md)


@pytest.fixture
def c2w():
    return make_synthetic_scene(num_cameras=8).camtoworlds  # ring of radius 4 around the origin


def rotations_ok(path):
    R = path[:, :3, :3]
    assert np.allclose(R @ R.transpose(0, 2, 1), np.eye(3), atol=1e-12)
    assert np.allclose(np.linalg.det(R), 1.0, atol=1e-12)


def test_focus_point_of_a_ring_looking_at_the_origin_is_the_origin(c2w):
    assert np.allclose(focus_point(c2w), 0.0, atol=1e-9)


def test_interpolated_path_passes_through_every_camera(c2w):
    k = 4
    path = interpolated_path(c2w, (len(c2w) - 1) * k + 1)
    rotations_ok(path)
    # frame i*k sits exactly on camera i (Catmull-Rom interpolates its control points)
    assert np.allclose(path[::k], c2w, atol=1e-9)
    steps = np.linalg.norm(np.diff(path[:, :3, 3], axis=0), axis=1)
    assert steps.max() < 1.5 * np.linalg.norm(np.diff(c2w[:, :3, 3], axis=0), axis=1).max() / k


def test_ellipse_circles_the_focus_point_in_the_cameras_plane(c2w):
    path = ellipse_path(c2w, 24)
    rotations_ok(path)
    eye = path[:, :3, 3]
    fwd = path[:, :3, 2]
    to_target = -eye / np.linalg.norm(eye, axis=1, keepdims=True)  # the focus point is the origin
    assert np.allclose(fwd, to_target, atol=1e-9)  # every frame looks at it
    up = -c2w[:, :3, 1].mean(0)
    up /= np.linalg.norm(up)
    # upright: the image's down axis (y) points down in the world, as the training cameras'
    assert (path[:, :3, 1] @ up < -0.5).all() and (c2w[:, :3, 1] @ up < -0.5).all()
    height = eye @ up
    assert np.ptp(height) < 1e-9 and abs(height[0] - (c2w[:, :3, 3] @ up).mean()) < 1e-9
    r = np.linalg.norm(eye - height[:, None] * up, axis=1)
    assert 3.0 < r.min() and r.max() < 4.2  # the ring's radius is 4 (90th percentile of the spread)
    with pytest.raises(ValueError, match="--render_traj_path must be interp, ellipse or spiral"):
        camera_path("helix", c2w, 4)


def test_ellipse_of_a_partial_capture_sweeps_only_the_seen_arc():
    """Cameras on a 150-degree arc around an object: the ellipse goes there and back over
    that arc (a loop), never round to the unseen back; a full ring still goes round."""
    from distsplat.data.synthetic import look_at

    arc = np.deg2rad(np.linspace(-75.0, 75.0, 16))  # seen from +x, from -75 to +75 degrees
    up = np.array([0.0, 0.0, 1.0])
    c2w = np.stack([look_at(np.array([4 * np.cos(t), 4 * np.sin(t), 1.0]), np.zeros(3), up) for t in arc])
    path = ellipse_path(c2w, 60)
    rotations_ok(path)
    angles = np.degrees(np.arctan2(path[:, 1, 3], path[:, 0, 3]))
    assert angles.min() > -80 and angles.max() < 80, angles  # never behind the object
    assert angles.min() < -70 and angles.max() > 70  # the whole seen arc
    assert abs(angles[0] - angles[-1]) < 5  # there and back: the video loops
    eyes = ellipse_path(make_synthetic_scene(num_cameras=8).camtoworlds, 60)[:, :3, 3]  # a ring around the origin
    eyes /= np.linalg.norm(eyes, axis=1, keepdims=True)
    assert eyes[0] @ eyes[30] < -0.9  # all the way round: half-way is the other side


def test_spiral_of_a_forward_facing_capture():
    """gsplat's `--render_traj_path spiral` (LLFF's forward-facing path): cameras on a 3 x 3 grid
    in the plane x = 0 looking along +x, points at depths 2 to 10 ahead. The spiral stays
    around the mean camera (within the grid's spread, on both sides of it), moves along the
    view axis too, and every frame looks at the focus point ahead of it, which sits between
    near and far 3/4 of the way in disparity."""
    from distsplat.data.synthetic import look_at

    up = np.array([0.0, 0.0, 1.0])
    eyes = [np.array([0.0, y, z]) for y in (-0.5, 0.0, 0.5) for z in (-0.3, 0.0, 0.3)]
    c2w = np.stack([look_at(e, e + np.array([1.0, 0.0, 0.0]), up) for e in eyes])
    rng = np.random.default_rng(0)
    points = np.stack([rng.uniform(2.0, 10.0, 2000), rng.uniform(-1, 1, 2000), rng.uniform(-1, 1, 2000)], 1)
    d = np.concatenate([(points - e) @ np.array([1.0, 0.0, 0.0]) for e in eyes])
    near, far = np.percentile(d, [1, 99])
    depth = focus_depth(c2w, points)
    assert depth == pytest.approx(1 / (0.25 / near + 0.75 / far), rel=1e-12)
    assert near < depth < far
    path = camera_path("spiral", c2w, 40, points)
    rotations_ok(path)
    pos = path[:, :3, 3]
    assert np.abs(pos[:, 1]).max() <= 0.5 + 1e-9 and np.abs(pos[:, 2]).max() <= 0.3 + 1e-9
    assert pos[:, 1].min() < -0.4 and pos[:, 1].max() > 0.4 and pos[:, 2].min() < -0.2 and pos[:, 2].max() > 0.2
    assert np.ptp(pos[:, 0]) > 0  # and along the view axis (the grid has no spread there: radius 1e-6)
    target = np.array([depth, 0.0, 0.0])
    to_target = (target - pos) / np.linalg.norm(target - pos, axis=1, keepdims=True)
    assert np.allclose(path[:, :3, 2], to_target, atol=1e-9)
    assert (path[:, :3, 1] @ up < -0.5).all()  # upright, as the training cameras
    # without points: the axes are parallel (they meet nowhere ahead): the cameras' extent
    assert focus_depth(c2w) == pytest.approx(np.hypot(0.5, 0.3), rel=1e-12)
