"""The live viewer's collective side (docs/design.md: the viewer asks the trainer for
distributed renders between steps). One `LiveViewer` per rank; rank 0 also owns the
`ViewerServer` (viser, the browsers).

    every rank, at a step boundary:   step < next_poll ?  -> return (an int compare, nothing else)
    at a poll step (rank 0 picks when, see pacing.py):
        rank 0 turns the browsers' state into a PollMessage (camera to render, pause, next poll)
        broadcast of one [24] float64 vector         <- the poll's one collective + host sync
        camera set: every rank projects its own Gaussians into it, rank 0 rasterizes
                    (distributed_rasterize, camera owned by rank 0; the model is never gathered)
        paused: all ranks stay in the hook, polling, until rank 0 says resume

The Gaussians stay sharded: rank 0 only receives the (Gaussian, pixel-tile) pairs visible
in the one viewer camera, like any camera owner in a training step.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

import numpy as np
import torch
from torch import Tensor

from ..distributed import DistContext, all_reduce_max, broadcast, distributed_rasterize
from .camera import PollMessage, ViewCamera, initial_view
from .pacing import Pacer
from .server import (DEFAULT_PORT, START_FAILED, TRAINER_PORT_HINT, ViewerServer, ViewerStartError,
                     port_error_message)

log = logging.getLogger(__name__)

TRAIN, PAUSED, SERVE = "train", "paused", "serve"  # what a poll interrupts


@dataclass
class RenderModel:
    """What a viewer frame renders: this rank's chunk, activated (as `activated()` gives)."""

    # -> means [N, 3], quats [N, 4], scales [N, 3], opacities [N], colors [N, K, 3]
    gaussians: Callable[[], Dict[str, Tensor]]
    sh_degree: Optional[int]
    render_kwargs: Dict[str, Any] = field(default_factory=dict)  # packed, backend, near_plane, ...
    version: int = 0  # changes whenever the Gaussians do (the training step)


@torch.no_grad()
def render_view(model: RenderModel, camera: ViewCamera, device: torch.device) -> Optional[Tensor]:
    """The viewer's render callback; every rank calls it with the same camera. Returns
    the image [H, W, 3] in [0, 1] on rank 0 (the camera's owner), None on the others."""
    viewmat, K = camera.tensors(device)  # [1, 4, 4], [1, 3, 3]
    g = model.gaussians()
    colors, _, meta = distributed_rasterize(
        g["means"], g["quats"], g["scales"], g["opacities"], g["colors"], viewmat, K,
        camera.width, camera.height, torch.zeros(1, dtype=torch.int64, device=device),
        sh_degree=model.sh_degree, **model.render_kwargs,
    )
    return colors[0, ..., :3].clamp(0, 1) if colors.shape[0] else None


def to_uint8(image: Tensor) -> np.ndarray:
    """[H, W, 3] float in [0, 1] -> uint8 numpy (what the browser receives)."""
    return (image * 255).round().to(torch.uint8).cpu().numpy()


class LiveViewer:
    """Built on every rank with `start` (rank 0 serves); `on_step` is the trainer hook,
    `serve` shows a finished model until stopped."""

    def __init__(self, ctx: DistContext, server: Optional[ViewerServer], pacer: Pacer):
        self.ctx, self.server, self.pacer = ctx, server, pacer
        self.next_poll = 0  # the first hook call polls (every rank starts from the same 0)
        self.paused_at: list = []  # steps where a pause began (same on every rank)
        self._view_set = False

    @classmethod
    def start(cls, ctx: DistContext, host: str = "127.0.0.1", port: Optional[int] = None,
              max_side: int = 512, budget: float = 0.03, max_fps: float = 20.0,
              title: str = "distsplat", port_hint: str = TRAINER_PORT_HINT) -> "LiveViewer":
        """Starts the server on rank 0: on `port`, or (None) on 8080 or a free port when
        8080 is taken, saying which. An explicit port in use (or any start failure) raises
        the same ValueError naming the port (and `port_hint`, what to pass) on every rank,
        before training: rank 0's outcome reaches the others in one tiny all-reduce, so
        nobody waits in a later collective."""
        pacer = Pacer(budget=budget, max_fps=max_fps)  # bad values raise on every rank alike
        server, code = None, 0
        if ctx.is_main:
            try:
                server = ViewerServer(host, port, max_side, title)
            except ViewerStartError as e:
                code = e.code
            except Exception:  # noqa: BLE001 - must still reach the all-reduce below
                log.exception("viewer: could not start")
                code = START_FAILED
        code = int(all_reduce_max(torch.tensor([code], device=ctx.device)).item())
        if code:
            if server is not None:
                server.close()
            error = ValueError(port_error_message(code, host, DEFAULT_PORT if port is None else port, port_hint))
            error.agreed = True  # type: ignore[attr-defined]  # every rank raises it: rank 0 says it, once
            raise error
        if server is not None:
            if server.moved_from is not None:
                log.warning("viewer: port %d is in use (another run?); serving on port %d instead (--port P picks one)",
                            server.moved_from, server.port)
            log.info("viewer: open %s in a browser (ssh -L %d:%s:%d HOST for a remote box)",
                     server.url, server.port, host, server.port)
        return cls(ctx, server, pacer)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    # ------------------------------------------------------------- training
    def on_step(self, run: Any, step: int) -> None:
        """The trainer's step hook, on every rank after each step. `run`: the run as
        extensions see it (train/run_view.py: cfg, scene, train_np, params, app, metrics, n_all)."""
        max_steps = run.cfg.max_steps
        if step < self.next_poll and step != max_steps:  # every rank knows both numbers
            return  # the common case: no sync, no collective
        t0 = time.perf_counter()
        main = self.server is not None
        if main:
            self.pacer.observe_steps(t0, step)
            if not self._view_set and getattr(run, "scene", None) is not None:
                # The first training camera's view (a test camera may come first in the scene)
                train = getattr(run, "train_np", None)
                c2w = run.scene.camtoworlds[train if train is not None else slice(None)]  # [C, 4, 4] float64
                self.server.set_initial_view(*initial_view(c2w))
                self._view_set = True
        model = trainer_model(run, step)
        msg = self._poll(model, TRAIN, stats=lambda paused: self._stats(
            run, step, "**paused**" if paused else "training"))
        if msg.paused:
            self.paused_at.append(step)
            if main:
                log.info("viewer: training paused at step %d", step)
            while msg.paused:
                msg = self._poll(model, PAUSED)
            if main:
                log.info("viewer: training resumed at step %d", step)
                self.server.show(self._stats(run, step, "training"), paused=False)
        self.next_poll = step + msg.interval
        if main:
            if step >= max_steps:
                self.server.show(self._stats(run, step, "**done**"), paused=None)
            self.pacer.add_viewer_time(time.perf_counter() - t0)

    def _stats(self, run: Any, step: int, status: str) -> str:
        m = run.metrics
        lines = [f"step: **{step}** / {run.cfg.max_steps}",
                 f"loss: {m['loss']:.5f}" if "loss" in m else "loss: -",
                 f"Gaussians: {run.n_all:,}",
                 f"steps/s: {self.pacer.steps_per_s:.2f}",
                 f"PSNR: {m['val_psnr']:.3f} (step {m.get('val_step', '?')})"
                 if "val_psnr" in m else "PSNR: -",
                 f"status: {status}"]
        return "  \n".join(lines)

    def keep_open(self, run: Any) -> None:
        """--viewer_keep_open, the trainer's end hook on every rank: serve the final model
        (already saved) until Ctrl-C, as gsplat's viewer does. Only when rank 0's stdin is a
        terminal, where a Ctrl-C can come: otherwise (a job script, CI) rank 0 stops the
        serving at its first poll and says why, so a non-interactive run never blocks."""
        interactive = self.server is not None and _stdin_is_a_terminal()
        if self.server is not None:
            if interactive:
                log.info("viewer: training done; serving the final model at %s until Ctrl-C", self.server.url)
            else:
                log.info("viewer: --viewer_keep_open serves only when stdin is a terminal (Ctrl-C ends it); "
                         "this run is not interactive, so the viewer closes now")
        model = trainer_model(run, run.cfg.max_steps)
        try:
            self.serve(model, seconds=None if interactive else 0.0,
                       info=self._stats(run, run.cfg.max_steps, "**done**, Ctrl-C closes the viewer"))
        except KeyboardInterrupt:
            if self.server is not None:  # the other ranks wait in the next poll: tell them to stop
                log.info("viewer: closed (Ctrl-C)")
                self._poll(model, SERVE, stop=True)

    # --------------------------------------------------------------- serving
    def serve(self, model: RenderModel, seconds: Optional[float] = None, info: str = "",
              view: Optional[tuple] = None) -> None:
        """Shows a finished model until rank 0 stops (after `seconds`, or never); every
        rank calls it. Polls at most max_fps times a second and renders when a browser's
        view is out of date. view: (position, look_at, up) of a browser's first view."""
        if self.server is not None:
            if view is not None:
                self.server.set_initial_view(*view)
            self.server.show(info, paused=None)
            self.server.hide_training_controls()
        t_end = None if seconds is None else time.perf_counter() + seconds
        while True:
            stop = t_end is not None and time.perf_counter() >= t_end
            if self._poll(model, SERVE, stop=stop).stop:
                return

    # ------------------------------------------------------------------ poll
    def _poll(self, model: RenderModel, mode: str, stop: bool = False,
              stats: Optional[Callable[[bool], str]] = None) -> PollMessage:
        """One poll on every rank: rank 0 decides, one broadcast, maybe one frame. mode:
        TRAIN (a step boundary; frames within the budget), PAUSED (the pause loop) or
        SERVE (a finished model); the last two poll at most max_fps times a second."""
        ctx, server = self.ctx, self.server
        request = None
        if server is not None:
            if mode != TRAIN:  # nothing else to wait for: keep polls (and frames) at max_fps
                time.sleep(max(0.0, 1.0 / self.pacer.max_fps - (time.perf_counter() - self.pacer.last_poll)))
            try:
                request, msg = self._decide(model, mode, stop)
                if stats is not None:
                    server.show(stats(msg.paused), paused=msg.paused)
            except Exception:  # noqa: BLE001 - a viewer bug must not stall the other ranks
                log.exception("viewer: poll failed; training goes on")
                request, msg = None, PollMessage(interval=1, stop=stop)
            buf = msg.pack(ctx.device)
        else:
            buf = PollMessage.empty(ctx.device)
        msg = PollMessage.unpack(broadcast(buf).tolist())  # the poll's one host sync
        if msg.camera is not None:
            t0 = time.perf_counter()
            image = render_view(model, msg.camera, ctx.device)
            if server is not None:
                server.send_frame(request.client_id, to_uint8(image))
                self.pacer.frame_done(t0, time.perf_counter(), training=mode == TRAIN)
        if server is not None:
            self.pacer.last_poll = time.perf_counter()
        return msg

    def _decide(self, model: RenderModel, mode: str, stop: bool):
        """Rank 0: the poll message from the browsers' state and the pacer."""
        server, pacer = self.server, self.pacer
        now = time.perf_counter()
        browsers = server.has_browsers()
        request = None
        if browsers and not stop and pacer.frame_allowed(now, training=mode == TRAIN):
            request = server.next_request(model.version)
        paused = mode != SERVE and not stop and server.pause_wanted()
        msg = PollMessage(interval=pacer.interval(now, browsers), paused=paused, stop=stop,
                          camera=request.camera if request is not None else None)
        return request, msg


def trainer_model(run: Any, step: int) -> RenderModel:
    """The trainer's Gaussians as the viewer renders them, with the SH degree in use at
    `step` and the trainer's render options."""
    from ..train.model.gaussians import activated

    cfg = run.cfg
    sh = min(step // cfg.sh_degree_interval, cfg.sh_degree)
    kwargs = dict(packed=cfg.packed, backend=cfg.backend, near_plane=cfg.near_plane,
                  far_plane=cfg.far_plane, rasterize_mode="antialiased" if cfg.antialiased else "classic")
    app = getattr(run, "app", None)
    if app is not None:  # --app_opt: the colour MLP at a zero embedding, as the test images
        kwargs["pair_colors"] = app.pair_colors(sh, None)
        sh = None
    return RenderModel(lambda: activated(run.params, sh), sh, kwargs, version=step)


def attach_live_viewer(cfg: Any, ctx: DistContext, run: Any) -> Optional[Callable[[], None]]:
    """The trainer CLI's extension: unless --disable_viewer, serve on rank 0 and hook into
    every step (and with --viewer_keep_open, serve the final model after training). Started
    once setup succeeded on every rank (cli.run), so bad flags or data fail before any banner;
    a port in use fails alike on every rank, before training. `cfg`: the app's config (the
    trainer's flags and viewer.config.ViewerConfig's); `run`: the run as extensions see it
    (train/run_view.py), its hooks included."""
    if cfg.disable_viewer or cfg.eval_only or cfg.render_only:  # nothing to watch: simple_viewer.py shows a checkpoint
        return None
    viewer = LiveViewer.start(ctx, cfg.viewer_host, cfg.port, max_side=cfg.viewer_res,
                              budget=cfg.viewer_budget)
    run.step_hooks.append(viewer.on_step)
    if cfg.viewer_keep_open:
        run.end_hooks.append(viewer.keep_open)
    return viewer.close


def _stdin_is_a_terminal() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (ValueError, OSError):  # closed or detached
        return False
