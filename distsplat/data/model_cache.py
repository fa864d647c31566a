"""A compact binary copy of a COLMAP model's image table, written beside the model on first
use and read by every later start (issue 35: a million-image model takes each rank seconds
to parse, every start, every rank; the copy is a few flat arrays, mapped, not parsed).

`images.bin` (or `images.txt`) -> `images.distsplat` in the same folder:

    b"DSPLTIMG" | u32 header length | header (JSON) | padding to 64 | ids int64 [C] |
    qvecs float64 [C, 4] | tvecs float64 [C, 3] | camera ids int64 [C] | names S<width> [C]

The header records the source file's name, size and mtime (ns), the row count, the name
width and a BLAKE2b digest of the arrays. The copy is used only when all of them match:
a model re-exported, or touched, makes it stale, a cut or altered copy fails its digest,
and either is rebuilt from the source with one line saying why; the copy is never trusted
blindly. The arrays are validated when the source is parsed (colmap_io), before the copy is
written, so a copy whose digest matches holds validated values. Writes are atomic (a
temporary file renamed), so concurrent ranks or a crash never leave half a copy; a folder
that is not writable, or is marked read-only (no write bit, which root would ignore), just
means no copy (the source is parsed, as without one).

DISTSPLAT_MODEL_CACHE=0 turns the copy off (neither read nor written).
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
from pathlib import Path
from typing import Any, Callable, Optional, Tuple, Type

import numpy as np


log = logging.getLogger(__name__)

MAGIC = b"DSPLTIMG"
VERSION = 1
SUFFIX = ".distsplat"  # images.bin -> images.distsplat
ALIGN = 64
# A record the data layer emits alike on every rank (the same as sources.ONCE; not imported
# from there: this module sits below the sources)
_ONCE = {"same_on_every_rank": True}


def cache_path(source: Path) -> Path:
    return source.with_suffix(SUFFIX)


def enabled() -> bool:
    return os.environ.get("DISTSPLAT_MODEL_CACHE", "1") != "0"


def read_table(source: Path, parse: Callable[[Path], Any], table_type: Type) -> Any:
    """The image table of `source` (a COLMAP images.bin/.txt): from its binary copy when the
    copy is current and whole (a `table_type` of its arrays: colmap_io.ImageTable), else parsed
    by `parse` and the copy (re)written."""
    source = Path(source)
    if not enabled():
        return parse(source)
    path = cache_path(source)
    stat = source.stat()
    why = None
    if path.exists():
        table, why = _load(path, source.name, stat.st_size, stat.st_mtime_ns, table_type)
        if table is not None:
            log.debug("%s: image table from %s", source, path)
            return table
    table = parse(source)
    if why is not None:
        log.info("%s: %s; rebuilt it from %s", path, why, source.name, extra=_ONCE)
    _write(path, table, source.name, stat.st_size, stat.st_mtime_ns)
    return table


def _digest(arrays) -> str:
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        h.update(np.ascontiguousarray(a).reshape(-1).view(np.uint8))
    return h.hexdigest()


def _layout(count: int, width: int):
    """[(field, dtype, shape)] of the arrays, in file order."""
    return [("ids", np.int64, (count,)), ("qvecs", np.float64, (count, 4)), ("tvecs", np.float64, (count, 3)),
            ("camera_ids", np.int64, (count,)), ("names", np.dtype(f"S{width}"), (count,))]


def _write(path: Path, table: Any, name: str, size: int, mtime_ns: int) -> None:
    """Atomically writes the copy; a folder that cannot be written is no error (no copy)."""
    if table.names.dtype.kind != "S" or not len(table):  # names of wildly different lengths (an object
        return  # table), or no images (an error next): parse each time
    try:
        if not path.parent.stat().st_mode & 0o222:  # a folder marked read-only: kept so, even for root
            return
    except OSError:
        return
    width = table.names.dtype.itemsize
    arrays = [np.ascontiguousarray(getattr(table, f), dtype=d).reshape(s) for f, d, s in _layout(len(table), width)]
    header = json.dumps({"version": VERSION, "source": name, "source_size": size, "source_mtime_ns": mtime_ns,
                         "count": len(table), "name_width": width, "digest": _digest(arrays)}).encode()
    start = _data_start(len(header))
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC + len(header).to_bytes(4, "little") + header)
            f.write(b"\0" * (start - f.tell()))
            for a in arrays:
                f.write(a.reshape(-1).view(np.uint8))
        os.replace(tmp, path)
    except OSError as e:  # read-only data, a full disk: the next start parses again
        log.debug("%s: no binary copy of the image table (%s)", path, e)
        try:
            tmp.unlink()
        except OSError:
            pass


def _data_start(header_len: int) -> int:
    return -(-(len(MAGIC) + 4 + header_len) // ALIGN) * ALIGN


def _load(path: Path, name: str, size: int, mtime_ns: int, table_type: Type) -> Tuple[Optional[Any], Optional[str]]:
    """(table, None) from a current, whole copy; (None, why it is not used) otherwise."""
    try:
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:  # unreadable, or empty (mmap of 0 bytes)
        return None, f"cannot read the binary copy ({e})"
    buf = memoryview(mapped)
    try:
        if bytes(buf[:len(MAGIC)]) != MAGIC or len(buf) < len(MAGIC) + 4:
            return None, "not a binary copy of an image table (damaged)"
        n = int.from_bytes(buf[len(MAGIC):len(MAGIC) + 4], "little")
        try:
            head = json.loads(bytes(buf[len(MAGIC) + 4:len(MAGIC) + 4 + n]))
        except ValueError:
            return None, "its header does not parse (damaged)"
        if not isinstance(head, dict) or head.get("version") != VERSION:
            return None, "written by another version"
        if (head.get("source"), head.get("source_size"), head.get("source_mtime_ns")) != (name, size, mtime_ns):
            return None, f"stale ({name} changed since the copy was written)"
        count, width = head.get("count"), head.get("name_width")
        if not (isinstance(count, int) and isinstance(width, int) and count >= 0 and width >= 1):
            return None, "its header is damaged"
        layout = _layout(count, width)
        offset = _data_start(n)
        need = offset + sum(np.dtype(d).itemsize * int(np.prod(s)) for _, d, s in layout)
        if len(buf) != need:
            return None, f"{len(buf)} bytes where {need} were written (cut or damaged)"
        arrays = []
        for _, dtype, shape in layout:
            k = np.dtype(dtype).itemsize * int(np.prod(shape))
            # copies, not views of the mapping: the table outlives the map and is sorted,
            # indexed and freed by the loader as if parsed
            arrays.append(np.frombuffer(buf[offset:offset + k], dtype=dtype).reshape(shape).copy())
            offset += k
        if _digest(arrays) != head.get("digest"):
            return None, "its contents do not match its digest (damaged)"
        return table_type(*arrays), None
    finally:
        buf.release()
        mapped.close()
