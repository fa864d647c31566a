"""Blender / NeRF-synthetic parser: `transforms_{train,test}.json` + RGBA PNGs -> `Scene`.

Poses in these files are camera-to-world in OpenGL/Blender axes (y up, z backward); the
Scene holds OpenCV axes, so the y and z camera axes are negated. RGBA images are composited
on `background` (white by default, as NeRF-synthetic results are usually reported) when
decoded. The format carries no sparse points: `Scene.points` is empty and the trainer
initialises Gaussians itself. `write_blender` writes the layout (tests, generated scenes).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
from PIL import Image

from .decode import probe_images
from .errors import DataError
from .normalize import normalize as normalize_world
from .open_images import open_images
from .scene import Scene
from .sources import ONCE, FolderSource, first_present

log = logging.getLogger(__name__)

GL_TO_CV = np.diag([1.0, -1.0, -1.0, 1.0])  # flips a camera's y and z axes


def _frames(path: Path) -> Tuple[dict, List[str], np.ndarray]:
    """(meta, image names relative to the data dir, camtoworlds [F, 4, 4] OpenCV)."""
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}; fix or re-export the file") from None
    except (UnicodeDecodeError, RecursionError) as e:  # not text; nested past Python's recursion limit
        raise DataError(f"{path}: not a transforms JSON file ({type(e).__name__}); fix or re-export the file") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("frames"), list) or not meta["frames"]:
        raise DataError(f"{path}: expected an object with a non-empty 'frames' list "
                        "({\"camera_angle_x\": ..., \"frames\": [{\"file_path\": ..., \"transform_matrix\": ...}, ...]})")
    if not any(k in meta for k in ("camera_angle_x", "fl_x")):
        raise DataError(f"{path}: needs 'camera_angle_x' (or 'fl_x') for the focal length")
    names, c2w = [], []
    for j, frame in enumerate(meta["frames"]):
        try:
            name = str(frame["file_path"])
            M = np.array(frame["transform_matrix"], dtype=np.float64)
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(f"{path}: frame {j} needs 'file_path' and a numeric 'transform_matrix' ({type(e).__name__}: {e})") from None
        name = name[2:] if name.startswith("./") else name
        if not Path(name).suffix:
            name += ".png"
        if M.shape != (4, 4):
            raise DataError(f"{path}: frame {j} ({name}) transform_matrix must be a 4x4 matrix, got shape {M.shape}")
        if not np.all(np.isfinite(M)):
            r, c = np.argwhere(~np.isfinite(M))[0]
            raise DataError(f"{path}: frame {j} ({name}) transform_matrix[{r}][{c}] is {M[r, c]}, not a finite number; "
                            "fix or remove the frame")
        names.append(name)
        c2w.append(M @ GL_TO_CV)
    return meta, names, np.stack(c2w)


def _intrinsics(path: Path, meta: dict, w: int, h: int) -> np.ndarray:
    """K [3, 3] from fl_x/fl_y/cx/cy or camera_angle_x; DataError unless finite with positive focals."""
    try:
        fx = float(meta["fl_x"]) if "fl_x" in meta else 0.5 * w / math.tan(0.5 * float(meta["camera_angle_x"]))
        fy = float(meta.get("fl_y", fx))
        cx, cy = float(meta.get("cx", w / 2)), float(meta.get("cy", h / 2))
    except (TypeError, ValueError, OverflowError, ZeroDivisionError) as e:
        raise DataError(f"{path}: camera_angle_x / fl_x, fl_y, cx, cy must be numbers ({type(e).__name__}: {e})") from None
    if not (all(math.isfinite(v) for v in (fx, fy, cx, cy)) and fx > 0 and fy > 0):
        raise DataError(f"{path}: focal lengths {fx}, {fy} (from camera_angle_x or fl_x/fl_y) and centre {cx}, {cy} must "
                        "be finite with positive focals; fix the file")
    return np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])


def load_blender(
    data_dir: Union[str, Path],
    background: Optional[Sequence[int]] = (255, 255, 255),
    normalize: bool = False,
    check: bool = True,
    shards: Optional[Union[str, Path]] = None,
    skip_missing: bool = False,
) -> Scene:
    """Train frames first, then test frames, each in file order. `background=None` drops
    alpha instead of compositing. `check=True` reads every image's header here; `check=False`
    only the first image present (node-local staging: the caller checks the images a rank
    owns, train/node_data.py). `shards`: an index.json of tar shards (shards.py) holding the
    frames by their file_path (e.g. `train/r_0.png`), read instead of the files. `skip_missing`:
    frames whose image file is absent are left out (one warning) instead of a DataError."""
    data_dir = Path(data_dir)
    train_file, test_file = data_dir / "transforms_train.json", data_dir / "transforms_test.json"
    if not train_file.exists():
        raise DataError(f"{train_file} does not exist (Blender/NeRF-synthetic layout expected)")
    meta, names, c2w = _frames(train_file)
    n_train = len(names)
    if test_file.exists():
        _, test_names, test_c2w = _frames(test_file)
        names, c2w = names + test_names, np.concatenate([c2w, test_c2w])
    else:
        log.warning("%s does not exist: no test split", test_file, extra=ONCE)

    listed_in = lambda i, n=n_train: str(train_file if i < n else test_file)  # noqa: E731
    opened = open_images(names, shards, lambda kept: FolderSource([data_dir / n for n in kept], kept), listed_in,
                         check, skip_missing)
    source, names = opened.source, opened.names
    if opened.keep is not None:  # --skip_missing_images: the frames present, in their order
        n_train, c2w = int((opened.keep < n_train).sum()), c2w[opened.keep]
    # One size for every frame (one camera_angle_x describes them all): the images tell it, no camera does
    sizes = probe_images(source, range(len(names)) if check else [first_present(source, data_dir)])
    if len(set(sizes)) > 1:
        bad = next(i for i, s in enumerate(sizes) if s != sizes[0])
        raise DataError(f"{source.where(bad)}: image is {sizes[bad][0]}x{sizes[bad][1]}, the others {sizes[0][0]}x{sizes[0][1]} "
                        f"(one camera_angle_x describes all frames): resize the frames to one size, or bring the "
                        "capture as COLMAP or nerfstudio's transforms.json, whose cameras carry their own size")
    w, h = sizes[0]
    K = _intrinsics(train_file, meta, w, h)
    C = len(names)
    points, transform = np.zeros((0, 3), np.float32), np.eye(4)
    if normalize:
        try:
            c2w, points, transform = normalize_world(c2w, points)
        except DataError as e:  # degenerate cameras or points: name the file
            raise DataError(f"{train_file}: {e}") from None
    log.info("Blender %s: %d train + %d test frames, %dx%d, background %s", data_dir, n_train, C - n_train, w, h, background)
    return Scene(
        names=names, camtoworlds=c2w, Ks=np.tile(K, (C, 1, 1)), widths=np.full(C, w, np.int64),
        heights=np.full(C, h, np.int64), points=points, points_rgb=np.zeros((0, 3), np.uint8),
        train=np.arange(n_train, dtype=np.int64), test=np.arange(n_train, C, dtype=np.int64), images=source,
        background=None if background is None else tuple(int(v) for v in background), transform=transform, kind="blender",
    )


def write_blender(
    out_dir: Union[str, Path],
    camtoworlds: np.ndarray,  # [C, 4, 4] OpenCV axes
    fx: float,
    images: Sequence[np.ndarray],  # C x [H, W, 4] uint8 RGBA (or [H, W, 3])
    train: Sequence[int],
    test: Sequence[int],
) -> Path:
    """Writes a NeRF-synthetic layout: `train/r_i.png`, `test/r_i.png`, `transforms_*.json`."""
    out_dir = Path(out_dir)
    h, w = images[0].shape[:2]
    for split, idx in (("train", train), ("test", test)):
        (out_dir / split).mkdir(parents=True, exist_ok=True)
        frames: List[Dict] = []
        for j, i in enumerate(idx):
            Image.fromarray(images[i]).save(out_dir / split / f"r_{j}.png")
            frames.append({"file_path": f"./{split}/r_{j}", "transform_matrix": (camtoworlds[i] @ GL_TO_CV).tolist()})
        meta = {"camera_angle_x": 2 * math.atan(0.5 * w / fx), "frames": frames}
        (out_dir / f"transforms_{split}.json").write_text(json.dumps(meta, indent=1))
    return out_dir
