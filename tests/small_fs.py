"""A real, size-limited file system for the disk-full tests (issue 36): a tmpfs mounted
in a mount namespace of its own, so that a write past its size fails with the kernel's
ENOSPC, exactly as a full disk answers, and the mount goes away with the command (nothing
to clean up on the machine, even after a kill).

Root (CAP_SYS_ADMIN) mounts it in `unshare --mount`; another user in `unshare --user
--map-root-user --mount` where the kernel allows unprivileged user namespaces. Where
neither works (`namespace_prefix` says why), the tests that need it skip; the portable
checks are a write into /dev/full (ENOSPC from the kernel, any Linux) and a child with
RLIMIT_FSIZE (EFBIG).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

PAGE = 4096  # tmpfs counts its size in pages

# mount the tmpfs at $2 (size $1 bytes), fill $3 bytes of it with $2/ballast, run the rest;
# then copy what the run left on the tmpfs to $4 (it vanishes with the namespace)
_SCRIPT = ('mount -t tmpfs -o size="$1" tmpfs "$2" || exit 97; '
           'if [ "$3" -gt 0 ]; then head -c "$3" /dev/zero > "$2/ballast" || exit 98; fi; '
           'fs="$2"; copy="$4"; shift 4; "$@"; rc=$?; cp -a "$fs"/. "$copy"/; exit $rc')


@functools.lru_cache(maxsize=None)
def namespace_prefix() -> Tuple[Optional[Tuple[str, ...]], str]:
    """(the unshare command under which a tmpfs can be mounted, "") or (None, why not)."""
    if shutil.which("unshare") is None:
        return None, "unshare(1) is not installed"
    tries = []
    if os.geteuid() == 0:
        tries.append(("unshare", "--mount", "--propagation", "private"))
    tries.append(("unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"))
    why = ""
    with tempfile.TemporaryDirectory() as d:
        for prefix in tries:
            p = subprocess.run([*prefix, "mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", d],
                               capture_output=True, text=True)
            if p.returncode == 0:
                return prefix, ""
            why = f"{' '.join(prefix)} mount -t tmpfs failed: {(p.stderr or p.stdout).strip()[:200]}"
    return None, f"this machine does not let the tests mount a tmpfs ({why})"


def on_small_fs(cmd: Sequence[str], mountpoint: Path, size: int, ballast: int = 0,
                copy_to: Optional[Path] = None) -> List[str]:
    """`cmd` run with a tmpfs of `size` bytes mounted at `mountpoint` (an existing empty
    folder), `ballast` bytes of it taken by mountpoint/ballast first; what is on the tmpfs
    at the end is copied to `copy_to`. Only where namespace_prefix() has a prefix."""
    prefix, why = namespace_prefix()
    if prefix is None:
        raise RuntimeError(why)
    copy = copy_to if copy_to is not None else Path(tempfile.mkdtemp(prefix="small_fs_copy_"))
    return [*prefix, "sh", "-c", _SCRIPT, "sh", str(size), str(mountpoint), str(ballast), str(copy), *cmd]
