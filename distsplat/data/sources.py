"""Image sources: where a camera's encoded image comes from. A `Scene` holds one; a rank's
image cache (cache.py) calls `read(i)` only for the cameras the rank owns.

- `FolderSource`: one file per image (COLMAP `images*/`, Blender `train/*.png`).
- `TarShardSource` (shards.py): tar shards + a JSON index, read by offset.
- `ArraySource`: in-memory [H, W, 3] uint8 images, e.g. a synthetic scene's renders, or a
  function that produces camera i's image on demand.
"""

from __future__ import annotations

import logging
import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .errors import DataError
from .names import NameList

log = logging.getLogger(__name__)

Encoded = Union[bytes, np.ndarray]


class ImageSource(ABC):
    """Encoded images by camera index. Implementations must be safe to call from several
    decode threads at once."""

    names: List[str]  # [C_all]

    def __len__(self) -> int:
        return len(self.names)

    @abstractmethod
    def read(self, index: int) -> Encoded:
        """Encoded bytes of camera `index` (or a [H, W, 3] uint8 array for in-memory sources)."""

    @abstractmethod
    def encoded_size(self, index: int) -> int:
        """Bytes `read(index)` returns; known without reading (file size, index length)."""

    @abstractmethod
    def peek(self, index: int, head: int) -> Tuple[bytes, bytes]:
        """(first `head` bytes, last 16 bytes) of the encoded image, for header checks."""

    def where(self, index: int) -> str:
        """What an error message names: a path, or a shard and offset."""
        return self.names[index]

    def has(self, index: int) -> bool:
        """Whether camera `index`'s image is stored here (a node holding only its own
        images, train/node_data.py, lacks the others); a cheap look, not a read."""
        return True

    def close(self) -> None:
        pass


class JoinedPaths(Sequence):
    """[C] `folder/names[i]` (or `folder/renamed[i]`), joined on access: a million path
    strings cost ~100 MB per rank (issue 20), the names are held anyway."""

    def __init__(self, folder: str, names: Sequence[str], renamed: Optional[Dict[int, str]] = None):
        self.folder, self.names, self.renamed = os.fspath(folder), names, dict(renamed or {})

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n, i = len(self.names), int(i)
        if not -n <= i < n:
            raise IndexError(i)
        i %= n
        return os.path.join(self.folder, (self.renamed.get(i) if self.renamed else None) or self.names[i])


def first_present(source: ImageSource, where: object, indices: Optional[Sequence[int]] = None) -> int:
    """The first of `indices` (default: every camera) whose image is stored here, for a
    loader that reads one image's size (a node holding only its own images); DataError
    naming `where` when there is none."""
    for i in range(len(source)) if indices is None else indices:
        if source.has(i):
            return int(i)
    raise DataError(f"{where}: none of these images is present here, so their stored size is unknown; "
                    "stage at least one of them on this node (scripts/stage_nodes.py) or give the right --data_dir")


SHOWN = 3  # absent images named in keep_present's warning
# A log record every rank emits alike: printed by rank 0 only (distributed.setup_logging's filter)
ONCE = {"same_on_every_rank": True}


Lister = Union[str, Callable[[int], str]]  # the file that lists the images, or camera index -> that file


def missing_message(source: ImageSource, missing: Sequence[int], model: Lister) -> str:
    """The error for images that `model` lists and the folder lacks: what to do about it."""
    listed_in = model(missing[0]) if callable(model) else model
    return (f"image file {source.where(missing[0])} is missing ({len(missing)} of {len(source)} images missing); "
            f"restore it, remove it from {listed_in}, or pass --skip_missing_images to train without the missing images")


def keep_present(source: "FolderSource", model: Lister, skip: bool,
                 why: str = "--skip_missing_images") -> Optional[np.ndarray]:
    """[C_kept] int64 indices of the cameras whose image file exists, or None when all do.
    Absent ones are a DataError (missing_message) unless `skip`: then one warning names
    how many and the first few, and the caller drops them (`why`: what made it skip).
    Every rank sees the same files, so every rank drops the same cameras. `model`: the
    file that lists the images (what the messages name), or a function of the camera index."""
    missing = source.missing()
    if not missing:
        return None
    if not skip:
        raise DataError(missing_message(source, missing, model))
    if callable(model):
        model = model(missing[0])
    if len(missing) == len(source):
        raise DataError(f"{model}: none of its {len(source)} images exists (the first: {source.where(0)}); "
                        "put the images where the file's paths point, or pass the right --data_dir")
    first = ", ".join(source.names[i] for i in missing[:SHOWN])
    first += f", +{len(missing) - SHOWN} more" if len(missing) > SHOWN else ""
    n = len(missing)
    log.warning("%s lists %d %s absent, training on the other %d (%s): %s", model, n,
                "images that are" if n > 1 else "image that is", len(source) - n, why, first, extra=ONCE)
    return np.setdiff1d(np.arange(len(source), dtype=np.int64), np.asarray(missing, dtype=np.int64))


LISTINGS = 64  # folder listings FolderSource.missing keeps at once


def _files_in(folder: str) -> frozenset:
    """Names of the files in `folder` (links followed; the directory entries' types, so no
    stat per regular file); empty when it cannot be listed."""
    try:
        with os.scandir(folder) as entries:
            return frozenset(e.name for e in entries if e.is_file())
    except OSError:
        return frozenset()


class FolderSource(ImageSource):
    """Images as files: `paths[i]` is camera i's file."""

    def __init__(self, paths: Sequence[Union[str, Path]], names: Optional[Sequence[str]] = None):
        # str, not Path: a million Path objects cost ~300 MB and seconds per rank to build;
        # JoinedPaths and NameList are kept as given (no per-camera objects)
        self.paths: Sequence[str] = paths if isinstance(paths, JoinedPaths) else [os.fspath(p) for p in paths]
        if names is None:
            self.names = [os.path.basename(p) for p in self.paths]
        else:
            self.names = names if isinstance(names, NameList) else list(names)
        # [C] file sizes peek saw (-1: not yet, or 2 GiB and more): the cache sizes its arena
        # from them without a second stat per image (4 bytes a camera, made on the first peek)
        self._sizes: Optional[np.ndarray] = None

    def missing(self, indices: Optional[Sequence[int]] = None) -> List[int]:
        """Indices (of `indices`, default every camera) whose image file is absent: one
        listing per folder, not a stat per image (a million images: seconds, not minutes, on a
        network file system); a name the listing lacks is looked up once more (case-insensitive
        file systems), and one that is no file (a folder, a dangling link) is absent."""
        listings: Dict[str, frozenset] = {}  # folder -> its files' names (the last LISTINGS folders)
        out = []
        for i in range(len(self.paths)) if indices is None else indices:
            folder, base = os.path.split(self.paths[i])
            files = listings.get(folder)
            if files is None:
                if len(listings) >= LISTINGS:  # names come sorted, folder by folder: a few at a time
                    listings.clear()
                files = listings[folder] = _files_in(folder or ".")
            if base not in files and not os.path.isfile(self.paths[i]):  # a stat only for the unlisted
                out.append(int(i))  # (a case-insensitive file system finds IMG.JPG as img.jpg)
        return out

    def check_exist(self, model: "Lister" = "the scene's model") -> None:
        """Every file present, else DataError naming the first missing (and how many) and
        `model`, the file that lists the images (e.g. `.../transforms.json`)."""
        missing = self.missing()
        if missing:
            raise DataError(missing_message(self, missing, model))

    def read(self, index: int) -> bytes:
        try:
            with open(self.paths[index], "rb") as f:
                return f.read()
        except OSError as e:
            raise DataError(f"{self.paths[index]}: cannot read image ({e.strerror})") from None

    def encoded_size(self, index: int) -> int:
        # What peek saw (the up-front check peeks at every image a rank reads), else a stat
        known = -1 if self._sizes is None else int(self._sizes[index])
        if known >= 0:
            return known
        try:
            return os.stat(self.paths[index]).st_size
        except OSError as e:
            raise DataError(f"{self.paths[index]}: cannot stat image ({e.strerror})") from None

    def peek(self, index: int, head: int) -> Tuple[bytes, bytes]:
        # Plain descriptors, no buffered file object: the up-front check peeks at every own
        # image (half a million per rank at a million images, W = 2)
        path = self.paths[index]
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                first = os.read(fd, head)
                size = os.fstat(fd).st_size
                tail = first[-16:] if size <= len(first) else os.pread(fd, 16, size - 16)
                if self._sizes is None:
                    self._sizes = np.full(len(self.paths), -1, dtype=np.int32)
                if size < 2**31:
                    self._sizes[index] = size
            finally:
                os.close(fd)
            return first, tail
        except OSError as e:
            raise DataError(f"{path}: cannot read image ({e.strerror})") from None

    def where(self, index: int) -> str:
        return self.paths[index]

    def has(self, index: int) -> bool:
        return os.path.isfile(self.paths[index])


class ArraySource(ImageSource):
    """In-memory images: a list of [H, W, 3] uint8 arrays, or `fn(i) -> array` called when
    camera i is read (the trainer renders a synthetic scene's ground truth this way)."""

    def __init__(self, names: Sequence[str], images: Union[Sequence[np.ndarray], Callable[[int], np.ndarray]],
                 shapes: Optional[Sequence[Tuple[int, int, int]]] = None):
        self.names = list(names)
        self._images = images
        if shapes is None:
            if callable(images):
                raise ValueError("ArraySource(fn) needs shapes [(H, W, 3)] so caches can size themselves without rendering")
            shapes = [tuple(a.shape) for a in images]
        self._shapes = [tuple(s) for s in shapes]

    def read(self, index: int) -> np.ndarray:
        img = self._images(index) if callable(self._images) else self._images[index]
        return np.asarray(img)

    def encoded_size(self, index: int) -> int:
        return int(np.prod(self._shapes[index]))

    def peek(self, index: int, head: int) -> Tuple[bytes, bytes]:
        return b"", b""

    def where(self, index: int) -> str:
        return f"in-memory image {self.names[index]!r}"
