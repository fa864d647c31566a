"""Ranks for test_bad_input_catalog.py: the real CLI entry point (`distsplat.app.main`, what
examples/simple_trainer.py calls), run in one gloo group for many bad-input cases in turn.

A torchrun launch costs ~10 s of CPU (the launcher's and each rank's torch import), nearly
all of what a case refused at setup costs; here the ranks fork from the harness's
forkserver once and run every case, each rank seeing exactly the command line it would
under torchrun, with the rank variables torchrun sets (harness.py). What each rank wrote to
stderr, its exit code and the line it left for torchrun's summary (its
TORCHELASTIC_ERROR_FILE) come back per case, so the test checks the line the user sees and
that every rank ended alike."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import torch.distributed as dist


def run_cli_cases(ctx, cases: Sequence[Tuple[str, List[str], str]]) -> Dict[str, dict]:
    """cases: [(case id, CLI arguments, error file stem)]; returns {case id: {"code", "stderr",
    "seconds", "recorded"}} for this rank."""
    from distsplat import app, cli

    # The group is the harness's, shared by every case: the CLI must not end it after each
    # (init_distributed returns the existing group's layout). A rank that leaves an agreed error
    # to rank 0 sleeps so torchrun's launcher, which ends the job at the first exit, lets rank
    # 0 print first; there is no launcher here, only wall time to lose.
    cli.destroy = lambda _ctx: None
    cli.QUIET_EXIT_DELAY_S = 0.0
    log = logging.getLogger("distsplat")
    out = {}
    for case_id, args, err_stem in cases:
        dist.barrier()  # each case starts together, as a launch's ranks do
        for handler in list(log.handlers):  # setup_logging's handler writes to the stderr of its time: this case's
            log.removeHandler(handler)
        err_file = f"{err_stem}.rank{ctx.rank}.json"
        os.environ["TORCHELASTIC_ERROR_FILE"] = err_file
        err = io.StringIO()
        code = 0
        t0 = time.monotonic()
        with contextlib.redirect_stderr(err):
            try:
                app.main(list(args))
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        seconds = time.monotonic() - t0
        recorded = Path(err_file).read_text() if os.path.exists(err_file) else None
        out[case_id] = {"code": code, "stderr": err.getvalue(), "seconds": seconds, "recorded": recorded}
    os.environ.pop("TORCHELASTIC_ERROR_FILE", None)
    return out
