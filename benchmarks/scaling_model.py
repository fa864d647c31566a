"""A scaling model of the distributed step for machines we do not have (W GPUs), built
from W *virtual* ranks in ONE process on one device, and validated against real gloo
multi-process runs on this CPU.

Virtual ranks. W Trainers are set up in this process, each with the layout of rank r of
W (its own contiguous Gaussian chunk, optimizers, strategy state, camera shard and image
cache; no process group). A step runs the distributed step's own pieces
(`distsplat.distributed.render._prepare` / `_render_own`, the trainer's loss, Adam and
densification hooks) rank by rank, with the all-to-all replaced by the equivalent local
copy of the packed payload (and of its gradient, backwards). Each rank's compute is timed
in the three segments that the step's synchronization points separate:
    A_r  data + project + pack + count           -> count exchange, payload all-to-all
    B_r  unpack + rasterize own cameras + loss, forward and backward -> reverse all-to-all
    C_r  backward through the projection + optimizer + densification (then A of the next step)
and the bytes each rank would send are counted from the real payload splits.

Model (steady state, each collective a synchronization point):
    T(W) = mk(A + C) + mk(B) + X(W)
    X(W) = 3 * latency + host_sync + 2 * max_r(max(bytes_sent_r, bytes_received_r)) / bandwidth
    mk(s) = max_r s_r                            one device per rank (GPUs)
    mk(s) = max_r s_r / min(1, k / W)            W processes sharing k cores (this CPU)
Compute is CPU time of the rank's thread (time.thread_time), so that other processes on
the machine do not inflate it; for the CPU validation, k is MEASURED in the real runs (a
0.5 s spin in every rank at once, before and after the timed steps: the cores the W
processes actually got next to whatever else ran), not os.cpu_count().
and the training throughput speedup (the global batch is W x batch_size cameras, so a
step of W ranks renders W times the images of a step of one) is W * T(1) / T(W).

Validation: the same scene, batches and steps run as W real gloo processes (plain
`Trainer.train_step`, timed), next to the prediction with the cores they got and the
gloo latency and bandwidth measured by an all-to-all microbenchmark inside those runs.
Two checks: the step's wall time (model incl. scheduling and exchange), and the CPU work
per step summed over ranks (virtual vs real process CPU time: does the virtual run do
the same compute as the real ranks?).

GPU prediction: compute times are the CPU-measured ones divided by GPU_FACTOR (an
ASSUMPTION: how much faster one GPU runs a rank's compute than one CPU core runs the torch
backend; swept in the output), exchange at NVLink and PCIe figures (LINKS below). The
speedup then depends on compute *ratios* between ranks measured here (load balance, the
per-rank overhead of W) and on the exchange's share, not on absolute CPU speed.

    python benchmarks/scaling_model.py              # NGPU=4 STEPS=6 SCENE=builtin
Environment: NGPU (4), STEPS (6), WARMUP (3), SCENE / SYNTH / DATA_FACTOR (benchmarks/
procs.py), GPU_FACTOR (300), VALIDATE (1: also the real gloo runs). Writes
benchmarks/results/scaling_model.json and prints one summary line.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.procs import make_config, prewarm, run_ranks, scene_spec  # noqa: E402

# Interconnects of the GPU prediction (stated assumptions, not measurements).
LINKS = {
    "nvlink": {"bandwidth_Bps": 300e9, "latency_s": 25e-6, "host_sync_s": 15e-6,
               "source": "NVLink (A100/H100 class): ~300 GB/s effective all-to-all bandwidth per "
                         "GPU; ~25 us per small NCCL all-to-all; ~15 us device->host read of the counts"},
    "pcie4": {"bandwidth_Bps": 20e9, "latency_s": 50e-6, "host_sync_s": 15e-6,
              "source": "PCIe 4.0 x16 without NVLink: ~20 GB/s per GPU effective; ~50 us per small "
                        "NCCL all-to-all; ~15 us device->host read of the counts"},
}
GPU_FACTORS = (30, 100, 300, 1000)
COUNT_COLUMNS = 4  # exchange.N_COLUMNS int64 per rank pair


# ------------------------------------------------------------------------------ the model


def makespan(seconds: Sequence[float], cores: Optional[float] = None) -> float:
    """Time until all ranks finish a segment of `seconds` compute each: the slowest rank
    with one device each (cores=None), or, with the W processes sharing `cores` cores
    (fewer than W, or a fraction of the machine), each running at a share
    min(1, cores / W) of a core."""
    if not seconds:
        return 0.0
    if cores is None:
        return max(seconds)
    return max(seconds) / min(1.0, cores / len(seconds))


def exchange_time(bytes_sent: Sequence[int], bytes_received: Sequence[int], bandwidth_Bps: float,
                  latency_s: float, host_sync_s: float) -> float:
    """Count all-to-all + payload all-to-all + reverse all-to-all (3 collectives), one
    host read of the counts, and the payload both ways at the busiest rank's volume."""
    if len(bytes_sent) <= 1:
        return 0.0
    busiest = max(max(s, r) for s, r in zip(bytes_sent, bytes_received))
    return 3 * latency_s + host_sync_s + 2 * busiest / bandwidth_Bps


def step_time(A: Sequence[float], B: Sequence[float], C: Sequence[float], exchange_s: float,
              cores: Optional[float] = None, compute_scale: float = 1.0) -> float:
    """T = mk(A + C) + mk(B) + X, compute divided by compute_scale."""
    ac = [(a + c) / compute_scale for a, c in zip(A, C)]
    b = [x / compute_scale for x in B]
    return makespan(ac, cores) + makespan(b, cores) + exchange_s


def speedup(t1: float, tW: float, W: int) -> float:
    """Throughput speedup at a per-rank batch: W times the images per step."""
    return W * t1 / tW


# ------------------------------------------------------------------------ virtual ranks


@contextlib.contextmanager
def virtual_rank(r: int, W: int):
    """Makes distributed.render see rank r of W (without a process group)."""
    import distsplat.distributed.render as dr

    saved = dr.get_world_size, dr.get_rank
    dr.get_world_size, dr.get_rank = (lambda group=None: W), (lambda group=None: r)
    try:
        yield
    finally:
        dr.get_world_size, dr.get_rank = saved


def virtual_trainers(spec: Dict[str, Any], W: int, steps: int, tmp: str):
    from distsplat.distributed import DistContext
    from distsplat.train.trainer import Trainer

    trainers = []
    for r in range(W):
        cfg = make_config(spec, steps, f"{tmp}/r{r}")
        ctx = DistContext(rank=r, world_size=W, local_rank=r, device=torch.device("cpu"), backend=None)
        t = Trainer(cfg, ctx)
        t.setup()
        prewarm(t)
        trainers.append(t)
    return trainers


def virtual_step(trainers, step: int) -> Dict[str, Any]:
    """One training step of W virtual ranks; returns per-rank A, B, C seconds and bytes."""
    import distsplat.distributed.render as dr
    from distsplat.distributed.render import _RENDER_DEFAULTS, _prepare, _render_own
    from distsplat.render import make_meta
    from distsplat.train.gaussians import activated
    from distsplat.train.losses import photometric_loss

    W = len(trainers)
    A, B, C = [0.0] * W, [0.0] * W, [0.0] * W  # CPU seconds of this thread (one torch thread)
    wall = [0.0] * W
    clock = time.thread_time  # not perf_counter: other processes share this machine's cores
    st = []
    for r, t in enumerate(trainers):  # segment A
        t0, w0 = clock(), time.perf_counter()
        cfg = t.cfg
        batch = t._batch(step)
        images = next(t.loader)
        gt = images.stacked().to(t.device).float() / 255.0
        n_cam = len(batch.cameras)
        cams = t.train_idx[batch.cameras]
        sh = min(step // cfg.sh_degree_interval, cfg.sh_degree)
        g = activated(t.params, sh)
        kw = t._render_kwargs(None)
        packed, backend = kw.pop("packed"), kw.pop("backend")
        opts = dict(_RENDER_DEFAULTS)
        opts.update(kw)
        with virtual_rank(r, W):
            local = _prepare(g["means"], g["quats"], g["scales"], g["opacities"], g["colors"],
                             t.viewmats[cams], t.Ks[cams], t.width, t.height, batch.camera_owner,
                             sh, packed, backend, True, opts, [], None)
        if local.error is not None:
            raise local.error
        counts = local.counts.tolist()  # the one host read of the real count exchange
        meta = make_meta(local.pairs, local.dense, t.width, t.height, n_cam)
        t.strategy.step_pre_backward(t.params, t.optimizers, t.strategy_state, step, meta)
        A[r], wall[r] = clock() - t0, wall[r] + time.perf_counter() - w0
        st.append({"batch": batch, "gt": gt, "g": g, "local": local, "counts": counts,
                   "meta": meta, "opts": opts, "backend": local.backend, "n_cam": n_cam})

    # The all-to-all as a local copy: rank d receives, in source-rank order, every rank's
    # rows for d (what all_to_all_single delivers). Not timed as compute.
    F = st[0]["local"].payload.shape[1]
    itemsize = st[0]["local"].payload.element_size()
    pieces = [s["local"].payload.detach().split(s["counts"]) for s in st]
    received = [torch.cat([pieces[r][d] for r in range(W)]).requires_grad_() for d in range(W)]
    sent = [sum(c for d, c in enumerate(s["counts"]) if d != r) for r, s in enumerate(st)]
    recv = [sum(st[r]["counts"][d] for r in range(W) if r != d) for d in range(W)]
    count_bytes = (W - 1) * COUNT_COLUMNS * 8

    for d, t in enumerate(trainers):  # segment B
        s = st[d]
        t0, w0 = clock(), time.perf_counter()
        own_idx = s["batch"].own(d)
        colors, _ = _render_own(received[d], own_idx, torch.float32, t.width, t.height,
                                s["backend"], s["opts"])
        loss = photometric_loss(colors, s["gt"], t.cfg.ssim_lambda) / s["n_cam"]
        loss.backward()
        B[d], wall[d] = clock() - t0, wall[d] + time.perf_counter() - w0

    for r, t in enumerate(trainers):  # segment C
        s, cfg = st[r], t.cfg
        grad = torch.cat([received[d].grad.split([st[q]["counts"][d] for q in range(W)])[r]
                          for d in range(W)])
        t0, w0 = clock(), time.perf_counter()
        outs, grads = [s["local"].payload], [grad]
        if cfg.opacity_reg > 0:
            outs.append(cfg.opacity_reg * s["g"]["opacities"].sum() / t.n_all)
            grads.append(torch.ones(()))
        if cfg.scale_reg > 0:
            outs.append(cfg.scale_reg * s["g"]["scales"].sum() / (3 * t.n_all))
            grads.append(torch.ones(()))
        torch.autograd.backward(outs, grads)
        lr = t._means_lr(step)
        t.optimizers["means"].param_groups[0]["lr"] = lr
        for opt in t.optimizers.values():
            opt.step()
            opt.zero_grad(set_to_none=True)
        t._densify(step, s["meta"], lr)
        C[r], wall[r] = clock() - t0, wall[r] + time.perf_counter() - w0
    del dr
    return {"A": A, "B": B, "C": C, "wall": wall,
            "pairs_projected": [sum(s["counts"]) for s in st],
            "pairs_rendered": [sum(st[r]["counts"][d] for r in range(W)) for d in range(W)],
            "bytes_sent": [p * F * itemsize + (count_bytes if W > 1 else 0) for p in sent],
            "bytes_received": [p * F * itemsize + (count_bytes if W > 1 else 0) for p in recv],
            "payload_fields": F, "bytes_per_pair": F * itemsize}


def run_virtual(spec: Dict[str, Any], W: int, warmup: int, steps: int) -> List[Dict[str, Any]]:
    torch.set_num_threads(1)  # one core per virtual rank, as each real rank has
    with tempfile.TemporaryDirectory(prefix="distsplat-virtual-") as tmp:
        trainers = virtual_trainers(spec, W, warmup + steps, tmp)
        try:
            out = []
            for step in range(warmup + steps):
                rec = virtual_step(trainers, step)
                if step >= warmup:
                    out.append(rec)
            return out
        finally:
            for t in trainers:
                t.cleanup()


# ---------------------------------------------------------------- real runs (validation)


def real_run(ctx, spec: Dict[str, Any], warmup: int, steps: int) -> Dict[str, Any]:
    """On every rank: plain Trainer.train_step times, then the gloo all-to-all
    microbenchmark (latency: one int64 per peer; bandwidth: 1 MiB and 4 MiB per peer)."""
    import torch.distributed as dist

    from distsplat.train.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="distsplat-real-") as tmp:
        trainer = Trainer(make_config(spec, warmup + steps, tmp), ctx)
        try:
            trainer.setup()
            prewarm(trainer)
            times, cpu = [], []
            shares = [cpu_share()]
            for step in range(warmup + steps):
                t0, c0 = time.perf_counter(), time.process_time()
                trainer.train_step(step)
                if step >= warmup:
                    times.append(time.perf_counter() - t0)
                    cpu.append(time.process_time() - c0)
            shares.append(cpu_share())
        finally:
            trainer.cleanup()
    W = ctx.world_size
    micro: Dict[str, Any] = {}
    if W > 1:
        def timed(inp: torch.Tensor, reps: int) -> float:
            out = torch.empty_like(inp)
            ts = []
            for i in range(reps + 2):
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_to_all_single(out, inp)
                if i >= 2:
                    ts.append(time.perf_counter() - t0)
            return statistics.median(ts)

        micro["latency_s"] = timed(torch.zeros(W, dtype=torch.int64), 30)
        for mib in (1, 4):
            per_peer = mib << 20
            t = timed(torch.zeros(W * per_peer // 4, dtype=torch.float32), 8)
            micro[f"a2a_{mib}MiB_per_peer_s"] = t
            micro[f"bandwidth_{mib}MiB_Bps"] = (W - 1) * per_peer / max(t - micro["latency_s"], 1e-9)
    return {"rank": ctx.rank, "step_s": times, "cpu_s": cpu, "cpu_share": statistics.mean(shares),
            "micro": micro}


def cpu_share(seconds: float = 0.5) -> float:
    """The fraction of a core this process gets right now: a pure-Python spin of
    `seconds`, CPU time over wall time. Every rank spins at once (after a barrier), so
    the sum over ranks is the cores the W processes get together, next to whatever else
    runs on the machine."""
    from distsplat.distributed import barrier

    barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        pass
    return (time.process_time() - c0) / (time.perf_counter() - t0)


# ------------------------------------------------------------------------------ summary


def predict(records: List[Dict[str, Any]], W: int, **link) -> Dict[str, float]:
    """Median over steps of the predicted step time (per step: max over ranks)."""
    cores = link.pop("cores", None)
    scale = link.pop("compute_scale", 1.0)
    ts = [step_time(r["A"], r["B"], r["C"],
                    exchange_time(r["bytes_sent"], r["bytes_received"], **link) if W > 1 else 0.0,
                    cores, scale) for r in records]
    return statistics.median(ts)


def main() -> None:
    from benchmarks.common import write_result

    max_w = int(os.environ.get("NGPU", 4))
    steps = int(os.environ.get("STEPS", 6))
    warmup = int(os.environ.get("WARMUP", 3))
    gpu_factor = float(os.environ.get("GPU_FACTOR", 300))
    validate = os.environ.get("VALIDATE", "1") == "1"
    cores = os.cpu_count() or 1
    spec = scene_spec()
    load_at_start = [round(x, 2) for x in os.getloadavg()]  # other processes share the cores
    rows: List[Dict[str, Any]] = []
    for W in range(1, max_w + 1):
        recs = run_virtual(spec, W, warmup, steps)
        med = lambda key: [statistics.median(r[key][i] for r in recs) for i in range(W)]  # noqa: E731
        row: Dict[str, Any] = {
            "W": W,
            "virtual": {
                "A_ms": [1e3 * x for x in med("A")], "B_ms": [1e3 * x for x in med("B")],
                "C_ms": [1e3 * x for x in med("C")],
                "pairs_projected": med("pairs_projected"), "pairs_rendered": med("pairs_rendered"),
                "bytes_sent": med("bytes_sent"), "bytes_received": med("bytes_received"),
                "bytes_per_pair": recs[0]["bytes_per_pair"],
                "compute_ms_sum_over_ranks": 1e3 * statistics.median(
                    sum(r["A"]) + sum(r["B"]) + sum(r["C"]) for r in recs),
                # T(W) without the exchange, one device per rank
                "compute_ms_one_device_per_rank": 1e3 * statistics.median(
                    step_time(r["A"], r["B"], r["C"], 0.0) for r in recs),
            },
            "_records": recs,
        }
        if validate:
            real = run_ranks(real_run, W, spec, warmup, steps)
            measured = statistics.median(
                max(real[r]["step_s"][i] for r in range(W)) for i in range(steps))
            cores_got = sum(r["cpu_share"] for r in real)  # measured, not cpu_count()
            real_cpu = statistics.median(sum(r["cpu_s"][i] for r in real) for i in range(steps))
            virt_cpu = statistics.median(sum(x["A"]) + sum(x["B"]) + sum(x["C"]) for x in recs)
            micro = real[0]["micro"]
            link = ({"bandwidth_Bps": micro["bandwidth_4MiB_Bps"], "latency_s": micro["latency_s"],
                     "host_sync_s": 0.0} if W > 1 else {"bandwidth_Bps": 1.0, "latency_s": 0.0, "host_sync_s": 0.0})
            pred = predict(recs, W, cores=cores_got, **link)
            row["cpu_validation"] = {
                "measured_step_ms": 1e3 * measured,
                "predicted_step_ms": 1e3 * pred,
                "error_pct": 100 * (pred - measured) / measured,
                "measured_cpu_ms_all_ranks": 1e3 * real_cpu,
                "virtual_cpu_ms_all_ranks": 1e3 * virt_cpu,
                "cpu_error_pct": 100 * (virt_cpu - real_cpu) / real_cpu,
                "cores_got": cores_got,
                "cpu_share_per_rank": [r["cpu_share"] for r in real],
                "gloo_microbenchmark": micro,
                "cores": cores,
            }
        row["gpu_prediction"] = {
            name: {"step_ms": 1e3 * predict(recs, W, compute_scale=gpu_factor, **{k: v for k, v in link_.items() if k != "source"}),
                   "exchange_ms": 1e3 * statistics.median(
                       exchange_time(r["bytes_sent"], r["bytes_received"],
                                     **{k: v for k, v in link_.items() if k != "source"}) if W > 1 else 0.0
                       for r in recs)}
            for name, link_ in LINKS.items()
        }
        rows.append(row)
        v = row.get("cpu_validation")
        print(f"W={W}: virtual compute A+B+C max-rank "
              f"{row['virtual']['compute_ms_one_device_per_rank']:.0f} ms, "
              f"{sum(row['virtual']['bytes_sent']) / 1e6:.2f} MB sent/step"
              + (f"; CPU ({v['cores_got']:.2f} of {v['cores']} cores free): predicted {v['predicted_step_ms']:.0f} ms vs "
                 f"measured {v['measured_step_ms']:.0f} ms ({v['error_pct']:+.1f}%), CPU work "
                 f"{v['virtual_cpu_ms_all_ranks']:.0f} vs {v['measured_cpu_ms_all_ranks']:.0f} ms "
                 f"({v['cpu_error_pct']:+.1f}%)" if v else ""), flush=True)

    # Speedups (throughput; per-rank batch fixed) from the virtual compute.
    t1 = {name: rows[0]["gpu_prediction"][name]["step_ms"] for name in LINKS}
    for row in rows:
        W = row["W"]
        row["gpu_prediction"]["speedup"] = {name: speedup(t1[name], row["gpu_prediction"][name]["step_ms"], W)
                                           for name in LINKS}
        row["gpu_prediction"]["speedup_compute_only"] = speedup(
            rows[0]["virtual"]["compute_ms_one_device_per_rank"], row["virtual"]["compute_ms_one_device_per_rank"], W)
        if "cpu_validation" in row:
            v = row["cpu_validation"]
            v["measured_speedup"] = speedup(rows[0]["cpu_validation"]["measured_step_ms"], v["measured_step_ms"], W)
            v["predicted_speedup"] = speedup(rows[0]["cpu_validation"]["predicted_step_ms"], v["predicted_step_ms"], W)
    sweep = {}
    for f in GPU_FACTORS:
        sweep[str(f)] = {}
        for name, link_ in LINKS.items():
            lk = {k: v for k, v in link_.items() if k != "source"}
            t_1 = predict(rows[0]["_records"], 1, compute_scale=f, **lk)
            sweep[str(f)][name] = {str(r["W"]): speedup(t_1, predict(r["_records"], r["W"], compute_scale=f, **lk), r["W"])
                                   for r in rows}
    for row in rows:
        row.pop("_records")
    last = rows[-1]
    errors = [abs(r["cpu_validation"]["error_pct"]) for r in rows if "cpu_validation" in r and r["W"] > 1]
    cpu_errors = [abs(r["cpu_validation"]["cpu_error_pct"]) for r in rows if "cpu_validation" in r]
    payload = {
        "load_avg_1_5_15min_at_start": load_at_start,
        "scene": spec,
        "steps": {"warmup": warmup, "timed": steps},
        "batch": "1 camera per rank per step (global batch W); speedup = W * T(1) / T(W) "
                 "(throughput in images/s, the gsplat --steps_scaler 1/W setting)",
        "model": {
            "step": "T(W) = mk(A + C) + mk(B) + X(W)",
            "segments": {"A": "data + project + pack + count (until the count exchange)",
                         "B": "unpack + rasterize own cameras + loss, forward and backward (until the reverse all-to-all)",
                         "C": "backward through projection + optimizer + densification statistics"},
            "exchange": "X = 3 * latency + host_sync + 2 * max_r max(bytes_sent_r, bytes_received_r) / bandwidth",
            "makespan": "GPUs: mk = max over ranks; CPU validation: mk = max_r / min(1, cores_got / W)",
        },
        "assumptions": [
            "each rank's compute is the CPU time of its segments run alone on one thread "
            "(torch.set_num_threads(1)); W real processes on this machine share the cores they get "
            "(cores_got, measured by a spin in every rank, since other users' processes run here too), "
            "each at min(1, cores_got / W) of a core",
            "every collective is a synchronization point; no overlap of exchange and compute",
            "the local copy that replaces the all-to-all costs nothing; bytes counted from the real splits",
            "densification: statistics every step; grow/prune/rebalance steps are not modelled (rare)",
            f"GPU: compute = CPU-measured compute / GPU_FACTOR (assumed {gpu_factor:g}; swept over {list(GPU_FACTORS)}), "
            "i.e. the GPU keeps the CPU's ratios between ranks and phases; kernel-launch overheads "
            "and gsplat's different per-phase costs are not modelled",
            "GPU interconnects: " + "; ".join(f"{k}: {v['source']}" for k, v in LINKS.items()),
            "CPU validation interconnect: gloo on localhost, latency and bandwidth measured by an "
            "all_to_all_single microbenchmark in the same W processes after the timed steps",
        ],
        "gpu_factor": gpu_factor,
        "links": LINKS,
        "validation_abs_error_pct_W_gt_1": {"mean": statistics.mean(errors) if errors else None,
                                            "max": max(errors) if errors else None},
        "compute_validation_abs_error_pct": {"mean": statistics.mean(cpu_errors) if cpu_errors else None,
                                             "max": max(cpu_errors) if cpu_errors else None},
        "predicted_speedup_sweep_by_gpu_factor": sweep,
        "note": (f"Virtual ranks and the validation runs are CPU processes on a {cores}-core machine "
                 "(torch backend, 1 thread each); no GPU was used. The GPU numbers are a model "
                 "prediction under the stated assumptions, not a measurement."),
        "results": rows,
    }
    path = write_result("scaling_model", payload)
    sp = last["gpu_prediction"]["speedup"]
    err = payload["validation_abs_error_pct_W_gt_1"]
    print(f"scaling_model: predicted {last['W']}-GPU speedup {sp['nvlink']:.2f}x NVLink / {sp['pcie4']:.2f}x PCIe "
          f"(GPU_FACTOR {gpu_factor:g}, CPU-measured compute ratios)"
          + (f"; CPU validation |error| mean {err['mean']:.1f}% max {err['max']:.1f}% (W=2..{last['W']})" if errors else "")
          + f" -> {path}")


if __name__ == "__main__":
    main()
