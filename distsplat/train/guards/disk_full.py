"""A full disk as a real file system produces it (issue 36), for the saves of files/save_guard.SaveGuard.

A file system out of room answers a write with ENOSPC (EDQUOT over a quota, EROFS when it
is read-only, EFBIG past the process's or the file system's largest file), but the error
rarely reaches the trainer as that OSError:
- torch.save's zip writer calls the file's `write`, drops the OSError it raises and
  reports `RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos A vs B`
  (with a path instead of a file: `basic_ios::clear: iostream error`); the file's close
  may then raise the OSError again, chained to the RuntimeError;
- a raw write may take fewer bytes than it was given (a short write) and 0 bytes once
  the disk is full, which a loop that retries never leaves.

So a save recognises all three (`disk_error`): an OSError of those errnos anywhere in the
exception chain; torch's writer failure when the file system has less room than the save
needs (the OSError torch dropped is kept by `CheckedWriter`, which the checkpoint writer
hands torch.save, so in practice it is in the chain); a write that made no progress
(`CheckedWriter`, export.write_ply_rows). And it looks before it writes (`check_room`):
statvfs's free bytes (and the process's file size limit) against the bytes about to be
written plus a margin of `margin(n)` = 64 KiB + n / 64 (torch's zip framing, a few hundred
bytes per tensor, the pickled structure and the file system's block rounding), so a disk
that is plainly too full is skipped without writing a byte. A file system whose statvfs
reports no blocks at all (some FUSE mounts) is not judged by it, and
$DISTSPLAT_CHECK_FREE_SPACE=0 turns the look off for one whose statvfs misleads otherwise
(the write itself stays guarded).
"""

from __future__ import annotations

import errno
import os
import re
import resource
from pathlib import Path
from typing import Optional

from .shared_dir import nearest_existing

DISK_ERRNOS = {errno.ENOSPC: "ENOSPC", errno.EDQUOT: "EDQUOT", errno.EROFS: "EROFS", errno.EFBIG: "EFBIG"}
MARGIN_BYTES = 64 * 1024  # plus 1/64 of the bytes: see margin()
CHECK_ENV = "DISTSPLAT_CHECK_FREE_SPACE"  # 0: no look at the free space before a write
# torch's zip writer's words for a write that failed under it (inline_container.cc)
_TORCH_WRITE_FAILURE = re.compile(r"unexpected pos \d+ vs \d+|iostream error|PytorchStreamWriter failed writing")


def margin(nbytes: int) -> int:
    """Bytes beyond `nbytes` a write of `nbytes` of tensors may take on disk."""
    return MARGIN_BYTES + nbytes // 64


class NoRoom(OSError):
    """Raised by check_room before anything is written (an OSError of DISK_ERRNOS)."""

    before_writing = True


def free_bytes(path: Path) -> int:
    """Bytes this process may still write on the file system of `path` (or of its nearest
    existing parent); -1 when statvfs fails. Root may use the blocks kept back for it."""
    try:
        st = os.statvfs(nearest_existing(path))
    except OSError:
        return -1
    if st.f_blocks == 0:  # a file system that does not say (some FUSE mounts): unknown
        return -1
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize


def check_room(path: Path, nbytes: int) -> None:
    """NoRoom (ENOSPC, or EFBIG past the process's file size limit) unless a write of
    `nbytes` plus margin(nbytes) fits at `path` now. Other writers may take the room
    meanwhile: the write itself is still guarded (disk_error). Nothing with
    $DISTSPLAT_CHECK_FREE_SPACE=0."""
    if os.environ.get(CHECK_ENV, "1") == "0":
        return
    need = nbytes + margin(nbytes)
    free = free_bytes(path)
    if 0 <= free < need:
        raise NoRoom(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: {free} bytes free, {need} needed "
                                   f"({nbytes} + a margin of {margin(nbytes)})", str(path))
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY and need > limit:
        raise NoRoom(errno.EFBIG, f"{os.strerror(errno.EFBIG)}: the process may write files of at most {limit} "
                                  f"bytes (ulimit -f), {need} needed", str(path))


def disk_error(error: BaseException, path: Optional[Path] = None, nbytes: int = 0) -> Optional[OSError]:
    """The OSError saying the disk is full, over quota, read-only or past a file size limit
    behind `error` (itself, or anywhere in its chain of causes and contexts), else None.
    With `path`: torch's zip writer failure without an OSError in the chain counts as
    ENOSPC when the file system at `path` has less room than nbytes + margin(nbytes)."""
    seen = set()
    e: Optional[BaseException] = error
    torch_failure = False
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in DISK_ERRNOS:
            return e
        torch_failure |= isinstance(e, RuntimeError) and bool(_TORCH_WRITE_FAILURE.search(str(e)))
        e = e.__cause__ or e.__context__
    if torch_failure and path is not None and 0 <= free_bytes(path) < nbytes + margin(nbytes):
        return OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (torch's writer failed: {error})", str(path))
    return None


def is_disk_full(error: BaseException) -> bool:
    """A write that failed for lack of room (full disk, quota, file size limit) or a read-only file system."""
    return disk_error(error) is not None


class CheckedWriter:
    """The file torch.save writes through: it keeps the first OSError a write raised (torch
    drops it for a RuntimeError), writes the rest of a short write, and turns a write that
    makes no progress into ENOSPC."""

    def __init__(self, f, path: Path):
        self.f, self.path = f, Path(path)
        self.error: Optional[OSError] = None

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        done = 0
        try:
            while done < len(view):
                n = self.f.write(view[done:])
                if not n:  # 0 (or None: nothing taken): the file system took nothing
                    raise OSError(errno.ENOSPC, f"short write: {done} of {len(view)} bytes written, then none",
                                  str(self.path))
                done += n
        except OSError as e:
            if self.error is None:
                self.error = e
            raise
        return done

    def flush(self) -> None:
        try:
            self.f.flush()
        except OSError as e:
            if self.error is None:
                self.error = e
            raise

    def reraise(self, error: BaseException) -> None:
        """Called with torch.save's exception: raises the file system's OSError, naming the
        file, in its place (chained to it) when a write failed, else re-raises it."""
        if self.error is not None:
            raise OSError(self.error.errno, self.error.strerror, str(self.path)) from error
        raise error
