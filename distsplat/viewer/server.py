"""Rank 0's web side of the live viewer (docs/design.md: the viewer asks the trainer for
distributed renders between steps): a viser server, its panel, and the browsers' cameras.

Everything here runs on rank 0 only and never talks to other ranks. Browser events arrive
on viser's threads and only write small state under a lock (the latest camera per
browser: requests coalesce, latest wins; the pause button's wish). The training thread
reads that state at a poll step (`next_request`, `pause_wanted`) and hands finished frames
and panel text to a sender thread (`send_frame`, `show`), which does the JPEG encoding
and the websocket writes. So a slow or vanished browser can delay only the sender thread,
never a training step.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np

from .camera import ViewCamera, view_camera

log = logging.getLogger(__name__)

# Why the viewer could not start; the code travels to every rank, which all raise the
# same message (ranks other than 0 never see rank 0's exception text).
PORT_IN_USE, PORT_UNAVAILABLE, START_FAILED = 1, 2, 3
REASONS = {
    PORT_IN_USE: "is already in use",
    PORT_UNAVAILABLE: "cannot be bound on this machine (address not local, or a privileged port)",
    START_FAILED: "could not start the viser server (see rank 0's log)",
}


DEFAULT_PORT = 8080  # --port's default; when it is taken, a free port is served instead (issue 32)


TRAINER_PORT_HINT = "pass a free --port or --disable_viewer"


def port_error_message(code: int, host: str, port: int, hint: str = TRAINER_PORT_HINT) -> str:
    return f"--port {port}: the viewer's address {host}:{port} {REASONS[code]}; {hint}"


def free_port(host: str) -> int:
    """A port of `host` that nobody listens on now (the OS picks it)."""
    family = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0][0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port(host: str, port: int) -> int:
    """0 when (host, port) can be bound now, else PORT_IN_USE / PORT_UNAVAILABLE. Binds
    with SO_REUSEADDR like the server will, so a port in TIME_WAIT counts as free."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        return PORT_IN_USE if e.errno == errno.EADDRINUSE else PORT_UNAVAILABLE
    return 0


@dataclass
class _Browser:
    """The latest camera of one browser and what its last frame showed."""

    wxyz: Tuple[float, ...]
    position: Tuple[float, ...]
    fov: float
    aspect: float
    version: int = 0  # bumped by every camera message
    served: Tuple[int, int, int] = (-1, -1, -1)  # (version, model version, max side) last rendered
    served_at: float = 0.0


@dataclass(frozen=True)
class Request:
    client_id: int
    camera: ViewCamera


class ViewerServer:
    """The viser server on (host, port) with the training panel. Raises OSError-free:
    construction failures surface as `ViewerStartError(code)`."""

    def __init__(self, host: str, port: Optional[int], max_side: int, title: str = "distsplat"):
        """port None: DEFAULT_PORT, or a free one when it is taken (`moved_from` says so);
        an explicit port must be free."""
        import viser  # imported here: a run with --disable_viewer never loads it

        self.moved_from: Optional[int] = None
        code = check_port(host, DEFAULT_PORT if port is None else port)
        if port is None:
            port = DEFAULT_PORT
            if code == PORT_IN_USE:  # a second run on this machine: not worth stopping for
                self.moved_from, port = DEFAULT_PORT, free_port(host)
                code = check_port(host, port)
        if code:
            raise ViewerStartError(code)
        try:
            # viser moves on to the next port when its own bind fails; we refuse that below
            # instead, because a user told to open :8080 must find the viewer there.
            self.server = viser.ViserServer(host=host, port=port, label=title, verbose=False)
        except Exception as e:  # noqa: BLE001 - any start failure becomes a code for all ranks
            log.error("viser failed to start on %s:%d: %r", host, port, e)
            raise ViewerStartError(START_FAILED) from e
        if port != 0 and self.server.get_port() != port:  # lost a race for the port
            self.server.stop()
            raise ViewerStartError(PORT_IN_USE)
        self.host, self.port = host, self.server.get_port()
        self._lock = threading.Lock()
        self._browsers: Dict[int, _Browser] = {}
        self._pause_wanted = False
        self._max_side = int(max_side)
        self._sender = _Sender(self)
        self._build_panel(max_side)
        self.server.on_client_connect(self._on_connect)
        self.server.on_client_disconnect(self._on_disconnect)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ---------------------------------------------------------------- panel
    def _build_panel(self, max_side: int) -> None:
        gui = self.server.gui
        # The share button opens a public tunnel: not from a training box, not by a click.
        gui.configure_theme(show_share_button=False)
        with gui.add_folder("Status"):
            self._stats = gui.add_markdown("step -")
            self._pause = gui.add_button("Pause", hint="Pause training at the next step boundary")
            self._resume = gui.add_button("Resume", disabled=True, hint="Resume training")
        with gui.add_folder("Rendering"):
            self._res = gui.add_slider("Max render side (px)", min=32, max=2048, step=16,
                                       initial_value=int(min(max(max_side, 32), 2048)))

        @self._pause.on_click
        def _(_event) -> None:
            with self._lock:
                self._pause_wanted = True

        @self._resume.on_click
        def _(_event) -> None:
            with self._lock:
                self._pause_wanted = False

        @self._res.on_update
        def _(_event) -> None:
            with self._lock:
                self._max_side = int(self._res.value)

    def hide_training_controls(self) -> None:
        self._pause.visible = self._resume.visible = False

    def set_initial_view(self, position: np.ndarray, look_at: np.ndarray, up: np.ndarray) -> None:
        cam = self.server.initial_camera
        cam.position, cam.look_at, cam.up = tuple(position), tuple(look_at), tuple(up)

    # ------------------------------------------------------------- browsers
    def _on_connect(self, client) -> None:
        @client.camera.on_update
        def _(camera) -> None:
            with self._lock:
                old = self._browsers.get(client.client_id)
                b = _Browser(tuple(camera.wxyz), tuple(camera.position), float(camera.fov),
                             float(camera.aspect))
                if old is not None:
                    b.version, b.served, b.served_at = old.version + 1, old.served, old.served_at
                self._browsers[client.client_id] = b

        camera = client.camera
        with self._lock:
            self._browsers[client.client_id] = _Browser(
                tuple(camera.wxyz), tuple(camera.position), float(camera.fov), float(camera.aspect))
        log.info("viewer: browser %d connected", client.client_id)

    def _on_disconnect(self, client) -> None:
        with self._lock:
            self._browsers.pop(client.client_id, None)
        log.info("viewer: browser %d disconnected", client.client_id)

    def has_browsers(self) -> bool:
        with self._lock:
            return bool(self._browsers)

    def pause_wanted(self) -> bool:
        with self._lock:
            return self._pause_wanted

    def next_request(self, model_version: int) -> Optional[Request]:
        """The browser whose view is most out of date (a moved camera, a newer model or a
        new resolution), marked as served; None when every browser shows the latest."""
        with self._lock:
            side = self._max_side
            due = [(b.served_at, cid) for cid, b in self._browsers.items()
                   if b.served != (b.version, model_version, side)]
            if not due:
                return None
            _, cid = min(due)
            b = self._browsers[cid]
            b.served, b.served_at = (b.version, model_version, side), time.monotonic()
            wxyz, position, fov, aspect = b.wxyz, b.position, b.fov, b.aspect
        return Request(cid, view_camera(wxyz, position, fov, aspect, side))

    # -------------------------------------------------------------- outputs
    def send_frame(self, client_id: int, image: np.ndarray) -> None:
        """Hands image [H, W, 3] uint8 to the sender thread; returns at once."""
        self._sender.put(frame=(client_id, image))

    def show(self, stats: str, paused: Optional[bool] = None) -> None:
        """Panel text (markdown) and button states; returns at once."""
        self._sender.put(stats=(stats, paused))

    def close(self) -> None:
        self._sender.close()
        self.server.stop()

    # The sender thread's side: may block on a slow browser, never on training.
    def _deliver_frame(self, client_id: int, image: np.ndarray) -> None:
        client = self.server.get_clients().get(client_id)
        if client is not None:  # gone since: drop the frame
            client.scene.set_background_image(image, format="jpeg", jpeg_quality=90)

    def _deliver_stats(self, stats: str, paused: Optional[bool]) -> None:
        self._stats.content = stats
        if paused is not None:
            self._pause.disabled, self._resume.disabled = paused, not paused


class ViewerStartError(Exception):
    def __init__(self, code: int):
        super().__init__(REASONS[code])
        self.code = code


class _Sender(threading.Thread):
    """One slot per kind (the latest frame, the latest panel text): a browser that cannot
    keep up sees fewer frames, and nothing queues up behind it."""

    def __init__(self, owner: ViewerServer):
        super().__init__(name="distsplat-viewer-sender", daemon=True)
        self._owner = owner
        self._cv = threading.Condition()
        self._slots: Dict[str, object] = {}
        self._closed = False
        self.start()

    def put(self, **items: object) -> None:
        with self._cv:
            self._slots.update(items)
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self.join(timeout=5.0)

    def run(self) -> None:
        while True:
            with self._cv:
                while not self._slots and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                slots, self._slots = self._slots, {}
            try:
                if "frame" in slots:
                    self._owner._deliver_frame(*slots["frame"])
                if "stats" in slots:
                    self._owner._deliver_stats(*slots["stats"])
            except Exception as e:  # noqa: BLE001 - a browser gone mid-frame must not kill the viewer
                log.debug("viewer: could not deliver to a browser: %r", e)
