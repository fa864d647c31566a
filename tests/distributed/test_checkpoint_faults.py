"""Checkpoints under SIGKILL (issue 9, part 3): whenever a writer dies, the newest complete
checkpoint exists once one was ever completed, verifies, and holds exactly its step's
contents; every complete checkpoint left behind loads on W' = 1, 2, 3 ranks.

Three loops: a writer (tests/distributed/ckpt_writer.py, Trainer.save's sequence for 2
simulated ranks) killed at every filesystem call of a save that cleans up earlier kills,
saves a step again and prunes; the same writer killed at random times; and the real CLI
under torchrun, killed as a whole or one rank at a time, then resumed."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest
import torch

import ckpt_writer as cw
from distsplat.distributed import chunk_bounds
from distsplat.train.files import checkpoint as ck

from benchmarks.procs import worker_pids
from harness import FORKSERVER_PRELOAD
from torchrun_cli import TINY_FLAGS, TRAINER, REPO, torchrun

HERE = Path(__file__).resolve().parent


def complete_steps(root: Path) -> List[int]:
    return [ck._step_of(p) for p in ck.complete_checkpoints(root)]


def check_contents(meta: Dict, world_sizes=(1, 2, 3)) -> None:
    """Every row range a run on W' ranks would read verifies and is exactly the writer's
    contents for that step."""
    step = meta["step"]
    assert meta["num_gaussians"] == cw.num_rows(step) and meta["state"] == cw.state_for(step)
    for w in world_sizes:
        for start, end in chunk_bounds(meta["num_gaussians"], w):
            got, want = ck.read_rows(meta, start, end, verify=True), cw.expected_rows(step, start, end)
            for k, v in want["params"].items():
                assert torch.equal(got["params"][k], v), (meta["dir"], k)
                for s, t in want["optim"][k].items():
                    assert torch.equal(got["optim"][k][s], t), (meta["dir"], k, s)
            assert torch.equal(got["per_gaussian"]["grad2d"], want["per_gaussian"]["grad2d"])


def check_after_kill(root: Path, before: List[int]) -> List[int]:
    """The invariants after a kill, given the complete steps before the writer started."""
    steps = complete_steps(root)
    if before:
        assert steps and max(steps) >= max(before), (before, steps)  # never goes back
    for p in before:  # a checkpoint disappears only when pruned behind KEEP newer ones
        assert p in steps or sum(s > p for s in steps) >= cw.KEEP, (p, before, steps)
    if steps:
        newest = ck.read_meta(root)
        assert newest["step"] == max(steps)
        check_contents(newest)  # what a resume on 1, 2 or 3 ranks reads
    for path in ck.complete_checkpoints(root)[:-1]:
        check_contents(ck.read_meta(path), world_sizes=(1,))  # every one left behind loads
    return steps


def start_writer(root: Path, steps: List[int], **kwargs) -> mp.Process:
    ctx = mp.get_context("forkserver")  # a writer costs a fork, not a torch import
    ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    ready = ctx.Event()
    proc = ctx.Process(target=cw.write_loop, args=(str(root), steps),
                       kwargs=dict(ready=ready, sys_path=[str(HERE)] + sys.path, **kwargs))
    proc.start()
    assert ready.wait(60), "the writer did not start"
    return proc


def leftovers(root: Path) -> List[str]:
    return sorted(p.name for p in root.iterdir() if not re.fullmatch(r"step_\d{6}", p.name))


@pytest.fixture
def scarred(tmp_path) -> Path:
    """Checkpoints 2, 3 and 5 after earlier kills: 5 only as `.replaced` (killed between
    a re-save's two renames), a stale .tmp, a half-deleted .pruned and a `.replaced` of 3
    whose new version did arrive."""
    root = tmp_path / "scarred"
    for step in (2, 3, 5):
        cw.save(root, step, keep=0)
    os.replace(root / "step_000005", root / "step_000005.replaced")
    shutil.copytree(root / "step_000003", root / "step_000003.replaced")
    (root / "step_000007.tmp").mkdir()
    (root / "step_000007.tmp" / "rank_0000.pt").write_bytes(b"half a shard")
    (root / "step_000001.pruned").mkdir()
    shutil.copy(root / "step_000002" / "meta.json", root / "step_000001.pruned" / "meta.json")
    assert complete_steps(root) == [2, 3, 5]
    return root


@pytest.mark.slow
def test_writer_killed_at_every_filesystem_call(scarred, tmp_path):
    # Saves 3 again (its old version must stay visible until the new one is in place), then
    # 4 (prunes 2, keeps 5: newer than 4, it belongs to another run).
    plan = [3, 4]
    traced = tmp_path / "traced"
    shutil.copytree(scarred, traced)
    proc = start_writer(traced, plan, trace=str(tmp_path / "trace.json"))
    proc.join(60)
    assert proc.exitcode == 0
    events = json.loads((tmp_path / "trace.json").read_text())["events"]
    assert complete_steps(traced) == [3, 4, 5] and leftovers(traced) == []
    names = " | ".join(events)
    for window in ("rmtree step_000007.tmp half done", "rmtree step_000001.pruned half done",
                   "replace step_000005.replaced -> step_000005", "torch.save shard half written",
                   "json.dump meta half written", "replace step_000003 -> step_000003.replaced",
                   "replace step_000003.tmp -> step_000003", "replace step_000002 -> step_000002.pruned",
                   "rmtree step_000002.pruned half done"):
        assert window in names, window  # the windows this scenario must pass through
    for k, event in enumerate(events):
        root = tmp_path / f"k{k}"
        shutil.copytree(scarred, root)
        proc = start_writer(root, plan, die_at=k)
        proc.join(60)
        assert proc.exitcode == -signal.SIGKILL, (k, event, proc.exitcode)
        try:
            steps = check_after_kill(root, [2, 3, 5])
            assert {3, 5} <= set(steps) and (2 in steps or 4 in steps), steps
            cw.save(root, 6)  # the next save clears what the kill left
            assert leftovers(root) == [] and complete_steps(root)[-2:] == [5, 6]
            check_after_kill(root, steps)
        except Exception as e:
            raise AssertionError(f"killed at event {k} ({event}): {e}") from e
        shutil.rmtree(root)


@pytest.mark.slow
def test_writer_killed_at_random_times(tmp_path):
    traced = tmp_path / "traced"
    proc = start_writer(traced, [1, 2, 3, 4], trace=str(tmp_path / "trace.json"))
    proc.join(60)
    save_s = json.loads((tmp_path / "trace.json").read_text())["seconds"] / 4
    rng = random.Random(20261121)
    root = tmp_path / "ckpts"
    before: List[int] = []
    debris: Dict[str, int] = {}
    for rep in range(48):
        newest = max(before, default=0)
        # Sometimes a run resumed from an earlier checkpoint: it saves existing steps again.
        first = max(1, newest + 1 - rng.choice([0, 0, 0, 1, 2]))
        proc = start_writer(root, list(range(first, first + 10_000)))
        time.sleep(rng.uniform(0, 4 * save_s))
        proc.kill()
        proc.join(30)
        for name in leftovers(root) if root.exists() else []:
            kind = name.split(".")[-1]
            debris[kind] = debris.get(kind, 0) + 1
        try:
            before = check_after_kill(root, before)
        except Exception as e:
            raise AssertionError(f"repetition {rep} (from step {first}, {sorted(debris)}): {e}") from e
    assert before and max(before) >= 10, before  # the writer got somewhere
    print(f"48 kills, save {save_s * 1e3:.0f} ms, debris left by kills: {debris}")


def test_a_bad_shard_that_one_rank_reads_is_refused_by_every_rank(run_workers, tmp_path):
    from trainer_workers import tiny_config

    run_workers("trainer_workers:train", 2, tiny_config(str(tmp_path / "run"), max_steps=2, save_steps=[2]))
    shard = tmp_path / "run" / "ckpts" / "step_000002" / "rank_0001.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    # Rank 0 reads only rank_0000.pt, yet stops with rank 1's error instead of waiting for it.
    cfg = tiny_config(str(tmp_path / "resume"), max_steps=2, ckpt=str(tmp_path / "run" / "ckpts"))
    errors = run_workers("ckpt_writer:resume_error", 2, cfg)
    assert errors[0] == errors[1], errors
    assert errors[0] == (f"rank 1: {shard} does not match its checksum in {shard.parent}/meta.json: the file is "
                         "corrupt or truncated; start without --ckpt (no earlier complete checkpoint is next to it)")


# ------------------------------------------------------------------------------ real CLI
def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":  # killed, waiting to be reaped
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds torchrun's workers in /proc")
def test_cli_killed_while_saving_every_step_resumes_from_newest(tmp_path):
    rng = random.Random(9)
    for rep, victim in enumerate(["job", "rank 1", "rank 0"]):
        out = tmp_path / f"run{rep}"
        steps = 60
        args = ["default", "--max_steps", str(steps), "--save_steps", *map(str, range(1, steps + 1)),
                "--eval_steps", str(steps), "--result_dir", str(out), *TINY_FLAGS]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(TRAINER), *args]
        proc = subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1", DISTSPLAT_TIMEOUT_S="30"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while not complete_steps(out / "ckpts") and time.monotonic() < deadline:
                time.sleep(0.05)
            assert complete_steps(out / "ckpts"), "no checkpoint within 120 s"
            time.sleep(rng.uniform(0, 1.5))
            workers = worker_pids(proc.pid)
            assert len(workers) == 2, workers
            if victim == "job":  # every process at once, as a lost node
                for pid in workers.values():
                    os.killpg(pid, signal.SIGKILL)
                os.killpg(proc.pid, signal.SIGKILL)
            else:  # torchrun stops the other rank
                os.kill(workers[int(victim[-1])], signal.SIGKILL)
            assert proc.wait(90) != 0
            for pid in workers.values():  # all gone: nothing writes while the test checks
                assert wait_gone(pid, 30), f"{victim} killed: worker {pid} still running"
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        saved = complete_steps(out / "ckpts")
        assert saved, f"{victim} killed: no complete checkpoint left"
        newest = saved[-1]
        if newest == steps:
            continue  # finished before the kill (a slow start on a busy machine)
        meta = ck.read_meta(out / "ckpts")
        ck.read_rows(meta, 0, meta["num_gaussians"])  # every shard verifies
        p = torchrun(["default", "--max_steps", str(newest + 3), "--save_steps", str(newest + 3),
                      "--eval_steps", str(newest + 3), "--result_dir", str(out),
                      "--ckpt", str(out / "ckpts"), *TINY_FLAGS], timeout=120)
        assert p.returncode == 0, f"{victim} killed at step {newest}: {p.stderr[-3000:]}"
        assert re.search(rf"resumed .*step_{newest:06d}: step {newest},", p.stderr), p.stderr[-2000:]
        assert complete_steps(out / "ckpts")[-1] == newest + 3
        print(f"{victim} killed after step {newest}: resumed and finished")
