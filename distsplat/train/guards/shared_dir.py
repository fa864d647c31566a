"""Is --result_dir one folder for every node? Checked at setup, before training.

Every rank writes into the result dir (its checkpoint shard, its PLY rows, its stats) and
rank 0 reads what the others wrote (checkpoint meta, the merged PLY), so on several nodes
the dir must be on storage every node mounts (NFS, Lustre, ...). A node-local path (each
node's /tmp, or a relative path from different working directories) would train and then
leave every node with part of each checkpoint. `check_shared(ctx, result_dir)` finds out:

0. every rank resolves --result_dir against its working directory (`os.path.abspath`:
   symlinks are not followed, so one mount reached through differently named links is
   refused here rather than guessed at) and one gather compares them: ranks given
   different paths (a launch script that builds the path per node, a relative path from
   different working directories) stop here, naming every rank's path, before anything is
   written (issue 36: the marker below lands in the paths' common existing parent, where
   every node sees it, and the run used to crash at its first save);
1. rank 0 writes a marker file holding a random token into the nearest existing folder of
   the result dir (the dir itself when it exists: nothing is created before setup
   succeeds everywhere, and the marker is removed at the end of the check);
2. it broadcasts the token; every rank looks for the marker under ITS OWN resolution of
   --result_dir, waiting up to $DISTSPLAT_SHARED_DIR_WAIT_S (default 30 s: a network
   file system may cache "no such file" that long) only if it does not see it at once;
3. one gather of (saw it, node, folder) per rank; every rank raises the same ValueError
   naming the nodes that do not see the marker.

Costs two gathers (all-reduces of a small byte table) and one broadcast when the dir is
shared; nothing at W=1.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from pathlib import Path
from typing import Optional

import torch

from ...distributed import DistContext, broadcast
from ...distributed.nodes import gather_text, group_by_node, node_name

WAIT_ENV = "DISTSPLAT_SHARED_DIR_WAIT_S"
DEFAULT_WAIT_S = 30.0
MARKER_PREFIX = ".distsplat-shared-"
TOKEN_BYTES = 16
PATH_ROW_BYTES = 1024  # per rank: a digest of the path (compared), the node, the path (shown, cut past this)


def nearest_existing(result_dir: "str | Path") -> Path:
    """The path if it exists, else its nearest existing parent (absolute)."""
    path = Path(result_dir).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _sees(folder: Path, token: str, wait_s: float) -> bool:
    marker = folder / (MARKER_PREFIX + token)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.listdir(folder)  # a directory read revalidates a network file system's cached entries
            if marker.read_text() == token:
                return True
        except OSError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.25)


def check_shared(ctx: DistContext, result_dir: str, wait_s: Optional[float] = None) -> None:
    """ValueError, the same on every rank, unless every rank sees the same --result_dir
    (module docstring). Every rank calls it, after the flags are agreed and before setup."""
    if ctx.world_size == 1:
        return
    if wait_s is None:
        wait_s = float(os.environ.get(WAIT_ENV, DEFAULT_WAIT_S))
    shown = check_same_path(ctx, result_dir)  # before the marker: a refused run writes nothing
    folder = nearest_existing(result_dir)
    token, marker = "", None
    if ctx.is_main:
        token = secrets.token_hex(TOKEN_BYTES)
        marker = folder / (MARKER_PREFIX + token)
        try:
            tmp = marker.with_name(marker.name + ".tmp")
            tmp.write_text(token)
            os.replace(tmp, marker)  # others never read half a token
        except OSError:
            token = ""  # every rank learns it from the empty token below
    buf = torch.zeros(2 * TOKEN_BYTES, dtype=torch.uint8, device=ctx.device)  # [32] hex chars
    if token:
        buf[:] = torch.frombuffer(bytearray(token.encode()), dtype=torch.uint8).to(ctx.device)
    token = bytes(broadcast(buf, src=0).cpu().numpy()).rstrip(b"\0").decode()
    seen = bool(token) and (ctx.is_main or _sees(folder, token, wait_s))
    rows = gather_text(ctx, f"{int(seen)}|{node_name()}|{folder}")
    if marker is not None:
        marker.unlink(missing_ok=True)
    if not token:
        raise _agreed(f"--result_dir {shown}: rank 0 could not write a marker file into "
                      f"{rows[0].split('|', 2)[2]}; check the folder's permissions and free space")
    fields = [row.split("|", 2) for row in rows]
    blind = [r for r, f in enumerate(fields) if f[0] != "1"]
    if blind:
        names = [f[1] for f in fields]
        where = "; ".join(sorted({f"{names[r]} looked in {fields[r][2]}" for r in blind}))
        raise _agreed(
            f"--result_dir {shown} is not shared by every node: rank 0 on {names[0]} wrote a marker "
            f"into {fields[0][2]}, and {group_by_node(blind, names)} do not see it ({where}, waited "
            f"{wait_s:g} s). Every rank writes its checkpoint shard and PLY rows there and rank 0 reads "
            "them back: pass a --result_dir on a file system every node mounts at the same path "
            f"(NFS, Lustre, ...); if it is one that is slow to show new files, raise {WAIT_ENV}")


def check_same_path(ctx: DistContext, result_dir: str) -> str:
    """ValueError, the same on every rank, unless every rank resolves --result_dir to the
    same absolute path; the message lists each rank's path (grouped by node). Returns
    --result_dir as rank 0 typed it (what later messages name, the same on every rank)."""
    path = os.path.abspath(result_dir)
    digest = hashlib.sha256(path.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    rows = [row.split("\0", 3) for row in  # NUL: the one byte no path or host name holds
            gather_text(ctx, f"{digest}\0{node_name()}\0{result_dir}\0{path}", PATH_ROW_BYTES)]
    if len({row[0] for row in rows}) == 1:
        return rows[0][2] if len(rows[0]) > 2 else result_dir
    names = [row[1] for row in rows]
    groups: dict = {}  # (typed, resolved) -> ranks, in rank order
    for r, row in enumerate(rows):
        groups.setdefault((row[2], row[3] if len(row) > 3 else ""), []).append(r)
    where = "; ".join(f"{group_by_node(ranks, names)}: {resolved}" + (f" (typed {typed})" if typed != resolved else "")
                      for (typed, resolved), ranks in groups.items())
    raise _agreed(
        f"--result_dir is not the same folder on every rank: {where}. Every rank writes its checkpoint shard and "
        "PLY rows into the result dir and rank 0 reads them back: pass the same absolute --result_dir to every "
        "node, on a file system every node mounts at that path (NFS, Lustre, ...)")


def _agreed(message: str) -> ValueError:
    error = ValueError(message)
    error.agreed = True  # type: ignore[attr-defined]  # the same on every rank (cli.main)
    return error
