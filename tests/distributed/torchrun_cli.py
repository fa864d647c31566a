"""The real CLI (`examples/simple_trainer.py`) under torchrun, for the tests that run it
end to end (test_trainer.py, test_bad_input_catalog.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
TRAINER = REPO / "examples" / "simple_trainer.py"

# The built-in synthetic scene, small enough for a CPU step in milliseconds.
TINY_FLAGS = [
    "--synthetic.kind", "ball", "--synthetic.num_cameras", "12", "--synthetic.num_gaussians", "400",
    "--synthetic.width", "32", "--synthetic.height", "24", "--sh_degree", "1",
    "--num_workers", "1", "--prefetch", "1", "--disable_viewer",
]


def torchrun_cmd(args: Sequence[str], nproc: int = 2, script: Path = TRAINER) -> list:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            str(script), *args]


def torchrun_env(timeout_s: float = 60, extra: Optional[Mapping[str, str]] = None) -> dict:
    """One thread per rank (the CPU is shared) and a collective timeout that turns a hang
    into an error well within a test's time limit."""
    return dict(os.environ, OMP_NUM_THREADS="1", DISTSPLAT_TIMEOUT_S=str(timeout_s), **(extra or {}))


def torchrun(args: Sequence[str], nproc: int = 2, timeout: float = 180, collective_timeout_s: float = 60,
             script: Path = TRAINER, extra_env: Optional[Mapping[str, str]] = None) -> subprocess.CompletedProcess:
    """Runs the CLI (or `script`, a wrapper of it) to the end; past `timeout` the whole job
    (launcher and ranks, its own session) is killed and TimeoutExpired raised."""
    with subprocess.Popen(torchrun_cmd(args, nproc, script), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=torchrun_env(collective_timeout_s, extra_env), cwd=REPO,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
