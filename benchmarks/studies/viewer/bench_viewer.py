"""Benchmark of the live viewer's cost to training (docs/design.md: the viewer renders between
steps): step time of a W-rank training of the built-in synthetic scene with

    off      --disable_viewer
    idle     the viewer on, no browser (polls only)
    client   a browser that moves its camera every 20 ms, simulated inside rank 0's server
             (so every poll has a request; frames are JPEG-encoded as viser sends them)
    browser  a real headless Chromium on the viewer page (when installed); it shares
             this machine's cores with the training, which a user's laptop would not

Modes run interleaved REPS times (other processes on the machine drift; interleaving
spreads that over all modes). Step time = the trainer's own steps/s over the run; the
viewer's share = time inside the viewer's hook on rank 0 / the training loop's time (the
direct cost), and CPU time of all ranks' processes (every thread: viser, JPEG encoding)
per step, both far less sensitive to other jobs on the machine than wall time.

    python benchmarks/studies/viewer/bench_viewer.py                   # NGPU=2 STEPS=200 REPS=2 SCENE=3000
    NGPU=2 STEPS=200 REPS=2 MODES=off,client python benchmarks/studies/viewer/bench_viewer.py
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from benchmarks.common import write_result  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _orbit(n: int = 360) -> list:
    """n (wxyz, position) camera poses on a circle around the scene, looking at the origin
    (camera-to-world, OpenCV axes). Precomputed: the fake browser itself should cost
    about what viser's handling of a camera message does, not a rotation solve."""
    import math

    import numpy as np
    from scipy.spatial.transform import Rotation

    poses = []
    for i in range(n):
        a = 2 * math.pi * i / n
        eye = np.array([4 * math.cos(a), 4 * math.sin(a), 1.0])
        z = -eye / np.linalg.norm(eye)
        x = np.cross(z, [0.0, 0.0, 1.0])
        x /= np.linalg.norm(x)
        qx, qy, qz, qw = Rotation.from_matrix(np.stack([x, np.cross(z, x), z], axis=1)).as_quat()
        poses.append(((qw, qx, qy, qz), tuple(eye)))
    return poses


def _fake_browser(server, stop: threading.Event) -> None:
    """A browser orbiting the scene: a new camera every 20 ms (what viser's camera
    callback stores); frames are JPEG-encoded like viser's set_background_image."""
    from viser._scene_api import _encode_image_binary

    from distsplat.viewer.server import _Browser

    def deliver(client_id, image):
        _encode_image_binary(image, "jpeg", jpeg_quality=90)
        server.frames += 1

    server.frames = 0
    server._deliver_frame = deliver
    poses, t = _orbit(), 0
    while not stop.is_set():
        wxyz, eye = poses[t % len(poses)]
        with server._lock:
            old = server._browsers.get(0)
            b = _Browser(wxyz, eye, 0.9, 16 / 9)
            if old is not None:
                b.version, b.served, b.served_at = old.version + 1, old.served, old.served_at
            server._browsers[0] = b
        t += 1
        time.sleep(0.02)


def worker(rank: int, W: int, port: int, mode: str, steps: int, n: int, viewer_port: int,
           out_dir: str) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(W), "LOCAL_RANK": str(rank)})
    torch.set_num_threads(1)
    import distsplat.viewer.live as live
    from distsplat.cli import run
    from distsplat.app import AppConfig
    from distsplat.train.config import default_config

    stop = threading.Event()
    frames = {}
    hook = {"s": 0.0, "calls": 0}
    if mode != "off":  # the viewer's own time inside the training loop, on this rank
        on_step = live.LiveViewer.on_step

        def timed_on_step(self, trainer, step):
            t0 = time.perf_counter()
            on_step(self, trainer, step)
            hook["s"] += time.perf_counter() - t0
            hook["calls"] += 1

        live.LiveViewer.on_step = timed_on_step
    if mode == "client":
        start = live.LiveViewer.start.__func__

        def start_with_browser(cls, ctx, *a, **k):
            viewer = start(cls, ctx, *a, **k)
            if viewer.server is not None:
                frames["server"] = viewer.server
                threading.Thread(target=_fake_browser, args=(viewer.server, stop), daemon=True).start()
            return viewer

        live.LiveViewer.start = classmethod(start_with_browser)
    from distsplat.train.trainer import Trainer

    cpu = {}
    train = Trainer.train

    def timed_train(self):  # CPU time of this process (all its threads) over the training loop
        c0 = time.process_time()
        out = train(self)
        cpu["s"] = time.process_time() - c0
        return out

    Trainer.train = timed_train
    cfg = AppConfig.of(default_config())  # the trainer's flags and the viewer's, as the app parses them
    cfg.max_steps, cfg.eval_steps, cfg.save_steps, cfg.save_ply = steps, [], [], False
    cfg.result_dir, cfg.disable_viewer, cfg.port = str(Path(out_dir) / mode), mode == "off", viewer_port
    cfg.synthetic.kind, cfg.synthetic.num_gaussians, cfg.log_every, cfg.num_workers = "ball", n, steps, 1
    cfg.synthetic.width, cfg.synthetic.height = 64, 48  # the scene its recorded results used
    # The viewer is the CLI's extension (distsplat.app), not part of cli.run: pass it, or no
    # viewer starts and every mode measures plain training.
    metrics = run(cfg, extensions=[] if mode == "off" else [live.attach_live_viewer])
    stop.set()
    n_frames = getattr(frames.get("server"), "frames", None)
    loop_s = steps / metrics["steps_per_s"]
    torch.save({"steps_per_s": metrics["steps_per_s"], "frames": n_frames,
                "hook_fraction": hook["s"] / loop_s, "hook_calls": hook["calls"], "cpu_s": cpu["s"]},
               Path(out_dir) / f"{mode}_rank{rank}.pt")


def run_mode(mode: str, W: int, steps: int, n: int) -> dict:
    viewer_port = free_port()
    driver = None
    with tempfile.TemporaryDirectory(prefix="bench-viewer-") as out_dir:
        ctx = mp.start_processes(worker, args=(W, free_port(), mode, steps, n, viewer_port, out_dir),
                                 nprocs=W, start_method="spawn", join=False)
        if mode == "browser":
            driver = _open_browser(viewer_port)
        try:
            while not ctx.join():
                pass
        finally:
            if driver is not None:
                driver.quit()
        ranks = [torch.load(Path(out_dir) / f"{mode}_rank{r}.pt") for r in range(W)]
    r0 = ranks[0]
    if mode != "off" and not r0["hook_calls"]:
        raise RuntimeError(f"mode {mode}: the viewer's hook never ran; the result would measure no viewer")
    if mode == "client" and not r0["frames"]:
        raise RuntimeError("mode client: the fake browser got no frame; the result would measure no rendering")
    return {"hook_calls": r0["hook_calls"], "mode": mode, "step_ms": 1000.0 / r0["steps_per_s"], "frames": r0["frames"],
            "hook_fraction": r0["hook_fraction"],
            "cpu_ms_per_step": 1000.0 * sum(r["cpu_s"] for r in ranks) / steps}


def _open_browser(port: int):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--enable-unsafe-swiftshader", "--window-size=800,560",
                f"--user-data-dir={tempfile.mkdtemp(prefix='bench-chromium-')}"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    for _ in range(120):
        try:
            driver.get(f"http://127.0.0.1:{port}")
            return driver
        except Exception:  # noqa: BLE001 - the server is not up yet
            time.sleep(0.5)
    return driver


def main() -> None:
    W = int(os.environ.get("NGPU", "2"))
    steps = int(os.environ.get("STEPS", "200"))
    reps = int(os.environ.get("REPS", "2"))
    n = int(os.environ.get("SCENE", "3000"))
    modes = os.environ.get("MODES", "off,idle,client,browser").split(",")
    if "browser" in modes and not (shutil.which("chromium") and shutil.which("chromedriver")):
        modes.remove("browser")
    runs = []
    for rep in range(reps):
        for mode in modes:
            r = run_mode(mode, W, steps, n)
            r["rep"] = rep
            runs.append(r)
            print(f"rep {rep} {mode:8s} {r['step_ms']:.1f} ms/step, frames {r['frames']}, "
                  f"viewer hook {100 * r['hook_fraction']:.2f}% of the loop, "
                  f"CPU {r['cpu_ms_per_step']:.1f} ms/step (all ranks)", flush=True)
    summary = {}
    for mode in modes:
        times = [r["step_ms"] for r in runs if r["mode"] == mode]
        hooks = [r["hook_fraction"] for r in runs if r["mode"] == mode]
        cpus = [r["cpu_ms_per_step"] for r in runs if r["mode"] == mode]
        summary[mode] = {"step_ms_median": statistics.median(times), "step_ms": times,
                         "viewer_hook_fraction_median": statistics.median(hooks),
                         "cpu_ms_per_step_median": statistics.median(cpus)}
    base = summary["off"]["step_ms_median"] if "off" in summary else None
    cpu_base = summary["off"]["cpu_ms_per_step_median"] if "off" in summary else None
    for mode, s in summary.items():
        s["overhead_vs_off"] = (s["step_ms_median"] / base - 1) if base else None
        s["cpu_overhead_vs_off"] = (s["cpu_ms_per_step_median"] / cpu_base - 1) if cpu_base else None
    path = write_result("viewer", {
        "world_size": W, "steps": steps, "reps": reps, "num_gaussians": n,
        "viewer": {"budget": 0.03, "max_side": 512, "scene": "synthetic 64x48"},
        "summary": summary, "runs": runs,
        "note": "CPU gloo, 2-core machine shared with other jobs; 'browser' runs Chromium "
                "(software WebGL) on the same cores as training",
    })
    line = ", ".join(f"{m} {s['step_ms_median']:.1f} ms ({(s['overhead_vs_off'] or 0) * 100:+.1f}%, "
                     f"CPU {(s['cpu_overhead_vs_off'] or 0) * 100:+.1f}%, "
                     f"hook {100 * s['viewer_hook_fraction_median']:.1f}%)" for m, s in summary.items())
    print(f"bench_viewer W={W}: {line} -> {path}")


if __name__ == "__main__":
    main()
