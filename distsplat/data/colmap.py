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
from .decode import downscaled_size, draft_note, probe_images
from .errors import DataError
from .heap import TRIM_FROM, trim_heap
from .names import NameList, TrackTable
from .normalize import normalize as normalize_world
from .open_images import open_images, shards_downscaled, stored_sizes
from .scene import Scene, split_every
from .sources import FolderSource, JoinedPaths, ONCE
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
    shards: Optional[Union[str, Path]] = None,
    model_dir: Optional[Union[str, Path]] = None,
    skip_missing: bool = False,
) -> Scene:
    """Parses a COLMAP capture: the model in `model_dir` (default: find_model's sparse/0 or
    sparse/), the images in data_dir/images*/. `check=True` reads every image's header (size, truncation)
    here, so bad images fail now on every rank rather than mid-training on one; `check=False`
    touches only one image per COLMAP camera (node-local staging: the caller checks the
    images a rank owns, train/node_data.py). `shards`: an index.json of tar shards
    (shards.py) holding the images by their model names, read instead of images*/; images
    stored at their camera's full size are downscaled on load when factor > 1. `skip_missing`:
    images the model lists but images*/ lacks are left out (one warning) instead of a
    DataError (with check=False, as staged per node, nothing is left out)."""
    data_dir = Path(data_dir)
    if factor < 1:
        raise ValueError(f"factor must be >= 1, got {factor}")
    model_dir = find_model(data_dir) if model_dir is None else Path(model_dir)
    cameras, table, points = colmap_io.read_model_table(model_dir)  # arrays: no object per image
    cam_file = next(model_dir / f for f in ("cameras.bin", "cameras.txt") if (model_dir / f).exists())
    images_file = next((model_dir / f for f in ("images.bin", "images.txt") if (model_dir / f).exists()), model_dir)
    base_K = {cid: intrinsics(cam, cam_file) for cid, cam in cameras.items()}

    # gsplat sorts by name (UTF-8 bytes order = str order); a model written in name order (most
    # are) is not sorted again (a stable sort of a million names takes seconds)
    in_order = table.names.dtype.kind == "S" and bool((table.names[1:] >= table.names[:-1]).all())
    order = np.arange(len(table.names)) if in_order else np.argsort(table.names, kind="stable")
    raw = table.names[order]
    names = NameList(raw) if raw.dtype.kind == "S" else [b.decode("utf-8") for b in raw]  # [C]
    qvecs, tvecs = table.qvecs[order], table.tvecs[order]  # [C, 4], [C, 3]
    cam_ids, image_ids = table.camera_ids[order], table.ids[order]  # [C]
    del table, raw  # poses and points were checked as read (colmap_io: finite, in range)
    C = len(names)
    w2c = np.tile(np.eye(4), (C, 1, 1))  # [C, 4, 4]
    w2c[:, :3, :3] = _rotmats(qvecs)  # one numpy op, not C
    w2c[:, :3, 3] = tvecs
    del qvecs, tvecs
    camtoworlds = np.linalg.inv(w2c)
    del w2c
    cam_list = sorted(cameras)
    cam_pos = np.searchsorted(np.array(cam_list, dtype=np.int64), cam_ids)  # [C] index into cam_list

    # images_N/ when it exists, else images/ downscaled on load; with shards, their stored sizes decide (below)
    full_dir = data_dir / "images"
    image_dir = data_dir / f"images_{factor}" if factor > 1 else full_dir
    on_the_fly = shards is None and factor > 1 and not image_dir.is_dir()
    if shards is not None:
        image_dir = Path(shards)  # what the messages and the load line name
    else:
        if on_the_fly:
            log.warning("%s does not exist: downscaling %s by %d while loading%s; "
                        "pre-downscaled images_%d/ loads faster", image_dir, full_dir, factor, draft_note(names), factor,
                        extra=ONCE)
            image_dir = full_dir
        if not image_dir.is_dir():
            raise DataError(_no_image_folder(data_dir, factor))
    opened = open_images(names, shards, lambda kept: _folder_source(str(image_dir), kept), str(images_file),
                         check, skip_missing)
    source, names, dropped = opened.source, opened.names, opened.dropped
    if opened.keep is not None:  # --skip_missing_images: the model's other images, as if it listed only them
        keep = opened.keep
        camtoworlds, cam_ids, image_ids, cam_pos = camtoworlds[keep], cam_ids[keep], image_ids[keep], cam_pos[keep]
        C = len(names)

    # Sizes: every image's header when checking, else the first image found here of each
    # camera size (stored_sizes: a capture with one COLMAP camera per image has a camera per image)
    cam_wh = np.array([(cameras[c].width, cameras[c].height) for c in cam_list], dtype=np.int64)  # [K, 2]
    sizes_wh, size_of_cam = np.unique(cam_wh, axis=0, return_inverse=True)  # [S, 2], [K]
    size_of_image = size_of_cam.reshape(-1)[cam_pos]  # [C]
    stored = stored_sizes(source, probe_images(source, range(C)) if check else None, size_of_image, sizes_wh,
                          lambda w, h: f"{image_dir} (the {w}x{h} COLMAP cameras' images)")  # [C, 2]
    on_the_fly = on_the_fly or shards_downscaled(shards, factor, stored, size_of_image, sizes_wh)
    # One K, size and undistortion plan per (COLMAP camera, stored size) group, not per image:
    # a capture of a million images usually has one group, held as broadcast views.
    groups, inverse = np.unique(np.concatenate([cam_pos[:, None], stored], 1), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)  # [C] group of each image
    del stored
    g_cams = [cameras[cam_list[k]] for k in groups[:, 0].tolist()]
    g_stored = groups[:, 1:].copy()  # [G, 2] (w, h) of the stored images
    g_sizes = np.array([downscaled_size(w, h, factor) for w, h in g_stored.tolist()] if on_the_fly else g_stored,
                       dtype=np.int64).reshape(-1, 2)  # [G, 2] loaded (w, h)
    g_Ks = np.stack([base_K[c.id] for c in g_cams])  # [G, 3, 3]
    g_cam_sizes = np.array([(c.width, c.height) for c in g_cams], dtype=np.float64).reshape(-1, 2)
    g_Ks[:, 0, :] *= (g_sizes[:, 0] / g_cam_sizes[:, 0])[:, None]
    g_Ks[:, 1, :] *= (g_sizes[:, 1] / g_cam_sizes[:, 1])[:, None]
    plans = undistort_cameras(g_cams, g_Ks, g_sizes, lambda c: f"{cam_file} camera {c.id} ({c.model})")
    _check_pinholes(cam_file, g_cams, g_Ks, g_sizes)
    Ks, sizes, source_sizes = _per_image(g_Ks, inverse), _per_image(g_sizes, inverse), _per_image(g_stored, inverse)
    undistort = None if plans is None else [plans[g] for g in inverse.tolist()]

    train, test = _split(data_dir, names, test_every, dropped)
    points_xyz = points.xyz.astype(np.float32)
    transform = np.eye(4)
    if normalize:
        try:
            camtoworlds, points_xyz, transform = normalize_world(camtoworlds, points_xyz)
        except DataError as e:  # degenerate cameras or points: name the model
            raise DataError(f"{model_dir}: {e}") from None
    log.info("COLMAP %s: %d images, %d cameras, %d points, %d train / %d test, images from %s%s",
             data_dir, C, len(cameras), len(points_xyz), len(train), len(test), image_dir,
             f" downscaled by {factor} on load" if on_the_fly else "")
    scene = Scene(
        names=names, camtoworlds=camtoworlds, Ks=Ks, widths=sizes[:, 0], heights=sizes[:, 1],
        points=points_xyz, points_rgb=points.rgb.copy(), train=train, test=test, images=source,
        source_sizes=source_sizes if on_the_fly or undistort else None, transform=transform,
        kind="colmap", undistort=undistort, point_tracks=_point_tracks(points, image_ids),
    )
    if C >= TRIM_FROM:
        del points, image_ids, cam_ids, cam_pos, size_of_image, inverse
        trim_heap()  # the parse's temporaries: 130 MB per rank at a million images without it
    return scene


def _check_pinholes(cam_file: Path, cams: Sequence[colmap_io.Camera], Ks: np.ndarray, sizes: np.ndarray) -> None:
    """The pinhole cameras the renderer gets (scaled to the loaded images, undistorted):
    finite, positive focal lengths and sizes. colmap_io checked the model's values; this
    catches what scaling or an undistortion plan made of extreme ones. Ks [G, 3, 3], sizes [G, 2]."""
    for g, cam in enumerate(cams):
        K, (w, h) = Ks[g], sizes[g].tolist()
        if not (np.isfinite(K).all() and K[0, 0] > 0 and K[1, 1] > 0 and w >= 1 and h >= 1):
            raise DataError(f"{cam_file}: camera {cam.id} ({cam.model}, parameters {cam.params.tolist()}) gives a "
                            f"{w}x{h} pinhole camera with focal lengths {K[0, 0]!r}, {K[1, 1]!r} and principal point "
                            f"{K[0, 2]!r}, {K[1, 2]!r} at the loaded size: the reconstruction is damaged: "
                            "re-export or re-run it")


def _per_image(per_group: np.ndarray, inverse: np.ndarray) -> np.ndarray:
    """[C, ...] rows of `per_group` [G, ...] by group: a read-only broadcast view (no bytes
    per image) when there is one group, else a gather."""
    if len(per_group) == 1:
        return np.broadcast_to(per_group[0], (len(inverse),) + per_group.shape[1:])
    return per_group[inverse]


def _folder_source(folder: str, names: Sequence[str]) -> FolderSource:
    """FolderSource of `names` in `folder`, each matched to the file present (images_N/ may hold
    PNGs for JPEG originals): paths joined on access, only the renamed ones stored."""
    listings: Dict[str, list] = {}
    renamed: Dict[int, str] = {}
    if not isinstance(names, NameList):
        for i, name in enumerate(names):
            match = _match_name(folder, name, listings)
            if match != name:
                renamed[i] = match
        return FolderSource(JoinedPaths(folder, names, renamed), names)
    # A million names: each folder listed once and its names looked up in numpy; only the
    # names its listing lacks (PNGs for JPEGs, or images another node holds) go by name
    parts = np.char.rpartition(names.raw, b"/")  # [C, 3] parent, "/", base
    parents, bases = parts[:, 0], parts[:, 2]
    cuts = np.flatnonzero(parents[1:] != parents[:-1]) + 1  # runs of one folder (sorted names: one run each)
    for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(bases)]):
        try:
            entries = os.listdir(os.path.join(folder, parents[a].decode("utf-8")))
        except OSError:
            entries = []
        if entries:  # a binary search of the sorted listing (np.isin sorts both sides each time)
            listed = np.sort(np.array([e.encode("utf-8", "surrogateescape") for e in entries], dtype=bytes))
            at = np.minimum(np.searchsorted(listed, bases[a:b]), len(listed) - 1)
            absent = a + np.flatnonzero(listed[at] != bases[a:b])
        else:
            absent = np.arange(a, b)
        for i in absent.tolist():
            match = _match_name(folder, names[i], listings)
            if match != names[i]:
                renamed[i] = match
    return FolderSource(JoinedPaths(folder, names, renamed), names)


def _point_tracks(points: colmap_io.Points, image_ids: np.ndarray) -> Optional[TrackTable]:
    """[C] per image (in scene order), the sorted indices of the points whose track holds it:
    one sort of the (image, point) pairs, not a pass over every track per image."""
    if points.track_offsets is None:
        return None
    P, C = len(points.ids), len(image_ids)
    point_of = np.repeat(np.arange(P, dtype=np.int64), np.diff(points.track_offsets))  # [T]
    by_id = np.argsort(image_ids, kind="stable")  # [C]
    ids_sorted = image_ids[by_id]
    pos = np.minimum(np.searchsorted(ids_sorted, points.track_images), max(C - 1, 0))  # [T]
    seen = ids_sorted[pos] == points.track_images if C else np.zeros(len(pos), bool)  # tracks of unknown images drop
    key = np.unique(by_id[pos[seen]] * max(P, 1) + point_of[seen])  # [T'] (camera, point) pairs, once each
    cam, point = key // max(P, 1), key % max(P, 1)
    offsets = np.concatenate([[0], np.cumsum(np.bincount(cam, minlength=C))]).astype(np.int64)  # [C + 1]
    return TrackTable(offsets, point)


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


def _match_name(image_dir: str, name: str, listings: Optional[Dict[str, tuple]] = None) -> str:
    """images_N/ may hold PNGs for JPEG originals (gsplat writes them so): same stem, any extension.
    `listings` caches each folder's entries (one listing per folder, not a stat and a glob per
    image: a million-image capture, or a node that holds only its staged images); str paths,
    no pathlib, for the same reason."""
    listings = {} if listings is None else listings
    parent, base = os.path.split(name)
    folder = os.path.join(image_dir, parent)
    if folder not in listings:
        if len(listings) >= 4:  # names come sorted, folder by folder: keep a few listings, not all
            listings.clear()
        try:
            entries = os.listdir(folder)
        except OSError:
            entries = []
        listings[folder] = [set(entries), None]
    entry = listings[folder]
    if base in entry[0]:
        return name
    if entry[1] is None:  # stems only when some name misses (PNGs for JPEGs)
        stems: Dict[str, List[str]] = {}
        for e in entry[0]:
            stems.setdefault(os.path.splitext(e)[0], []).append(e)
        entry[1] = stems
    matches = entry[1].get(os.path.splitext(base)[0], []) if "*" not in name and "?" not in name else []
    return os.path.join(parent, matches[0]) if len(matches) == 1 else name


def _split(data_dir: Path, names: Sequence[str], test_every: int, dropped: Sequence[str] = ()):
    """(train, test) indices: test.txt / train.txt when present (less the `dropped` images
    left out for being absent), else every test_every-th image."""
    test_file, train_file = data_dir / "test.txt", data_dir / "train.txt"
    if not test_file.exists():
        return split_every(names, test_every)
    gone = set(dropped)
    test_names = [n for n in _read_names(test_file) if n not in gone]
    test_pos = _positions(names, test_names)
    unknown = [n for n, p in zip(test_names, test_pos.tolist()) if p < 0]
    if unknown:
        raise DataError(f"{test_file}: names {unknown[:3]} are not images of the COLMAP model")
    test = np.sort(test_pos)
    if train_file.exists():
        train_names = [n for n in _read_names(train_file) if n not in gone]
        train_pos = _positions(names, train_names)
        unknown = [n for n, p in zip(train_names, train_pos.tolist()) if p < 0]
        if unknown:
            raise DataError(f"{train_file}: names {unknown[:3]} are not images of the COLMAP model")
        train = np.sort(train_pos)
    else:
        train = np.setdiff1d(np.arange(len(names)), test)
    return train, test


def _positions(names: Sequence[str], wanted: Sequence[str]) -> np.ndarray:
    """[len(wanted)] int64 index of each name in `names`, -1 where absent."""
    if isinstance(names, NameList):
        return names.positions(wanted)
    pos = {n: i for i, n in enumerate(names)}
    return np.array([pos.get(n, -1) for n in wanted], dtype=np.int64)
