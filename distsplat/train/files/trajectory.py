"""Camera paths through a scene for --render_only videos, as gsplat's simple_trainer
renders them: a smooth path interpolated through the training cameras, an ellipse
around the point the cameras look at, or a spiral around the mean camera (forward-facing
captures). Pure numpy on camera-to-world matrices (OpenCV axes: x right, y down, z
forward), shared by every rank (each computes the same path)."""

from __future__ import annotations

from typing import Optional

import numpy as np

from ...data.synthetic import look_at  # [4, 4] camera-to-world from eye, target, up


def focus_point(camtoworlds: np.ndarray) -> np.ndarray:
    """[3] the point nearest (least squares) to every camera's optical axis."""
    origins, dirs = camtoworlds[:, :3, 3], camtoworlds[:, :3, 2]  # [C, 3], [C, 3]
    dirs = dirs / np.linalg.norm(dirs, axis=1, keepdims=True)
    P = np.eye(3)[None] - dirs[:, :, None] * dirs[:, None, :]  # [C, 3, 3] projectors off each axis
    A, b = P.sum(0), (P @ origins[:, :, None]).sum(0)[:, 0]
    return np.linalg.lstsq(A, b, rcond=None)[0]


def _orthonormal(forward: np.ndarray, down: np.ndarray) -> np.ndarray:
    """[3, 3] rotation with z along forward and y as close to down as possible."""
    z = forward / np.linalg.norm(forward)
    x = np.cross(down, z)
    x = x / np.linalg.norm(x)
    return np.stack([x, np.cross(z, x), z], axis=1)


def interpolated_path(camtoworlds: np.ndarray, n_frames: int) -> np.ndarray:
    """[n_frames, 4, 4] through the cameras in their order: positions on a Catmull-Rom
    spline (it passes through every camera), axes interpolated and re-orthonormalised."""
    C = len(camtoworlds)
    if C == 1:
        return np.repeat(camtoworlds[:1], n_frames, 0)
    pos = camtoworlds[:, :3, 3]
    fwd, down = camtoworlds[:, :3, 2], camtoworlds[:, :3, 1]
    t = np.linspace(0.0, C - 1.0, n_frames)
    i = np.minimum(t.astype(int), C - 2)  # [F] segment
    s = (t - i)[:, None]  # [F, 1] position in the segment
    p0, p1, p2, p3 = (pos[np.clip(i + k, 0, C - 1)] for k in (-1, 0, 1, 2))
    # Catmull-Rom (uniform): the tangent at each camera is half the chord of its neighbours.
    xyz = 0.5 * ((2 * p1) + (-p0 + p2) * s + (2 * p0 - 5 * p1 + 4 * p2 - p3) * s**2 + (-p0 + 3 * p1 - 3 * p2 + p3) * s**3)
    f = (1 - s) * fwd[i] + s * fwd[i + 1]
    d = (1 - s) * down[i] + s * down[i + 1]
    out = np.tile(np.eye(4), (n_frames, 1, 1))
    for k in range(n_frames):
        out[k, :3, :3] = _orthonormal(f[k], d[k])
    out[:, :3, 3] = xyz
    return out


# A capture whose cameras leave a gap wider than this around the focus point (a 150-degree
# walk around an object leaves 210) is partial: its ellipse sweeps the seen arc, not the back.
PARTIAL_GAP = np.pi / 2


def seen_arc(theta: np.ndarray) -> tuple:
    """(start, span) in radians of the arc that camera angles `theta` [C] cover, the circle
    minus their widest gap; (0, 2 pi) when no gap is wider than PARTIAL_GAP."""
    t = np.sort(np.mod(theta, 2 * np.pi))
    gaps = np.diff(np.concatenate([t, t[:1] + 2 * np.pi]))  # [C] gap after each camera
    widest = int(np.argmax(gaps))
    if gaps[widest] <= PARTIAL_GAP:
        return 0.0, 2 * np.pi
    return float(t[(widest + 1) % len(t)]), float(2 * np.pi - gaps[widest])


def ellipse_path(camtoworlds: np.ndarray, n_frames: int) -> np.ndarray:
    """[n_frames, 4, 4] on an ellipse around the cameras' focus point, in the plane of the
    cameras (perpendicular to their mean up), radii the 90th percentile of their spread
    along the plane's principal axes, every frame looking at the focus point. A partial
    capture (seen_arc) sweeps its seen arc there and back, so the video loops and never
    shows the unseen back (issue 32); a full ring goes round once, as gsplat's."""
    pos = camtoworlds[:, :3, 3]
    up = -camtoworlds[:, :3, 1].mean(0)
    up = up / np.linalg.norm(up)
    target = focus_point(camtoworlds)
    rel = pos - pos.mean(0)
    flat = rel - (rel @ up)[:, None] * up  # [C, 3] in the plane
    _, _, vt = np.linalg.svd(flat, full_matrices=True)
    a = vt[0] - (vt[0] @ up) * up
    a = a / np.linalg.norm(a)
    b = np.cross(up, a)
    centre = target + ((pos.mean(0) - target) @ up) * up  # the focus point lifted to the cameras' height
    ra = max(np.percentile(np.abs((pos - centre) @ a), 90), 1e-6)
    rb = max(np.percentile(np.abs((pos - centre) @ b), 90), 1e-6)
    start, span = seen_arc(np.arctan2(((pos - centre) @ b) / rb, ((pos - centre) @ a) / ra))
    t = np.linspace(0.0, 1.0, n_frames, endpoint=False)
    theta = 2 * np.pi * t if span >= 2 * np.pi else start + span * (1 - np.cos(2 * np.pi * t)) / 2
    eyes = centre + ra * np.cos(theta)[:, None] * a + rb * np.sin(theta)[:, None] * b
    return np.stack([look_at(e, target, up) for e in eyes])


def mean_pose(camtoworlds: np.ndarray) -> np.ndarray:
    """[4, 4] the cameras' mean position, looking along their mean forward axis, upright along
    their mean down axis."""
    out = np.eye(4)
    out[:3, :3] = _orthonormal(camtoworlds[:, :3, 2].mean(0), camtoworlds[:, :3, 1].mean(0))
    out[:3, 3] = camtoworlds[:, :3, 3].mean(0)
    return out


def focus_depth(camtoworlds: np.ndarray, points: Optional[np.ndarray] = None, weight: float = 0.75) -> float:
    """How far ahead of the mean camera a spiral looks: between the near and far depth of the
    scene's points in front of the cameras (1st and 99th percentile), `weight` of the way in
    disparity (1 / depth), as forward-facing (LLFF) captures' videos do; without points, the
    distance to the point nearest every optical axis (focus_point), or where those are
    parallel the cameras' extent."""
    pose = mean_pose(camtoworlds)
    if points is not None and len(points):
        depths = []
        for c2w in camtoworlds:  # each camera's depths of the points in front of it
            d = (np.asarray(points, np.float64) - c2w[:3, 3]) @ c2w[:3, 2]
            depths.append(d[d > 1e-6])
        d = np.concatenate(depths)
        if len(d):
            near, far = np.percentile(d, [1.0, 99.0])
            return float(1.0 / ((1.0 - weight) / near + weight / far))
    ahead = float((focus_point(camtoworlds) - pose[:3, 3]) @ pose[:3, 2])
    if np.isfinite(ahead) and ahead > 1e-6:
        return ahead
    # parallel axes meet nowhere ahead: the cameras' own extent (1 for a single camera)
    spread = np.linalg.norm(camtoworlds[:, :3, 3] - pose[:3, 3], axis=1).max()
    return float(spread if spread > 1e-6 else 1.0)


def spiral_path(camtoworlds: np.ndarray, n_frames: int, points: Optional[np.ndarray] = None,
                rotations: int = 2, z_rate: float = 0.5) -> np.ndarray:
    """[n_frames, 4, 4] on a spiral around the mean camera (gsplat's `--render_traj_path spiral`
    for forward-facing captures): in the mean camera's frame the eye moves on an ellipse of
    the cameras' spread (90th percentile of |position - mean| along its x and y), `rotations`
    times round, and back and forth along its forward axis (its spread there) `z_rate` times as
    fast; every frame looks at the point focus_depth ahead of the mean camera."""
    pose = mean_pose(camtoworlds)
    R, centre = pose[:3, :3], pose[:3, 3]
    local = (camtoworlds[:, :3, 3] - centre) @ R  # [C, 3] positions in the mean camera's frame
    radii = np.maximum(np.percentile(np.abs(local), 90, axis=0), 1e-6)
    target = centre + focus_depth(camtoworlds, points) * R[:, 2]
    theta = np.linspace(0.0, 2 * np.pi * rotations, n_frames, endpoint=False)
    offsets = radii * np.stack([np.cos(theta), -np.sin(theta), -np.sin(theta * z_rate)], axis=1)  # [F, 3]
    eyes = centre + offsets @ R.T
    up = -R[:, 1]  # look_at's up: the image's down axis points away from it
    return np.stack([look_at(e, target, up) for e in eyes])


def camera_path(kind: str, camtoworlds: np.ndarray, n_frames: int, points: Optional[np.ndarray] = None) -> np.ndarray:
    """`--render_traj_path`'s path through the training cameras `camtoworlds` [C, 4, 4]; `points`
    [P, 3] (the scene's sparse points) place a spiral's focus."""
    if kind == "interp":
        return interpolated_path(camtoworlds, n_frames)
    if kind == "ellipse":
        return ellipse_path(camtoworlds, n_frames)
    if kind == "spiral":
        return spiral_path(camtoworlds, n_frames, points)
    raise ValueError(f"--render_traj_path must be interp, ellipse or spiral, got {kind!r}")
