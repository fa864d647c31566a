"""Benchmark of the packed sparse all-to-all of `distributed_rasterize` (docs/design.md's
exchange) for one fixed generated scene, W = 1..NGPU gloo processes on the CPU.

Reports per W: visible pairs per step, pairs and bytes that cross ranks, bytes per pair,
the collectives and host syncs counted from real calls (next to gsplat 1.5.3's), and the
exchange time (inside the real call, and isolated after a barrier: forward payload and
the backward reverse all-to-all). Writes JSON to benchmarks/results/.

    python benchmarks/studies/exchange/bench_exchange.py            # NGPU=4 STEPS=3 SCENE=20000x8
    NGPU=2 STEPS=3 SCENE=5000x4 python benchmarks/studies/exchange/bench_exchange.py

These are CPU processes talking over gloo on localhost: absolute times say nothing about
NCCL on GPUs; the counts and bytes are the same on any backend.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from benchmarks.common import viewmat_towards_origin  # noqa: E402
from benchmarks.procs import run_ranks  # noqa: E402

WIDTH, HEIGHT = 96, 72
# gsplat 1.5.3 rasterization(packed=True) with world_size > 1, as read in its rendering.py
# and distributed.py (and stated in issue 3): all_gather of N and of (viewmats, Ks);
# all_to_all of the counts, of radii, of the float fields, of (camera_ids, gaussian_ids);
# host syncs: the gathered N, plus per-rank .item() reads of the splits.
GSPLAT_153 = {"forward_all_gathers": 2, "forward_all_to_alls": 4, "host_syncs": "1 + 3W"}


def make_scene(n_all: int, n_cameras: int):
    g = torch.Generator().manual_seed(0)
    means = torch.randn(n_all, 3, generator=g) * 0.8
    quats = torch.randn(n_all, 4, generator=g)
    scales = torch.rand(n_all, 3, generator=g) * 0.03 + 0.005
    opacities = torch.rand(n_all, generator=g) * 0.8 + 0.1
    colors = torch.rand(n_all, 3, generator=g)
    viewmats = []
    for i in range(n_cameras):
        a = 2 * math.pi * i / n_cameras
        viewmats.append(viewmat_towards_origin([3 * math.cos(a), 0.3, 3 * math.sin(a)]))
    Ks = torch.tensor([[80.0, 0, WIDTH / 2], [0, 80.0, HEIGHT / 2], [0, 0, 1]]).expand(n_cameras, 3, 3)
    return [means, quats, scales, opacities, colors], torch.stack(viewmats), Ks.contiguous()


class Recorder:
    """Wraps torch.distributed collectives and Tensor.tolist/item/cpu to count real calls
    and time all_to_all_single; the one-process render stages run uncounted."""

    def __init__(self):
        import torch.distributed as dist

        import distsplat.distributed.render as render
        self.on, self.calls, self.a2a = False, {}, []
        for name in ("all_to_all_single", "all_to_all", "all_gather", "all_gather_object",
                     "all_gather_into_tensor", "all_reduce", "broadcast"):
            self._wrap(dist, name, timed=name == "all_to_all_single")
        for name in ("tolist", "item", "cpu", "numpy"):
            self._wrap(torch.Tensor, name)
        for name in ("project", "rasterize_pairs"):
            original = getattr(render, name)

            def paused(*a, _f=original, **k):
                was, self.on = self.on, False
                try:
                    return _f(*a, **k)
                finally:
                    self.on = was
            setattr(render, name, paused)

    def _wrap(self, owner, name, timed=False):
        original = getattr(owner, name)

        def wrapper(*a, **k):
            if not self.on:
                return original(*a, **k)
            self.calls[name] = self.calls.get(name, 0) + 1
            t0 = time.perf_counter()
            out = original(*a, **k)
            if timed:
                self.a2a.append({"s": time.perf_counter() - t0, "args": (a, k)})
            return out
        setattr(owner, name, wrapper)

    def start(self):
        self.on, self.calls, self.a2a = True, {}, []

    def stop(self):
        self.on = False
        return dict(self.calls), list(self.a2a)


def worker(ctx, cfg: dict) -> dict:
    """One rank (benchmarks/procs.py run_ranks: a gloo process, one thread): the library's
    distributed_rasterize on this rank's chunk, its real calls counted and timed."""
    import torch.distributed as dist

    from distsplat.distributed import barrier, distributed_rasterize, local_chunk

    rank, W = ctx.rank, ctx.world_size
    params, viewmats, Ks = make_scene(cfg["n_all"], cfg["n_cameras"])
    params = [t.clone().requires_grad_() for t in local_chunk(params, rank, W)]
    owner = torch.arange(cfg["n_cameras"]) * W // cfg["n_cameras"]  # rank-major
    rec = Recorder()
    calls, meta, in_call, fwd_iso, bwd_iso, call_s = {}, None, [], [], [], []
    for rep in range(cfg["steps"] + 1):  # rep 0 warms up
        barrier()
        t0 = time.perf_counter()
        rec.start()
        _, _, meta = distributed_rasterize(*params, viewmats, Ks, WIDTH, HEIGHT, owner,
                                           backend="torch")
        calls, a2a = rec.stop()
        dt = time.perf_counter() - t0
        if W > 1:
            (out, payload), kw = a2a[1]["args"]
            send, recv = kw["input_split_sizes"], kw["output_split_sizes"]
            barrier()  # isolated: no rank is still projecting
            t1 = time.perf_counter()
            dist.all_to_all_single(torch.empty_like(out), payload.detach(), recv, send)
            t2 = time.perf_counter()
            dist.all_to_all_single(torch.empty_like(payload), out.detach(), send, recv)
            t3 = time.perf_counter()
        if rep:
            call_s.append(dt)
            if W > 1:
                in_call.append(a2a[0]["s"] + a2a[1]["s"])
                fwd_iso.append(t2 - t1)
                bwd_iso.append(t3 - t2)
    med = lambda xs: 1e3 * statistics.median(xs) if xs else 0.0  # noqa: E731
    result = {"calls": calls, "comm": meta["comm"], "call_ms": med(call_s),
              "exchange_in_call_ms": med(in_call), "exchange_fwd_isolated_ms": med(fwd_iso),
              "exchange_bwd_isolated_ms": med(bwd_iso)}
    return result


def summarize(W: int, ranks: list) -> dict:
    comm = [r["comm"] for r in ranks]
    return {
        "W": W,
        "pairs_per_step": sum(c["pairs_projected"] for c in comm),
        "pairs_crossing_ranks_per_step": sum(c["pairs_sent"] for c in comm),
        "bytes_per_pair": comm[0]["bytes_per_pair"],
        "bytes_sent_per_step_forward": sum(c["bytes_sent"] for c in comm),
        "bytes_sent_per_step_forward_and_backward": sum(
            2 * c["bytes_sent"] - (W - 1) * 32 for c in comm),
        "max_rank_bytes_sent_forward": max(c["bytes_sent"] for c in comm),
        "collectives_forward_measured": ranks[0]["calls"].get("all_to_all_single", 0),
        "other_collectives_measured": {k: v for k, v in ranks[0]["calls"].items()
                                       if k not in ("all_to_all_single", "tolist", "item", "cpu", "numpy")},
        "host_syncs_measured": sum(ranks[0]["calls"].get(k, 0) for k in ("tolist", "item", "cpu", "numpy")),
        "collectives_backward_per_meta": comm[0]["backward_collectives"] if W > 1 else 0,
        "exchange_in_call_ms_max_rank": max(r["exchange_in_call_ms"] for r in ranks),
        "exchange_fwd_isolated_ms_max_rank": max(r["exchange_fwd_isolated_ms"] for r in ranks),
        "exchange_bwd_isolated_ms_max_rank": max(r["exchange_bwd_isolated_ms"] for r in ranks),
        "forward_call_ms_max_rank": max(r["call_ms"] for r in ranks),
    }


def main() -> None:
    max_w = int(os.environ.get("NGPU", 4))
    n_all, n_cameras = (int(x) for x in os.environ.get("SCENE", "20000x8").split("x"))
    cfg = {"n_all": n_all, "n_cameras": n_cameras, "steps": int(os.environ.get("STEPS", 3))}
    rows = []
    for W in range(1, max_w + 1):
        row = summarize(W, run_ranks(worker, W, cfg))
        rows.append(row)
        gsplat_ref = (f"gsplat 1.5.3: 2 all_gather + 4 all_to_all fwd, {1 + 3 * W} host syncs"
                      if W > 1 else "gsplat 1.5.3: no exchange at W=1")
        print(f"W={W}: {row['pairs_per_step']} pairs/step, {row['pairs_crossing_ranks_per_step']} cross ranks "
              f"({row['bytes_sent_per_step_forward']} B fwd, {row['bytes_per_pair']} B/pair); "
              f"collectives fwd {row['collectives_forward_measured']} + bwd {row['collectives_backward_per_meta']}, "
              f"host syncs {row['host_syncs_measured']} ({gsplat_ref}); exchange {row['exchange_fwd_isolated_ms_max_rank']:.2f} ms fwd / "
              f"{row['exchange_bwd_isolated_ms_max_rank']:.2f} ms bwd isolated, "
              f"{row['exchange_in_call_ms_max_rank']:.2f} ms in call; forward call {row['forward_call_ms_max_rank']:.0f} ms")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    import gsplat
    out = {
        "benchmark": "bench_exchange",
        "note": (f"CPU processes on one {os.cpu_count()}-core machine talking over gloo on localhost "
                 "(torch backend, float32). Times are dominated by process scheduling on few cores "
                 "and say nothing about NCCL on GPUs; pair, byte and call counts carry over. "
                 "exchange_in_call includes waiting for the slowest rank to finish projecting; "
                 "the isolated times start after a barrier. Medians over STEPS calls after a warm-up."),
        "command": " ".join([f"NGPU={max_w}", f"SCENE={n_all}x{n_cameras}", f"STEPS={cfg['steps']}",
                             "python", *sys.argv]),
        "git_commit": commit,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "cpu_count": os.cpu_count(), "python": platform.python_version()},
        "torch": torch.__version__, "gsplat": gsplat.__version__,
        "scene": {"gaussians": n_all, "cameras_per_step": n_cameras, "width": WIDTH, "height": HEIGHT,
                  "camera_owner": "rank-major, C/W cameras per rank"},
        "ours_per_step": {"forward_collectives": "1 count all_to_all + 1 payload all_to_all",
                          "backward_collectives": "1 (counted from real calls in tests/distributed/test_comm_budget.py)", "host_syncs": 1},
        "gsplat_1_5_3_per_step": GSPLAT_153,
        "results": rows,
    }
    from benchmarks.results_index import result_path

    path = result_path("exchange", f"cpu{os.cpu_count()}", out["date"])
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"bench_exchange: W=1..{max_w}, {rows[-1]['bytes_per_pair']} B/pair, "
          f"{rows[-1]['pairs_per_step']} pairs/step -> {path}")


if __name__ == "__main__":
    main()
