"""A full disk as real file systems deliver it (issue 36; distsplat/train/guards/disk_full.py):
the OSError torch's zip writer hides, a short write, the look at the free space before a
write. The writes here fail for real: into /dev/full (the kernel's ENOSPC, any Linux), a
tmpfs of 256 KiB (tests/small_fs.py, where the machine lets a test mount one), a child with
RLIMIT_FSIZE (EFBIG)."""

from __future__ import annotations

import errno
import json
import logging
import os
import resource
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from distsplat.distributed import DistContext
from distsplat.train.files import checkpoint as ck
from distsplat.train.guards import disk_full
from distsplat.train.guards.disk_full import CheckedWriter, NoRoom, check_room, disk_error, is_disk_full, margin
from distsplat.train.files.export import create_ply, write_ply_rows
from distsplat.train.files.save_guard import SaveGuard
from tests.small_fs import namespace_prefix, on_small_fs

CTX = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)
PAYLOAD = {"params": {"means": torch.zeros(100_000, 3)}, "optim": {}, "per_gaussian": {}}  # 1.2 MB


def test_the_disk_error_is_found_anywhere_in_the_chain():
    full = OSError(errno.ENOSPC, "No space left on device", "/x/rank_0000.pt")
    try:
        try:
            raise full
        except OSError as e:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598") from e
    except RuntimeError as wrapped:
        assert disk_error(wrapped) is full and is_disk_full(wrapped)
    try:
        try:
            raise RuntimeError("unexpected pos 704 vs 598")
        except RuntimeError:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")  # the file's close, after torch's error
    except OSError as closing:
        assert disk_error(closing).errno == errno.EDQUOT
    assert is_disk_full(OSError(errno.EFBIG, "File too large")) and is_disk_full(OSError(errno.EROFS, "ro"))
    assert not is_disk_full(OSError(errno.EIO, "io")) and not is_disk_full(RuntimeError("unexpected pos 1 vs 2"))


def test_torchs_hidden_error_counts_as_a_full_disk_only_where_the_room_is_missing(tmp_path):
    """torch.save given a path (no CheckedWriter) reports only its own RuntimeError: it is a
    full disk when the file system has less room than the save needs, not otherwise."""
    hidden = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    free = disk_full.free_bytes(tmp_path)
    assert free > 0
    assert disk_error(hidden, tmp_path / "f.pt", nbytes=10) is None  # room enough: a real failure
    found = disk_error(hidden, tmp_path / "f.pt", nbytes=free)
    assert found.errno == errno.ENOSPC and "unexpected pos 576 vs 534" in str(found)


@pytest.mark.skipif(not os.access("/dev/full", os.W_OK), reason="no writable /dev/full")
def test_write_shard_into_dev_full_raises_the_kernels_enospc(tmp_path):
    """/dev/full answers every write with ENOSPC, as a full disk does. torch's zip writer
    reports it in its own words (RuntimeError("unexpected pos ...") when a buffered file
    takes the write); write_shard raises the OSError, naming the shard."""
    with open("/dev/full", "wb", buffering=0) as f:  # unbuffered: the close writes nothing more
        w = CheckedWriter(f, "/dev/full")
        with pytest.raises(Exception):  # torch's zip writer's own words, whichever call failed
            torch.save(PAYLOAD, w)
    assert w.error.errno == errno.ENOSPC  # what the writer kept
    d = ck.tmp_dir(tmp_path, 3)
    d.mkdir(parents=True)
    (d / "rank_0000.pt").symlink_to("/dev/full")
    with pytest.raises(OSError) as info:
        ck.write_shard(tmp_path, 3, 0, PAYLOAD)
    assert info.value.errno == errno.ENOSPC and is_disk_full(info.value)
    assert info.value.filename == str(d / "rank_0000.pt")


class _Stingy:
    """A file whose writes take at most `take` bytes, and nothing after `total`."""

    def __init__(self, take, total):
        self.take, self.left, self.data = take, total, bytearray()

    def write(self, b):
        n = min(self.take, self.left, len(b))
        self.data += bytes(b[:n])
        self.left -= n
        return n

    def flush(self):
        pass


def test_short_writes_are_finished_and_no_progress_is_enospc(tmp_path, monkeypatch):
    f = _Stingy(take=7, total=10**6)
    assert CheckedWriter(f, tmp_path / "a").write(b"x" * 100) == 100 and bytes(f.data) == b"x" * 100
    w = CheckedWriter(_Stingy(take=7, total=30), tmp_path / "b")
    with pytest.raises(OSError, match=r"short write: 30 of 100 bytes written, then none") as info:
        w.write(b"y" * 100)
    assert info.value.errno == errno.ENOSPC and w.error is info.value
    # the PLY rows' pwrite loop: a write that takes nothing ends it (it looped forever before)
    ply = tmp_path / "p.ply"
    header = create_ply(ply, 4, 3)
    monkeypatch.setattr(os, "pwrite", lambda fd, data, off: 0)
    with pytest.raises(OSError, match="short write: 0 of") as info:
        write_ply_rows(ply, header, 0, np.zeros((4, 26), "<f4"))
    assert info.value.errno == errno.ENOSPC


def test_the_room_is_checked_before_writing(tmp_path, monkeypatch, caplog):
    free = disk_full.free_bytes(tmp_path)
    check_room(tmp_path / "f", free - margin(free) - 2 * 2**20)  # fits
    with pytest.raises(NoRoom, match=rf"{free} bytes free, {free + margin(free)} needed") as info:
        check_room(tmp_path / "f", free)
    assert info.value.errno == errno.ENOSPC and info.value.before_writing
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (10**6, hard))  # nothing is written while it holds
    try:
        with pytest.raises(NoRoom, match=r"files of at most 1000000 bytes \(ulimit -f\)") as info:
            check_room(tmp_path / "f", 10**6)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert info.value.errno == errno.EFBIG
    monkeypatch.setenv(disk_full.CHECK_ENV, "0")
    check_room(tmp_path / "f", free)  # turned off

    monkeypatch.delenv(disk_full.CHECK_ENV)
    guard, wrote = SaveGuard(CTX, torch.device("cpu"), tmp_path / "ckpts"), []
    with caplog.at_level(logging.WARNING):
        assert not guard.run("checkpoint of step 5", lambda r: tmp_path / "rank_0000.pt", free,
                             lambda: wrote.append(1))
    assert wrote == []  # skipped without a byte written
    assert (f"rank 0 could not write {tmp_path / 'rank_0000.pt'} (No space left on device [ENOSPC], found "
            f"before writing: {free} bytes + a margin of {margin(free)} do not fit)") in caplog.text


_IN_TMPFS = textwrap.dedent("""
    import errno, json, sys, torch
    from pathlib import Path
    from distsplat.train.files import checkpoint as ck
    from distsplat.train.guards.disk_full import disk_error, free_bytes
    from distsplat.train.files.save_guard import SaveGuard
    from distsplat.distributed import DistContext
    fs = Path(sys.argv[1])
    out = {"free": free_bytes(fs)}
    payload = {"params": {"means": torch.zeros(100_000, 3)}, "optim": {}, "per_gaussian": {}}  # 1.2 MB
    try:
        ck.write_shard(fs / "ckpts", 1, 0, payload)
    except Exception as e:
        out["write_shard"] = [type(e).__name__, getattr(e, "errno", None), str(e.__cause__)[:80]]
    try:  # torch.save given a path: only torch's error comes back
        torch.save(payload, str(fs / "by_path.pt"))
    except Exception as e:
        found = disk_error(e, fs / "by_path.pt", 1_200_000)
        out["by_path"] = [type(e).__name__, found.errno if found is not None else None]
    (fs / "by_path.pt").unlink(missing_ok=True)
    ctx = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)
    guard = SaveGuard(ctx, torch.device("cpu"), fs / "ckpts")
    out["guarded"] = guard.checkpoint(2, payload, lambda: ck.finalize(fs / "ckpts", 2, [100_000], {}))
    out["left"] = sorted(p.name for p in (fs / "ckpts").iterdir())
    print(json.dumps(out))
""")


def test_a_real_full_tmpfs(tmp_path):
    """A 256 KiB tmpfs and a 1.2 MB shard: the kernel's ENOSPC inside torch.save comes back
    as that OSError; torch.save given a path is recognised by the room; SaveGuard skips
    the save (before writing) and leaves no partial checkpoint."""
    prefix, why = namespace_prefix()
    if prefix is None:
        pytest.skip(why)
    fs = tmp_path / "fs"
    fs.mkdir()
    cmd = on_small_fs([sys.executable, "-c", _IN_TMPFS, str(fs)], fs, 256 * 1024, copy_to=tmp_path / "copy")
    (tmp_path / "copy").mkdir()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert 0 < out["free"] <= 256 * 1024
    name, code, cause = out["write_shard"]
    assert (name, code) == ("OSError", errno.ENOSPC) and cause != "None"  # chained to what torch.save raised
    assert out["by_path"] == ["RuntimeError", errno.ENOSPC]
    assert out["guarded"] is False and out["left"] == []  # begin cleared write_shard's leftovers, discard its own
    assert "checkpoint of step 2 not saved: rank 0 could not write" in p.stderr and "found before writing" in p.stderr
