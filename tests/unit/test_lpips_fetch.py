"""LPIPS out of the box (issue 32): weights missing from the usual places are downloaded
into torch hub's cache where the machine is online, and offline LPIPS is skipped with one
short line, never a hang or a failed run. Nothing leaves this machine: the "servers" are
local (a real HTTP server on 127.0.0.1, a closed port, a port that never answers), and the
downloads-off switch every other test runs under (tests/conftest.py) is unset here only."""

from __future__ import annotations

import hashlib
import io
import socket
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, Iterator

import pytest
import torch

from distsplat.distributed import DistContext
from distsplat.train.scoring import lpips as lp
from distsplat.train.scoring.lpips import LPIPS, fetch_weights, load_lpips, ready_lpips, short_lpips_note

real_urlopen = lp.urlopen


@pytest.fixture
def online(tmp_path, monkeypatch) -> Path:
    """Downloads on, torch hub's cache in tmp_path, no heads from an installed package."""
    monkeypatch.delenv(lp.NO_DOWNLOAD_ENV, raising=False)
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    monkeypatch.setattr(lp, "_package_dir", lambda name: None)
    return tmp_path / "hub" / "checkpoints"


@contextmanager
def serve(files: Dict[str, bytes], trickle: bool = False) -> Iterator[str]:
    """A local HTTP server of `files` by name; `trickle`: headers, then a byte every 20 ms."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = files.get(self.path.rsplit("/", 1)[-1])
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                if not trickle:
                    self.wfile.write(body)
                    return
                for i in range(len(body)):
                    self.wfile.write(body[i:i + 1])
                    self.wfile.flush()
                    time.sleep(0.02)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up, as it should
                pass

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def within(seconds: float, fn, *args, **kwargs):
    """fn's result, failing (not hanging) when it takes longer than `seconds`."""
    out = []
    worker = threading.Thread(target=lambda: out.append(fn(*args, **kwargs)), daemon=True)
    worker.start()
    worker.join(seconds)
    assert out, f"{fn.__name__} still running after {seconds} s: a download must never hang a run"
    return out[0]


def alex_files():
    """A random AlexNet backbone (10 MB) in torchvision's layout and lpips' real v0.1 alex heads (torchmetrics')."""
    tml = pytest.importorskip("torchmetrics.functional.image.lpips")
    torch.manual_seed(0)
    buf = io.BytesIO()
    torch.save({f"features.{k}": v for k, v in LPIPS("alex").features.state_dict().items()}, buf)
    heads = (Path(tml.__file__).parent / "lpips_models" / "alex.pth").read_bytes()
    return buf.getvalue(), heads


def point_at(monkeypatch, base: str, backbone_sha: str) -> None:
    monkeypatch.setitem(lp.BACKBONE_URLS, "alex", f"{base}/models/alexnet-owt-7be5be79.pth")
    monkeypatch.setitem(lp.BACKBONE_SHA256, "alex", backbone_sha)
    monkeypatch.setattr(lp, "HEAD_URL", base + "/lpips/weights/v0.1/{net}.pth")


def heads_cached(cache: Path) -> None:
    """lpips' real alex heads already in torch hub's cache: only the backbone is missing."""
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "lpips_v0.1_alex-df73285e.pth").write_bytes(alex_files()[1])


def test_the_heads_hashes_are_those_lpips_publishes():
    tml = pytest.importorskip("torchmetrics.functional.image.lpips")
    for net in ("alex", "vgg"):
        data = (Path(tml.__file__).parent / "lpips_models" / f"{net}.pth").read_bytes()
        assert hashlib.sha256(data).hexdigest() == lp.HEAD_SHA256[net]
    assert all(lp.BACKBONE_URLS[n].endswith("/" + lp.BACKBONE_FILES[n]) for n in ("alex", "vgg"))
    assert all(f"-{lp.BACKBONE_SHA256[n]}." in lp.BACKBONE_FILES[n] for n in ("alex", "vgg"))


def test_missing_weights_are_downloaded_once_into_torch_hubs_cache(online, monkeypatch):
    backbone, heads = alex_files()
    said = []
    with serve({"alexnet-owt-7be5be79.pth": backbone, "alex.pth": heads}) as base:
        point_at(monkeypatch, base, hashlib.sha256(backbone).hexdigest()[:8])
        assert load_lpips("alex")[0] is None
        assert fetch_weights("alex", say=lambda fmt, *a: said.append(fmt % a)) is None
        model, note = load_lpips("alex")
        assert model is not None, note
        assert note == (f"LPIPS alex: backbone {online / 'alexnet-owt-7be5be79.pth'}, "
                        f"heads {online / 'lpips_v0.1_alex-df73285e.pth'}")
        assert sorted(p.name for p in online.iterdir()) == ["alexnet-owt-7be5be79.pth", "lpips_v0.1_alex-df73285e.pth"]
        mb = f"{len(backbone) / 1e6:.0f} MB"
        assert said == [f"LPIPS alex: downloading {base}/lpips/weights/v0.1/alex.pth (6 kB) into {online} (once)",
                        f"LPIPS alex: downloading {base}/models/alexnet-owt-7be5be79.pth ({mb}) into {online} (once)"]
        said.clear()
        assert fetch_weights("alex", say=said.append) is None and said == []  # cached: nothing fetched again


def test_unreachable_heads_spare_the_backbones_download(online, monkeypatch):
    backbone, _ = alex_files()
    asked = []
    monkeypatch.setattr(lp, "urlopen", lambda req, **kw: asked.append(req.full_url) or real_urlopen(req, **kw))
    with serve({"alexnet-owt-7be5be79.pth": backbone}) as base:  # no heads there: 404
        point_at(monkeypatch, base, hashlib.sha256(backbone).hexdigest()[:8])
        note = fetch_weights("alex")
    assert note.startswith("LPIPS skipped: could not download alex.pth from 127.0.0.1:")
    assert "(HTTPError: HTTP Error 404: Not Found)" in note, note
    assert asked == [f"{base}/lpips/weights/v0.1/alex.pth"] and list(online.iterdir()) == []


def test_a_file_with_the_wrong_hash_is_not_cached(online, monkeypatch):
    backbone, heads = alex_files()
    with serve({"alexnet-owt-7be5be79.pth": backbone + b"x", "alex.pth": heads}) as base:
        point_at(monkeypatch, base, hashlib.sha256(backbone).hexdigest()[:8])
        note = fetch_weights("alex")
        assert note.startswith("LPIPS skipped: could not download alexnet-owt-7be5be79.pth from 127.0.0.1:")
        assert "(ValueError: its SHA-256 " in note  # the heads came; no backbone, no .partial:
        assert [p.name for p in online.iterdir()] == ["lpips_v0.1_alex-df73285e.pth"]


def test_offline_is_skipped_with_one_short_line(online, monkeypatch):
    with socket.socket() as s:  # a port nobody listens on: refused at once, as an offline DNS fails
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    heads_cached(online)
    point_at(monkeypatch, f"http://127.0.0.1:{port}", "7be5be79")
    note = within(10, fetch_weights, "alex")
    line = short_lpips_note(note)
    assert line == (f"LPIPS skipped: could not download alexnet-owt-7be5be79.pth from 127.0.0.1:{port} "
                    "(ConnectionRefusedError: [Errno 111] Connection refused) "
                    "(what to pass: lpips_skipped in stats/val_stepNNNN.json, or --help)")
    assert "pass --lpips_weights" in note and [p.name for p in online.iterdir()] == ["lpips_v0.1_alex-df73285e.pth"]


def test_a_server_that_never_answers_times_out(online, monkeypatch):
    heads_cached(online)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)  # connects, then silence
        point_at(monkeypatch, f"http://127.0.0.1:{s.getsockname()[1]}", "7be5be79")
        note = within(10, fetch_weights, "alex", timeout_s=0.5)
    assert "could not download alexnet-owt-7be5be79.pth" in note and "timed out" in note, note


def test_a_trickle_gives_up_at_the_deadline(online, monkeypatch):
    heads_cached(online)
    with serve({"alexnet-owt-7be5be79.pth": b"x" * 10_000}, trickle=True) as base:  # 200 s at this pace
        point_at(monkeypatch, base, "7be5be79")
        note = within(10, fetch_weights, "alex", deadline_s=1.0)
    assert "(TimeoutError: not done after 1 s)" in note and len(list(online.iterdir())) == 1  # the heads


def test_downloads_off_fetches_nothing_and_says_so(online, monkeypatch):
    monkeypatch.setenv(lp.NO_DOWNLOAD_ENV, "1")
    monkeypatch.setattr(lp, "urlopen", lambda *a, **k: pytest.fail("downloaded with downloads off"))
    assert fetch_weights("alex") is None
    _, note = load_lpips("alex")
    assert short_lpips_note(note).startswith(
        "LPIPS skipped: no alex backbone weights (downloads are off: DISTSPLAT_NO_DOWNLOAD=1) in ")


def test_named_files_and_small_images_are_never_fetched(online, monkeypatch, tmp_path):
    monkeypatch.setattr(lp, "urlopen", lambda *a, **k: pytest.fail("downloaded what was not needed"))
    assert fetch_weights("alex", min_side=24) is None  # below AlexNet's 31 px: LPIPS is skipped anyway
    (tmp_path / "b.pth").write_bytes(b"named")
    (tmp_path / "h.pth").write_bytes(b"named")
    assert fetch_weights("vgg", weights=str(tmp_path / "b.pth"), heads=str(tmp_path / "h.pth")) is None


def test_ready_lpips_on_one_rank_downloads_or_skips(online, monkeypatch):
    ctx = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)
    backbone, heads = alex_files()
    with serve({"alexnet-owt-7be5be79.pth": backbone, "alex.pth": heads}) as base:
        point_at(monkeypatch, base, "00000000")  # a wrong hash: skipped with the download's reason
        model, note = ready_lpips(ctx, "alex", None, None, torch.device("cpu"), 64, None, "setup's note", print)
        assert model is None and note.startswith("LPIPS skipped: could not download alexnet-owt-7be5be79.pth")
        point_at(monkeypatch, base, hashlib.sha256(backbone).hexdigest()[:8])
        model, note = ready_lpips(ctx, "alex", None, None, torch.device("cpu"), 64, None, "setup's note", print)
        assert isinstance(model, LPIPS) and note.startswith("LPIPS alex: backbone ")
