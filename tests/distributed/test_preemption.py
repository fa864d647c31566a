"""Preemption (issue 44): a stop signal on any rank saves one checkpoint and stops every rank at
the same step; the same command resumes from the newest checkpoint of the run in --result_dir
and ends bit for bit like an uninterrupted run (CPU, the same W: docs/determinism.md); a dead
rank under torchrun's --max_restarts costs at most the steps since the last checkpoint.

Real signals throughout: torchrun gets SIGTERM as a scheduler sends it, a rank is SIGKILLed
from outside, and in the phase test one rank sends a signal to itself at the chosen moment
(preemption_workers.py). Few launches: the phase test relaunches the CLI's run in one gloo group
(as a requeued job relaunches the command); the torchrun tests compare with its reference."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest
import torch

from distsplat.train.files import checkpoint as ck
from preemption_workers import STEPS, args
from torchrun_cli import REPO, checkpoint_tensors, torchrun_cmd, torchrun_env

pytestmark = pytest.mark.slow

def assert_same_model(a: Path, b: Path) -> None:
    ta, tb = checkpoint_tensors(a), checkpoint_tensors(b)
    assert ta.keys() == tb.keys() and len(ta) > 20
    different = [k for k in ta if not (ta[k].shape == tb[k].shape and torch.equal(ta[k], tb[k]))]
    assert not different, (a, b, different)


def test_a_signal_in_each_phase_then_the_same_command_ends_like_an_uninterrupted_run(phased):
    base, (out, out1) = phased
    N, S, E = STEPS["max"], STEPS["save"], STEPS["eval"]
    assert "val_psnr" in out["ref"] and "preempted" not in out["ref"]
    # A signal during setup (rank 1, SIGUSR1): the first step runs, then every rank saves it and stops.
    assert {k: out["setup"]["preempted"][k] for k in ("step", "saved")} == {"step": 1, "saved": True}, out["setup"]
    assert out["setup_state"] == {"steps": [1], "newest_verified": 1, "others": [], "interim": [1]}
    # During a save (rank 0, SIGTERM while writing its shard): that save completes, the next step stops.
    assert out["save"]["preempted"]["step"] == S + 1 and out["save"]["preempted"]["saved"]
    assert out["save_state"] == {"steps": [S, S + 1], "newest_verified": S + 1, "others": [], "interim": [S + 1]}
    # During an evaluation (rank 1, SIGINT), with --save_every_minutes' interim saves on the way: at most
    # --keep_ckpts (2) of them, all newer than the regular one they bridge from.
    assert out["eval"]["preempted"]["step"] == E + 1 and out["eval"]["preempted"]["saved"]
    st = out["eval_state"]
    assert st["steps"][0] == S and st["steps"][-1] == E + 1 and st["newest_verified"] == E + 1, st
    assert st["interim"] == st["steps"][1:] and len(st["interim"]) == 2 and st["others"] == [], st
    # During the final PLY (rank 0, SIGTERM): too late to stop; the run ends, interim checkpoints pruned.
    assert "preempted" not in out["ply"] and "val_psnr" in out["ply"], out["ply"]
    assert out["ply_state"] == {"steps": [S, N], "newest_verified": N, "others": [], "interim": []}
    assert (base / "run" / "ply" / f"point_cloud_{N:04d}.ply").is_file()
    assert_same_model(base / "ref" / "ckpts" / f"step_{N:06d}", base / "final_first")
    # rank 0's line (the one the CLI prints) names the signal it got, or the count of ranks that got one
    ckpts = base / "run" / "ckpts"
    assert re.fullmatch(rf"preempted at step 1 by a signal on 1 other rank: checkpoint saved to {ckpts}/step_000001 "
                        r"in \d+\.\d s; the same command resumes", out["setup"]["preempted"]["line"])
    assert out1["setup"]["preempted"]["line"].startswith("preempted at step 1 by SIGUSR1: ")
    assert out["save"]["preempted"]["line"].startswith(f"preempted at step {S + 1} by SIGTERM: ")
    assert out["eval"]["preempted"]["line"].startswith(f"preempted at step {E + 1} by a signal on 1 other rank: ")
    assert out1["eval"]["preempted"]["line"].startswith(f"preempted at step {E + 1} by SIGINT: ")


def test_the_same_command_on_a_finished_run_writes_nothing_and_other_flags_are_refused(phased):
    base, (out, out1) = phased
    assert out["again"] == {"finished": True} and out["again_unchanged"]
    err = out["other_flags"]
    assert err["agreed"] and err == out1["other_flags"], (err, out1["other_flags"])
    assert err["error"].startswith(f"--result_dir {base / 'run'} holds a run with other flags "
                                   f"({base / 'run' / 'ckpts' / 'step_000020'}): --sh_degree 1 there, 2 now; "
                                   "--strategy.grow_grad2d 0.0002 there, 0.0003 now. To resume that run"), err
    assert "--no-resume" in err["error"] and "--ckpt" in err["error"] and out["other_flags_unchanged"]
    # the final evaluation missing (stopped while writing it): written by the same command, nothing retrained
    assert out["finish_outputs"]["val_step"] == STEPS["max"] and "val_psnr" in out["finish_outputs"]
    assert out["finish_outputs_state"]["steps"] == [STEPS["save"], STEPS["max"]]
    assert (base / "run" / "stats" / f"val_step{STEPS['max']:04d}.json").is_file()


def test_another_world_size_resumes_the_same_run(phased, tmp_path):
    """The checkpoint a launch on W = 1 would resume from a W = 2 run's result dir: the same run
    (the flags as typed), its shards verified for W = 1's rows (the resume itself on any W' is
    test_checkpoint_faults.py's and test_resume_and_errors.py's)."""
    import shutil

    from distsplat.app import CONFIGS
    from distsplat.cli import parse
    from distsplat.distributed import DistContext
    from distsplat.train import auto_resume
    from distsplat.train.run_checks import check_flags

    base, _ = phased
    run = tmp_path / "run"
    shutil.copytree(base / "run" / "ckpts", run / "ckpts")
    shutil.rmtree(run / "ckpts" / f"step_{STEPS['max']:06d}")  # the run as if stopped before its end
    cfg = parse(args(run), CONFIGS)
    flags = auto_resume.run_flags(cfg)
    one = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)
    check_flags(cfg, one)
    plan = auto_resume.plan(cfg, one, flags)
    assert plan == auto_resume.Plan(ckpt=str(run / "ckpts" / f"step_{STEPS['save']:06d}"), found=True, verified=True)


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(phased):
    base, (out, out1) = phased
    N, S = STEPS["max"], STEPS["save"]
    # rank 1 alone read the bad shard; both ranks resumed from step S and trained to the end again
    assert "val_psnr" in out["damaged"] and "val_psnr" in out1["damaged"]
    assert out["damaged_state"] == {"steps": [S, N], "newest_verified": N, "others": [], "interim": []}
    assert_same_model(base / "ref" / "ckpts" / f"step_{N:06d}", base / "run" / "ckpts" / f"step_{N:06d}")


# ------------------------------------------------------------------------------ the real CLI
def start(cmd: List[str], log: Path, extra_env: Dict[str, str] = None) -> subprocess.Popen:
    """The command in a session of its own, its output into `log` (a file: a full pipe would stall it)."""
    with open(log, "w") as f:
        return subprocess.Popen(cmd, cwd=REPO, env=torchrun_env(60, extra_env), stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)


def wait_for(log: Path, pattern: str, proc: subprocess.Popen, timeout: float = 120) -> re.Match:
    """The first match of `pattern` in the log, waiting for it (a step marker: no fixed sleeps)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text())
        if found:
            return found
        assert proc.poll() is None, f"exited {proc.returncode} before {pattern!r}:\n{log.read_text()[-3000:]}"
        time.sleep(0.02)
    raise AssertionError(f"no {pattern!r} within {timeout} s:\n{log.read_text()[-3000:]}")


def finish(proc: subprocess.Popen, timeout: float = 150) -> int:
    try:
        return proc.wait(timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds torchrun's workers in /proc")
def test_sigterm_to_torchrun_then_a_dead_rank_under_max_restarts_the_same_command_ends_like_one_run(phased, tmp_path):
    """kill -TERM to torchrun at a random step: one line, a complete checkpoint of the step every
    rank stopped at; the same command (under torchrun --max_restarts 1) resumes from it, a rank
    SIGKILLed later is restarted and resumes from the newest checkpoint, and the final model is
    the uninterrupted run's, bit for bit."""
    from test_checkpoint_faults import worker_pids

    base, _ = phased
    out, N, S = tmp_path / "run", STEPS["max"], STEPS["save"]
    rng = __import__("random").Random()
    first = rng.randint(2, 6)
    log = tmp_path / "first.log"
    proc = start(torchrun_cmd(args(out)), log)
    wait_for(log, rf"step {first}/{N}:", proc)
    os.kill(proc.pid, signal.SIGTERM)  # torchrun forwards it to both ranks, waits for them, then exits 1
    assert finish(proc) == 1
    text = log.read_text()
    lines = [line for line in text.splitlines() if line.startswith("distsplat: preempted")]
    assert len(lines) == 1, text[-3000:]
    stopped = int(re.match(r"distsplat: preempted at step (\d+) by SIGTERM: checkpoint saved to (\S+) in "
                           r"[\d.]+ s; the same command resumes$", lines[0])[1])
    assert first <= stopped <= first + 2, (first, lines)  # the step in progress, then the agreed boundary
    assert [ck._step_of(p) for p in ck.complete_checkpoints(out / "ckpts")] == [stopped]
    assert text.count("Traceback (most recent call last)") == 1 and text.rstrip().endswith("got signal: 15")  # torchrun's

    # The same command (torchrun's --max_restarts is the launcher's) and a rank SIGKILLed after step S's save
    log = tmp_path / "second.log"
    cmd = torchrun_cmd(args(out))
    proc = start(cmd[:3] + ["--max_restarts=1"] + cmd[3:], log)
    wait_for(log, rf"resumed \S+step_{stopped:06d}: step {stopped},.*the newest checkpoint of this run", proc)
    killed_at = rng.randint(S + 1, S + 4)
    wait_for(log, rf"step {killed_at}/{N}:", proc)
    workers = worker_pids(proc.pid)
    os.kill(workers[1], signal.SIGKILL)
    assert finish(proc) == 0, log.read_text()[-3000:]
    text = log.read_text()
    resumed = [int(m) for m in re.findall(r"resumed \S+step_\d+: step (\d+),", text)]
    assert resumed[0] == stopped and resumed[1] == max(stopped, S), resumed  # the restart: the newest checkpoint
    assert killed_at - resumed[1] <= S  # steps redone: at most the save interval
    assert_same_model(base / "ref" / "ckpts" / f"step_{N:06d}", out / "ckpts" / f"step_{N:06d}")
