"""Viewer functions run on every rank by harness.run_workers (`fn(ctx, *args) -> result`):
the frame callback on a sharded model, the port check, the poll schedule with pause, and
a real training run with the viewer on (driven by a browser in the test process)."""

from __future__ import annotations

import copy
import socket
import threading
import time
from types import SimpleNamespace
from typing import Any, Dict, List

import numpy as np
import torch

from distsplat.distributed import DistContext, chunk_bounds
from distsplat.viewer import LiveViewer, RenderModel, render_view, view_camera

VIEWS = [  # (eye, up hint, fov_y, aspect, max_side): browser cameras looking at the origin
    ((0.4, -3.1, 0.6), (0.0, 0.0, 1.0), 0.9, 4 / 3, 40),
    ((-0.5, 0.8, -3.0), (0.3, 1.0, 0.0), 1.1, 0.75, 36),
]


def look_at_wxyz(eye, up) -> tuple:
    """wxyz of the camera-to-world rotation (OpenCV axes) of a camera at eye facing the origin."""
    from scipy.spatial.transform import Rotation

    z = -np.asarray(eye, dtype=np.float64) / np.linalg.norm(eye)
    x = np.cross(z, np.asarray(up, dtype=np.float64))
    x /= np.linalg.norm(x)
    R = np.stack([x, np.cross(z, x), z], axis=1)
    qx, qy, qz, qw = Rotation.from_matrix(R).as_quat()
    return (qw, qx, qy, qz)


def camera_for(i: int):
    eye, up, fov, aspect, side = VIEWS[i]
    return view_camera(look_at_wxyz(eye, up), eye, fov, aspect, side)


def render_frames(ctx: DistContext, gaussians: Dict[str, torch.Tensor], sh_degree: int) -> List[Any]:
    """The viewer's frame callback on this rank's chunk, for every camera of VIEWS."""
    start, end = chunk_bounds(len(gaussians["means"]), ctx.world_size)[ctx.rank]
    local = {k: v[start:end] for k, v in gaussians.items()}
    model = RenderModel(lambda: local, sh_degree, {"backend": "torch"})
    return [render_view(model, camera_for(i), ctx.device) for i in range(len(VIEWS))]


def port_in_use(ctx: DistContext, port: int) -> str:
    """LiveViewer.start on a port that rank 0's process already listens on: the error text."""
    blocker = None
    if ctx.is_main:  # rank 0's own listener: the port is in use for sure
        blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        blocker.bind(("127.0.0.1", port))
        blocker.listen(1)
    try:
        LiveViewer.start(ctx, "127.0.0.1", port)
    except ValueError as e:
        return str(e)
    finally:
        if blocker is not None:
            blocker.close()
    return "no error"


def _fake_trainer(step_s: float):
    """The public trainer attributes the hook reads; `params` is this rank's chunk."""
    cfg = SimpleNamespace(max_steps=10_000, sh_degree=0, sh_degree_interval=1000, packed=True,
                          backend="torch", near_plane=0.01, far_plane=1e10, antialiased=False)
    g = torch.Generator().manual_seed(0)
    params = {"means": torch.randn(20, 3, generator=g), "scales": torch.full((20, 3), -3.0),
              "quats": torch.randn(20, 4, generator=g), "opacities": torch.zeros(20),
              "sh0": torch.rand(20, 1, 3, generator=g), "shN": torch.zeros(20, 0, 3)}
    return SimpleNamespace(cfg=cfg, params=params, metrics={"loss": 0.5}, n_all=40, scene=None)


def poll_schedule(ctx: DistContext, steps: int, step_s: float, pause_at: int) -> Dict[str, Any]:
    """Runs the hook for `steps` fake steps of `step_s` seconds with a server on rank 0 and
    no browser. Rank 0 presses pause at step pause_at and resume 0.3 s later (as the
    panel's buttons do). Returns the steps that polled and the steps where pauses began."""
    viewer = LiveViewer.start(ctx, "127.0.0.1", 0)
    trainer = _fake_trainer(step_s)
    polled: List[int] = []
    real_poll = viewer._poll

    def counting_poll(model, mode, **kw):
        polled.append(model.version)
        return real_poll(model, mode, **kw)

    viewer._poll = counting_poll
    try:
        for step in range(1, steps + 1):
            time.sleep(step_s)
            if ctx.is_main and step == pause_at:
                with viewer.server._lock:
                    viewer.server._pause_wanted = True

                def resume():  # once every rank has agreed on the pause
                    while not viewer.paused_at:
                        time.sleep(0.01)
                    time.sleep(0.3)
                    with viewer.server._lock:
                        viewer.server._pause_wanted = False

                threading.Thread(target=resume, daemon=True).start()
            viewer.on_step(trainer, step)
    finally:
        viewer.close()
    return {"polled": polled, "paused_at": list(viewer.paused_at)}


def train_with_viewer(ctx: DistContext, port: int, result_dir: str, max_steps: int) -> Dict[str, Any]:
    """cli.run with the viewer attached as distsplat.app does: the built-in synthetic scene,
    small and random-initialized so that frames change visibly as training proceeds."""
    torch.set_num_threads(1)
    from distsplat.app import CONFIGS
    from distsplat.cli import run
    from distsplat.viewer import attach_live_viewer
    from distsplat.train.config import SyntheticConfig

    cfg = copy.deepcopy(CONFIGS["default"][1])  # the app's config: the trainer's flags and the viewer's
    cfg.max_steps, cfg.result_dir, cfg.port = max_steps, result_dir, port
    cfg.eval_steps, cfg.save_steps, cfg.save_ply = [max_steps], [], False
    cfg.synthetic = SyntheticConfig(kind="ball", num_cameras=16, num_gaussians=800, width=48, height=36)
    cfg.init_type, cfg.init_num_pts, cfg.init_extent = "random", 600, 0.4
    cfg.sh_degree, cfg.num_workers, cfg.log_every = 0, 1, 25
    cfg.viewer_res, cfg.viewer_budget = 96, 0.3
    metrics = run(cfg, extensions=[_with_a_browser_from_step_1(attach_live_viewer)])
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float))}


def _with_a_browser_from_step_1(attach, settle_s: float = 2.0, wait_s: float = 40.0):
    """`attach` (the CLI's viewer extension), plus a hook that holds rank 0 after step 1
    until a browser has stayed connected for settle_s (at most wait_s, below the collective
    timeout; the other ranks wait in step 2's collectives). The viewer itself waits for
    nobody, so without it the test raced Chromium's start against training: a machine that
    trained the 50 steps before the page showed left nothing to see or pause. settle_s
    lets the test's page-load loop (which reloads the page until the panel shows) finish
    before training goes on. The browser arrives once, at the start: what the test checks
    (frames, pause and resume, the browser leaving mid-run) all happens after."""
    def extension(cfg, ctx, trainer):
        close = attach(cfg, ctx, trainer)
        viewer = trainer.step_hooks[-1].__self__  # the LiveViewer whose on_step attach added
        waited = []

        def wait_for_a_browser(trainer, step):
            if waited or viewer.server is None:  # once, on rank 0 (the one that serves)
                return
            deadline, since = time.monotonic() + wait_s, None
            while time.monotonic() < deadline:
                if not viewer.server.has_browsers():
                    since = None
                elif since is None:
                    since = time.monotonic()
                elif time.monotonic() - since >= settle_s:
                    break
                time.sleep(0.05)
            waited.append(step)

        trainer.step_hooks.insert(len(trainer.step_hooks) - 1, wait_for_a_browser)
        return close
    return extension
