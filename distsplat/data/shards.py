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
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple, Union

import numpy as np

from .errors import DataError, Where
from .heap import TRIM_FROM, trim_heap
from .names import NameList, encoded, fixed_width, utf8_ok
from .sources import ImageSource

log = logging.getLogger(__name__)

INDEX_FORMAT = "distsplat-shards/2"
# Format 1 (still read): every image in index.json as {"name": [shard, offset, length]}. At a
# million images that is a 45 MB JSON whose parse costs each rank seconds and ~300 MB of
# Python objects; format 2 keeps the names (sorted, one a line) and a [C, 3] int64 table
# beside a small index.json, loaded as arrays.
NAMES_FILE, TABLE_FILE = "index-names.txt", "index-table.npy"
ABSENT = -1  # shard of an image the index lacks (TarShardSource(missing_ok=True))


def _list_files(folder: Path) -> List[str]:
    """Every file under `folder` as a '/'-separated path relative to it, sorted. os.walk
    (scandir's file types) instead of rglob + is_file: no stat and no Path per file."""
    out = []
    for dirpath, _dirs, files in os.walk(folder):
        rel = os.path.relpath(dirpath, folder)
        prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        out.extend(prefix + f for f in files)
    out.sort()
    return out


def _header(name: str, size: int, mtime: int) -> bytes:
    """The tar header block(s) of a regular file, as tarfile writes them: a ustar block
    built here for short ASCII names (tarfile's TarInfo.tobuf costs more than the file's
    read and write at 64x48 JPEGs), tarfile's PAX headers for anything else."""
    raw = name.encode("ascii", "replace")
    if len(raw) > 100 or not name.isascii():
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = size, mtime, 0o644
        return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    block = bytearray(_USTAR)
    block[0:len(raw)] = raw
    block[124:136] = b"%011o\0" % size
    block[136:148] = b"%011o\0" % mtime
    block[148:156] = b"%06o\0 " % sum(block)  # checksum over the block with its field as spaces
    return bytes(block)


def _ustar_template() -> bytes:
    b = bytearray(tarfile.BLOCKSIZE)
    b[100:108] = b"0000644\0"  # mode
    b[108:116] = b"0000000\0"  # uid
    b[116:124] = b"0000000\0"  # gid
    b[148:156] = b" " * 8  # checksum field counts as spaces
    b[156:157] = tarfile.REGTYPE
    b[257:265] = tarfile.POSIX_MAGIC  # b"ustar\x0000"
    return bytes(b)


_USTAR = _ustar_template()


def _end_tar(fh, pos: int) -> None:
    """Two zero blocks, then zeros to a whole record, as tarfile closes an archive."""
    end = pos + 2 * tarfile.BLOCKSIZE
    fh.write(b"\0" * (2 * tarfile.BLOCKSIZE + (-end % tarfile.RECORDSIZE)))
    fh.close()


def pack_shards(folder: Union[str, Path], out: Union[str, Path], shard_size_mb: float = 256.0) -> Path:
    """Packs every file under `folder` (names: paths relative to it, '/'-separated, sorted)
    into `out/shard-NNNNN.tar` of at most `shard_size_mb` each (a single larger file gets a
    shard of its own) and writes `out/index.json` (+ its names and table files). Returns the
    index path."""
    folder = Path(folder)
    names = _list_files(folder)
    if not names:
        raise DataError(f"{folder}: no files to pack")

    def read(i: int) -> bytes:
        with open(folder / names[i], "rb") as fh:
            return fh.read()

    index = write_shards(names, read, out, shard_size_mb)
    log.info("packed %d files from %s into %s", len(names), folder, out)
    return index


def write_shards(names: Sequence[str], read: Callable[[int], bytes], out: Union[str, Path],
                 shard_size_mb: float = 256.0) -> Path:
    """Writes images `names` (sorted), image i's bytes given by `read(i)`, as shards and an
    index in `out` (pack_shards; scripts/stage_nodes.py re-packs one node's images with it)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    limit = int(shard_size_mb * 1024 * 1024)
    table = np.zeros((len(names), 3), dtype=np.int64)  # [C, 3] (shard, data offset, length)
    shards: List[dict] = []
    tar = None
    pos = 0  # bytes written to the current shard
    mtime = int(time.time())
    try:
        for i, name in enumerate(names):
            data = read(i)
            if tar is None or (pos > 0 and pos + len(data) + 1024 > limit):
                if tar is not None:
                    _end_tar(tar, pos)
                    shards.append({"file": f"shard-{len(shards):05d}.tar"})
                tar, pos = open(out / f"shard-{len(shards):05d}.tar", "wb"), 0
            header = _header(name, len(data), mtime)
            pad = -len(data) % tarfile.BLOCKSIZE
            tar.write(header + data + b"\0" * pad)
            table[i] = (len(shards), pos + len(header), len(data))
            pos += len(header) + len(data) + pad
    finally:
        if tar is not None:
            _end_tar(tar, pos)
    shards.append({"file": f"shard-{len(shards):05d}.tar"})
    for sh in shards:
        sh["bytes"] = (out / sh["file"]).stat().st_size
    (out / NAMES_FILE).write_text("\n".join(names) + "\n", encoding="utf-8")
    np.save(out / TABLE_FILE, table)
    index = out / "index.json"
    index.write_text(json.dumps({"format": INDEX_FORMAT, "shards": shards, "count": len(names),
                                 "names": NAMES_FILE, "table": TABLE_FILE}))
    return index


def _read_index(index_path: Path) -> Tuple[List[Path], np.ndarray, np.ndarray, np.ndarray]:
    """(shard paths [S], their sizes as listed [S] int64, names [C] bytes sorted, table [C, 3]
    int64) of either index format. A damaged or hand-edited index raises DataError, never
    another exception, and allocates no more than its files justify."""
    root = index_path.parent
    try:
        index = json.loads(index_path.read_text())
        shards = index["shards"]
        if not isinstance(shards, list) or not all(isinstance(s, dict) and isinstance(s.get("file"), str)
                                                   for s in shards):
            raise TypeError("'shards' must be a list of {\"file\": name, \"bytes\": size}")
        paths = [root / s["file"] for s in shards]
        no_size = np.iinfo(np.int64).max  # format 1 lists no sizes: the files are checked instead
        sizes = np.array([int(s.get("bytes", no_size)) for s in shards], dtype=np.int64)  # [S]
        if index.get("format") == INDEX_FORMAT:
            blob = np.fromfile(root / str(index["names"]), dtype=np.uint8)  # [bytes] one name a line
            ends = np.flatnonzero(blob == 10)  # [C] newline after each name
            starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64) if len(ends) else ends.astype(np.int64)
            # Names are stored fixed-width (the longest), gathered without a bytes object per
            # name: refuse a file whose one long name would make that table far larger than the
            # file (real captures' names have similar lengths).
            names = fixed_width(blob, starts, ends - starts)
            if names is None:
                raise ValueError("one image name is far longer than the others")
            if len(blob) and blob[-1] != 10:
                raise ValueError(f"{index['names']} does not end with a newline")
            table = np.load(root / str(index["table"]), mmap_mode="r", allow_pickle=False)  # no read past the file
        else:  # format 1: the whole table in the JSON
            items = sorted(index["images"].items())
            names = np.array([k.encode("utf-8") for k, _ in items], dtype=bytes)  # [C] fixed-width bytes
            table = np.array([v for _, v in items], dtype=np.int64).reshape(-1, 3)
    except FileNotFoundError as e:
        raise DataError(f"shard index {index_path} (or its {Path(e.filename).name}) does not exist") from None
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError, UnicodeError,
            OSError) as e:  # RecursionError: JSON nested past Python's limit
        raise DataError(f"{index_path}: malformed shard index ({type(e).__name__}: {e}); "
                        "re-run scripts/pack_shards.py") from None
    if (table.shape != (len(names), 3) or table.dtype.kind not in "iu"
            or (len(names) > 1 and not (names[1:] > names[:-1]).all())):
        raise DataError(f"{index_path}: malformed shard index (names unsorted or table not [{len(names)}, 3] "
                        "integers); re-run scripts/pack_shards.py")
    return paths, sizes, names, table


def _narrow(values: np.ndarray) -> np.ndarray:
    """`values` (>= 0, checked before) as uint32 when they fit, else int64."""
    if not len(values) or (values.min() >= 0 and values.max() <= np.iinfo(np.uint32).max):
        return values.astype(np.uint32)
    return values.astype(np.int64)


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

    def __init__(self, index_path: Union[str, Path], names: Optional[Sequence[str]] = None, max_open: int = 8,
                 check_shards: bool = True, missing_ok: bool = False):
        self.index_path = Path(index_path)
        self.shard_paths, sizes, indexed, table = _read_index(self.index_path)
        if names is None:
            if not utf8_ok(indexed):  # validated at once, kept as bytes
                raise DataError(f"{self.index_path}: an image name is not UTF-8; re-run scripts/pack_shards.py")
            self.names = NameList(indexed) if len(indexed) else []
            rows = np.arange(len(indexed))
        else:
            # A NameList (load_colmap's) is kept as is: no list of C str per rank
            self.names = names if isinstance(names, NameList) else list(names)
            # Vectorized lookup of every name in the sorted index (no dict of C entries).
            wanted = encoded(self.names)  # [C]
            rows = np.minimum(np.searchsorted(indexed, wanted), max(len(indexed) - 1, 0))
            absent = np.flatnonzero(indexed[rows] != wanted) if len(indexed) else np.arange(len(wanted))
            if len(absent) and not missing_ok:
                raise DataError(f"{self.index_path}: image {self.names[absent[0]]!r} is not in the shard index "
                                f"({len(indexed)} images indexed); re-pack the images of the scene's model "
                                "(scripts/pack_shards.py)")
        where = np.asarray(table[rows], dtype=np.int64) if len(indexed) else np.zeros((len(rows), 3), np.int64)  # [C, 3]
        present = np.ones(len(where), dtype=bool)  # [C]
        if names is not None:
            # missing_ok (shards staged per node, train/node_data.py): other nodes' images are
            # absent here; shard -1 marks them (after the table's own values are checked), and
            # reading one raises DataError naming it.
            present[absent] = False
        if present.any() and not (0 <= where[present, 0].min() and where[present, 0].max() < len(self.shard_paths)):
            i = int(np.flatnonzero(present & ((where[:, 0] < 0) | (where[:, 0] >= len(self.shard_paths))))[0])
            raise DataError(f"{self.index_path}: image {self.names[i]!r} names shard {where[i, 0]}, the index "
                            f"lists {len(self.shard_paths)}")
        where[~present] = (ABSENT, 0, 0)
        # The narrowest integer types that hold the values (10 bytes per camera, not 24, at a
        # million images); arithmetic on them is done in int64 (_wide).
        self._shard = where[:, 0].astype(np.int16 if len(self.shard_paths) <= np.iinfo(np.int16).max else np.int32)  # [C]
        self._offset = _narrow(where[:, 1])  # [C]
        self._length = _narrow(where[:, 2])  # [C]
        # Every (offset, length) inside its shard's size as listed in the index, then each
        # shard file against it; check_shards=False leaves the files to the caller (a node
        # that holds only the shards of its own images: train/node_data.py).
        # length > size - offset, not offset + length > size: the sum of two huge values wraps
        offset, length = where[:, 1], where[:, 2]  # [C] int64
        room = np.zeros(len(where), dtype=np.int64)  # [C] bytes of its shard (0 for an absent image)
        room[present] = sizes[self._shard[present]]
        bad = np.flatnonzero((offset < 0) | (length < 0) | (length > room - np.maximum(offset, 0)))
        if len(bad):
            i, s = bad[0], self._shard[bad[0]]
            raise DataError(f"{self.index_path}: image {self.names[i]!r} at offset {offset[i]} length "
                            f"{length[i]} points past the end of {self.shard_paths[s]} ({sizes[s]} bytes); "
                            "re-run scripts/pack_shards.py")
        del where, offset, length
        if check_shards:  # a few hundred stats at most (256 MB shards), whatever C is
            for s in np.unique(self._shard).tolist():
                if s != ABSENT:
                    self._check_shard(s)
        self._fds = _FdLRU(max_open)
        if len(self.names) >= TRIM_FROM:
            trim_heap()  # the index's [C] temporaries (~85 MB resident at a million images without it)

    def _check_shard(self, s: int) -> None:
        """DataError unless shard s exists with the size the index lists."""
        path = self.shard_paths[s]
        try:
            size = os.stat(path).st_size
        except OSError:
            raise DataError(f"shard {path} (listed in {self.index_path}) is missing") from None
        mine = self._shard == s
        end = int((self._offset[mine].astype(np.int64) + self._length[mine]).max()) if mine.any() else 0
        if end > size:
            raise DataError(f"{self.index_path}: images of {path} point past its end ({size} bytes); "
                            "re-run scripts/pack_shards.py")

    def _pread(self, index: int, length: int, offset: int) -> bytes:
        path = self.shard_paths[self._shard[index]]
        fd = self._fds.acquire(path)
        try:
            data = os.pread(fd, length, offset)
        finally:
            self._fds.release(path)
        if len(data) != length:
            raise DataError(f"{path}: short read of {self.names[index]!r} ({len(data)} of {length} bytes at offset {offset})")
        return data

    def _present(self, index: int) -> None:
        if self._shard[index] == ABSENT:
            raise DataError(f"image {self.names[index]!r} is not in the shard index {self.index_path} (shards staged "
                            "for another node?); stage this node's images with scripts/stage_nodes.py")

    def read(self, index: int) -> bytes:
        self._present(index)
        return self._pread(index, int(self._length[index]), int(self._offset[index]))

    def has(self, index: int) -> bool:
        s = int(self._shard[index])
        return s != ABSENT and os.path.isfile(self.shard_paths[s])

    def absent(self, indices: Sequence[int]) -> List[int]:
        """Those of `indices` whose images are not in the index (missing_ok sources only)."""
        idx = np.asarray(indices, dtype=np.int64)
        return idx[self._shard[idx] == ABSENT].tolist()

    def encoded_size(self, index: int) -> int:
        return int(self._length[index])

    def shard_of(self, index: int) -> int:
        """Index into `shard_paths` of the shard holding camera `index` (-1: not in the index)."""
        return int(self._shard[index])

    def peek(self, index: int, head: int) -> Tuple[bytes, bytes]:
        self._present(index)
        off, length = int(self._offset[index]), int(self._length[index])
        first = self._pread(index, min(head, length), off)
        tail_len = min(16, length)
        return first, self._pread(index, tail_len, off + length - tail_len)

    def where(self, index: int) -> str:
        if self._shard[index] == ABSENT:
            return f"{self.names[index]} (not in {self.index_path})"
        # A damaged image inside a shard is repaired by packing the shards again from intact images
        return Where(f"{self.names[index]} in {self.shard_paths[self._shard[index]]} at offset {self._offset[index]}",
                     "pack the shards again from intact images (python scripts/pack_shards.py FOLDER OUT, or "
                     "scripts/stage_nodes.py --shards ... --copy-to for a node's own)")

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
