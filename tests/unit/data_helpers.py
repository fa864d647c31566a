"""Small generated datasets on disk for the data tests: a COLMAP capture of the synthetic
scene (JPEGs + binary model) that tests may break on purpose, and a plain Pillow decode,
the independent reference every cache mode must match byte for byte."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple

import numpy as np
from PIL import Image

from distsplat.data import colmap_io
from distsplat.data.synthetic import make_synthetic_scene, splat_points


def rotmat_to_qvec(R: np.ndarray) -> np.ndarray:
    """[3, 3] rotation -> (w, x, y, z), for writing COLMAP models."""
    K = np.array([
        [R[0, 0] - R[1, 1] - R[2, 2], 0, 0, 0],
        [R[1, 0] + R[0, 1], R[1, 1] - R[0, 0] - R[2, 2], 0, 0],
        [R[2, 0] + R[0, 2], R[2, 1] + R[1, 2], R[2, 2] - R[0, 0] - R[1, 1], 0],
        [R[1, 2] - R[2, 1], R[2, 0] - R[0, 2], R[0, 1] - R[1, 0], R[0, 0] + R[1, 1] + R[2, 2]],
    ]) / 3.0
    vals, vecs = np.linalg.eigh(K)
    q = vecs[[3, 0, 1, 2], np.argmax(vals)]
    return -q if q[0] < 0 else q


def scene_to_model(scene, model: str = "PINHOLE", params: Optional[np.ndarray] = None) -> colmap_io.Model:
    K = scene.Ks[0]
    w, h = int(scene.widths[0]), int(scene.heights[0])
    if params is None:
        params = np.array([K[0, 0], K[1, 1], K[0, 2], K[1, 2]])
    cameras = {1: colmap_io.Camera(1, model, w, h, np.asarray(params, dtype=np.float64))}
    images = {}
    for i, name in enumerate(scene.names):
        w2c = np.linalg.inv(scene.camtoworlds[i])
        images[i + 1] = colmap_io.Image(i + 1, rotmat_to_qvec(w2c[:3, :3]), w2c[:3, 3], 1, name + ".jpg")
    n = len(scene.points)
    points = colmap_io.Points(np.arange(1, n + 1), scene.points.astype(np.float64), scene.points_rgb, np.full(n, 0.5))
    return colmap_io.Model(cameras, images, points)


def make_colmap_dataset(root: Path, num_cameras: int = 10, width: int = 64, height: int = 48,
                        factors: Tuple[int, ...] = (2,), quality: int = 90) -> Path:
    """root/{sparse/0/*.bin, images/*.jpg, images_N/*.jpg} of a synthetic scene."""
    scene = make_synthetic_scene(num_cameras=num_cameras, num_gaussians=300, width=width, height=height)
    colmap_io.write_model_bin(scene_to_model(scene), root / "sparse" / "0")
    (root / "images").mkdir(parents=True)
    for i, name in enumerate(scene.names):
        img = Image.fromarray(splat_points(scene, i))
        img.save(root / "images" / f"{name}.jpg", quality=quality)
        for f in factors:
            (root / f"images_{f}").mkdir(exist_ok=True)
            img.resize((round(width / f), round(height / f)), Image.LANCZOS).save(root / f"images_{f}" / f"{name}.jpg", quality=quality)
    return root


def pillow_decode(path, size: Optional[Tuple[int, int]] = None, background=None) -> np.ndarray:
    """The reference: Pillow, as a user would write it (draft + bicubic when downscaling)."""
    im = Image.open(path)
    if size is not None and im.size != size:
        im.draft("RGB", size)
    if background is not None and im.mode == "RGBA":
        im = Image.alpha_composite(Image.new("RGBA", im.size, (*background, 255)), im)
    im = im.convert("RGB")
    if size is not None and im.size != size:
        im = im.resize(size, Image.BICUBIC)
    return np.asarray(im)


def global_batches(num_cameras: int, batch_size: int, steps: int, seed: int = 0):
    """Stand-in for the distributed batcher: each epoch a shared-seed permutation of the
    cameras, cut into batches; the same on every rank."""
    out, epoch = [], 0
    while len(out) < steps:
        perm = np.random.default_rng(seed + epoch).permutation(num_cameras)
        out += [perm[i:i + batch_size].tolist() for i in range(0, num_cameras - batch_size + 1, batch_size)]
        epoch += 1
    return out[:steps]


def owners(num_cameras: int, world: int, seed: int = 0) -> np.ndarray:
    """[C] rank owning each camera: a shared-seed permutation dealt round robin."""
    perm = np.random.default_rng(10_000 + seed).permutation(num_cameras)
    own = np.empty(num_cameras, np.int64)
    own[perm] = np.arange(num_cameras) % world
    return own


class CountingSource:
    """Wraps an ImageSource and counts reads per camera (to see I/O)."""

    def __init__(self, source):
        self.source, self.reads = source, {}
        self.names = source.names

    def __len__(self):
        return len(self.source)

    def read(self, i):
        self.reads[i] = self.reads.get(i, 0) + 1
        return self.source.read(i)

    def __getattr__(self, name):
        return getattr(self.source, name)
