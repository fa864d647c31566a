"""The viewer's pieces on one process: browser camera -> render camera, the poll message,
the pacing arithmetic, request coalescing, the port check, finished-model loading (PLY and
checkpoints re-chunked for W ranks), simple_viewer end to end, and layering."""

import ast
import math
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import distsplat.viewer
from distsplat.distributed import DistContext, chunk_bounds
from distsplat.train.files import checkpoint as ck
from distsplat.train.files.export import write_ply
from distsplat.viewer import (LiveViewer, Pacer, PollMessage, ViewerServer, check_port,
                              load_model, read_ply_chunk, render_size, view_camera)
from distsplat.viewer.server import PORT_IN_USE, _Browser

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


def _ctx(rank=0, world_size=1):
    return DistContext(rank=rank, world_size=world_size, local_rank=rank, device=CPU, backend=None)


def test_view_camera_inverts_the_browser_pose():
    angle = 0.7  # rotation about z
    wxyz = (math.cos(angle / 2), 0.0, 0.0, math.sin(angle / 2))
    cam = view_camera(wxyz, (1.0, 2.0, 3.0), fov_y=math.radians(60), aspect=16 / 9, max_side=320)
    assert (cam.width, cam.height) == (320, 180)
    assert cam.viewmat @ np.array([1.0, 2.0, 3.0, 1.0]) == pytest.approx([0, 0, 0, 1], abs=1e-12)
    R = np.array([[math.cos(angle), -math.sin(angle), 0], [math.sin(angle), math.cos(angle), 0], [0, 0, 1]])
    np.testing.assert_allclose(cam.viewmat[:3, :3], R.T, atol=1e-12)
    assert cam.fy == pytest.approx(90 / math.tan(math.radians(30)))
    assert (cam.cx, cam.cy) == (160.0, 90.0)
    assert render_size(0.5, 100) == (50, 100) and render_size(float("nan"), 64) == (64, 48)


def test_poll_message_round_trip():
    cam = view_camera((1, 0, 0, 0), (0, 0, -4), 0.8, 1.5, 96)
    for msg in (PollMessage(7), PollMessage(3, paused=True, camera=cam), PollMessage(1, stop=True)):
        back = PollMessage.unpack(msg.pack(CPU).tolist())
        assert (back.interval, back.paused, back.stop) == (msg.interval, msg.paused, msg.stop)
        if msg.camera is None:
            assert back.camera is None
        else:
            np.testing.assert_array_equal(back.camera.viewmat, cam.viewmat)
            assert (back.camera.width, back.camera.height, back.camera.fy) == (cam.width, cam.height, cam.fy)


def test_pacer_keeps_frames_within_the_budget():
    p = Pacer(budget=0.05, max_fps=20, max_wait_s=0.5)
    assert p.interval(0.0, want_frames=True) == 1  # nothing measured yet: poll next step
    p.observe_steps(0.0, 1)
    p.observe_steps(1.0, 11)  # 0.1 s per step
    assert p.step_s == pytest.approx(0.1)
    assert p.interval(1.0, want_frames=False) == 5  # max_wait_s / step
    p.frame_done(1.0, 1.02, training=True)  # a 20 ms frame buys 380 ms of training
    assert not p.frame_allowed(1.3, training=True) and p.frame_allowed(1.41, training=True)
    assert p.interval(1.02, want_frames=True) == 4
    assert p.frame_allowed(1.08, training=False)  # paused: only max_fps limits
    with pytest.raises(ValueError):
        Pacer(budget=0.0)


def test_port_in_use_is_refused_before_anything_starts():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert check_port("127.0.0.1", port) == PORT_IN_USE
        with pytest.raises(ValueError, match=f"--port {port}: .*already in use"):
            LiveViewer.start(_ctx(), "127.0.0.1", port)


def test_requests_coalesce_latest_camera_wins():
    server = ViewerServer("127.0.0.1", 0, max_side=64)
    try:
        assert server.next_request(model_version=0) is None  # no browser
        for x in (1.0, 2.0, 3.0):  # three camera messages before a poll: one request
            with server._lock:
                old = server._browsers.get(7)
                b = _Browser((1, 0, 0, 0), (x, 0, -4), 0.8, 1.0)
                b.version = old.version + 1 if old else 0
                if old:
                    b.served = old.served
                server._browsers[7] = b
        req = server.next_request(model_version=5)
        assert req.client_id == 7 and req.camera.viewmat[0, 3] == pytest.approx(-3.0)
        assert server.next_request(model_version=5) is None  # up to date
        assert server.next_request(model_version=6) is not None  # the model trained on
        server._on_disconnect(type("C", (), {"client_id": 7})())
        assert server.next_request(model_version=7) is None
    finally:
        server.close()


def test_a_stuck_or_vanished_browser_never_blocks_the_training_thread():
    import threading
    import time

    server = ViewerServer("127.0.0.1", 0, max_side=64)
    release, delivered = threading.Event(), []

    def stuck(client_id, image):  # a websocket write that hangs (browser gone mid-frame)
        delivered.append(client_id)
        release.wait(10)
        raise ConnectionError("browser went away")

    try:
        server.send_frame(123, np.zeros((4, 4, 3), np.uint8))  # no such browser: dropped
        time.sleep(0.1)
        server._deliver_frame = stuck
        t0 = time.perf_counter()
        for i in range(5):  # the training thread hands frames over while the sender hangs
            server.send_frame(i, np.zeros((4, 4, 3), np.uint8))
            server.show(f"step {i}")
        assert time.perf_counter() - t0 < 0.5  # the stuck write holds the sender for 10 s
        release.set()
        time.sleep(0.2)
        assert delivered[-1] == 4 and len(delivered) <= 2  # latest wins: no backlog of frames
        assert server._sender.is_alive()  # the error was swallowed, the sender goes on
    finally:
        release.set()
        server.close()


def _raw_params(n, sh_rest, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"means": torch.randn(n, 3, generator=g), "scales": torch.randn(n, 3, generator=g),
            "quats": torch.randn(n, 4, generator=g), "opacities": torch.randn(n, generator=g),
            "sh0": torch.randn(n, 1, 3, generator=g), "shN": torch.randn(n, sh_rest, 3, generator=g)}


def test_ply_chunks_of_w_ranks_give_back_the_model(tmp_path):
    params = _raw_params(23, 3)
    path = write_ply(tmp_path / "m.ply", params)
    for W in (1, 3):
        chunks = [read_ply_chunk(path, r, W) for r in range(W)]
        assert all(n == 23 for _, n in chunks)
        for k, v in params.items():
            torch.testing.assert_close(torch.cat([c[k] for c, _ in chunks]), v)
    model = load_model(str(path), _ctx(1, 2))
    assert model.sh_degree == 1 and model.n_all == 23 and len(model.params["means"]) == 11


def test_checkpoint_of_2_ranks_rechunks_onto_3(tmp_path):
    params = _raw_params(17, 0, seed=1)
    root, step = tmp_path / "ckpts", 30
    ck.begin(root, step)
    bounds = chunk_bounds(17, 2)
    for r, (a, b) in enumerate(bounds):
        rows = {k: torch.nn.Parameter(v[a:b]) for k, v in params.items()}
        ck.write_shard(root, step, r, ck.shard_payload(rows, {}))
    ck.finalize(root, step, [b - a for a, b in bounds], {"config": {"packed": False}})
    got = [load_model(str(root), _ctx(r, 3)) for r in range(3)]
    assert got[0].render_kwargs == {"packed": False} and got[0].sh_degree == 0
    for k, v in params.items():
        torch.testing.assert_close(torch.cat([m.params[k] for m in got]), v)
    with pytest.raises(ValueError, match="no complete checkpoint"):
        load_model(str(tmp_path / "nothing"), _ctx())


def test_simple_viewer_serves_a_ply_and_stops(tmp_path, monkeypatch):
    path = write_ply(tmp_path / "m.ply", _raw_params(40, 0))
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    import simple_viewer

    simple_viewer.main(simple_viewer.Args(ckpt=str(path), port=0, seconds=0.3))
    with pytest.raises(SystemExit) as exit_:
        simple_viewer.main(simple_viewer.Args(ckpt=str(tmp_path / "missing.ply"), port=0))
    assert exit_.value.code == 2
    sys.modules.pop("simple_viewer", None)


def test_simple_viewer_moves_off_a_taken_default_port(tmp_path, monkeypatch, caplog):
    """Its --port defaults to the trainer viewer's: 8080, or a free port when 8080 is taken."""
    path = write_ply(tmp_path / "m.ply", _raw_params(40, 0))
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    import simple_viewer

    held = socket.socket()
    try:
        held.bind(("127.0.0.1", 8080))
        held.listen()
    except OSError:  # someone else holds 8080: taken all the same
        held.close()
        held = None
    try:
        with caplog.at_level("INFO", logger="distsplat"):
            simple_viewer.main(simple_viewer.Args(ckpt=str(path), seconds=0.3))
    finally:
        if held is not None:
            held.close()
        sys.modules.pop("simple_viewer", None)
    said = [r.getMessage() for r in caplog.records if r.name.startswith("distsplat.viewer")]
    moved = [m for m in said if m.startswith("viewer: port 8080 is in use (another run?); serving on port ")]
    assert moved and any(m.startswith("viewer: open http://127.0.0.1:") for m in said), said


def test_viewer_layering_and_size():
    """The viewer sits above train and never talks to torch.distributed itself."""
    for path in Path(distsplat.viewer.__file__).parent.glob("*.py"):
        text = path.read_text()
        assert len(text.splitlines()) < 500, f"{path.name} is past ~500 lines"
        for node in ast.walk(ast.parse(text)):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not any(n.startswith("torch.distributed") for n in names), f"{path.name} imports {names}"
