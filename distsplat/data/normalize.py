"""Scene normalization, as gsplat's `examples/datasets/normalize.py` does it, applied by the
parsers when asked (`normalize=True`) before the scene reaches the trainer:

1. `similarity_from_cameras`: rotate the world so the mean camera "up" (-y in OpenCV
   camera axes) becomes the world's -y (gsplat's code does this, although its comment
   says +z; we follow the code so normalized scenes match gsplat's), translate so the median of the points where each camera's
   optical axis passes closest to the origin becomes the origin ("focus" centre), and
   scale so the median camera distance to that centre is 1.
2. `align_principal_axes` of the sparse points: rotate about their median so the axis of
   largest spread is x and the smallest is z (z then points roughly "up" for a capture
   over a ground plane).
3. If the point cloud's median z is above its mean z (the bulk of points, typically the
   ground, is on top), rotate 180 degrees about x.

The product of the three is `Scene.transform` ([4, 4], a similarity:
world_normalized = transform @ world_input); camera rotations stay orthonormal.

Degenerate inputs (issue 36) keep to finite numbers or end in a DataError, never NaN or a
numpy error: cameras whose up axes cancel are not rotated (1.), cameras whose centres all
sit at their focus are not scaled (1.), a point cloud whose spread has no principal axes
(fewer than 3 points, or a covariance numpy cannot decompose) is not rotated (2.); a
similarity that would put the scene outside float32's range (cameras a hair apart, points
far out) is refused naming the scale.
"""

from __future__ import annotations

import logging
from typing import Tuple

import numpy as np

from .errors import DataError

log = logging.getLogger(__name__)

FLOAT32_SAFE = 1e30  # |coordinate| after normalising: the trainer computes in float32 (max 3.4e38)


def similarity_from_cameras(camtoworlds: np.ndarray) -> np.ndarray:
    """[C, 4, 4] OpenCV camera-to-world -> [4, 4] similarity (rotation, focus centre, scale)."""
    R, t = camtoworlds[:, :3, :3], camtoworlds[:, :3, 3]  # [C, 3, 3], [C, 3]
    up = -R[:, :, 1].mean(0)  # mean of the cameras' up axes in world coordinates
    norm = np.linalg.norm(up)
    if norm > 1e-6:
        R_align = _rotation_between(up / norm, np.array([0.0, -1.0, 0.0]))
    else:  # the up axes cancel (cameras upside down to each other): no "up" to align
        log.warning("normalization: the cameras' up axes cancel out; the world is not rotated")
        R_align = np.eye(3)
    t = t @ R_align.T
    fwd = (R_align @ R)[:, :, 2]  # [C, 3] optical axes
    # Closest point to the origin on each optical axis; their median is the "focus".
    nearest = t + ((-t * fwd).sum(-1, keepdims=True)) * fwd
    translate = -np.median(nearest, axis=0)
    spread = np.median(np.linalg.norm(t + translate, axis=-1))
    if spread > 0:
        scale = 1.0 / spread
    else:  # every camera at the focus (one camera at the origin): nothing to scale by
        log.warning("normalization: the cameras' centres all lie at their focus point; the world is not scaled")
        scale = 1.0
    T = np.eye(4)
    T[:3, :3] = scale * R_align
    T[:3, 3] = scale * translate
    return T


def align_principal_axes(points: np.ndarray) -> np.ndarray:
    """[P, 3] -> [4, 4] rigid transform putting the points' principal axes on x, y, z
    (largest spread first) around their median."""
    centre = np.median(points, axis=0)
    cov = np.cov((points - centre).T)
    try:
        if not np.isfinite(cov).all():
            raise np.linalg.LinAlgError("the covariance is not finite")
        evals, evecs = np.linalg.eigh(cov)
    except np.linalg.LinAlgError as e:  # finite, in-range points make this unreachable; kept as a net
        log.warning("normalization: the points' principal axes cannot be found (%s); they are not aligned", e)
        evals, evecs = np.ones(3), np.eye(3)
    evecs = evecs[:, np.argsort(evals)[::-1]]
    if np.linalg.det(evecs) < 0:
        evecs[:, 0] *= -1  # keep it a rotation
    T = np.eye(4)
    T[:3, :3] = evecs.T
    T[:3, 3] = -evecs.T @ centre
    return T


def transform_points(T: np.ndarray, points: np.ndarray) -> np.ndarray:
    return points @ T[:3, :3].T + T[:3, 3]


def transform_cameras(T: np.ndarray, camtoworlds: np.ndarray) -> np.ndarray:
    """Applies similarity T to [C, 4, 4] camera-to-world matrices, keeping rotations orthonormal."""
    out = T[None] @ camtoworlds
    scale = np.linalg.norm(out[:, :3, 0], axis=-1)  # [C] the similarity's scale
    out[:, :3, :3] /= scale[:, None, None]
    return out


def normalize(camtoworlds: np.ndarray, points: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Returns (camtoworlds [C, 4, 4], points [P, 3], transform [4, 4]) as the module docstring says."""
    T = similarity_from_cameras(camtoworlds)
    scale = float(np.linalg.norm(T[:3, 0]))  # a similarity: every column has the scale's norm
    _check_range(T, transform_points(T, points), transform_points(T, camtoworlds[:, :3, 3]), scale)
    if len(points) >= 3:
        T = align_principal_axes(transform_points(T, points)) @ T
        p = transform_points(T, points)
        if np.median(p[:, 2]) > np.mean(p[:, 2]):
            T = np.diag([1.0, -1.0, -1.0, 1.0]) @ T
    log.info("normalized world: scale %.4g, translation %s", scale, np.round(T[:3, 3], 4).tolist())
    return transform_cameras(T, camtoworlds), transform_points(T, points).astype(points.dtype), T


def _check_range(T: np.ndarray, points: np.ndarray, centres: np.ndarray, scale: float) -> None:
    """DataError unless the similarity and the scene it gives are finite and within
    +-FLOAT32_SAFE (rotations after it keep the norms). points [P, 3], centres [C, 3]."""
    with np.errstate(over="ignore", invalid="ignore"):
        ok = all(np.isfinite(a).all() and (np.abs(a) <= FLOAT32_SAFE).all() for a in (T, points, centres))
    if not ok:
        raise DataError(f"normalizing the scene scales it by {scale:.3g}, which puts the cameras or points outside "
                        f"+-{FLOAT32_SAFE:g} (the cameras' centres lie within a hair of their focus, or points lie "
                        "far out): the reconstruction is damaged; re-export or re-run it, or train without "
                        "normalizing (--no-normalize-world-space)")


def _rotation_between(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Rotation taking unit vector a to unit vector b (Rodrigues). Opposite vectors: 180
    degrees about x (for b = -y; gsplat's fallback there is a reflection)."""
    v, c = np.cross(a, b), float(a @ b)
    if c < -1 + 1e-9:
        return np.diag([1.0, -1.0, -1.0])
    K = np.array([[0, -v[2], v[1]], [v[2], 0, -v[0]], [-v[1], v[0], 0]])
    return np.eye(3) + K + K @ K / (1 + c)
