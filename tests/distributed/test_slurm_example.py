"""examples/slurm/train.sbatch as written (issue 44), run on this machine with a fake `srun` (one
torchrun agent per "node", tests/distributed/fake_slurm/) and `scontrol`: 2 nodes x 1 rank, c10d
rendezvous. Slurm's warning before the time limit (SIGUSR1 to the batch script) stops every rank
at one step with its checkpoint saved and requeues the job; the requeued script (the same
command) resumes and ends with the model of an uninterrupted run (test_preemption.py's)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from distsplat.train.files import checkpoint as ck
from test_preemption import STEPS, args, assert_same_model, finish, wait_for
from torchrun_cli import REPO, free_port, torchrun_env

pytestmark = pytest.mark.slow

SBATCH = REPO / "examples" / "slurm" / "train.sbatch"
FAKE = Path(__file__).resolve().parent / "fake_slurm"


def sbatch_lines() -> dict:
    return dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?", SBATCH.read_text(), re.M))


def test_the_sbatch_file_asks_for_a_signal_before_the_time_limit_and_a_requeue():
    opts = sbatch_lines()
    assert opts["signal"] == "B:USR1@180" and "requeue" in opts and opts["ntasks-per-node"] == "1", opts
    assert opts["open-mode"] == "append" and opts["nodes"] == "1"  # sbatch --nodes=2 for two


def launch(result: Path, log: Path, slurm_log: Path, port: int) -> subprocess.Popen:
    env = torchrun_env(60, {
        "PATH": f"{FAKE}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "4242", "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "localhost,localhost", "NPROC_PER_NODE": "1", "RDZV_PORT": str(port),
        "FAKE_SLURM_LOG": str(slurm_log), "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "GRACE_S": "60"})
    with open(log, "w") as f:  # a file: a full pipe would stall the ranks
        return subprocess.Popen(["bash", str(SBATCH), *args(result)], cwd=REPO, env=env, stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)


def test_a_time_limit_warning_saves_requeues_and_the_requeued_job_finishes_the_run(phased, tmp_path):
    base, _ = phased
    out, N = tmp_path / "run", STEPS["max"]
    slurm_log, port = tmp_path / "slurm.jsonl", free_port()
    log = tmp_path / "job1.log"
    proc = launch(out, log, slurm_log, port)
    wait_for(log, rf"step 3/{N}:", proc, timeout=150)
    os.kill(proc.pid, signal.SIGUSR1)  # Slurm's --signal=B:USR1@180: the batch script alone
    assert finish(proc) != 0
    text = log.read_text()
    lines = [line for line in text.splitlines() if line.startswith("distsplat: preempted")]
    assert len(lines) == 1, text[-4000:]
    stopped = int(re.match(r"distsplat: preempted at step (\d+) by SIGTERM: checkpoint saved to \S+ in [\d.]+ s; "
                           r"the same command resumes$", lines[0])[1])
    assert [ck._step_of(p) for p in ck.complete_checkpoints(out / "ckpts")] == [stopped]
    records = [json.loads(line) for line in slurm_log.read_text().splitlines()]
    srun, requeue = records[0], records[1:]
    assert requeue == [{"scontrol": "requeue", "job": "4242"}], records
    assert srun["nodes"] == 2 and "--kill-on-bad-exit=1" in srun["srun"], srun
    command = " ".join(srun["command"])
    for part in ("torchrun --nnodes=2 --nproc_per_node=1 --rdzv_backend=c10d", f"--rdzv_endpoint=localhost:{port}",
                 "--rdzv_id=4242", "--max_restarts=3", "-m distsplat.app default"):
        assert part in command, command

    # Slurm starts the requeued job: the same script and arguments
    log = tmp_path / "job2.log"
    proc = launch(out, log, slurm_log, port)
    assert finish(proc) == 0, log.read_text()[-4000:]
    assert re.search(rf"resumed \S+step_{stopped:06d}: step {stopped},", log.read_text())
    assert len(slurm_log.read_text().splitlines()) == 3  # a second srun, no second requeue
    assert_same_model(base / "ref" / "ckpts" / f"step_{N:06d}", out / "ckpts" / f"step_{N:06d}")
