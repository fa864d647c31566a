"""Camera paths through a scene for --render_only videos, as gsplat's simple_trainer
renders them: a smooth path interpolated through the training cameras, or an ellipse
around the point the cameras look at. Pure numpy on camera-to-world matrices (OpenCV
axes: x right, y down, z forward), shared by every rank (each computes the same path)."""

from __future__ import annotations

import numpy as np

from ..data.synthetic import look_at  # [4, 4] camera-to-world from eye, target, up


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


def camera_path(kind: str, camtoworlds: np.ndarray, n_frames: int) -> np.ndarray:
    if kind == "interp":
        return interpolated_path(camtoworlds, n_frames)
    if kind == "ellipse":
        return ellipse_path(camtoworlds, n_frames)
    raise ValueError(f"--render_traj_path must be interp or ellipse, got {kind!r}")
