"""nerfstudio and instant-ngp parser: a `transforms.json` (what `ns-process-data` or
instant-ngp's `colmap2nerf.py` writes) -> `Scene`, so users bring their captures as they are.

What is read (nerfstudio's `nerfstudio_dataparser.py` is the reference for the meaning):
- intrinsics `fl_x, fl_y, cx, cy, w, h`, global or per frame (a frame's own keys win);
- `camera_model`: PINHOLE/SIMPLE_PINHOLE, OPENCV (`k1, k2, k3, p1, p2`; default when the
  key is missing, with zero coefficients a pinhole) or OPENCV_FISHEYE (`k1..k4`); distorted
  cameras are undistorted on load to pinhole crops (undistort.py), as COLMAP's are;
- frames' `file_path` (relative to the folder) and `transform_matrix` (camera-to-world,
  OpenGL axes: y up, z backward), sorted by file name as nerfstudio sorts them;
- `applied_transform` ([3, 4], the world rotation ns-process-data applied to COLMAP's
  world): undone, so the scene's world (and exported PLYs) is COLMAP's original one and a
  capture trains the same from its COLMAP model or its transforms.json;
- `ply_file_path`: the initial points (ascii or binary PLY with x, y, z and optional
  red, green, blue), in the same world as the frames;
- `--data_factor N`: `images_N/<name>` (nerfstudio's downscale folders), else `images/`
  downscaled on load; intrinsics scaled by the actual image size over `w`, `h`;
- split: `test_filenames` (or `val_filenames`) when listed, else every `test_every`-th
  image like the COLMAP parser (gsplat's split; nerfstudio's own default is a 90% fraction).

An instant-ngp file (no `camera_model`, and instant-ngp's keys such as `camera_angle_x` or
`aabb_scale`: `is_instant_ngp`) is read as instant-ngp reads it: focal lengths from `fl_x`,
`fl_y` or `camera_angle_x`, `camera_angle_y` (fl_y defaults to fl_x), `w`, `h` from the
image when absent, `cx`, `cy` the centre when absent, all global or per frame; distortion
`k1 k2 p1 p2` (OPENCV, `k3` too) or `is_fisheye` with `k1..k4`, undistorted on load; a
`file_path` without extension is a .png; frames whose image is absent are skipped with one
warning, as instant-ngp skips them (a nerfstudio file stops with an error naming the file,
unless --skip_missing_images). `aabb_scale`, `scale`, `offset` and `sharpness` are ignored:
they place and bound instant-ngp's own unit cube, and the scene is normalised here anyway;
with no points file the trainer starts from random points in the cameras' extent.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .colmap import _match_name
from .colmap_io import Camera
from .decode import downscaled_size, draft_note, probe_images
from .errors import DataError
from .normalize import normalize as normalize_world
from .open_images import open_images, shards_downscaled, stored_sizes
from .scene import Scene, split_every
from .sources import FolderSource, ONCE, first_present
from .undistort import undistort_cameras

log = logging.getLogger(__name__)

GL_TO_CV = np.diag([1.0, -1.0, -1.0, 1.0])  # flips a camera's y and z axes
INTRINSICS = ("fl_x", "fl_y", "cx", "cy", "w", "h")
MODELS = ("OPENCV", "OPENCV_FISHEYE", "PINHOLE", "SIMPLE_PINHOLE")


def _number(path: Path, where: str, key: str, value) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise DataError(f"{path}: {where} '{key}' is {value!r}, not a number") from None
    if not np.isfinite(v):
        raise DataError(f"{path}: {where} '{key}' is {v}, not a finite number")
    return v


def _camera(path: Path, meta: dict, frame: dict, j: int, ingp: bool = False,
            image_size: Optional[Callable[[], Tuple[int, int]]] = None) -> Tuple[str, np.ndarray, Tuple[int, int]]:
    """(COLMAP model name, COLMAP params, (w, h)) of frame j: its own keys, else the file's.
    `ingp` (instant-ngp's reading): focal lengths from fl_x/fl_y or camera_angle_x/y (fl_y
    defaults to fl_x), w/h from `image_size()` (the frame's image) when absent, cx/cy the
    image centre when absent, `is_fisheye` for OPENCV_FISHEYE, no camera_model."""
    def get(key, default=None):
        if key in frame:
            return _number(path, f"frame {j}", key, frame[key])
        if key in meta:
            return _number(path, "the file's", key, meta[key])
        if default is None:
            raise DataError(f"{path}: frame {j} has no '{key}' and the file sets none (nerfstudio's intrinsics "
                            f"{', '.join(INTRINSICS)} are needed, globally or per frame)")
        return default

    if ingp:
        if "w" in frame or "w" in meta or "h" in frame or "h" in meta:
            w, h = get("w"), get("h")
        else:
            w, h = image_size()
        fx = _ingp_focal(path, meta, frame, j, "x", w)
        fy = _ingp_focal(path, meta, frame, j, "y", h, fx)
        cx, cy = get("cx", w / 2), get("cy", h / 2)
        fisheye = frame.get("is_fisheye", meta.get("is_fisheye", False))
        model = "OPENCV_FISHEYE" if fisheye is True or str(fisheye).lower() in ("1", "true") else "OPENCV"
    else:
        fx, fy, cx, cy = (get(k) for k in INTRINSICS[:4])
        w, h = get("w"), get("h")
        model = str(frame.get("camera_model", meta.get("camera_model", "OPENCV")))
    if fx <= 0 or fy <= 0 or w < 1 or h < 1 or w != int(w) or h != int(h):
        raise DataError(f"{path}: frame {j} has fl_x {fx}, fl_y {fy}, w {w}, h {h}: focal lengths must be > 0 "
                        "and w, h whole numbers of pixels")
    if model not in MODELS:
        raise DataError(f"{path}: frame {j} 'camera_model' is {model!r}; distsplat reads {', '.join(MODELS)} "
                        "(re-run ns-process-data with --camera-type perspective or fisheye)")
    k1, k2, k3, k4, p1, p2 = (get(k, 0.0) for k in ("k1", "k2", "k3", "k4", "p1", "p2"))
    if model == "OPENCV_FISHEYE":
        if p1 or p2:
            raise DataError(f"{path}: frame {j} is OPENCV_FISHEYE with tangential 'p1'/'p2' ({p1}, {p2}), which "
                            "the fisheye model does not have; remove them")
        return "OPENCV_FISHEYE", np.array([fx, fy, cx, cy, k1, k2, k3, k4]), (int(w), int(h))
    if model in ("PINHOLE", "SIMPLE_PINHOLE"):
        return "PINHOLE", np.array([fx, fy, cx, cy]), (int(w), int(h))
    if k4:
        raise DataError(f"{path}: frame {j} is OPENCV with 'k4' {k4}, which OpenCV's 5-coefficient model "
                        "(k1, k2, p1, p2, k3) has not; remove it or use OPENCV_FISHEYE if the lens is a fisheye"
                        + (" (instant-ngp: \"is_fisheye\": true)" if ingp else ""))
    if k3:  # OpenCV's 8-coefficient (rational) form with the denominator terms zero
        return "FULL_OPENCV", np.array([fx, fy, cx, cy, k1, k2, p1, p2, k3, 0.0, 0.0, 0.0]), (int(w), int(h))
    return "OPENCV", np.array([fx, fy, cx, cy, k1, k2, p1, p2]), (int(w), int(h))


def _ingp_focal(path: Path, meta: dict, frame: dict, j: int, axis: str, size: float,
                fallback: Optional[float] = None) -> float:
    """instant-ngp's focal length along `axis` (x: w, y: h): fl_<axis>, else camera_angle_<axis>
    (radians, the full field of view), the frame's keys before the file's; `fallback` (y: the
    x focal length) when neither sets it."""
    for where, keys in ((f"frame {j}", frame), ("the file's", meta)):
        if f"fl_{axis}" in keys:
            return _number(path, where, f"fl_{axis}", keys[f"fl_{axis}"])
        if f"camera_angle_{axis}" in keys:
            angle = _number(path, where, f"camera_angle_{axis}", keys[f"camera_angle_{axis}"])
            if not 0 < angle < math.pi:
                raise DataError(f"{path}: {where} 'camera_angle_{axis}' is {angle}; a field of view in radians "
                                "must be in (0, pi)")
            return 0.5 * size / math.tan(0.5 * angle)
    if fallback is None:
        raise DataError(f"{path}: frame {j} has no focal length: instant-ngp's transforms.json needs 'fl_x' or "
                        "'camera_angle_x', in the frame or for the whole file")
    return fallback


INGP_KEYS = ("camera_angle_x", "camera_angle_y", "aabb_scale", "is_fisheye", "scale", "offset")


def is_instant_ngp(meta: dict) -> bool:
    """An instant-ngp transforms.json (colmap2nerf.py's, or a NeRF-synthetic-style file):
    no `camera_model` (ns-process-data always writes one) and a key that only instant-ngp's
    format has. nerfstudio files keep nerfstudio's reading (missing images are an error)."""
    frames = [f for f in meta["frames"][:1] if isinstance(f, dict)]
    if "camera_model" in meta or any("camera_model" in f for f in meta["frames"] if isinstance(f, dict)):
        return False
    return any(k in d for d in (meta, *frames) for k in INGP_KEYS)


def _read_meta(path: Path) -> dict:
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}; fix or re-export the file") from None
    except (UnicodeDecodeError, RecursionError) as e:  # not UTF-8 text; nested past Python's recursion limit
        raise DataError(f"{path}: not a JSON text file ({type(e).__name__}); fix or re-export the file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("frames"), list) or not meta["frames"]:
        raise DataError(f"{path}: expected an object with a non-empty 'frames' list (nerfstudio's transforms.json: "
                        "{\"fl_x\": ..., \"frames\": [{\"file_path\": ..., \"transform_matrix\": ...}, ...]})")
    return meta


def _matrix(path: Path, key: str, value, shapes: Sequence[Tuple[int, int]], where: str) -> np.ndarray:
    try:
        M = np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise DataError(f"{path}: {where} '{key}' must be a numeric matrix") from None
    if M.shape not in shapes:
        raise DataError(f"{path}: {where} '{key}' must be {' or '.join(f'{a}x{b}' for a, b in shapes)}, got shape {M.shape}")
    if not np.all(np.isfinite(M)):
        r, c = np.argwhere(~np.isfinite(M))[0]
        raise DataError(f"{path}: {where} '{key}'[{r}][{c}] is {M[r, c]}, not a finite number; fix or remove it")
    if M.shape[0] == 3:
        M = np.vstack([M, [0.0, 0.0, 0.0, 1.0]])
    return M


def load_nerfstudio(
    data_dir: Union[str, Path],
    factor: int = 1,
    normalize: bool = False,
    test_every: int = 8,
    check: bool = True,
    shards: Optional[Union[str, Path]] = None,
    skip_missing: bool = False,
) -> Scene:
    """Parses `data_dir/transforms.json` (module docstring). `check=True` reads every
    image's header here, so bad images fail now on every rank; `check=False` one image per
    camera (node-local staging: the caller checks the images a rank owns,
    train/node_data.py). `shards`: an index.json of tar shards (shards.py) holding the
    frames by their file_path (e.g. `images/frame_00001.png`), read instead of the files;
    images stored at their camera's full size are downscaled on load when factor > 1.
    `skip_missing`: frames whose image file is absent are left out (one warning) instead of
    a DataError; an instant-ngp file always leaves them out, as instant-ngp does."""
    data_dir = Path(data_dir)
    path = data_dir / "transforms.json"
    if factor < 1:
        raise ValueError(f"factor must be >= 1, got {factor}")
    meta = _read_meta(path)
    ingp = is_instant_ngp(meta)
    frames, names = _frames(path, meta, ingp)

    applied = np.eye(4)
    if "applied_transform" in meta:
        applied = _matrix(path, "applied_transform", meta["applied_transform"], [(3, 4), (4, 4)], "the file's")
    try:
        to_input = np.linalg.inv(applied)  # nerfstudio's world -> the capture's original (COLMAP) world
    except np.linalg.LinAlgError:
        to_input = np.full((4, 4), np.nan)
    if not np.all(np.isfinite(to_input)):  # singular, or so near it that the inverse overflows
        raise DataError(f"{path}: the file's 'applied_transform' {applied[:3].tolist()} is not invertible (ns-process-data "
                        "writes a rotation there); fix it, or remove the key if the frames are in COLMAP's world")
    c2w = np.stack([to_input @ _matrix(path, "transform_matrix", f["transform_matrix"], [(4, 4), (3, 4)], f"frame {j}")
                    @ GL_TO_CV for _, j, f in frames])  # [C, 4, 4] OpenCV axes

    # images_N/<file name> when it exists, else the frames' files, downscaled on load; with
    # shards, their stored sizes decide (below)
    scaled_dir = data_dir / f"images_{factor}"
    full_paths = [data_dir / n for n in names]  # the files the frames name
    on_the_fly = shards is None and factor > 1 and not scaled_dir.is_dir()
    scaled = shards is None and factor > 1 and not on_the_fly

    def folder(names: Sequence[str]) -> FolderSource:  # nerfstudio: images_N/<file name>
        return FolderSource([scaled_dir / _match_name(scaled_dir, Path(n).name) for n in names] if scaled
                            else [data_dir / n for n in names], names)

    opened = open_images(names, shards, folder, str(path), check, skip_missing or ingp,
                         "instant-ngp skips them too" if ingp else "--skip_missing_images")
    source, names, dropped = opened.source, opened.names, opened.dropped
    if opened.keep is not None:
        keep = opened.keep.tolist()
        frames, c2w, full_paths = [frames[i] for i in keep], c2w[opened.keep], [full_paths[i] for i in keep]
    if shards is not None:
        image_dirs = [str(shards)]
    else:
        if on_the_fly:
            log.warning("%s does not exist: downscaling the frames' images by %d while loading%s; "
                        "pre-downscaled images_%d/ (as ns-process-data writes) loads faster", scaled_dir, factor,
                        draft_note(names), factor, extra=ONCE)
        image_dirs = sorted({os.path.dirname(source.where(i)) for i in range(len(names))})

    probed = probe_images(source, range(len(names))) if check else None  # [C] (w, h) of the images read
    if probed is not None and not scaled and shards is None:  # they are the full-size files
        full_size = lambda i: tuple(probed[i])  # noqa: E731
    else:
        full_size = _full_size(path, names, full_paths, check)
    # One camera per distinct (model, params, size): images of one camera share its undistortion maps.
    cams: List[Camera] = []
    ids: Dict[tuple, int] = {}
    for i, (_, j, frame) in enumerate(frames):
        model, params, (w, h) = _camera(path, meta, frame, j, ingp, lambda i=i: full_size(i))
        key = (model, tuple(params.tolist()), w, h)
        if key not in ids:
            ids[key] = len(ids) + 1
        cams.append(Camera(ids[key], model, w, h, params))

    of_size: Dict[Tuple[int, int], int] = {}  # camera size -> its row in sizes_wh, in frame order
    size_of_image = np.array([of_size.setdefault((c.width, c.height), len(of_size)) for c in cams], dtype=np.int64)
    sizes_wh = np.array(list(of_size), dtype=np.int64).reshape(-1, 2)  # [S, 2]
    stored = stored_sizes(source, probed, size_of_image, sizes_wh, lambda w, h: f"{path} frames of size {w}x{h}")
    on_the_fly = on_the_fly or shards_downscaled(shards, factor, stored, size_of_image, sizes_wh)
    loaded = [downscaled_size(w, h, factor) for w, h in stored.tolist()] if on_the_fly else stored

    sizes = np.array(loaded, dtype=np.int64)  # [C, 2] (w, h)
    Ks = np.stack([np.array([[c.params[0], 0, c.params[2]], [0, c.params[1], c.params[3]], [0, 0, 1.0]]) for c in cams])
    cam_sizes = np.array([(c.width, c.height) for c in cams], dtype=np.float64)
    Ks[:, 0, :] *= (sizes[:, 0] / cam_sizes[:, 0])[:, None]
    Ks[:, 1, :] *= (sizes[:, 1] / cam_sizes[:, 1])[:, None]
    undistort = undistort_cameras(cams, Ks, sizes, lambda c: f"{path} camera_model {c.model} ({c.width}x{c.height})")

    points, rgb = _points(data_dir, meta, path)
    if len(points):
        points = (points.astype(np.float64) @ to_input[:3, :3].T + to_input[:3, 3]).astype(np.float32)
    train, test = _split(path, meta, names, test_every, dropped)
    transform = np.eye(4)
    if normalize:
        try:
            c2w, points, transform = normalize_world(c2w, points)
        except DataError as e:  # degenerate cameras or points: name the file
            raise DataError(f"{path}: {e}") from None
    shown = ", ".join(image_dirs[:FOLDERS_SHOWN]) + (f" (+{len(image_dirs) - FOLDERS_SHOWN} folders)"
                                                     if len(image_dirs) > FOLDERS_SHOWN else "")
    log.info("%s %s: %d frames, %d cameras, %d points, %d train / %d test, images from %s%s",
             "instant-ngp" if ingp else "nerfstudio", path, len(names), len(ids), len(points), len(train), len(test),
             shown, f" downscaled by {factor} on load" if on_the_fly else "")
    return Scene(
        names=names, camtoworlds=c2w, Ks=Ks, widths=sizes[:, 0], heights=sizes[:, 1], points=points,
        points_rgb=rgb, train=train, test=test, images=source,
        source_sizes=stored if on_the_fly or undistort else None,
        transform=transform, kind="nerfstudio", undistort=undistort,
    )


FOLDERS_SHOWN = 4  # image folders the load line names


def _frames(path: Path, meta: dict, ingp: bool) -> Tuple[List[Tuple[str, int, dict]], List[str]]:
    """([(file_path, index in the file, frame)], names relative to the folder), sorted by
    file name as nerfstudio sorts them; instant-ngp's file_path may lack the extension
    (then .png, as NeRF-synthetic files mean)."""
    frames = []
    for j, frame in enumerate(meta["frames"]):
        if not isinstance(frame, dict) or "file_path" not in frame or "transform_matrix" not in frame:
            raise DataError(f"{path}: frame {j} needs 'file_path' and 'transform_matrix'")
        frames.append((str(frame["file_path"]), j, frame))
    frames.sort(key=lambda f: f[0])  # nerfstudio sorts frames by file name
    names = [Path(f[0][2:] if f[0].startswith("./") else f[0]).as_posix() for f in frames]
    if ingp:
        names = [n if Path(n).suffix else n + ".png" for n in names]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise DataError(f"{path}: file_path {dup!r} appears in more than one frame")
    return frames, names


def _full_size(path: Path, names: Sequence[str], full_paths: Sequence[Path],
               check: bool) -> Callable[[int], Tuple[int, int]]:
    """frame i -> (w, h) of the image its file_path names, for instant-ngp frames without
    'w'/'h' (instant-ngp reads each image's size): every image's header when checking, else
    the first present one's (a node-local stage; the owners' checks compare the rest)."""
    source = FolderSource(full_paths, names)
    sizes: Dict[int, Tuple[int, int]] = {}
    probed: List[int] = []  # check=False: the one image probed

    def size(i: int) -> Tuple[int, int]:
        if not check:
            if not probed:
                probed.append(first_present(source, f"{path} (frames without 'w'/'h')"))
            i = probed[0]
        if i not in sizes:
            if not source.has(i):
                raise DataError(f"{path}: frame {names[i]!r} has no 'w'/'h' and its full-size image {full_paths[i]} "
                                "is absent, so its size is unknown; add 'w' and 'h' to the file")
            sizes[i] = tuple(probe_images(source, [i])[0])
        return sizes[i]

    return size


def _split(path: Path, meta: dict, names: List[str], test_every: int, dropped: Sequence[str] = ()):
    """(train, test): the frames test_filenames (or val_filenames) lists, less the `dropped`
    ones left out for an absent image, else every test_every-th frame."""
    for key in ("test_filenames", "val_filenames"):
        if key in meta:
            pos = {n: i for i, n in enumerate(names)}
            listed = [str(n)[2:] if str(n).startswith("./") else str(n) for n in meta[key]]
            gone = set(dropped)
            listed = [n for n in listed if n not in gone]
            unknown = [n for n in listed if n not in pos]
            if unknown:
                raise DataError(f"{path}: '{key}' lists {unknown[:3]}, which are no frame's file_path")
            test = np.array(sorted(pos[n] for n in listed), dtype=np.int64)
            return np.setdiff1d(np.arange(len(names)), test), test
    return split_every(names, test_every)


PLY_TYPES = {"float": "f4", "float32": "f4", "double": "f8", "float64": "f8", "uchar": "u1", "uint8": "u1",
             "char": "i1", "int8": "i1", "short": "i2", "int16": "i2", "ushort": "u2", "uint16": "u2",
             "int": "i4", "int32": "i4", "uint": "u4", "uint32": "u4"}


def _points(data_dir: Path, meta: dict, path: Path) -> Tuple[np.ndarray, np.ndarray]:
    """([P, 3] float32, [P, 3] uint8) from `ply_file_path`, or empty when the key is absent."""
    if "ply_file_path" not in meta:  # the load line says 0 points, the trainer how it initialises
        return np.zeros((0, 3), np.float32), np.zeros((0, 3), np.uint8)
    ply = data_dir / str(meta["ply_file_path"])
    if not ply.is_file():
        raise DataError(f"{path}: 'ply_file_path' {ply} does not exist; restore it or remove the key "
                        "(then train with --init_type random)")
    return read_ply_points(ply)


def read_ply_points(ply: Path) -> Tuple[np.ndarray, np.ndarray]:
    """x, y, z (and red, green, blue if present, else grey) of a PLY's vertex element;
    ascii or binary little/big endian, no list properties in the vertex element."""
    data = ply.read_bytes()
    end = data.find(b"end_header")
    if not data.startswith(b"ply") or end < 0:
        raise DataError(f"{ply}: not a PLY file (no 'ply' magic or no 'end_header')")
    newline = data.find(b"\n", end)
    if newline < 0:
        raise DataError(f"{ply}: no line break after 'end_header' (a truncated file?); re-export the file")
    body = data[newline + 1:]
    fmt, count, props, element = None, 0, [], None
    for line in data[:end].decode("ascii", "replace").splitlines():
        parts = line.split()
        if parts[:1] == ["format"] and len(parts) > 1:
            fmt = parts[1]
        elif parts[:1] == ["element"] and len(parts) == 3:
            element = parts[1]
            if element == "vertex":
                count = int(parts[2]) if parts[2].isdigit() else -1  # digits only: no sign, no '_'
                if count < 0:
                    raise DataError(f"{ply}: 'element vertex {parts[2]}' needs a vertex count >= 0")
            elif count == 0:
                raise DataError(f"{ply}: element {element!r} comes before 'vertex'; distsplat reads the vertex element first")
        elif parts[:1] == ["property"] and element == "vertex":
            if len(parts) != 3 or parts[1] not in PLY_TYPES:  # also 'property list ...'
                raise DataError(f"{ply}: vertex property {' '.join(parts[1:])!r} is not a scalar PLY type")
            props.append((parts[2], PLY_TYPES[parts[1]]))
    names = [p for p, _ in props]
    if not {"x", "y", "z"} <= set(names):
        raise DataError(f"{ply}: the vertex element needs x, y, z properties (has {names})")
    if fmt not in ("ascii", "binary_little_endian", "binary_big_endian"):
        raise DataError(f"{ply}: PLY format {fmt!r} is not ascii or binary")
    # The header's vertex count must fit the body before numpy sizes anything by it: a huge
    # count would otherwise overflow numpy's sizes (OverflowError) instead of failing cleanly.
    record = sum(np.dtype(t).itemsize for _, t in props)  # bytes per binary vertex
    holds = body.count(b"\n") + 1 if fmt == "ascii" else len(body) // record  # vertices the body can hold at most
    if count > holds:
        raise DataError(f"{ply}: the header declares {count} vertices but the file holds at most {holds}; "
                        "the file is truncated or its header is wrong, re-export it")
    try:
        if fmt == "ascii":
            rows = body.decode("ascii").split("\n")[:count]
            table = np.array([r.split()[: len(props)] for r in rows], dtype=np.float64).reshape(count, len(props))
            col = {p: table[:, i] for i, p in enumerate(names)}
        else:
            order = "<" if fmt == "binary_little_endian" else ">"
            rec = np.frombuffer(body, dtype=np.dtype([(p, order + t) for p, t in props]), count=count)
            col = {p: rec[p].astype(np.float64) for p in names}
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{ply}: vertex data do not match the header ({type(e).__name__}: {e}); re-export the file") from None
    xyz = np.stack([col["x"], col["y"], col["z"]], 1)
    if not np.isfinite(xyz).all():
        raise DataError(f"{ply}: {int((~np.isfinite(xyz).all(1)).sum())} points have non-finite coordinates")
    if {"red", "green", "blue"} <= set(names):
        rgb = np.clip(np.stack([col["red"], col["green"], col["blue"]], 1), 0, 255).astype(np.uint8)
    else:
        rgb = np.full((count, 3), 128, np.uint8)
    return xyz.astype(np.float32), rgb
