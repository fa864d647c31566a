"""The built-in scene people can recognise (no files): a checkered ground with a striped
ball, a cube with coloured checkered faces and a cylinder with a colour gradient, made of
surface-aligned flat Gaussians, seen by cameras on a ring above the ground looking at it.
Like `make_synthetic_scene` (the random ball the tests train on) it returns the
ground-truth Gaussians and no images; the trainer renders them (scene_setup.py)."""

from __future__ import annotations

import math
from typing import Dict, List

import numpy as np

from .scene import Scene
from .synthetic import ground_truth_scene, look_at


def _quats(R: np.ndarray) -> np.ndarray:
    """[N, 3, 3] rotations -> [N, 4] unit quaternions (w, x, y, z)."""
    from scipy.spatial.transform import Rotation

    xyzw = Rotation.from_matrix(R).as_quat()  # robust for every rotation (Shepperd's method)
    return np.concatenate([xyzw[:, 3:], xyzw[:, :3]], 1)


def _frames(normals: np.ndarray) -> np.ndarray:
    """[N, 3] unit normals -> [N, 3, 3] rotations whose third axis is the normal."""
    helper = np.where(np.abs(normals[:, 2:3]) < 0.9, [[0.0, 0.0, 1.0]], [[1.0, 0.0, 0.0]])
    t1 = np.cross(helper, normals)
    t1 /= np.linalg.norm(t1, axis=1, keepdims=True)
    return np.stack([t1, np.cross(normals, t1), normals], axis=2)


def _surface(points, normals, colors, size) -> Dict[str, np.ndarray]:
    """Flat discs of radius ~size on a surface: thin along the normal."""
    n = len(points)
    return {"means": points, "quats": _quats(_frames(normals)),
            "scales": np.tile([size, size, size * 0.1], (n, 1)), "colors": colors}


def _ground(spacing: float, radius: float) -> Dict[str, np.ndarray]:
    g = np.arange(-radius, radius + 1e-9, spacing)
    x, y = np.meshgrid(g, g)
    keep = x**2 + y**2 <= radius**2
    p = np.stack([x[keep], y[keep], np.zeros(keep.sum())], 1)
    tile = (np.floor(p[:, 0] / 0.5) + np.floor(p[:, 1] / 0.5)) % 2
    col = np.where(tile[:, None] > 0, [[0.85, 0.8, 0.7]], [[0.35, 0.25, 0.2]])
    return _surface(p, np.tile([0.0, 0.0, 1.0], (len(p), 1)), col, 0.7 * spacing)


def _ball(centre, r: float, n: int) -> Dict[str, np.ndarray]:
    i = np.arange(n) + 0.5
    phi = np.arccos(1 - 2 * i / n)  # Fibonacci sphere: even spacing
    theta = math.pi * (1 + 5**0.5) * i
    nrm = np.stack([np.cos(theta) * np.sin(phi), np.sin(theta) * np.sin(phi), np.cos(phi)], 1)
    stripe = (np.floor(phi / (math.pi / 8)) % 2)[:, None]
    col = np.where(stripe > 0, [[0.9, 0.15, 0.1]], [[0.95, 0.95, 0.9]])
    return _surface(np.asarray(centre) + r * nrm, nrm, col, 0.9 * r * math.sqrt(4 * math.pi / n))


def _cube(centre, side: float, per_edge: int, angle: float) -> Dict[str, np.ndarray]:
    c, s = math.cos(angle), math.sin(angle)
    Rz = np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])
    u = (np.arange(per_edge) + 0.5) / per_edge - 0.5
    a, b = (m.ravel() for m in np.meshgrid(u, u))
    face_colors = [[0.1, 0.3, 0.9], [0.1, 0.7, 0.3], [0.95, 0.75, 0.1], [0.6, 0.2, 0.7], [0.1, 0.7, 0.8], [0.9, 0.4, 0.1]]
    pts, nrm, col = [], [], []
    for k, (axis, sign) in enumerate([(0, 1), (0, -1), (1, 1), (1, -1), (2, 1), (2, -1)]):
        p = np.zeros((len(a), 3))
        p[:, axis] = 0.5 * sign
        others = [d for d in range(3) if d != axis]
        p[:, others[0]], p[:, others[1]] = a, b
        n = np.zeros_like(p)
        n[:, axis] = sign
        checker = ((np.floor((a + 0.5) * 3) + np.floor((b + 0.5) * 3)) % 2)[:, None]
        pts.append(p * side)
        nrm.append(n)
        col.append(np.asarray(face_colors[k]) * (0.55 + 0.45 * checker))
    p, n = np.concatenate(pts) @ Rz.T + np.asarray(centre), np.concatenate(nrm) @ Rz.T
    return _surface(p, n, np.concatenate(col), 0.75 * side / per_edge)


def _cylinder(centre, r: float, h: float, n_around: int, n_up: int) -> Dict[str, np.ndarray]:
    t, z = np.meshgrid(np.linspace(0, 2 * math.pi, n_around, endpoint=False), (np.arange(n_up) + 0.5) / n_up)
    t, z = t.ravel(), z.ravel()
    nrm = np.stack([np.cos(t), np.sin(t), np.zeros_like(t)], 1)
    p = np.asarray(centre) + r * nrm + np.outer(z * h, [0.0, 0.0, 1.0])
    col = np.stack([0.2 + 0.75 * z, 0.75 - 0.2 * z, 0.25 * (1 - z)], 1)  # green at the foot to orange at the top
    return _surface(p, nrm, col, 0.8 * max(2 * math.pi * r / n_around, h / n_up))


def tabletop_gaussians(detail: float = 1.0) -> Dict[str, np.ndarray]:
    """The scene's Gaussians; `detail` scales their number (~3800 at 1)."""
    d = max(detail, 0.1)
    parts: List[Dict[str, np.ndarray]] = [
        _ground(0.075 / math.sqrt(d), 2.0),
        _ball((-0.65, -0.35, 0.45), 0.45, int(600 * d)),
        _cube((0.6, 0.35, 0.35), 0.7, max(int(9 * math.sqrt(d)), 2), math.radians(30)),
        _cylinder((0.15, -1.0, 0.0), 0.22, 0.8, max(int(28 * math.sqrt(d)), 4), max(int(12 * math.sqrt(d)), 2)),
    ]
    g = {k: np.concatenate([p[k] for p in parts]).astype(np.float32) for k in parts[0]}
    g["opacities"] = np.full(len(g["means"]), 0.95, np.float32)
    return g


def make_tabletop_scene(
    num_cameras: int = 32, width: int = 128, height: int = 96, detail: float = 1.0,
    fov_deg: float = 55.0, test_every: int = 8, seed: int = 0,
) -> Scene:
    """Cameras on a ring of radius 3.2 at alternating heights (1.3 and 2.1) above the
    ground, looking at a point just above its centre. `seed` turns the ring."""
    gaussians = tabletop_gaussians(detail)
    rng = np.random.default_rng(seed)
    offset = rng.uniform(0, 2 * math.pi)
    c2w = []
    for i in range(num_cameras):
        a = offset + 2 * math.pi * i / num_cameras
        eye = np.array([3.2 * math.cos(a), 3.2 * math.sin(a), 2.1 if i % 2 else 1.3])
        c2w.append(look_at(eye, np.array([0.0, 0.0, 0.3])))
    return ground_truth_scene("tabletop", c2w, width, height, fov_deg, gaussians, test_every)
