"""A diverging step (issue 21): the real CLI under torchrun on 2 ranks with NaN injected
into ONE rank's gradients (tests/distributed/fault_trainer.py). Both ranks must skip the
same steps (no Adam update: Adam's own step count in the checkpoint says how many
updates happened), and --max_bad_steps in a row end the run with a clear message and a
loadable checkpoint of the last good state."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from distsplat.train.files import checkpoint as ck

from torchrun_cli import TINY_FLAGS, torchrun

FAULT_TRAINER = Path(__file__).resolve().parent / "fault_trainer.py"


def run(tmp_path, fault: str, steps: int, *extra: str):
    out = tmp_path / "run"
    args = ["default", "--max_steps", str(steps), "--save_steps", str(steps), "--eval_steps", str(steps),
            "--result_dir", str(out), *TINY_FLAGS, *extra]
    return out, torchrun(args, script=FAULT_TRAINER, timeout=150, extra_env={"DISTSPLAT_FAULT": fault})


def adam_updates_and_finite(ckpt: Path):
    """Per shard: Adam's step count of every parameter, and whether every value is finite."""
    meta = ck.read_meta(ckpt)
    out = []
    for i in range(meta["world_size"]):
        shard = ck.load_shard(meta, i)
        steps = {int(st["step"]) for st in shard["optim"].values()}
        finite = all(bool(v.isfinite().all()) for v in shard["params"].values())
        finite &= all(bool(st[k].isfinite().all()) for st in shard["optim"].values() for k in ("exp_avg", "exp_avg_sq"))
        out.append((steps, finite))
    return meta, out


@pytest.mark.slow
def test_nan_steps_on_one_rank_are_skipped_by_every_rank_and_training_goes_on(tmp_path):
    out, p = run(tmp_path, "nan:1:3-4", 8, "--max_bad_steps", "3")
    assert p.returncode == 0, p.stderr[-4000:]
    for s in (3, 4):
        assert re.search(rf"step {s} skipped: the loss or gradients are NaN/Inf on rank\(s\) \[1\]", p.stderr)
    assert "step 5 skipped" not in p.stderr and "step 2 skipped" not in p.stderr
    meta, shards = adam_updates_and_finite(out / "ckpts")
    assert meta["step"] == 8
    # 8 steps, 2 skipped: 6 Adam updates on BOTH ranks (rank 0's own gradients were finite)
    assert shards == [({6}, True), ({6}, True)], shards


@pytest.mark.slow
def test_max_bad_steps_in_a_row_stop_the_run_with_a_loadable_last_good_state(tmp_path):
    out, p = run(tmp_path, "nan:1:3-1000", 40, "--max_bad_steps", "4")
    assert p.returncode == 1, p.stderr[-4000:]
    ckpt = out / "ckpts" / "step_000007"
    line = (f"training diverged: 4 steps in a row (steps 3 to 6) had NaN/Inf loss or gradients (last on rank(s) 1), "
            f"--max_bad_steps 4; none of them changed the Gaussians. The last good state is saved: resume with "
            f"--ckpt {ckpt}. Lower the learning rates")
    assert line in p.stderr, p.stderr[-4000:]
    assert "train/trainer.py" not in p.stderr, p.stderr[-4000:]  # every rank agreed: a line, no traceback of ours
    meta, shards = adam_updates_and_finite(ckpt)
    assert shards == [({3}, True), ({3}, True)], shards  # steps 0, 1, 2: the last good state
    ck.read_rows(meta, 0, meta["num_gaussians"])  # every shard verifies
    # it resumes: 3 more steps on another W, with no fault
    p2 = torchrun(["default", "--max_steps", "10", "--save_steps", "10", "--eval_steps", "10",
                   "--result_dir", str(out), "--ckpt", str(ckpt), *TINY_FLAGS], nproc=1, timeout=120)
    assert p2.returncode == 0, p2.stderr[-3000:]
    _, shards = adam_updates_and_finite(out / "ckpts" / "step_000010")
    assert shards == [({6}, True)]
    assert not math.isnan(float(re.findall(r"PSNR ([\d.]+)", p2.stdout + p2.stderr)[-1]))
