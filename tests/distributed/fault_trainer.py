"""The trainer's CLI with one fault injected (tests only; run under torchrun like
examples/simple_trainer.py). DISTSPLAT_FAULT="kind:rank:step" with kind one of
  raise  an exception on `rank` in the middle of training step `step` (between the
         forward and the backward exchange: the peers wait in the backward all-to-all),
  kill   SIGKILL of `rank` at the same point,
  hang   `rank` stops making progress there (sleeps) while staying alive,
  setup  a ValueError at the end of `rank`'s setup (bad input only that rank can see).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import distsplat.train.trainer as trainer_mod  # noqa: E402
from distsplat.app import main  # noqa: E402


def install(spec: str) -> None:
    kind, rank, step = spec.split(":")
    rank, step = int(rank), int(step)
    if int(os.environ.get("RANK", "0")) != rank:
        return
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
