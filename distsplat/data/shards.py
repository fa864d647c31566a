"""Tar shards with an index: a capture of millions of JPEGs stored as a few hundred tar
files, read by (shard, offset, length) with `os.pread`, never by scanning a tar.

`pack_shards` (behind `scripts/pack_shards.py`) writes the shards and `index.json`;
`TarShardSource` is the `ImageSource` a rank's cache reads its own cameras from. Open file
handles are held in a small LRU whose size is fixed by `max_open` (plus at most one per
concurrent reader), however large the batch.
"""

from __future__ import annotations

import json
import logging
import os
import tarfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

from .errors import DataError
from .sources import ImageSource

log = logging.getLogger(__name__)

INDEX_FORMAT = "distsplat-shards/1"


def pack_shards(folder: Union[str, Path], out: Union[str, Path], shard_size_mb: float = 256.0) -> Path:
    """Packs every file under `folder` (names: paths relative to it, '/'-separated, sorted)
    into `out/shard-NNNNN.tar` of at most `shard_size_mb` each (a single larger file gets a
    shard of its own) and writes `out/index.json`. Returns the index path."""
    folder, out = Path(folder), Path(out)
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    if not files:
        raise DataError(f"{folder}: no files to pack")
    out.mkdir(parents=True, exist_ok=True)
    limit = int(shard_size_mb * 1024 * 1024)
    groups: List[List[Path]] = [[]]
    size = 0
    for p in files:
        n = p.stat().st_size + 1024  # + header and padding, roughly
        if groups[-1] and size + n > limit:
            groups.append([])
            size = 0
        groups[-1].append(p)
        size += n
    shards, images = [], {}
    for s, group in enumerate(groups):
        shard = out / f"shard-{s:05d}.tar"
        with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tar:
            for p in group:
                tar.add(p, arcname=p.relative_to(folder).as_posix(), recursive=False)
        # Offsets come from reading the headers back once, at pack time, so the reader
        # never has to parse tar (PAX headers for long names shift the data).
        with tarfile.open(shard, "r") as tar:
            for m in tar.getmembers():
                images[m.name] = [s, m.offset_data, m.size]
        shards.append({"file": shard.name, "bytes": shard.stat().st_size})
    index = out / "index.json"
    index.write_text(json.dumps({"format": INDEX_FORMAT, "shards": shards, "images": images}))
    log.info("packed %d files from %s into %d shards in %s", len(images), folder, len(shards), out)
    return index


class _FdLRU:
    """Open shard file descriptors, least recently used closed first. A descriptor in use by
    a reader is never closed under it, so the count may exceed `max_open` by the number of
    concurrent readers (decode workers), never by the batch size."""

    def __init__(self, max_open: int):
        self.max_open = max(1, max_open)
        self._lock = threading.Lock()
        self._open: "OrderedDict[Path, List[int]]" = OrderedDict()  # path -> [fd, users]

    def acquire(self, path: Path) -> int:
        with self._lock:
            entry = self._open.get(path)
            if entry is None:
                entry = self._open[path] = [os.open(path, os.O_RDONLY), 0]
            self._open.move_to_end(path)
            entry[1] += 1
            self._evict()
            return entry[0]

    def release(self, path: Path) -> None:
        with self._lock:
            self._open[path][1] -= 1
            self._evict()

    def _evict(self) -> None:
        for path in list(self._open):
            if len(self._open) <= self.max_open:
                break
            fd, users = self._open[path]
            if users == 0:
                os.close(fd)
                del self._open[path]

    def num_open(self) -> int:
        return len(self._open)

    def close(self) -> None:
        with self._lock:
            for fd, _ in self._open.values():
                os.close(fd)
            self._open.clear()


class TarShardSource(ImageSource):
    """Reads images named `names` from shards described by `index.json`. The index is
    checked when the source is built (every name present, every (offset, length) inside its
    shard), so a bad index fails while loading, before any collective."""

    def __init__(self, index_path: Union[str, Path], names: Optional[Sequence[str]] = None, max_open: int = 8):
        self.index_path = Path(index_path)
        try:
            index = json.loads(self.index_path.read_text())
            shards = index["shards"]
            table: Dict[str, list] = index["images"]
        except FileNotFoundError:
            raise DataError(f"shard index {self.index_path} does not exist") from None
        except (ValueError, KeyError, TypeError) as e:
            raise DataError(f"{self.index_path}: malformed shard index ({type(e).__name__}: {e})") from None
        root = self.index_path.parent
        self.shard_paths = [root / s["file"] for s in shards]
        self.names = list(names) if names is not None else sorted(table)
        self._where: List[Tuple[int, int, int]] = []  # per camera: (shard, offset, length)
        shard_bytes: Dict[int, int] = {}
        for name in self.names:
            if name not in table:
                raise DataError(f"{self.index_path}: image {name!r} is not in the shard index ({len(table)} images indexed)")
            s, off, length = (int(v) for v in table[name])
            if not 0 <= s < len(self.shard_paths):
                raise DataError(f"{self.index_path}: image {name!r} names shard {s}, the index lists {len(self.shard_paths)}")
            if s not in shard_bytes:
                try:
                    shard_bytes[s] = os.stat(self.shard_paths[s]).st_size
                except OSError:
                    raise DataError(f"shard {self.shard_paths[s]} (listed in {self.index_path}) is missing") from None
            if off < 0 or length < 0 or off + length > shard_bytes[s]:
                raise DataError(f"{self.index_path}: image {name!r} at offset {off} length {length} points past the end of "
                                f"{self.shard_paths[s]} ({shard_bytes[s]} bytes); re-run scripts/pack_shards.py")
            self._where.append((s, off, length))
        self._fds = _FdLRU(max_open)

    def _pread(self, index: int, length: int, offset: int) -> bytes:
        s = self._where[index][0]
        path = self.shard_paths[s]
        fd = self._fds.acquire(path)
        try:
            data = os.pread(fd, length, offset)
        finally:
            self._fds.release(path)
        if len(data) != length:
            raise DataError(f"{path}: short read of {self.names[index]!r} ({len(data)} of {length} bytes at offset {offset})")
        return data

    def read(self, index: int) -> bytes:
        _, off, length = self._where[index]
        return self._pread(index, length, off)

    def encoded_size(self, index: int) -> int:
        return self._where[index][2]

    def shard_of(self, index: int) -> int:
        """Index into `shard_paths` of the shard holding camera `index`."""
        return self._where[index][0]

    def peek(self, index: int, head: int) -> Tuple[bytes, bytes]:
        _, off, length = self._where[index]
        first = self._pread(index, min(head, length), off)
        tail_len = min(16, length)
        return first, self._pread(index, tail_len, off + length - tail_len)

    def where(self, index: int) -> str:
        s, off, _ = self._where[index]
        return f"{self.names[index]} in {self.shard_paths[s]} at offset {off}"

    def __getstate__(self):  # descriptors and locks stay in their process
        state = self.__dict__.copy()
        state["_fds"] = self._fds.max_open
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._fds = _FdLRU(state["_fds"])

    def num_open_files(self) -> int:
        return self._fds.num_open()

    def close(self) -> None:
        self._fds.close()
