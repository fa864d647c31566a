"""COLMAP parser: `data_dir/sparse/0` + `images/` (or `images_N/`) -> `Scene`.

Follows gsplat's `examples/datasets/colmap.py` where users rely on it: images sorted by
name; `--data_factor N` reads `images_N/` and scales intrinsics by the actual image size
over the camera size (per axis); test split from `test.txt`/`train.txt` in `data_dir`, else
every 8th image (`test_every`); distorted cameras are undistorted to pinhole ones on load
(undistort.py: the new K and size here, on every rank; the pixels by the owning rank only).
Differences: the fisheye models are undistorted exactly (gsplat approximates), and when
`images_N/` is missing, images are downscaled on load (JPEG draft mode) instead of written
to a new folder.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

import numpy as np

from . import colmap_io
from .decode import check_sizes, downscaled_size, probe_images
from .errors import DataError
from .normalize import normalize as normalize_world
from .scene import Scene, split_every
from .sources import FolderSource
from .undistort import SUPPORTED, split_params, undistort_cameras

log = logging.getLogger(__name__)


def intrinsics(cam: colmap_io.Camera, where: Path) -> np.ndarray:
    """[3, 3] K of a supported camera at its own size (before any undistortion); DataError
    for the models distsplat cannot undistort."""
    if cam.model not in SUPPORTED:
        raise DataError(f"{where}: camera {cam.id} uses model {cam.model}, which distsplat does not support "
                        f"(supported: {', '.join(SUPPORTED)}). Undistort the images first: "
                        f"colmap image_undistorter --image_path IMAGES --input_path sparse/0 --output_path OUT "
                        f"(then use OUT/images and OUT/sparse)")
    return split_params(cam.model, cam.params)[0]


def find_model(data_dir: Path) -> Path:
    sparse = data_dir / "sparse"
    for folder in (sparse / "0", sparse):
        if any((folder / f).exists() for f in ("cameras.bin", "cameras.txt", "images.bin", "images.txt")):
            return folder
    if not sparse.is_dir():
        raise DataError(f"{data_dir}: no COLMAP model (expected {sparse / '0'} with cameras/images/points3D .bin or .txt)")
    raise DataError(f"{sparse / '0'}: missing or empty COLMAP model (expected cameras/images/points3D .bin or .txt)")


def _read_names(path: Path) -> List[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def load_colmap(
    data_dir: Union[str, Path],
    factor: int = 1,
    normalize: bool = False,
    test_every: int = 8,
    check: bool = True,
) -> Scene:
    """Parses a COLMAP capture. `check=True` reads every image's header (size, truncation)
    here, so bad images fail now on every rank rather than mid-training on one; `check=False`
    touches only one image per COLMAP camera (node-local staging: the caller checks the
    images a rank owns, train/node_data.py)."""
    data_dir = Path(data_dir)
    if factor < 1:
        raise ValueError(f"factor must be >= 1, got {factor}")
    model_dir = find_model(data_dir)
    model = colmap_io.read_model(model_dir)
    cam_file = next(model_dir / f for f in ("cameras.bin", "cameras.txt") if (model_dir / f).exists())
    base_K = {cid: intrinsics(cam, cam_file) for cid, cam in model.cameras.items()}

    images = sorted(model.images.values(), key=lambda im: im.name)
    names = [im.name for im in images]
    _check_finite(model_dir, images, model.points)
    w2c = np.tile(np.eye(4), (len(images), 1, 1))  # [C, 4, 4]
    w2c[:, :3, :3] = _rotmats(np.array([im.qvec for im in images]).reshape(-1, 4))  # one numpy op, not C
    w2c[:, :3, 3] = np.array([im.tvec for im in images]).reshape(-1, 3)
    camtoworlds = np.linalg.inv(w2c)
    cams = [model.cameras[im.camera_id] for im in images]

    # images_N/ when it exists, else images/ downscaled on load.
    full_dir = data_dir / "images"
    image_dir = data_dir / f"images_{factor}" if factor > 1 else full_dir
    on_the_fly = factor > 1 and not image_dir.is_dir()
    if on_the_fly:
        log.warning("%s does not exist: downscaling %s by %d while loading (JPEG draft mode); "
                    "pre-downscaled images_%d/ loads faster", image_dir, full_dir, factor, factor)
        image_dir = full_dir
    if not image_dir.is_dir():
        raise DataError(_no_image_folder(data_dir, factor))
    listings: Dict[str, tuple] = {}
    folder = str(image_dir)
    source = FolderSource([os.path.join(folder, _match_name(folder, n, listings)) for n in names], names)
    if check:
        source.check_exist()

    # Sizes: every image's header when checking, else the first image of each camera (gsplat)
    # found here: with images staged per node (check=False) a node holds only its own.
    if check:
        stored = probe_images(source, range(len(names)))
    else:
        first = {}
        for i, im in enumerate(images):
            if im.camera_id not in first and os.path.isfile(source.paths[i]):
                first[im.camera_id] = probe_images(source, [i])[0]
        missing = sorted({im.camera_id for im in images} - set(first))
        if missing:
            raise DataError(f"{image_dir}: no image of COLMAP camera {missing[0]} is present here, so its image "
                            "size is unknown; stage at least one of its images on this node")
        stored = [first[im.camera_id] for im in images]
    check_sizes(names, stored, [(c.width, c.height) for c in cams], [source.where(i) for i in range(len(names))])
    loaded = [downscaled_size(w, h, factor) for w, h in stored] if on_the_fly else stored

    Ks = np.stack([base_K[im.camera_id] for im in images])  # [C, 3, 3]
    sizes = np.array(loaded, dtype=np.int64)  # [C, 2] (w, h)
    cam_sizes = np.array([(c.width, c.height) for c in cams], dtype=np.float64)
    Ks[:, 0, :] *= (sizes[:, 0] / cam_sizes[:, 0])[:, None]
    Ks[:, 1, :] *= (sizes[:, 1] / cam_sizes[:, 1])[:, None]
    undistort = undistort_cameras(cams, Ks, sizes, lambda c: f"{cam_file} camera {c.id} ({c.model})")

    train, test = _split(data_dir, names, test_every)
    points = model.points.xyz.astype(np.float32)
    transform = np.eye(4)
    if normalize:
        camtoworlds, points, transform = normalize_world(camtoworlds, points)
    log.info("COLMAP %s: %d images, %d cameras, %d points, %d train / %d test, images from %s%s",
             data_dir, len(names), len(model.cameras), len(points), len(train), len(test), image_dir,
             f" downscaled by {factor} on load" if on_the_fly else "")
    return Scene(
        names=names, camtoworlds=camtoworlds, Ks=Ks, widths=sizes[:, 0], heights=sizes[:, 1],
        points=points, points_rgb=model.points.rgb.copy(), train=train, test=test, images=source,
        source_sizes=np.array(stored, dtype=np.int64) if on_the_fly or undistort else None, transform=transform,
        kind="colmap", undistort=undistort, point_tracks=_point_tracks(model.points, [im.id for im in images]),
    )


def _point_tracks(points: colmap_io.Points, image_ids: Sequence[int]) -> Optional[List[np.ndarray]]:
    """[C] per image (in scene order), the sorted indices of the points whose track holds it."""
    if points.track_offsets is None:
        return None
    point_of = np.repeat(np.arange(len(points.ids)), np.diff(points.track_offsets))  # [T]
    tracks = []
    for iid in image_ids:
        tracks.append(np.unique(point_of[points.track_images == iid]))
    return tracks


def _no_image_folder(data_dir: Path, factor: int) -> str:
    full, scaled = data_dir / "images", data_dir / f"images_{factor}"
    others = sorted(p.name for p in data_dir.glob("images_*") if p.is_dir())
    if factor > 1:
        msg = f"image folder {scaled} does not exist, nor {full.name}/ to downscale by {factor} on load"
    else:
        msg = f"image folder {full} does not exist"
    if others:
        return f"{msg}; there is {', '.join(others)}/: pass the matching --data_factor"
    return f"{msg}; put the capture's images in {full.name}/" + (f" (or pre-downscaled ones in {scaled.name}/)" if factor > 1 else "")


def _rotmats(q: np.ndarray) -> np.ndarray:
    """[C, 4] (w, x, y, z) quaternions -> [C, 3, 3] rotations: colmap_io.qvec_to_rotmat for
    all cameras at once (a Python loop over a million cameras costs a minute)."""
    w, x, y, z = (q / np.linalg.norm(q, axis=1, keepdims=True)).T
    return np.stack([
        np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
        np.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
        np.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1),
    ], 1)


def _check_finite(model_dir: Path, images: Sequence[colmap_io.Image], points: colmap_io.Points) -> None:
    """NaN or Inf in a pose or a point would surface much later as a NaN loss or a failed
    normalization; refuse them here, naming the file and the image or point."""
    def model_file(stem: str) -> Path:
        return next((model_dir / f"{stem}{ext}" for ext in (".bin", ".txt") if (model_dir / f"{stem}{ext}").exists()),
                    model_dir / f"{stem}.bin")

    q = np.array([im.qvec for im in images]).reshape(-1, 4)  # [C, 4]
    t = np.array([im.tvec for im in images]).reshape(-1, 3)  # [C, 3]
    suspects = np.flatnonzero(~(np.isfinite(q).all(1) & np.isfinite(t).all(1)) | ~(np.linalg.norm(q, axis=1) > 0))
    for im in (images[i] for i in suspects[:1]):  # the first bad one, named as before
        if not (np.isfinite(im.qvec).all() and np.isfinite(im.tvec).all()):
            raise DataError(f"{model_file('images')}: image {im.name!r} has a non-finite pose (qvec {im.qvec.tolist()}, "
                            f"tvec {im.tvec.tolist()}); the reconstruction is damaged: re-export or re-run it")
        if not np.linalg.norm(im.qvec) > 0:
            raise DataError(f"{model_file('images')}: image {im.name!r} has a zero rotation quaternion; "
                            "the reconstruction is damaged: re-export or re-run it")
    bad = ~np.isfinite(points.xyz).all(axis=1)  # [P]
    if bad.any():
        raise DataError(f"{model_file('points3D')}: {int(bad.sum())} of {len(bad)} points have non-finite coordinates "
                        f"(first: point {int(points.ids[bad][0])} at {points.xyz[bad][0].tolist()}); the reconstruction "
                        "is damaged: re-export or re-run it")


def _match_name(image_dir: str, name: str, listings: Optional[Dict[str, tuple]] = None) -> str:
    """images_N/ may hold PNGs for JPEG originals (gsplat writes them so): same stem, any extension.
    `listings` caches each folder's entries (one listing per folder, not a stat and a glob per
    image: a million-image capture, or a node that holds only its staged images); str paths,
    no pathlib, for the same reason."""
    listings = {} if listings is None else listings
    parent, base = os.path.split(name)
    folder = os.path.join(image_dir, parent)
    if folder not in listings:
        try:
            entries = os.listdir(folder)
        except OSError:
            entries = []
        stems: Dict[str, List[str]] = {}
        for e in entries:
            stems.setdefault(os.path.splitext(e)[0], []).append(e)
        listings[folder] = (set(entries), stems)
    files, stems = listings[folder]
    if base in files:
        return name
    matches = stems.get(os.path.splitext(base)[0], []) if "*" not in name and "?" not in name else []
    return os.path.join(parent, matches[0]) if len(matches) == 1 else name


def _split(data_dir: Path, names: Sequence[str], test_every: int):
    test_file, train_file = data_dir / "test.txt", data_dir / "train.txt"
    if not test_file.exists():
        return split_every(names, test_every)
    pos = {n: i for i, n in enumerate(names)}
    test_names = _read_names(test_file)
    unknown = [n for n in test_names if n not in pos]
    if unknown:
        raise DataError(f"{test_file}: names {unknown[:3]} are not images of the COLMAP model")
    test = np.array(sorted(pos[n] for n in test_names), dtype=np.int64)
    if train_file.exists():
        train_names = _read_names(train_file)
        unknown = [n for n in train_names if n not in pos]
        if unknown:
            raise DataError(f"{train_file}: names {unknown[:3]} are not images of the COLMAP model")
        train = np.array(sorted(pos[n] for n in train_names), dtype=np.int64)
    else:
        train = np.setdiff1d(np.arange(len(names)), test)
    return train, test
