"""The live viewer as a user meets it on the real CLI (issue 32): on by default, it never
announces itself before a bad input's error; a taken default port moves to a free one
(said in the log), an explicit one stays an error (test_bad_input_catalog.py); it is off for
--eval_only; --viewer_keep_open never blocks a run whose stdin is not a terminal, and on a
terminal serves the final model until Ctrl-C. examples/simple_viewer.py under torchrun says
a bad --ckpt or a taken --port once, as the trainer does."""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from torchrun_cli import REPO, TINY_FLAGS, TRAINER, torchrun

pytestmark = pytest.mark.slow

VIEWER_ON = [f for f in TINY_FLAGS if f != "--disable_viewer"]


def python_cli(args, timeout: float = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(TRAINER), *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=timeout, stdin=subprocess.DEVNULL)


def hold_port(port: int):
    """A listener on 127.0.0.1:port, or None when someone else already holds it (either way
    the port is taken while the test runs)."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError as e:
        s.close()
        if e.errno == errno.EADDRINUSE:
            return None
        raise
    s.listen()
    return s


def test_no_viewer_banner_before_a_bad_data_dir(tmp_path):
    p = python_cli(["default", "--data_dir", str(tmp_path / "nowhere"), "--result_dir", str(tmp_path / "r"),
                    *VIEWER_ON])
    assert p.returncode == 2
    assert "viewer:" not in p.stderr and "http://" not in p.stderr, p.stderr
    assert p.stderr.splitlines()[-1] == f"distsplat: error: --data_dir {tmp_path / 'nowhere'} does not exist or is not a folder"


@pytest.fixture(scope="module")
def default_port_taken_run(tmp_path_factory):
    """A run with the viewer on its default port while 8080 is taken; --viewer_keep_open
    with stdin not a terminal (subprocess.DEVNULL)."""
    out = tmp_path_factory.mktemp("viewer") / "run"
    held = hold_port(8080)
    try:
        p = python_cli(["default", "--max_steps", "3", "--result_dir", str(out), "--viewer_keep_open", *VIEWER_ON])
    finally:
        if held is not None:
            held.close()
    return out, p


def test_a_taken_default_port_moves_to_a_free_one(default_port_taken_run):
    _, p = default_port_taken_run
    assert p.returncode == 0, p.stderr[-3000:]
    moved = re.search(r"viewer: port 8080 is in use \(another run\?\); serving on port (\d+) instead "
                      r"\(--port P picks one\)", p.stderr)
    assert moved, p.stderr[-3000:]
    assert f"viewer: open http://127.0.0.1:{moved.group(1)} in a browser" in p.stderr
    assert moved.start() < p.stderr.index("viewer: open")  # said before the URL


def test_keep_open_does_not_block_a_non_interactive_run(default_port_taken_run):
    out, p = default_port_taken_run
    assert p.returncode == 0 and "final: PSNR" in p.stdout, p.stderr[-3000:]
    assert ("viewer: --viewer_keep_open serves only when stdin is a terminal (Ctrl-C ends it); this run is not "
            "interactive, so the viewer closes now") in p.stderr
    assert (out / "ckpts" / "step_000003").is_dir() and (out / "ply" / "point_cloud_0003.ply").is_file()


def test_the_viewer_is_off_for_eval_only(default_port_taken_run, tmp_path):
    out, _ = default_port_taken_run
    p = python_cli(["default", "--eval_only", "--ckpt", str(out / "ckpts"), "--result_dir", str(tmp_path / "e"),
                    *VIEWER_ON])
    assert p.returncode == 0, p.stderr[-3000:]
    assert "viewer:" not in p.stderr and "http://" not in p.stderr, p.stderr[-3000:]


def test_keep_open_on_a_terminal_serves_until_ctrl_c(monkeypatch):
    """In one process: with stdin a terminal, keep_open serves (polls go on) until a SIGINT,
    then returns normally (the run then ends as usual: exit 0, the final line)."""
    import distsplat.viewer.live as live
    from distsplat.distributed import DistContext
    from distsplat.train.config import default_config
    from distsplat.train.model.gaussians import init_gaussians

    monkeypatch.setattr(live, "_stdin_is_a_terminal", lambda: True)
    ctx = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)
    cfg = default_config()
    cfg.max_steps, cfg.sh_degree = 10, 1
    params = init_gaussians(torch.rand(50, 3), torch.rand(50, 3), 1, (0, 50), device=torch.device("cpu"))
    trainer = SimpleNamespace(cfg=cfg, params=params, metrics={}, n_all=50, app=None)
    viewer = live.LiveViewer.start(ctx, port=0)
    polls = []
    real_poll = viewer._poll
    monkeypatch.setattr(viewer, "_poll", lambda *a, **k: polls.append(time.monotonic()) or real_poll(*a, **k))
    timer = threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    # Python's own Ctrl-C handler, also where the suite was started with SIGINT ignored (nohup,
    # a shell's `&`): there the signal would be dropped and keep_open serve forever
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    t0 = time.monotonic()
    timer.start()
    try:
        viewer.keep_open(trainer)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
        viewer.close()
    assert time.monotonic() - t0 >= 1.4  # it served until the Ctrl-C, not less
    assert len(polls) > 5  # polling the browsers all along


SIMPLE_VIEWER = REPO / "examples" / "simple_viewer.py"


def error_lines(stderr: str) -> list:
    return [line for line in stderr.splitlines() if line.startswith("distsplat: error")]


def test_simple_viewer_on_two_ranks_says_a_bad_ckpt_once(tmp_path):
    missing = tmp_path / "missing.ply"
    p = torchrun(["--ckpt", str(missing), "--seconds", "1"], nproc=2, script=SIMPLE_VIEWER)
    assert p.returncode == 1, p.stderr[-3000:]  # torchrun's code for a failed job (the ranks exit 2)
    line = f"distsplat: error: --ckpt {missing}: no such PLY file"
    assert error_lines(p.stderr) == [line], p.stderr[-3000:]  # once, from rank 0
    assert line in p.stderr.split("Root Cause (first observed failure):", 1)[1]  # torchrun's summary says it
    assert "To enable traceback" not in p.stderr


def test_simple_viewer_on_two_ranks_says_a_taken_port_once(tmp_path):
    from distsplat.train.files.export import write_ply

    g = torch.Generator().manual_seed(0)
    ply = write_ply(tmp_path / "m.ply", {"means": torch.randn(30, 3, generator=g), "scales": torch.randn(30, 3) - 3,
                                         "quats": torch.randn(30, 4, generator=g), "opacities": torch.randn(30),
                                         "sh0": torch.randn(30, 1, 3), "shN": torch.zeros(30, 0, 3)})
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        p = torchrun(["--ckpt", str(ply), "--port", str(port), "--seconds", "1"], nproc=2, script=SIMPLE_VIEWER)
    assert p.returncode == 1, p.stderr[-3000:]
    assert error_lines(p.stderr) == [
        f"distsplat: error: --port {port}: the viewer's address 127.0.0.1:{port} is already in use; pass a free "
        "--port, or none for 8080 or a free port"], p.stderr[-3000:]
    assert "To enable traceback" not in p.stderr
