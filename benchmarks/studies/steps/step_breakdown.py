"""Where a training step's time goes: per-phase time of `Trainer.train_step` for W = 1..NGPU
gloo CPU processes (and W = 1 on a GPU, where there is one), with the collectives, the
host reads of tensor values and the bytes each phase moves.

Instrumented from the outside: no library code changes. The benchmark wraps, for the
duration of the timed steps,
    data              the image loader's next()                       (data wait)
    project           distributed.render._prepare: validate, project
    count_exchange    distributed.exchange.exchange_counts (1 collective + 1 host read)
    pack              distributed.render._pack: the payload's one cat (W > 1)
    payload_exchange  distributed.exchange.all_to_all, forward
    rasterize         distributed.render._unpack + _rasterize_own: isect, rasterize own cameras
    loss              train.trainer.photometric_loss
    backward          Tensor.backward, including the reverse all-to-all (its time is
                      also reported alone as backward.reverse_exchange)
    optimizer         each Adam's step() and zero_grad()
    densification     strategy.step_pre_backward + Trainer._densify (accumulating the
                      strategy's statistics; one step, REFINE_AT, also grows/prunes,
                      counts Gaussians across ranks and may rebalance)
    other             the rest of train_step (activations, batch, image to float, ...)
and every torch.distributed collective (count, bytes sent to other ranks, time) and every
read of a tensor's value on the host (tolist/item/numpy/int/float/bool, .cpu() of a device
tensor) by phase and call site. On CUDA each phase is bracketed by torch.cuda.synchronize()
(which serializes the GPU: the phase sum is then an upper bound of the plain step).
Plain (uninstrumented) step times are measured first, on the same processes.

    python benchmarks/studies/steps/step_breakdown.py               # NGPU=4 STEPS=6 SCENE=builtin
    NGPU=2 STEPS=4 SCENE=../shared/data/thermos DATA_FACTOR=8 python benchmarks/studies/steps/step_breakdown.py

Environment: NGPU (4: W = 1..NGPU on CPU), STEPS (6 instrumented + 6 plain steps per W),
WARMUP (3), SCENE / SYNTH / DATA_FACTOR (benchmarks/procs.py), DEVICE (cpu|cuda; cuda
runs W = 1 in this process; default cuda when available, else cpu). Writes
benchmarks/results/step_breakdown_<device>.json and prints one summary line.

Honest scope: on CPU these are W processes sharing the machine's cores (W > cores
means time-slicing), talking over gloo on localhost, rendering with the pure-PyTorch
backend. Absolute times say nothing about GPUs; the phase structure, collective counts,
host reads and bytes carry over (host reads of the torch backend do not: GPUs run gsplat's).
"""

from __future__ import annotations

import collections
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks.procs import make_config, prewarm, run_ranks, scene_spec  # noqa: E402

PHASES = ("data", "project", "count_exchange", "pack", "payload_exchange", "rasterize", "loss",
          "backward", "optimizer", "densification", "other")
COLLECTIVES = ("all_to_all_single", "all_to_all", "all_gather", "all_gather_into_tensor",
               "all_gather_object", "all_reduce", "broadcast", "barrier", "reduce_scatter_tensor")
HOST_READS = ("tolist", "item", "numpy", "__int__", "__float__", "__bool__")


class Recorder:
    """Wraps the phase functions of one Trainer and the process-wide torch.distributed /
    Tensor functions. Only records while `active`; `remove()` restores everything."""

    def __init__(self, trainer, cuda: bool):
        import torch.distributed as dist

        import distsplat.distributed.exchange as ex
        import distsplat.distributed.render as drender
        import distsplat.train.trainer as tmod

        self.cuda, self.active, self.phase = cuda, False, None
        self.rank = trainer.ctx.rank
        self._undo: List[tuple] = []
        self.step: Dict[str, Any] = {}
        wrap = self._patch
        wrap(drender, "_prepare", lambda f: self._timed("project", f))
        wrap(ex, "exchange_counts", lambda f: self._timed("count_exchange", f))
        wrap(drender, "_pack", lambda f: self._timed("pack", f))
        wrap(ex, "all_to_all", lambda f: self._timed("payload_exchange", f))
        wrap(drender, "_unpack", lambda f: self._timed("rasterize", f))
        wrap(drender, "_rasterize_own", lambda f: self._timed("rasterize", f))
        wrap(tmod, "photometric_loss", lambda f: self._timed("loss", f))
        wrap(torch.Tensor, "backward", lambda f: self._timed("backward", f))
        for opt in trainer.optimizers.values():
            wrap(opt, "step", lambda f: self._timed("optimizer", f))
            wrap(opt, "zero_grad", lambda f: self._timed("optimizer", f))
        wrap(trainer.strategy, "step_pre_backward", lambda f: self._timed("densification", f))
        wrap(trainer, "_densify", lambda f: self._timed("densification", f))
        wrap(trainer, "loader", lambda loader: _TimedLoader(loader, self._timed("data", loader.__next__)))
        for name in COLLECTIVES:
            if hasattr(dist, name):
                wrap(dist, name, lambda f, n=name: self._collective(n, f))
        for name in HOST_READS:
            wrap(torch.Tensor, name, lambda f, n=name: self._host_read(n, f))
        wrap(torch.Tensor, "cpu", lambda f: self._host_read("cpu", f, device_only=True))

    # ------------------------------------------------------------------ wrapping
    def _patch(self, owner, name: str, make: Callable) -> None:
        had_own = name in vars(owner)
        original = getattr(owner, name)
        setattr(owner, name, make(original))
        self._undo.append((owner, name, original, had_own))

    def remove(self) -> None:
        for owner, name, original, had_own in reversed(self._undo):
            if had_own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)  # the wrapper shadowed an inherited method
        self._undo.clear()

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def _timed(self, phase: str, fn: Callable) -> Callable:
        def wrapper(*a, **k):
            if not self.active or self.phase is not None:  # nested calls belong to the outer phase
                return fn(*a, **k)
            self._sync()
            self.phase = phase
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self._sync()
                self.step["t"][phase] += time.perf_counter() - t0
                self.phase = None
        return wrapper

    def _collective(self, name: str, fn: Callable) -> Callable:
        def wrapper(*a, **k):
            if not self.active:
                return fn(*a, **k)
            t0 = time.perf_counter()
            out = fn(*a, **k)
            dt = time.perf_counter() - t0
            phase = self.phase or "other"
            sent, rows = _bytes_sent(name, a, k, self.rank)
            self.step["collectives"].append({"phase": phase, "name": name, "bytes_sent": sent,
                                             "rows_sent": rows, "s": dt})
            if phase == "backward" and name == "all_to_all_single":
                self.step["t_sub"]["backward.reverse_exchange"] += dt
            return out
        return wrapper

    def _host_read(self, name: str, fn: Callable, device_only: bool = False) -> Callable:
        def wrapper(t, *a, **k):
            if self.active and not (device_only and t.device.type == "cpu"):
                phase = self.phase or "other"
                self.step["host_reads"][phase] += 1
                f = sys._getframe(1)
                while f is not None and ("torch/" in f.f_code.co_filename or f.f_code.co_filename == __file__):
                    f = f.f_back
                # module:function, not file:line: line numbers go stale with the next edit
                site = "?" if f is None else f"{_module(f.f_code.co_filename)}:{f.f_code.co_qualname} {name}"
                self.step["sites"][f"{phase} | {site}"] += 1
            return fn(t, *a, **k)
        return wrapper

    # ------------------------------------------------------------------ steps
    def begin(self) -> None:
        self.step = {"t": collections.defaultdict(float), "t_sub": collections.defaultdict(float),
                     "collectives": [], "host_reads": collections.Counter(),
                     "sites": collections.Counter()}
        self._sync()
        self.active = True
        self._t0 = time.perf_counter()

    def end(self) -> Dict[str, Any]:
        self._sync()
        total = time.perf_counter() - self._t0
        self.active = False
        t = dict(self.step["t"])
        t["other"] = total - sum(t.values())
        return {"total": total, "t": t, "t_sub": dict(self.step["t_sub"]),
                "collectives": self.step["collectives"], "host_reads": dict(self.step["host_reads"]),
                "sites": dict(self.step["sites"])}


class _TimedLoader:
    """The trainer's loader with a timed next(); everything else passes through."""

    def __init__(self, loader, timed_next: Callable):
        self._loader, self._next = loader, timed_next

    def __iter__(self):
        return self

    def __next__(self):
        return self._next()

    def __getattr__(self, name):
        return getattr(self._loader, name)


def _module(path: str) -> str:
    """distsplat/render/torch_backend.py -> distsplat.render.torch_backend"""
    short = _short(path)
    return short[:-3].replace("/", ".") if short.endswith(".py") else short


def _short(path: str) -> str:
    for marker in ("/distsplat/", "/gsplat/", "/benchmarks/"):
        if marker in path:
            return marker[1:] + path.split(marker, 1)[1]
    return Path(path).name


def _bytes_sent(name: str, a: tuple, k: dict, rank: int):
    """Bytes (and rows, for all_to_all_single) this rank sends to OTHER ranks."""
    import torch.distributed as dist

    W = dist.get_world_size() if dist.is_initialized() else 1
    if name == "all_to_all_single":
        inp = a[1] if len(a) > 1 else k["input"]
        splits = k.get("input_split_sizes", a[3] if len(a) > 3 else None)
        rows = inp.shape[0]
        splits = list(splits) if splits else [rows // W] * W
        row_bytes = inp.element_size() * (inp.numel() // max(rows, 1))
        sent_rows = rows - splits[rank]
        return sent_rows * row_bytes, sent_rows
    tensors = [x for x in list(a) + list(k.values()) if isinstance(x, torch.Tensor)]
    nbytes = max((x.numel() * x.element_size() for x in tensors), default=0)
    if name in ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce_scatter_tensor"):
        return nbytes * (W - 1) // max(W, 1), 0  # ring-algorithm share, roughly
    return nbytes, 0


# ---------------------------------------------------------------------------- one rank


def measure(ctx, spec: Dict[str, Any], warmup: int, steps: int) -> Dict[str, Any]:
    """Runs on every rank: warm-up, `steps` plain steps, then `steps` instrumented steps
    (the last one also refines). Returns this rank's raw records."""
    from distsplat.train.trainer import Trainer

    total = warmup + 2 * steps
    with tempfile.TemporaryDirectory(prefix="distsplat-breakdown-") as tmp:
        cfg = make_config(spec, total, tmp, refine_at=total - 1)
        trainer = Trainer(cfg, ctx)
        cuda = ctx.device.type == "cuda"
        try:
            trainer.setup()
            prewarm(trainer)
            plain = []
            for step in range(warmup + steps):
                if cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                trainer.train_step(step)
                if cuda:
                    torch.cuda.synchronize()
                if step >= warmup:
                    plain.append(time.perf_counter() - t0)
            rec = Recorder(trainer, cuda)
            records = []
            try:
                for step in range(warmup + steps, total):
                    rec.begin()
                    trainer.train_step(step)
                    records.append(rec.end())
            finally:
                rec.remove()
            return {"rank": ctx.rank, "plain_s": plain, "records": records,
                    "gaussians_local": len(trainer.params["means"]), "n_all": trainer.n_all,
                    "image": [trainer.width, trainer.height], "device": str(ctx.device),
                    "sh_degree_in_use": min((total - 1) // cfg.sh_degree_interval, cfg.sh_degree)}
        finally:
            trainer.cleanup()


# ---------------------------------------------------------------------------- summary


def _median(xs: List[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def summarize(W: int, ranks: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Per W: each rank's median per phase over the steady (non-refine) instrumented
    steps; the table reports the slowest rank per phase. Counts are per step, rank 0."""
    per_rank = []
    for r in ranks:
        steady, refine = r["records"][:-1], r["records"][-1]
        phases = {p: 1e3 * _median([s["t"].get(p, 0.0) for s in steady]) for p in PHASES}
        sub = {"backward.reverse_exchange": 1e3 * _median(
            [s["t_sub"].get("backward.reverse_exchange", 0.0) for s in steady])}
        colls = collections.Counter()
        bytes_by_phase = collections.Counter()
        for c in steady[-1]["collectives"]:
            colls[f"{c['phase']}:{c['name']}"] += 1
            bytes_by_phase[c["phase"]] += c["bytes_sent"]
        per_rank.append({
            "rank": r["rank"], "gaussians_local": r["gaussians_local"],
            "plain_step_ms": 1e3 * _median(r["plain_s"]),
            "instrumented_step_ms": 1e3 * _median([s["total"] for s in steady]),
            "phase_ms": phases, "sub_ms": sub,
            "collectives_per_step": dict(colls),
            "bytes_sent_per_step": dict(bytes_by_phase),
            "host_reads_per_step": steady[-1]["host_reads"],
            "host_read_sites": steady[-1]["sites"],
            "refine_step": {"total_ms": 1e3 * refine["total"],
                            "densification_ms": 1e3 * refine["t"].get("densification", 0.0),
                            "collectives": collections.Counter(
                                f"{c['phase']}:{c['name']}" for c in refine["collectives"])},
        })
    r0 = per_rank[0]
    return {
        "W": W,
        "plain_step_ms_median_max_rank": max(p["plain_step_ms"] for p in per_rank),
        "instrumented_step_ms_max_rank": max(p["instrumented_step_ms"] for p in per_rank),
        "phase_ms_max_rank": {ph: max(p["phase_ms"][ph] for p in per_rank) for ph in PHASES},
        "reverse_exchange_ms_max_rank": max(p["sub_ms"]["backward.reverse_exchange"] for p in per_rank),
        "collectives_per_step": sum(r0["collectives_per_step"].values()),
        "collectives_per_step_by_phase": r0["collectives_per_step"],
        "host_reads_per_step": sum(r0["host_reads_per_step"].values()),
        "host_reads_per_step_by_phase": r0["host_reads_per_step"],
        "bytes_sent_per_step_all_ranks": sum(sum(p["bytes_sent_per_step"].values()) for p in per_rank),
        "bytes_sent_per_step_max_rank": max(sum(p["bytes_sent_per_step"].values()) for p in per_rank),
        "n_all": ranks[0]["n_all"], "image": ranks[0]["image"],
        "ranks": per_rank,
    }


def _line(row: Dict[str, Any]) -> str:
    ph = row["phase_ms_max_rank"]
    parts = " ".join(f"{k}={v:.0f}" for k, v in ph.items())
    return (f"W={row['W']}: plain step {row['plain_step_ms_median_max_rank']:.0f} ms | {parts} ms "
            f"(rev. exchange {row['reverse_exchange_ms_max_rank']:.1f}) | {row['collectives_per_step']} "
            f"collectives, {row['host_reads_per_step']} host reads, "
            f"{row['bytes_sent_per_step_all_ranks'] / 1e6:.2f} MB sent/step")


def main() -> None:
    from benchmarks.common import write_result

    max_w = int(os.environ.get("NGPU", 4))
    steps = int(os.environ.get("STEPS", 6))
    warmup = int(os.environ.get("WARMUP", 3))
    device = os.environ.get("DEVICE", "cuda" if torch.cuda.is_available() else "cpu")
    spec = scene_spec()
    load_at_start = [round(x, 2) for x in os.getloadavg()]  # other processes share the cores
    rows = []
    if device == "cpu":
        for W in range(1, max_w + 1):
            rows.append(summarize(W, run_ranks(measure, W, spec, warmup, steps)))
            print(_line(rows[-1]), flush=True)
    else:
        if not torch.cuda.is_available():
            raise SystemExit("DEVICE=cuda but torch.cuda.is_available() is False")
        from distsplat.distributed import init_distributed

        ctx = init_distributed()  # plain python: W = 1 on cuda:0, no process group
        rows.append(summarize(1, [measure(ctx, spec, warmup, steps)]))
        print(_line(rows[-1]), flush=True)
    cores = os.cpu_count()
    payload = {
        "load_avg_1_5_15min_at_start": load_at_start,
        "device": device,
        "scene": spec,
        "steps": {"warmup": warmup, "plain": steps, "instrumented": steps,
                  "refine_step": "the last instrumented step also grows/prunes (reported apart)"},
        "note": (
            f"{'CPU: W gloo processes on one ' + str(cores) + '-core machine (W > cores time-slices), torch backend, 1 thread each' if device == 'cpu' else 'GPU: one process, gsplat backend; phases bracketed by torch.cuda.synchronize()'}. "
            "phase_ms_max_rank: per phase, the slowest rank's median over the steady steps. "
            "count_exchange includes waiting for the slowest rank to finish projecting (load "
            "imbalance and, on CPU, time-slicing), not just the collective. Host reads are "
            "reads of tensor values on the host (each a device sync if the tensor is on a GPU; "
            "on CPU some are reads of CPU-only tensors that stay on the CPU in GPU runs too). "
            "Bytes are those sent to other ranks (the own share is a local copy)."),
        "results": rows,
    }
    path = write_result("step_breakdown", payload)
    print(f"step_breakdown {device}: W=1..{rows[-1]['W']}, plain step "
          + ", ".join(f"W={r['W']} {r['plain_step_ms_median_max_rank']:.0f} ms" for r in rows)
          + f" -> {path}")


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
