"""A full disk while saving (issue 21): the real CLI under torchrun on 2 ranks, with the
write of one save failing on ONE rank (tests/distributed/fault_trainer.py patches the
writer to raise OSError(ENOSPC) / EROFS). The run must finish, skip that save on both
ranks, keep the last complete checkpoint loadable, warn naming the file and the bytes,
and list the failed saves at the end."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from distsplat.train import checkpoint as ck
from distsplat.viewer.model import read_ply_header

from torchrun_cli import TINY_FLAGS, torchrun

FAULT_TRAINER = Path(__file__).resolve().parent / "fault_trainer.py"


def run(tmp_path, fault: str, steps=(2, 4, 6), keep: int = 3):
    out = tmp_path / "run"
    args = ["default", "--max_steps", str(steps[-1]), "--save_steps", *map(str, steps),
            "--eval_steps", str(steps[-1]), "--keep_ckpts", str(keep), "--result_dir", str(out), *TINY_FLAGS]
    p = torchrun(args, script=FAULT_TRAINER, timeout=150, extra_env={"DISTSPLAT_FAULT": fault})
    return out, p


def complete_steps(root: Path):
    return [ck._step_of(p) for p in ck.complete_checkpoints(root)]


def check_loads(root: Path, step: int) -> None:
    meta = ck.read_meta(ck.step_dir(root, step))
    rows = ck.read_rows(meta, 0, meta["num_gaussians"])  # every shard verifies
    assert meta["step"] == step and len(rows["params"]["means"]) == meta["num_gaussians"]


@pytest.mark.slow
def test_a_full_disk_on_one_rank_skips_that_save_on_both_and_training_goes_on(tmp_path):
    # rank 1's shard of step 4 and rank 0's PLY rows of step 6 (the last save) fail.
    out, p = run(tmp_path, "enospc:1:4,enospc_ply:0:6")
    assert p.returncode == 0, p.stderr[-4000:]
    root = out / "ckpts"
    assert complete_steps(root) == [2, 6], "step 4 must not be finalized with a shard missing"
    for s in (2, 6):
        check_loads(root, s)
    assert not list(root.glob("*.tmp")), "the partial checkpoint is removed"
    shard = root / "step_000004.tmp" / "rank_0001.pt"
    want = re.compile(rf"checkpoint of step 4 not saved: rank 1 could not write {re.escape(str(shard))} "
                      r"\(No space left on device \[ENOSPC\]\): it needs about [\d.]+ MiB \((\d+) bytes\)")
    m = want.search(p.stderr)
    assert m, p.stderr[-4000:]
    # the bytes named: the shard's tensors (the 400 Gaussians' rows are split ~200 per rank)
    assert 200 * (3 + 3 + 4 + 1 + 3 + 9) * 4 < int(m[1]) < 10 * 2**20
    assert f"the last complete checkpoint is {ck.step_dir(root, 2)}" in p.stderr
    ply = out / "ply" / "point_cloud_0006.ply.tmp"
    assert re.search(rf"PLY of step 6 not saved: rank 0 could not write {re.escape(str(ply))} .*ENOSPC", p.stderr)
    assert sorted(x.name for x in (out / "ply").iterdir()) == ["point_cloud_0002.ply", "point_cloud_0004.ply"]
    n, names, header = read_ply_header(out / "ply" / "point_cloud_0004.ply")  # whole: every row written
    assert n > 0 and (out / "ply" / "point_cloud_0004.ply").stat().st_size == header + 4 * n * len(names)
    summary = re.findall(r"2 save\(s\) failed because the disk was full or read-only: "
                         r"checkpoint of step 4, PLY of step 6; the last complete checkpoint is (\S+)", p.stderr)
    assert summary == [str(ck.step_dir(root, 6))], p.stderr[-3000:]


@pytest.mark.slow
def test_a_read_only_result_dir_at_the_final_save_keeps_the_previous_checkpoint(tmp_path):
    out, p = run(tmp_path, "erofs:0:4", steps=(2, 4), keep=1)
    assert p.returncode == 0, p.stderr[-4000:]
    root = out / "ckpts"
    assert complete_steps(root) == [2]  # keep=1 pruned nothing: step 4 never completed
    check_loads(root, 2)
    assert re.search(r"checkpoint of step 4 not saved: rank 0 could not write \S+step_000004\.tmp "
                     r"\(the file system is read-only\)", p.stderr), p.stderr[-3000:]
    assert "1 save(s) failed because the disk was full or read-only: checkpoint of step 4" in p.stderr
    assert torch.load(root / "step_000002" / "rank_0000.pt", weights_only=True)["params"]["means"].ndim == 2
