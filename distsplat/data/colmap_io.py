"""Readers and writers of COLMAP sparse models (`cameras`, `images`, `points3D`, binary
`.bin` and text `.txt`), with numpy and struct only.

This is the bottom of the COLMAP branch of the data flow: `colmap.py` turns the raw model
returned here into a `Scene`. The writers exist for tests (text round trip, deliberately
broken models) and for tools that export generated scenes in COLMAP layout.

Every value is checked where it is read (issue 36), so a damaged model is a DataError
naming the file, the record and the value, never an exception further down the load
(`colmap.py`, the normalisation, the undistortion plan): camera sizes and parameters
(`check_camera`), image poses (`check_poses`), point coordinates, colours and track
lengths (`check_points`, the readers). The limits are far past any real capture and
within what the rest of the load computes in float32 and float64 (the limits below).
"""

from __future__ import annotations

import logging
import struct
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from .errors import DataError
from .model_cache import read_table
from .names import fixed_width, utf8_ok

log = logging.getLogger(__name__)

# model id -> (name, number of params); COLMAP's src/colmap/sensor/models.h
CAMERA_MODELS: Dict[int, Tuple[str, int]] = {
    0: ("SIMPLE_PINHOLE", 3),
    1: ("PINHOLE", 4),
    2: ("SIMPLE_RADIAL", 4),
    3: ("RADIAL", 5),
    4: ("OPENCV", 8),
    5: ("OPENCV_FISHEYE", 8),
    6: ("FULL_OPENCV", 12),
    7: ("FOV", 5),
    8: ("SIMPLE_RADIAL_FISHEYE", 4),
    9: ("RADIAL_FISHEYE", 5),
    10: ("THIN_PRISM_FISHEYE", 12),
    11: ("RAD_TAN_THIN_PRISM_FISHEYE", 16),
}
MODEL_IDS = {name: mid for mid, (name, _) in CAMERA_MODELS.items()}
REEXPORT = "re-export the model from its COLMAP database (colmap model_converter)"
DAMAGED = "the reconstruction is damaged: re-export or re-run it"

# Limits of the values a model may hold. A value outside is damage (a flipped bit, an
# overwritten block), not a capture: the ranges are far wider than any real one.
MAX_SIDE = 1 << 20  # pixels, a camera's width or height: 1 .. 1048576
FOCAL_RANGE = (1e-3, 1e3)  # focal length / the camera's larger side: fields of view of 0.06 to 179.9 degrees
CENTRE_RANGE = 10.0  # the principal point lies within 10 widths (heights) of the image
COORD_LIMIT = 1e10  # |coordinate| of a point or a camera translation: past any real model (the Earth is
#                     1.3e7 m across), and far inside float32
QNORM_RANGE = (1e-3, 1e3)  # norm of an image's rotation quaternion: COLMAP writes unit quaternions
MAX_ID = 2**32 - 1  # COLMAP's camera and image ids are 32-bit unsigned


@dataclass
class Camera:
    id: int
    model: str
    width: int
    height: int
    params: np.ndarray  # [P] float64, COLMAP's order for the model


@dataclass
class Image:
    id: int
    qvec: np.ndarray  # [4] float64 (w, x, y, z), world-to-camera rotation
    tvec: np.ndarray  # [3] float64, world-to-camera translation
    camera_id: int
    name: str


@dataclass
class Points:
    ids: np.ndarray  # [P] int64
    xyz: np.ndarray  # [P, 3] float64
    rgb: np.ndarray  # [P, 3] uint8
    error: np.ndarray  # [P] float64
    # Tracks' image ids in CSR form (point i is seen by track_images[track_offsets[i]:
    # track_offsets[i + 1]]): [P + 1] and [T] int64; None when not read (depth loss uses them).
    track_offsets: Optional[np.ndarray] = None
    track_images: Optional[np.ndarray] = None


@dataclass
class Model:
    cameras: Dict[int, Camera]
    images: Dict[int, Image]
    points: Points


@dataclass
class ImageTable:
    """Every image of a model as arrays (file order), for captures of a million images: no
    Python object per image (load_colmap reads models this way)."""

    ids: np.ndarray  # [C] int64 image ids
    qvecs: np.ndarray  # [C, 4] float64 (w, x, y, z), world-to-camera rotations
    tvecs: np.ndarray  # [C, 3] float64, world-to-camera translations
    camera_ids: np.ndarray  # [C] int64
    names: np.ndarray  # [C] UTF-8 bytes (validated), or dtype object of bytes when widths differ wildly

    def __len__(self) -> int:
        return len(self.ids)

    @staticmethod
    def of(images: Dict[int, Image]) -> "ImageTable":
        ims = list(images.values())
        names = [im.name.encode("utf-8") for im in ims]
        return ImageTable(np.array([im.id for im in ims], dtype=np.int64).reshape(-1),
                          np.array([im.qvec for im in ims], dtype=np.float64).reshape(-1, 4),
                          np.array([im.tvec for im in ims], dtype=np.float64).reshape(-1, 3),
                          np.array([im.camera_id for im in ims], dtype=np.int64).reshape(-1), _names_array(names))


def _names_array(names: List[bytes]) -> np.ndarray:
    """[C] fixed-width bytes, or an object array when one name is far longer than the rest
    (a fixed-width table costs C x the longest)."""
    width, total = max(map(len, names), default=1), sum(map(len, names))
    if width * len(names) > 16 * total + (1 << 20):
        out = np.empty(len(names), dtype=object)
        out[:] = names
        return out
    return np.array(names, dtype=f"S{max(width, 1)}")


def qvec_to_rotmat(q: np.ndarray) -> np.ndarray:
    """[4] (w, x, y, z) unit quaternion -> [3, 3] rotation matrix."""
    w, x, y, z = np.asarray(q, dtype=np.float64) / np.linalg.norm(q)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


# ---------------------------------------------------------------- checks

def check_camera(path: Path, where: str, cam: Camera) -> None:
    """DataError unless `cam`'s size and parameters are finite and in range; `where` names
    the record ("camera 1", "line 4: camera 1")."""
    def bad(what: str) -> DataError:
        return DataError(f"{path}: {where} ({cam.model}) {what}; {DAMAGED}")

    for side, v in (("width", cam.width), ("height", cam.height)):
        if not 1 <= v <= MAX_SIDE:
            raise bad(f"has {side} {v}, outside 1..{MAX_SIDE}")
    n = CAMERA_MODELS[MODEL_IDS[cam.model]][1]
    if len(cam.params) != n:
        raise DataError(f"{path}: {where} ({cam.model}) has {len(cam.params)} parameters, the model has {n}; "
                        f"{REEXPORT}")
    p = cam.params
    if not np.isfinite(p).all():
        raise bad(f"has non-finite parameters {p.tolist()}")
    one = cam.model in ("SIMPLE_PINHOLE", "SIMPLE_RADIAL", "RADIAL", "SIMPLE_RADIAL_FISHEYE", "RADIAL_FISHEYE")
    focals, centre = (p[:1], p[1:3]) if one else (p[:2], p[2:4])
    side = max(cam.width, cam.height)
    lo, hi = FOCAL_RANGE
    for f in focals.tolist():
        if not lo * side <= f <= hi * side:
            raise bad(f"has focal length {f!r}, outside {lo:g} to {hi:g} times its larger side {side} "
                      f"({lo * side:g} to {hi * side:g} pixels)")
    for axis, c, size in (("cx", centre[0], cam.width), ("cy", centre[1], cam.height)):
        if not -CENTRE_RANGE * size <= c <= (CENTRE_RANGE + 1) * size:
            raise bad(f"has principal point {axis} = {float(c)!r}, more than {CENTRE_RANGE:g} image sizes "
                      f"outside the {cam.width}x{cam.height} image")


def check_poses(path: Path, ids: np.ndarray, names, q: np.ndarray, t: np.ndarray) -> None:
    """DataError naming the first image (file order) whose pose is not finite or out of
    range. ids [C], names [C] (str or UTF-8 bytes), q [C, 4], t [C, 3]."""
    finite = np.isfinite(q).all(1) & np.isfinite(t).all(1)  # [C]
    qf = np.where(finite[:, None], q, 0.0)  # [C, 4]
    m = np.abs(qf).max(1, initial=0.0)  # [C] scaled first: no square overflows or underflows
    qn = m * np.linalg.norm(qf / np.where(m > 0, m, 1.0)[:, None], axis=1)  # [C]
    far = (np.abs(np.where(finite[:, None], t, 0.0)) > COORD_LIMIT).any(1)  # [C]
    ok = finite & (qn >= QNORM_RANGE[0]) & (qn <= QNORM_RANGE[1]) & ~far
    for i in np.flatnonzero(~ok)[:1].tolist():
        name = names[i].decode("utf-8", "replace") if isinstance(names[i], bytes) else names[i]
        head, rec = f"{path}: image {name!r}", f"image id {int(ids[i])}, record {i + 1}"
        if not finite[i]:
            raise DataError(f"{head} has a non-finite pose (qvec {q[i].tolist()}, tvec {t[i].tolist()}; {rec}); "
                            f"{DAMAGED}")
        if not QNORM_RANGE[0] <= qn[i] <= QNORM_RANGE[1]:
            raise DataError(f"{head} has a rotation quaternion of norm {qn[i]:.3g} (qvec {q[i].tolist()}; {rec}), "
                            f"outside {QNORM_RANGE[0]:g}..{QNORM_RANGE[1]:g}: COLMAP writes unit quaternions; {DAMAGED}")
        raise DataError(f"{head} has a translation {t[i].tolist()} beyond +-{COORD_LIMIT:g} ({rec}); {DAMAGED}")


def check_points(path: Path, ids: np.ndarray, xyz: np.ndarray) -> None:
    """DataError naming the first point whose coordinates are non-finite or beyond
    +-COORD_LIMIT (and how many are). ids [P], xyz [P, 3]."""
    finite = np.isfinite(xyz).all(axis=1)  # [P]
    bad = ~finite if not finite.all() else (np.abs(xyz) > COORD_LIMIT).any(axis=1)  # [P]
    if not bad.any():
        return
    what = "non-finite coordinates" if not finite.all() else f"coordinates beyond +-{COORD_LIMIT:g}"
    first = int(np.flatnonzero(bad)[0])
    raise DataError(f"{path}: {int(bad.sum())} of {len(bad)} points have {what} (first: point {int(ids[first])} at "
                    f"{xyz[first].tolist()}, record {first + 1}); {DAMAGED}")


# ---------------------------------------------------------------- binary

class _Reader:
    """Bounds-checked cursor over a file's bytes, so truncation is a DataError naming the file."""

    def __init__(self, path: Path):
        self.path = path
        self.buf = path.read_bytes()
        self.pos = 0

    def unpack(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise DataError(f"{self.path}: truncated (wanted {size} bytes at offset {self.pos}, file has {len(self.buf)}); {REEXPORT}")
        out = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return out

    def skip(self, n: int) -> None:
        if self.pos + n > len(self.buf):
            raise DataError(f"{self.path}: truncated (wanted {n} bytes at offset {self.pos}, file has {len(self.buf)}); {REEXPORT}")
        self.pos += n

    def cstring(self) -> str:
        end = self.buf.find(b"\0", self.pos)
        if end < 0:
            raise DataError(f"{self.path}: truncated image name at offset {self.pos}; {REEXPORT}")
        try:
            s = self.buf[self.pos:end].decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{self.path}: image name at offset {self.pos} is not UTF-8 ({e.reason}); {REEXPORT}") from None
        self.pos = end + 1
        return s


def read_cameras_bin(path: Path) -> Dict[int, Camera]:
    r = _Reader(path)
    cameras = {}
    for _ in range(r.unpack("<Q")[0]):
        cid, mid, w, h = r.unpack("<iiQQ")
        if mid not in CAMERA_MODELS:
            raise DataError(f"{path}: camera {cid} has unknown camera model id {mid} (COLMAP's are 0-{max(CAMERA_MODELS)}): "
                            f"the file is damaged or not a COLMAP cameras.bin; {REEXPORT}")
        name, n = CAMERA_MODELS[mid]
        cameras[cid] = Camera(cid, name, w, h, np.array(r.unpack(f"<{n}d")))
        check_camera(path, f"camera {cid}", cameras[cid])
    return cameras


def read_images_bin(path: Path) -> Dict[int, Image]:
    r = _Reader(path)
    images = {}
    for _ in range(r.unpack("<Q")[0]):
        iid, qw, qx, qy, qz, tx, ty, tz, cid = r.unpack("<i7di")
        name = r.cstring()
        r.skip(24 * r.unpack("<Q")[0])  # points2D (x, y, point3D_id): not needed to train
        images[iid] = Image(iid, np.array([qw, qx, qy, qz]), np.array([tx, ty, tz]), cid, name)
    _check_image_dict(path, images)
    return images


def _check_image_dict(path: Path, images: Dict[int, "Image"]) -> None:
    ims = list(images.values())
    check_poses(path, np.array([im.id for im in ims], dtype=np.int64), [im.name for im in ims],
                np.array([im.qvec for im in ims], dtype=np.float64).reshape(-1, 4),
                np.array([im.tvec for im in ims], dtype=np.float64).reshape(-1, 3))


_IMAGE_HEAD = np.dtype([("id", "<i4"), ("q", "<f8", (4,)), ("t", "<f8", (3,)), ("cam", "<i4")])  # 64 bytes


def read_images_bin_table(path: Path) -> ImageTable:
    """read_images_bin as arrays: one pass finds each record's start and name end (a few
    Python operations per image, offsets kept in typed arrays, not a million int or bytes
    objects), then the fixed 64-byte heads and the names are gathered with numpy in chunks."""
    buf = path.read_bytes()
    size = len(buf)
    if size < 8:
        raise DataError(f"{path}: truncated (wanted 8 bytes at offset 0, file has {size}); {REEXPORT}")
    n = struct.unpack_from("<Q", buf, 0)[0]
    starts, ends = array("q"), array("q")
    find, unpack, pos = buf.find, struct.unpack_from, 8
    for _ in range(n):
        if pos + 64 > size:
            raise DataError(f"{path}: truncated (wanted 64 bytes at offset {pos}, file has {size}); {REEXPORT}")
        end = find(b"\0", pos + 64)
        if end < 0:
            raise DataError(f"{path}: truncated image name at offset {pos + 64}; {REEXPORT}")
        if end + 9 > size:
            raise DataError(f"{path}: truncated (wanted 8 bytes at offset {end + 1}, file has {size}); {REEXPORT}")
        starts.append(pos)
        ends.append(end)
        pos = end + 9 + 24 * unpack("<Q", buf, end + 1)[0]  # points2D (x, y, point3D_id): not needed to train
        if pos > size:
            raise DataError(f"{path}: truncated (wanted {pos - end - 9} bytes at offset {end + 9}, file has {size}); {REEXPORT}")
    s = np.frombuffer(starts, dtype=np.int64)  # [C] record starts
    lengths = np.frombuffer(ends, dtype=np.int64) - s - 64  # [C] name lengths
    data = np.frombuffer(buf, np.uint8)
    C = len(s)
    head = np.empty(C, _IMAGE_HEAD)  # [C]
    for a in range(0, C, _CHUNK):
        b = min(a + _CHUNK, C)
        head[a:b] = data[s[a:b, None] + np.arange(64)].view(_IMAGE_HEAD)[:, 0]
    names = fixed_width(data, s + 64, lengths)  # [C] 'S<width>'
    if names is None:  # one name far longer than the rest: objects, not a C x longest table
        names = np.empty(C, dtype=object)
        names[:] = [buf[o + 64:o + 64 + k] for o, k in zip(s.tolist(), lengths.tolist())]
    _check_utf8(path, names, s)
    table = ImageTable(head["id"].astype(np.int64), head["q"].astype(np.float64), head["t"].astype(np.float64),
                       head["cam"].astype(np.int64), names)
    check_poses(path, table.ids, table.names, table.qvecs, table.tvecs)
    return table


_CHUNK = 1 << 16  # records gathered at once (bounded temporaries: ~B x 64 x 8 bytes of indices)


def _check_utf8(path: Path, names: np.ndarray, starts: np.ndarray) -> None:
    """DataError naming the first image name (by its file offset) that is not UTF-8 (a
    fixed-width table is checked at once: names.utf8_ok)."""
    if names.dtype.kind == "S" and utf8_ok(names):
        return
    for a, raw in zip(starts.tolist(), names.tolist()):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: image name at offset {a + 64} is not UTF-8 ({e.reason}); {REEXPORT}") from None


POINT_BIN_BYTES = struct.calcsize("<Q3d3BdQ")  # one point without its track


def read_points_bin(path: Path) -> Points:
    r = _Reader(path)
    n = r.unpack("<Q")[0]
    if n * POINT_BIN_BYTES > len(r.buf) - r.pos:  # before allocating n rows: garbage can claim 2^64
        raise DataError(f"{path}: not a COLMAP points3D.bin: it claims {n} points, more than its {len(r.buf)} bytes "
                        f"can hold; {REEXPORT}")
    ids = np.empty(n, np.int64)
    xyz = np.empty((n, 3), np.float64)
    rgb = np.empty((n, 3), np.uint8)
    err = np.empty(n, np.float64)
    offsets = np.zeros(n + 1, np.int64)
    tracks = []
    for i in range(n):
        pid, x, y, z, cr, cg, cb, err[i], track = r.unpack("<Q3d3BdQ")
        if pid >= 2**63:  # COLMAP numbers points from 1; an id past int64 is a damaged file
            raise DataError(f"{path}: point {i} has id {pid}, past the int64 range: the file is damaged; {REEXPORT}")
        ids[i] = pid
        xyz[i] = (x, y, z)
        rgb[i] = (cr, cg, cb)
        start = r.pos
        if track > (len(r.buf) - start) // 8:  # before skipping: the length itself is the damage
            raise DataError(f"{path}: point {pid} (record {i + 1} of {n}) claims a track of {track} observations, "
                            f"more than the {len(r.buf) - start} bytes left in the file hold; {REEXPORT}")
        r.skip(8 * track)  # track (image_id, point2D_idx) int32 pairs
        tracks.append(np.frombuffer(r.buf, "<i4", 2 * track, start)[0::2])
        offsets[i + 1] = offsets[i] + track
    images = np.concatenate(tracks).astype(np.int64) if tracks else np.zeros(0, np.int64)
    check_points(path, ids, xyz)  # colours are bytes: 0..255 by construction
    return Points(ids, xyz, rgb, err, offsets, images)


def write_model_bin(model: Model, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "cameras.bin", "wb") as f:
        f.write(struct.pack("<Q", len(model.cameras)))
        for c in model.cameras.values():
            f.write(struct.pack("<iiQQ", c.id, MODEL_IDS[c.model], c.width, c.height))
            f.write(struct.pack(f"<{len(c.params)}d", *c.params))
    per_image, tracks = _observations(model)
    with open(folder / "images.bin", "wb") as f:
        f.write(struct.pack("<Q", len(model.images)))
        for im in model.images.values():
            f.write(struct.pack("<i7di", im.id, *im.qvec, *im.tvec, im.camera_id))
            obs = per_image.get(im.id, [])
            f.write(im.name.encode("utf-8") + b"\0" + struct.pack("<Q", len(obs)))
            f.write(b"".join(struct.pack("<ddq", 0.0, 0.0, pid) for pid in obs))
    p = model.points
    with open(folder / "points3D.bin", "wb") as f:
        f.write(struct.pack("<Q", len(p.ids)))
        for i in range(len(p.ids)):
            track = tracks[i]
            f.write(struct.pack("<Q3d3BdQ", p.ids[i], *p.xyz[i], *p.rgb[i], p.error[i], len(track)))
            f.write(struct.pack(f"<{2 * len(track)}i", *[v for pair in track for v in pair]))


def _track(p: Points, i: int) -> list:
    """Image ids of point i's track."""
    if p.track_offsets is None:
        return []
    return [int(v) for v in p.track_images[p.track_offsets[i]:p.track_offsets[i + 1]]]


def _observations(model: Model) -> Tuple[Dict[int, List[int]], List[List[Tuple[int, int]]]]:
    """For the writers: ({image id: [point3D id of each of its 2D points]}, [per point i:
    [(image id, point2D_idx)]]). The reader keeps no 2D coordinates, so an image's 2D points
    are written at (0, 0), one per observation, and each track indexes them: a model COLMAP
    and pycolmap read (a point2D_idx must exist in its image)."""
    p, per_image, tracks = model.points, {}, []
    for i in range(len(p.ids)):
        track = []
        for im in _track(p, i):
            obs = per_image.setdefault(im, [])
            track.append((im, len(obs)))
            obs.append(int(p.ids[i]))
        tracks.append(track)
    return per_image, tracks


# ---------------------------------------------------------------- text

def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not a COLMAP text file (not UTF-8 at byte {e.start}); {REEXPORT}") from None


def _text_lines(path: Path):
    for lineno, line in enumerate(_read_text(path).split("\n"), 1):
        line = line.strip()
        if line and not line.startswith("#"):
            yield lineno, line


def read_cameras_txt(path: Path) -> Dict[int, Camera]:
    cameras = {}
    for lineno, line in _text_lines(path):
        parts = line.split()
        try:
            cid, model, w, h = int(parts[0]), parts[1], int(parts[2]), int(parts[3])
            params = np.array([float(v) for v in parts[4:]], dtype=np.float64)
        except (IndexError, ValueError) as e:
            raise DataError(f"{path}:{lineno}: malformed camera line ({e})") from None
        _check_id(path, lineno, "camera id", cid)
        if model not in MODEL_IDS:
            raise DataError(f"{path}:{lineno}: camera {cid} has unknown camera model {model!r}; COLMAP's models are "
                            f"{', '.join(MODEL_IDS)} (distsplat trains on the undistorted pinhole ones)")
        cameras[cid] = Camera(cid, model, w, h, params)
        check_camera(path, f"line {lineno}: camera {cid}", cameras[cid])
    return cameras


def _check_id(path: Path, lineno: int, what: str, value: int) -> None:
    if not 0 <= value <= MAX_ID:
        raise DataError(f"{path}:{lineno}: {what} {value} is outside COLMAP's 0..{MAX_ID}; {DAMAGED}")


def read_images_txt(path: Path) -> Dict[int, Image]:
    """As COLMAP reads it: a pose line (10 fields), then one points2D line, possibly empty."""
    images = {}
    lines = _read_text(path).split("\n")
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        try:
            iid, vals, cid, name = int(parts[0]), [float(v) for v in parts[1:8]], int(parts[8]), parts[9]
        except (IndexError, ValueError) as e:
            raise DataError(f"{path}:{i}: malformed image line ({e})") from None
        _check_id(path, i, "image id", iid)
        _check_id(path, i, "camera id", cid)
        images[iid] = Image(iid, np.array(vals[:4]), np.array(vals[4:7]), cid, name)
        i += 1  # its points2D line
    _check_image_dict(path, images)
    return images


def read_points_txt(path: Path) -> Points:
    rows, tracks, linenos = [], [], []
    for lineno, line in _text_lines(path):
        parts = line.split()
        if len(parts) < 8 or len(parts) % 2:
            raise DataError(f"{path}:{lineno}: malformed point line ({len(parts)} fields: POINT3D_ID, X, Y, Z, R, G, B, "
                            "ERROR, then (IMAGE_ID, POINT2D_IDX) pairs); " + REEXPORT)
        rows.append(parts[:8])
        try:
            tracks.append(np.array(parts[8:], dtype=np.int64)[0::2])  # (image_id, point2D_idx) pairs: the ids
        except (ValueError, OverflowError) as e:
            raise DataError(f"{path}:{lineno}: malformed track of point {parts[0]} ({e}); {REEXPORT}") from None
        linenos.append(lineno)
    if not rows:
        return Points(np.zeros(0, np.int64), np.zeros((0, 3)), np.zeros((0, 3), np.uint8), np.zeros(0),
                      np.zeros(1, np.int64), np.zeros(0, np.int64))
    a = np.array(rows)
    try:
        ids, xyz, err = a[:, 0].astype(np.int64), a[:, 1:4].astype(np.float64), a[:, 7].astype(np.float64)
        rgb = a[:, 4:7].astype(np.int64)
    except (ValueError, OverflowError) as e:
        raise DataError(f"{path}: malformed point line ({e}); {REEXPORT}") from None
    out = np.flatnonzero(((rgb < 0) | (rgb > 255)).any(axis=1))
    for k in out[:1].tolist():
        raise DataError(f"{path}:{linenos[k]}: point {int(ids[k])} has colour {rgb[k].tolist()}, outside 0..255; "
                        f"{REEXPORT}")
    check_points(path, ids, xyz)
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in tracks])]).astype(np.int64)
    return Points(ids, xyz, rgb.astype(np.uint8), err, offsets, np.concatenate(tracks))


def write_model_txt(model: Model, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "cameras.txt", "w") as f:
        f.write("# CAMERA_ID, MODEL, WIDTH, HEIGHT, PARAMS[]\n")
        for c in model.cameras.values():
            f.write(f"{c.id} {c.model} {c.width} {c.height} " + " ".join(repr(float(v)) for v in c.params) + "\n")
    per_image, tracks = _observations(model)
    with open(folder / "images.txt", "w") as f:
        f.write("# IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME\n# POINTS2D[] as (X, Y, POINT3D_ID)\n")
        for im in model.images.values():
            vals = " ".join(repr(float(v)) for v in (*im.qvec, *im.tvec))
            obs = " ".join(f"0.0 0.0 {pid}" for pid in per_image.get(im.id, []))
            f.write(f"{im.id} {vals} {im.camera_id} {im.name}\n{obs}\n")
    p = model.points
    with open(folder / "points3D.txt", "w") as f:
        f.write("# POINT3D_ID, X, Y, Z, R, G, B, ERROR, TRACK[]\n")
        for i in range(len(p.ids)):
            x, y, z = (repr(float(v)) for v in p.xyz[i])
            track = "".join(f" {im} {idx}" for im, idx in tracks[i])
            f.write(f"{p.ids[i]} {x} {y} {z} {p.rgb[i][0]} {p.rgb[i][1]} {p.rgb[i][2]} {float(p.error[i])!r}{track}\n")


# ---------------------------------------------------------------- both

def read_model(folder: Path) -> Model:
    """Reads `folder/{cameras,images,points3D}.bin`, else the `.txt` files.
    Raises DataError when the folder is missing, empty or inconsistent."""
    return _read_model(Path(folder), table=False)


def read_model_table(folder: Path) -> Tuple[Dict[int, Camera], ImageTable, Points]:
    """read_model with the images as an ImageTable (no object per image: million-image captures)."""
    model = _read_model(Path(folder), table=True)
    return model.cameras, model.images, model.points


def _read_model(folder: Path, table: bool) -> Model:
    if not folder.is_dir():
        raise DataError(f"COLMAP model folder {folder} does not exist (expected sparse/0 with cameras, images, points3D .bin or .txt)")
    for ext, readers in ((".bin", (read_cameras_bin, read_images_bin, read_points_bin)),
                         (".txt", (read_cameras_txt, read_images_txt, read_points_txt))):
        paths = [folder / f"{stem}{ext}" for stem in ("cameras", "images", "points3D")]
        if paths[0].exists() or paths[1].exists():
            for p in paths[:2]:
                if not p.exists():
                    raise DataError(f"{p} is missing (COLMAP model in {folder} is incomplete)")
            cameras = readers[0](paths[0])
            if table:  # from the binary copy beside the model when it is current (model_cache.py)
                parse = read_images_bin_table if ext == ".bin" else (lambda p: ImageTable.of(read_images_txt(p)))
                images = read_table(paths[1], parse, ImageTable)
            else:
                images = readers[1](paths[1])
            points = readers[2](paths[2]) if paths[2].exists() else Points(
                np.zeros(0, np.int64), np.zeros((0, 3)), np.zeros((0, 3), np.uint8), np.zeros(0))
            break
    else:
        raise DataError(f"COLMAP model folder {folder} has no cameras.bin/images.bin or cameras.txt/images.txt")
    if not len(images):
        raise DataError(f"{paths[1]}: the COLMAP model has no registered images")
    if table:
        unknown = np.flatnonzero(~np.isin(images.camera_ids, np.array(sorted(cameras), dtype=np.int64)))
        bad = [(images.names[unknown[0]].decode("utf-8"), int(images.camera_ids[unknown[0]]))] if len(unknown) else []
    else:
        bad = [(im.name, im.camera_id) for im in images.values() if im.camera_id not in cameras][:1]
    for name, cid in bad:
        raise DataError(f"{paths[1]}: image {name!r} names camera {cid}, which {paths[0].name} does not define "
                        f"(defined: {sorted(cameras)})")
    log.debug("read COLMAP model %s: %d cameras, %d images, %d points", folder, len(cameras), len(images), len(points.ids))
    return Model(cameras, images, points)
