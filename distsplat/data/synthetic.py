"""Procedural synthetic scene (no files): cameras on a ring around random ground-truth
Gaussians. It is the trainer's built-in default scene and the tests' fixture.

The generator cannot render (the data layer never imports distsplat.render), so the
Scene it returns has `images=None`; the trainer renders the ground-truth Gaussians and
attaches the renders with `attach_images(scene, fn)` (an `ArraySource` calling `fn(i)` when
the rank owning camera i first reads it). `splat_points` is a tiny numpy stand-in renderer
(depth-sorted square splats of the Gaussian centres) for tests and benchmarks.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, Dict, Optional, Sequence, Union

import numpy as np

from .scene import Scene, split_every
from .sources import ArraySource

log = logging.getLogger(__name__)


def look_at(eye: np.ndarray, target: np.ndarray, up=(0.0, 0.0, 1.0)) -> np.ndarray:
    """[4, 4] camera-to-world, OpenCV axes (x right, y down, z towards target)."""
    z = target - eye
    z = z / np.linalg.norm(z)
    x = np.cross(z, np.asarray(up, dtype=np.float64))
    x = x / np.linalg.norm(x)
    y = np.cross(z, x)
    M = np.eye(4)
    M[:3, :3] = np.stack([x, y, z], axis=1)
    M[:3, 3] = eye
    return M


def make_synthetic_scene(
    num_cameras: int = 24,
    num_gaussians: int = 2000,
    width: int = 64,
    height: int = 48,
    radius: float = 4.0,
    fov_deg: float = 50.0,
    test_every: int = 8,
    seed: int = 0,
) -> Scene:
    """Gaussians in the unit ball; cameras on a ring of `radius` at alternating heights,
    looking at the origin. `Scene.gaussians` holds means [N, 3], quats [N, 4] (w, x, y, z),
    scales [N, 3] (world units), opacities [N], colors [N, 3] in [0, 1]."""
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(num_gaussians, 3))
    means *= (rng.uniform(size=(num_gaussians, 1)) ** (1 / 3)) / np.linalg.norm(means, axis=1, keepdims=True)
    quats = rng.normal(size=(num_gaussians, 4))
    quats /= np.linalg.norm(quats, axis=1, keepdims=True)
    gaussians = {
        "means": means.astype(np.float32),
        "quats": quats.astype(np.float32),
        "scales": np.exp(rng.uniform(math.log(0.01), math.log(0.08), size=(num_gaussians, 3))).astype(np.float32),
        "opacities": rng.uniform(0.3, 1.0, size=num_gaussians).astype(np.float32),
        "colors": rng.uniform(0.0, 1.0, size=(num_gaussians, 3)).astype(np.float32),
    }
    c2w = []
    for i in range(num_cameras):
        a = 2 * math.pi * i / num_cameras
        eye = np.array([radius * math.cos(a), radius * math.sin(a), radius * (0.3 if i % 2 else -0.1)])
        c2w.append(look_at(eye, np.zeros(3)))
    return ground_truth_scene("synthetic", c2w, width, height, fov_deg, gaussians, test_every)


def ground_truth_scene(prefix: str, c2w: Sequence[np.ndarray], width: int, height: int, fov_deg: float,
                       gaussians: Dict[str, np.ndarray], test_every: int) -> Scene:
    """A scene of ground-truth Gaussians seen by pinhole cameras `c2w` ([4, 4] each) of one
    size and field of view, named `prefix_NNNNN`, with no images (attach_images adds them);
    the Gaussians' centres and colours are its sparse points."""
    n = len(c2w)
    f = 0.5 * width / math.tan(math.radians(fov_deg) / 2)
    K = np.array([[f, 0.0, width / 2], [0.0, f, height / 2], [0.0, 0.0, 1.0]])
    names = [f"{prefix}_{i:05d}" for i in range(n)]
    train, test = split_every(names, test_every)
    return Scene(
        names=names, camtoworlds=np.stack(c2w), Ks=np.tile(K, (n, 1, 1)),
        widths=np.full(n, width, np.int64), heights=np.full(n, height, np.int64),
        points=gaussians["means"].copy(), points_rgb=(gaussians["colors"] * 255).round().astype(np.uint8),
        train=train, test=test, images=None, gaussians=gaussians, kind="synthetic",
    )


def attach_images(scene: Scene, images: Union[Sequence[np.ndarray], Callable[[int], np.ndarray]]) -> Scene:
    """Gives a synthetic scene its images: a list of [H, W, 3] uint8, or fn(i) -> that."""
    shapes = [(int(h), int(w), 3) for w, h in zip(scene.widths, scene.heights)]
    scene.images = ArraySource(scene.names, images, shapes)
    return scene


def appearance_gains(n: int, exposure: float, white_balance: float, seed: int,
                     train: Optional[Sequence[int]] = None) -> np.ndarray:
    """[n, 3] known per-image, per-channel gains, as a phone's auto exposure and white balance
    change from frame to frame: a brightness factor log-uniform in [1/exposure, exposure] times a
    channel factor uniform in [1 - white_balance, 1 + white_balance] (seeded; all 1 with none).

    With `train` (the images that get them), each channel's gains over those images are divided
    by their geometric mean: the training images then average, in log space, to the scene's own
    colours, which the test images keep. A global colour transform of all training images
    cannot be told from the scene's colours (nothing anchors it: a bilateral grid or an
    appearance model absorbs it either way), so a draw that left one (28 images of the built-in
    scene at seed 0: green 2.5% dark in the geometric mean, 5.4% in the median that an L1 loss
    follows) would be scored as the model's error by the plain test PSNR."""
    rng = np.random.default_rng((seed, 46))
    brightness = np.exp(rng.uniform(-np.log(exposure), np.log(exposure), size=(n, 1)))
    gains = brightness * rng.uniform(1 - white_balance, 1 + white_balance, size=(n, 3))
    if train is not None and len(train):
        rows = np.asarray(train, dtype=np.int64)
        gains[rows] /= np.exp(np.log(gains[rows]).mean(0))
    return gains


def apply_gains(image: np.ndarray, gains: np.ndarray) -> np.ndarray:
    """[H, W, 3] uint8 scaled by `gains` [3], rounded and clipped to 8 bits as a camera would."""
    return np.clip(np.round(image.astype(np.float64) * gains), 0, 255).astype(np.uint8)


def splat_points(scene: Scene, index: int, half_size: int = 1, alpha: bool = False) -> np.ndarray:
    """[H, W, 3] (or RGBA [H, W, 4], transparent background) uint8: the scene's points as
    squares of (2 * half_size + 1) pixels, far to near. A stand-in for a real render."""
    w, h = int(scene.widths[index]), int(scene.heights[index])
    out = np.zeros((h, w, 4 if alpha else 3), np.uint8)
    view = np.linalg.inv(scene.camtoworlds[index])
    p = scene.points @ view[:3, :3].T + view[:3, 3]  # [P, 3] camera coordinates
    front = p[:, 2] > 1e-3
    uv = p[front] @ scene.Ks[index].T
    uv = np.round(uv[:, :2] / uv[:, 2:3]).astype(np.int64)
    rgb = scene.points_rgb[front]
    for j in np.argsort(-p[front, 2]):
        u, v = uv[j]
        u0, u1, v0, v1 = max(u - half_size, 0), min(u + half_size + 1, w), max(v - half_size, 0), min(v + half_size + 1, h)
        if u0 < u1 and v0 < v1:
            out[v0:v1, u0:u1, :3] = rgb[j]
            if alpha:
                out[v0:v1, u0:u1, 3] = 255
    return out
