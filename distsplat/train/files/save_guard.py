"""The phases of a save, agreed so that a full disk on any rank skips the save on every rank
(guards/faults.py's module doc: a full disk while saving). Every write of a checkpoint, PLY
or cameras.json runs through `SaveGuard.run`: a look at the free space, the write, then one
all-reduce of W small rows in place of the barrier that separated the phases anyway."""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch
from torch import Tensor

from ...distributed import DistContext, all_reduce_sum
from ..guards.disk_full import DISK_ERRNOS, check_room, disk_error, free_bytes, margin
from ..guards.memory import fmt_bytes
from . import checkpoint as ck

log = logging.getLogger(__name__)

_META_BYTES = 64 * 1024  # meta.json: the config and a row per shard, a few KiB
_REASONS = {errno.EROFS: "the file system is read-only",
            errno.EFBIG: "the file would pass the largest this process or file system may write"}


def payload_bytes(obj: Any) -> int:
    """Bytes of the tensors in a (nested) payload: what torch.save needs, within its few KiB
    of framing."""
    if isinstance(obj, Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(payload_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(payload_bytes(v) for v in obj)
    return 0


class SaveGuard:
    """The phases of a save, run so that a full disk on any rank skips the save on all."""

    def __init__(self, ctx: DistContext, device: torch.device, ckpt_root: Path):
        self.ctx, self.device, self.ckpt_root = ctx, device, Path(ckpt_root)
        self.failed: List[str] = []  # "checkpoint of step 40", ... in order
        self.codes: set = set()  # the errnos of the failed saves (rank 0)

    def run(self, what: str, path_of: Callable[[int], Path], nbytes: int,
            write: Optional[Callable[[], Any]]) -> bool:
        """Runs `write` (None: this rank has no part in this phase), then agrees with every
        rank: True when no rank's write failed. Before writing, the free space at the
        file is checked against `nbytes` plus disk_full.margin (too little: the write is
        skipped as a full disk). A disk-full error is caught however it arrives
        (disk_full.disk_error; any other error propagates: a real failure, reported as
        such); rank 0 warns naming the failing rank's file (`path_of(rank)`), the bytes
        it needed and the bytes free."""
        W, r = self.ctx.world_size, self.ctx.rank
        row = torch.zeros(W, 4, dtype=torch.int64, device=self.device)  # [W, (errno, needed, free, before writing)]
        if write is not None:
            path = path_of(r)
            try:
                if nbytes > 0:
                    check_room(path, nbytes)
                write()
            except Exception as e:  # noqa: BLE001 - only a full disk is caught; the rest re-raised
                found = disk_error(e, path, nbytes)
                if found is None:
                    raise
                row[r] = torch.tensor([found.errno, nbytes, free_bytes(path), int(getattr(found, "before_writing", 0))])
        rows = all_reduce_sum(row).tolist()  # every rank: the same rows, the same decision
        bad = [(q, *v) for q, v in enumerate(rows) if v[0]]
        if not bad:
            return True
        if self.ctx.is_main:
            if not self.failed or self.failed[-1] != what:
                self.failed.append(what)
            for q, code, needed, free, before in bad:
                self.codes.add(code)
                reason = _REASONS.get(code, f"{os.strerror(code)} [{DISK_ERRNOS.get(code, code)}]")
                if before:
                    reason += f", found before writing: {needed} bytes + a margin of {margin(needed)} do not fit"
                room = f"; {fmt_bytes(free)} free there" if free >= 0 else ""
                log.warning("%s not saved: rank %d could not write %s (%s): it needs about %s (%d bytes)%s. "
                            "Training goes on and the next save step tries again; %s", what, q, path_of(q),
                            reason, fmt_bytes(needed), needed, room, last_complete(self.ckpt_root))
        return False

    def checkpoint(self, step: int, payload: Dict[str, Any], finalize: Callable[[], Any]) -> bool:
        """checkpoint.py's sequence, each phase agreed: begin (rank 0), every rank's shard,
        `finalize` (rank 0: meta.json and the rename). False (and the partial .tmp
        removed) when any rank's write failed for a full disk."""
        root, main = self.ckpt_root, self.ctx.is_main
        what, tmp = f"checkpoint of step {step}", ck.tmp_dir(self.ckpt_root, step)
        ok = (self.run(what, lambda r: tmp, 0, (lambda: ck.begin(root, step)) if main else None)
              and self.run(what, lambda r: tmp / f"rank_{r:04d}.pt", payload_bytes(payload),
                           lambda: ck.write_shard(root, step, self.ctx.rank, payload))
              and self.run(what, lambda r: tmp / ck.META, _META_BYTES, finalize if main else None))
        if not ok:
            self.discard(tmp)
        return ok

    def discard(self, path: Path) -> None:
        """Rank 0, after a failed save: removes its partial files (every rank has stopped
        writing: the agreement came first), giving their room back to the run."""
        if self.ctx.is_main:
            if Path(path).is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                Path(path).unlink(missing_ok=True)

    def report_end(self, metrics: Dict[str, Any]) -> None:
        """At the end of a run: rank 0 warns which saves failed; metrics["failed_saves"]."""
        metrics["failed_saves"] = list(self.failed)
        if self.failed and self.ctx.is_main:
            why = "full or read-only" if errno.EFBIG not in self.codes else "full or read-only, or a file too large"
            log.warning("%d save(s) failed because the disk was %s: %s; %s", len(self.failed), why,
                        ", ".join(self.failed), last_complete(self.ckpt_root))


def last_complete(ckpt_root: Path) -> str:
    """Where a run can go on from, in words: the newest complete checkpoint under `ckpt_root`."""
    done = ck.complete_checkpoints(ckpt_root)
    return f"the last complete checkpoint is {done[-1]}" if done else "no checkpoint is complete yet"
