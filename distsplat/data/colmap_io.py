"""Readers and writers of COLMAP sparse models (`cameras`, `images`, `points3D`, binary
`.bin` and text `.txt`), with numpy and struct only.

This is the bottom of the COLMAP branch of the data flow: `colmap.py` turns the raw model
returned here into a `Scene`. The writers exist for tests (text round trip, deliberately
broken models) and for tools that export generated scenes in COLMAP layout.
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
    return cameras


def read_images_bin(path: Path) -> Dict[int, Image]:
    r = _Reader(path)
    images = {}
    for _ in range(r.unpack("<Q")[0]):
        iid, qw, qx, qy, qz, tx, ty, tz, cid = r.unpack("<i7di")
        name = r.cstring()
        r.skip(24 * r.unpack("<Q")[0])  # points2D (x, y, point3D_id): not needed to train
        images[iid] = Image(iid, np.array([qw, qx, qy, qz]), np.array([tx, ty, tz]), cid, name)
    return images


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
    return ImageTable(head["id"].astype(np.int64), head["q"].astype(np.float64), head["t"].astype(np.float64),
                      head["cam"].astype(np.int64), names)


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
        r.skip(8 * track)  # track (image_id, point2D_idx) int32 pairs
        tracks.append(np.frombuffer(r.buf, "<i4", 2 * track, start)[0::2])
        offsets[i + 1] = offsets[i] + track
    images = np.concatenate(tracks).astype(np.int64) if tracks else np.zeros(0, np.int64)
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
            params = np.array([float(v) for v in parts[4:]])
        except (IndexError, ValueError) as e:
            raise DataError(f"{path}:{lineno}: malformed camera line ({e})") from None
        if model not in MODEL_IDS:
            raise DataError(f"{path}:{lineno}: camera {cid} has unknown camera model {model!r}; COLMAP's models are "
                            f"{', '.join(MODEL_IDS)} (distsplat trains on the undistorted pinhole ones)")
        cameras[cid] = Camera(cid, model, w, h, params)
    return cameras


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
        images[iid] = Image(iid, np.array(vals[:4]), np.array(vals[4:7]), cid, name)
        i += 1  # its points2D line
    return images


def read_points_txt(path: Path) -> Points:
    rows, tracks = [], []
    for lineno, line in _text_lines(path):
        parts = line.split()
        if len(parts) < 8:
            raise DataError(f"{path}:{lineno}: malformed point line")
        rows.append(parts[:8])
        tracks.append(np.array(parts[8::2], dtype=np.int64))  # (image_id, point2D_idx) pairs
    if not rows:
        return Points(np.zeros(0, np.int64), np.zeros((0, 3)), np.zeros((0, 3), np.uint8), np.zeros(0),
                      np.zeros(1, np.int64), np.zeros(0, np.int64))
    a = np.array(rows)
    try:
        ids, xyz, err = a[:, 0].astype(np.int64), a[:, 1:4].astype(np.float64), a[:, 7].astype(np.float64)
        rgb = a[:, 4:7].astype(np.int64)
    except (ValueError, OverflowError) as e:
        raise DataError(f"{path}: malformed point line ({e}); {REEXPORT}") from None
    if rgb.size and (rgb.min() < 0 or rgb.max() > 255):
        raise DataError(f"{path}: a point colour is outside 0..255; {REEXPORT}")
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
            if table:
                images = read_images_bin_table(paths[1]) if ext == ".bin" else ImageTable.of(readers[1](paths[1]))
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
