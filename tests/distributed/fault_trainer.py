"""The trainer's CLI with one fault injected (tests only; run under torchrun like
examples/simple_trainer.py). DISTSPLAT_FAULT="kind:rank:step" with kind one of
  raise  an exception on `rank` in the middle of training step `step` (between the
         forward and the backward exchange: the peers wait in the backward all-to-all),
  kill   SIGKILL of `rank` at the same point,
  hang   `rank` stops making progress there (sleeps) while staying alive,
  setup  a ValueError at the end of `rank`'s setup (bad input only that rank can see),
  enospc      `rank`'s checkpoint shard of save step `step` fails half-written with
              OSError(ENOSPC) (a disk that fills up on one node),
  enospc_ply  `rank`'s PLY rows of save step `step` fail the same way,
  erofs       rank 0's `begin` of save step `step` fails with OSError(EROFS).
  free        `rank` deletes the file $DISTSPLAT_BALLAST as the save of step `step` begins
              (room given back on a really full disk, tests/small_fs.py; nothing is mocked).
  nan         `rank`'s gradient of the means is NaN at training steps `step` ("a-b": a range).
Several faults: comma-separated specs.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import distsplat.train.trainer as trainer_mod  # noqa: E402
from distsplat.app import main  # noqa: E402


def install(specs: str) -> None:
    for spec in specs.split(","):
        kind, rank, step = spec.split(":")
        if int(os.environ.get("RANK", "0")) != int(rank):
            continue
        if kind == "nan":
            first, _, last = step.partition("-")
            install_nan(range(int(first), int(last or first) + 1))
        elif kind == "free":
            install_free(int(step))
        else:
            (install_disk_fault if kind in DISK_FAULTS else install_one)(kind, int(rank), int(step))


def install_nan(steps) -> None:
    """NaN in this rank's means gradient at the given training steps (the other ranks' own
    gradients stay finite: only this rank can see that something is wrong)."""
    import torch

    train_step, activated = trainer_mod.Trainer.train_step, trainer_mod.activated
    now = {"step": None}

    def tracked_train_step(self, step):
        now["step"] = step
        try:
            return train_step(self, step)
        finally:
            now["step"] = None

    def nan_activated(params, sh):
        g = activated(params, sh)
        if now["step"] in steps:
            g = dict(g, means=g["means"] * 1.0)
            g["means"].register_hook(lambda grad: torch.full_like(grad, float("nan")))
        return g

    trainer_mod.Trainer.train_step = tracked_train_step
    trainer_mod.activated = nan_activated


def install_free(step: int) -> None:
    """Deletes $DISTSPLAT_BALLAST when the save of `step` begins (before its first
    collective: the other ranks' writes of that save come after)."""
    save = trainer_mod.Trainer.save

    def freeing_save(self, s, *args, **kwargs):
        if s == step:
            Path(os.environ["DISTSPLAT_BALLAST"]).unlink()
        return save(self, s, *args, **kwargs)

    trainer_mod.Trainer.save = freeing_save


DISK_FAULTS = ("enospc", "enospc_ply", "erofs")


def install_disk_fault(kind: str, rank: int, step: int) -> None:
    """Patches the writer of one save step on this rank to fail as a full (or read-only) disk does."""
    import distsplat.train.files.checkpoint as ck
    import distsplat.train.files.outputs as outputs

    code = errno.EROFS if kind == "erofs" else errno.ENOSPC

    def fail(path):
        raise OSError(code, os.strerror(code), str(path))

    if kind == "enospc":
        write_shard = ck.write_shard

        def full_write_shard(root, s, r, payload):
            if s != step:
                return write_shard(root, s, r, payload)
            path = ck.tmp_dir(root, s) / f"rank_{r:04d}.pt"
            path.write_bytes(b"\0" * 1000)  # half written, as a write that ran out of room
            fail(path)

        ck.write_shard = full_write_shard
    elif kind == "enospc_ply":
        write_rows = outputs.write_ply_rows

        def full_write_rows(path, header, start, rows):
            if Path(path).name != f"point_cloud_{step:04d}.ply.tmp":
                return write_rows(path, header, start, rows)
            fail(path)

        outputs.write_ply_rows = full_write_rows
    else:
        begin = ck.begin

        def read_only_begin(root, s):
            if s != step:
                return begin(root, s)
            fail(ck.tmp_dir(root, s))

        ck.begin = read_only_begin


def install_one(kind: str, rank: int, step: int) -> None:
    if kind == "setup":
        setup = trainer_mod.Trainer.setup

        def faulty_setup(self):
            setup(self)
            raise ValueError(f"injected bad input seen only by rank {rank}")

        trainer_mod.Trainer.setup = faulty_setup
        return
    loss_fn = trainer_mod.photometric_loss
    calls = {"n": 0}

    def faulty_loss(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == step + 1:  # training step `step` (counted from 0)
            if kind == "raise":
                raise RuntimeError(f"injected fault at step {step}")
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if kind == "hang":
                time.sleep(3600)
        return loss_fn(*args, **kwargs)

    trainer_mod.photometric_loss = faulty_loss


if __name__ == "__main__":
    install(os.environ["DISTSPLAT_FAULT"])
    main()
