"""A user's mistakes on the real CLI (issue 32): a resume with nothing left to train, a
typo'd flag, a bad --data_dir. Each is bad input: one `distsplat: error` line (from rank 0
only, however many ranks), exit code 2 under python and torchrun's 1 under torchrun, the
line as the root cause of torchrun's summary, and the result dir untouched."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

import pytest

from torchrun_cli import REPO, TINY_FLAGS, TRAINER, torchrun

pytestmark = pytest.mark.slow

STEPS = 3


def python_cli(args, timeout: float = 180) -> subprocess.CompletedProcess:
    """The CLI as one plain python process (W = 1)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(TRAINER), *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=timeout)


def snapshot(root: Path) -> Dict[str, Optional[bytes]]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def error_lines(stderr: str):
    return [line for line in stderr.splitlines() if line.startswith("distsplat: error")]


def root_cause(stderr: str) -> str:
    """torchrun's summary from its "Root Cause" on."""
    assert "Root Cause (first observed failure):" in stderr, stderr[-3000:]
    return stderr.split("Root Cause (first observed failure):", 1)[1]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("trained") / "run"
    p = python_cli(["default", "--max_steps", str(STEPS), "--result_dir", str(out), *TINY_FLAGS])
    assert p.returncode == 0, p.stderr[-3000:]
    return out


def resume_message(ckpt: Path, max_steps: int) -> str:
    return (f"distsplat: error: --ckpt {ckpt / f'step_{STEPS:06d}'} holds step {STEPS}, and --max_steps "
            f"{max_steps} is not past it: nothing to train. --max_steps is the step to stop at, not a number "
            f"of steps to add: pass --max_steps {STEPS + 1000} to train 1000 more steps (step + N for N more), "
            "or --eval_only / --render_only to score or render this checkpoint")


@pytest.mark.parametrize("max_steps", [STEPS, STEPS - 1], ids=["at", "below"])
def test_a_resume_with_nothing_to_train_is_bad_input(trained, max_steps):
    before = snapshot(trained)
    p = python_cli(["default", "--max_steps", str(max_steps), "--ckpt", str(trained / "ckpts"),
                    "--result_dir", str(trained), *TINY_FLAGS])
    assert p.returncode == 2, p.stderr[-3000:]
    assert error_lines(p.stderr) == [resume_message(trained / "ckpts", max_steps)], p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    assert snapshot(trained) == before  # nothing written, nothing lost


def test_a_resume_with_steps_left_trains_them(trained, tmp_path):
    out = tmp_path / "more"
    p = python_cli(["default", "--max_steps", str(STEPS + 2), "--ckpt", str(trained / "ckpts"),
                    "--result_dir", str(out), *TINY_FLAGS])
    assert p.returncode == 0, p.stderr[-3000:]
    assert (out / "ckpts" / f"step_{STEPS + 2:06d}" / "meta.json").is_file()


def test_two_ranks_say_a_resume_error_once_and_torchrun_shows_it(trained):
    before = snapshot(trained)
    p = torchrun(["default", "--max_steps", str(STEPS), "--ckpt", str(trained / "ckpts"),
                  "--result_dir", str(trained), *TINY_FLAGS], nproc=2)
    message = resume_message(trained / "ckpts", STEPS)
    assert p.returncode == 1, p.stderr[-3000:]  # torchrun's own code for a failed job (the ranks exit 2)
    assert error_lines(p.stderr) == [message], p.stderr[-3000:]  # once, from rank 0
    assert message in root_cause(p.stderr)
    assert "To enable traceback" not in p.stderr and "new message format" not in p.stderr
    assert snapshot(trained) == before
    # setup read the 1-rank checkpoint's batcher position on 2 ranks: every rank warns alike, rank 0 says it
    assert p.stderr.count("CameraBatcher: resuming a run saved with world_size=1") == 1, p.stderr[-3000:]


def test_a_typo_is_said_once_and_is_torchruns_root_cause(tmp_path):
    p = torchrun(["default", "--max_stepz", "5", "--result_dir", str(tmp_path / "run"), *TINY_FLAGS], nproc=2)
    assert p.returncode == 1
    head = p.stderr.split("Root Cause (first observed failure):", 1)[0].split("FAILED", 1)[0]
    assert head.count("Unrecognized options: --max_stepz, 5") == 1, p.stderr[-3000:]  # tyro's box, once
    assert "distsplat: error: Unrecognized options: --max_stepz, 5; see --help" in root_cause(p.stderr)
    assert "To enable traceback" not in p.stderr
    assert not (tmp_path / "run").exists()


def test_help_is_printed_once(tmp_path):
    p = torchrun(["default", "--help"], nproc=2)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("--max-steps") == 1, p.stdout[-2000:]


def test_exit_codes_as_the_shell_sees_them(tmp_path):
    """docs/robustness.md's table: bad input is 2 under python; torchrun turns any failed rank into 1."""
    bad = ["default", "--data_dir", str(tmp_path / "nowhere"), "--result_dir", str(tmp_path / "run"), *TINY_FLAGS]
    p = python_cli(bad)
    assert p.returncode == 2 and error_lines(p.stderr) == [
        f"distsplat: error: --data_dir {tmp_path / 'nowhere'} does not exist or is not a folder"], p.stderr
    assert python_cli(["default", "--max_stepz", "5"]).returncode == 2  # tyro's code for a bad command line
    p = torchrun(bad, nproc=2)
    assert p.returncode == 1 and len(error_lines(p.stderr)) == 1, p.stderr[-3000:]


def test_eval_only_on_other_ranks_says_only_what_matters(trained, tmp_path):
    """--eval_only of a 1-rank checkpoint on 2 ranks: no batcher 'resuming ... epoch' warning
    (nothing is trained), no memory-guard line, one final line, and on a machine that is offline
    (downloads on, through a proxy at a closed port: nothing leaves this machine) the LPIPS
    weights' download is tried and fails at once, and LPIPS is skipped with one short line."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    offline = {"DISTSPLAT_NO_DOWNLOAD": "0", "https_proxy": closed, "HTTPS_PROXY": closed, "no_proxy": "",
               "NO_PROXY": "", "TORCH_HOME": str(tmp_path / "torch")}
    p = torchrun(["default", "--eval_only", "--ckpt", str(trained / "ckpts"), "--result_dir", str(tmp_path / "e"),
                  "--lpips_net", "vgg", *TINY_FLAGS], nproc=2, extra_env=offline)  # vgg: 16 px is enough
    assert p.returncode == 0, p.stderr[-3000:]
    assert "CameraBatcher" not in p.stderr and "memory guard" not in p.stderr, p.stderr
    lines = [line for line in (p.stdout + p.stderr).splitlines() if "LPIPS" in line]
    assert len(lines) == 1 and len(lines[0]) < 300, lines
    assert lines[0].endswith("LPIPS skipped: could not download vgg16-397923af.pth from download.pytorch.org "
                             "(ConnectionRefusedError: [Errno 111] Connection refused) (what to pass: lpips_skipped "
                             "in stats/val_stepNNNN.json, or --help)"), lines
    stats = json.loads((tmp_path / "e" / "stats" / f"val_step{STEPS:04d}.json").read_text())
    assert stats["lpips"] is None and "pass --lpips_weights" in stats["lpips_skipped"]
    assert not list((tmp_path / "torch").rglob("*.pth*"))  # no partial file left in torch hub's cache
    assert p.stdout.count("final: PSNR") == 1
