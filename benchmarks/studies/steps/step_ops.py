"""What one training step dispatches: aten ops, sorts, float64 work and host reads of
`Trainer.train_step`, counted per phase, package and call site, at W = 1, 2, 4 gloo CPU
processes with the same cameras per rank (so W=2 minus W=1 is what distribution adds).

Counted from the outside, during a few non-refine steps after warm-up:
    ops          every aten op that reaches a TorchDispatchMode, by phase
                   forward   train_step's start until loss.backward() is called
                   backward  inside loss.backward()
                   update    after it (Adam, divergence check, densification statistics),
                             and the image loader's next() (data, not render work)
                 and by package of the innermost Python frame in distsplat or gsplat:
                 distributed, train, torch_backend (the CPU reference projection and
                 rasterizer; a few gsplat kernels on a GPU), render (the rest of
                 distsplat/render), data, gsplat, other (torch.optim, autograd's gradient
                 accumulation, anything with no distsplat frame). A backward op runs under
                 the autograd engine with no Python frame of ours: it is attributed to the
                 forward line that created its autograd node (anomaly mode records each
                 node's creation traceback; custom autograd.Function backwards are Python
                 and counted where they are written). Views (func.is_view: metadata only,
                 no kernel) are counted apart from ops that compute or copy.
    sorts        sort/argsort/topk/unique/kthvalue/median ops, by package and site
    float64      non-view ops with a float64 output (the parameters are float32)
    host reads   Tensor.item/tolist/numpy/cpu/__bool__/__int__/__float__/__index__ by
                 call site (.cpu() of a CPU tensor is marked: a no-op here)
    implicit syncs  ops whose output size depends on values, which read them back on
                 CUDA: nonzero, masked_select, unique, bincount, boolean-mask indexing,
                 repeat_interleave without output_size, _local_scalar_dense outside the
                 reads above, linalg error checks
and, on the same processes without any counting, the median CPU step time.

    python benchmarks/studies/steps/step_ops.py      # SCENES=builtin,thermos WS=1,2,4 BATCH=1 WARMUP=5 STEPS=3 TIMED=10

Environment: SCENES (builtin: the trainer's default synthetic scene; thermos:
$DISTSPLAT_DATA/thermos or ../shared/data/thermos; or a scene folder), DATA_FACTOR (8),
WS, BATCH (cameras per rank), WARMUP, STEPS (counted), TIMED (plain timed steps), NAME
(step_ops_cpu). Writes benchmarks/results/$NAME.json and prints one summary line
(archive/step_ops_cpu2_2026-11-26.json: the step before the lean-step work, 5da5cbf).

Honest scope: on CPU the torch backend renders, so its ops (and its host reads) say
nothing about a GPU run; everything above it is the code a GPU runs. Every tensor is a
CPU tensor here: a host read of a tensor that lives on the host in a GPU run too (the
batcher's camera lists, Adam's step counter) is not a sync there.
"""

from __future__ import annotations

import collections
import functools
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from benchmarks.common import write_result  # noqa: E402
from benchmarks.paths import data_dir  # noqa: E402
from benchmarks.procs import prewarm, run_ranks, steady_state, trainer_config  # noqa: E402

PHASES = ("forward", "backward", "update")
HOST_READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__")
SORTS = {"sort", "argsort", "topk", "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive",
         "msort", "kthvalue", "median", "nanmedian", "mode"}
SYNCS = {"nonzero", "masked_select", "_unique", "_unique2", "unique_dim", "unique_consecutive", "bincount",
         "_local_scalar_dense", "_linalg_check_errors", "is_nonzero", "equal"}
MASK_INDEXING = {"index", "index_put", "index_put_", "_index_put_impl_"}
VIEW_LIKE = {"_unsafe_view", "lift_fresh"}  # not schema views, but no kernel either
_THIS = os.path.realpath(__file__)
_TB_LINE = re.compile(r'File "(.+?)", line (\d+), in (.+)')


def _dir(module) -> str:
    return os.path.dirname(os.path.realpath(module.__file__)) + os.sep


def default_roots() -> List[Tuple[str, str]]:
    """(path prefix, package), first match wins."""
    import distsplat

    ds = _dir(distsplat)
    roots = [(ds + "render/torch_backend.py", "torch_backend")]
    roots += [(ds + p + "/", p) for p in ("distributed", "train", "render", "data")]
    roots.append((ds, "other"))
    try:  # gsplat imports without CUDA; absent, nothing is attributed to it
        import gsplat
        # gsplat's pure-torch reference (the torch backend's SH) is a GPU kernel in a GPU
        # run: its frames pass the op on to their caller, like torch's own Python frames
        roots += [(_dir(gsplat) + "cuda/_torch_impl", None), (_dir(gsplat), "gsplat")]
    except ImportError:
        pass
    return roots


class OpCounter(TorchDispatchMode):
    """Counts what runs between start() and stop() on this thread (see the module doc).
    Tensor.backward is wrapped to switch the phase to backward, then update."""

    def __init__(self, roots: Optional[List[Tuple[str, str]]] = None):
        super().__init__()
        self.roots = roots if roots is not None else default_roots()
        # Sites are named relative to these: distsplat/..., gsplat/..., torch/..., tests/...
        parents = {os.path.dirname(p.rstrip(os.sep)) for p in (_dir(torch), *(p for p, pkg in self.roots
                                                                            if pkg in ("other", "gsplat")))}
        self._bases = sorted(parents | {str(ROOT)}, key=len, reverse=True)
        self.where = functools.lru_cache(maxsize=None)(self._where)
        self.on, self.phase, self._reading, self._undo = False, "forward", 0, []

    # ------------------------------------------------------------ attribution
    def _where(self, path: str) -> Tuple[Optional[str], str]:
        """(package or None, short path) of a source file; package 'self' for this module."""
        real = os.path.realpath(path)
        if real == _THIS:
            return "self", ""
        short = next((real[len(b) + 1:] for b in self._bases if real.startswith(b + os.sep)), os.path.basename(real))
        return next((pkg for prefix, pkg in self.roots if real.startswith(prefix)), None), short

    def _in_frames(self, frames) -> Tuple[str, str]:
        """frames: (file, line, function), innermost first -> (package, 'file:line function')
        of the innermost one of ours; an op reached through torch.optim is 'other'. The autograd
        engine's frame (a C++ backward node runs) hands over to the node's creation site."""
        optim = first = None
        for path, line, fn in frames:
            pkg, short = self.where(path)
            if pkg == "self":
                continue
            first = first or f"{short}:{line} {fn}"
            if pkg is not None:
                return ("other", optim) if optim else (pkg, f"{short}:{line} {fn}")
            if optim is None and short.startswith("torch/optim/"):
                optim = f"{short}:{line} {fn}"
            if fn == "_engine_run_backward":
                return self._node_site()
        return "other", optim or first or "?"

    def _node_site(self) -> Tuple[str, str]:
        node = torch._C._current_autograd_node()
        if node is None or "AccumulateGrad" in node.name():
            return "other", "autograd: " + ("engine" if node is None else "AccumulateGrad")
        tb = node.metadata.get("traceback_") or []  # outermost first, traceback.format_stack's
        frames = [(m[1], int(m[2]), m[3].strip()) for m in map(_TB_LINE.search, reversed(tb)) if m]
        pkg, site = self._in_frames(frames)
        return (pkg, site) if frames else ("other", f"autograd: {node.name()}")

    def attribute(self) -> Tuple[str, str]:
        frames, f = [], sys._getframe(1)
        while f is not None:
            frames.append((f.f_code.co_filename, f.f_lineno, f.f_code.co_name))
            f = f.f_back
        return self._in_frames(frames)

    # ---------------------------------------------------------------- counting
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.on:
            self._note(func, args, kwargs, out)
        return out

    def _note(self, func, args, kwargs, out) -> None:
        s, phase = self.step, self.phase
        pkg, site = self.attribute()
        name = func.overloadpacket.__name__
        view = func.is_view or name in VIEW_LIKE
        s["views" if view else "ops"][phase][pkg] += 1
        op = str(func.overloadpacket)  # aten.sum, c10d.alltoall_base_, profiler._record_function_exit
        if pkg != "torch_backend":  # every site and op of ours; the backend's: its busiest sites
            s["view_sites" if view else "sites"][phase][site] += 1
            if not view:
                s["op_names"][phase][f"{pkg} {op}"] += 1
        elif not view:
            s["backend_sites"][phase][site] += 1
        if name in SORTS:
            s["sorts"][pkg] += 1
            s["sort_sites"][f"{site} {op}"] += 1
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if not view and any(isinstance(o, torch.Tensor) and o.dtype == torch.float64 for o in outs):
            s["float64"][pkg] += 1
            s["float64_sites"][f"{site} {op}"] += 1
        if not self._reading and _syncs_on_cuda(func, name, args, kwargs):
            s["implicit_syncs"][f"{phase} | {site} | {op}"] += 1

    def _read(self, name: str, original: Callable) -> Callable:
        def wrapper(t, *a, **k):
            if not self.on or self._reading or threading.get_ident() != self._tid:
                return original(t, *a, **k)
            _, site = self.attribute()
            noop = " (CPU tensor: no copy)" if name == "cpu" and t.device.type == "cpu" else ""
            self.step["host_reads"][f"{self.phase} | {site} | .{name}(){noop}"] += 1
            self._reading += 1  # its _local_scalar_dense is this read, not an implicit sync
            try:
                return original(t, *a, **k)
            finally:
                self._reading -= 1
        return wrapper

    def _backward(self, original: Callable) -> Callable:
        def wrapper(t, *a, **k):
            was, self.phase = self.phase, "backward" if self.on else self.phase
            try:
                return original(t, *a, **k)
            finally:
                self.phase = "update" if self.on else was
        return wrapper

    def in_phase(self, phase: str, fn: Callable) -> Callable:
        """fn, with what it dispatches counted in `phase` (the loader's next(): update)."""
        def wrapper(*a, **k):
            was, self.phase = self.phase, phase
            try:
                return fn(*a, **k)
            finally:
                self.phase = was
        return wrapper

    def start(self) -> None:
        tree = lambda: collections.defaultdict(collections.Counter)  # noqa: E731
        self.step = {"ops": tree(), "views": tree(), "sites": tree(), "view_sites": tree(), "backend_sites": tree(),
                     "op_names": tree(),
                     **{k: collections.Counter() for k in ("sorts", "sort_sites", "float64", "float64_sites",
                                                           "host_reads", "implicit_syncs")}}
        self._tid, self.phase = threading.get_ident(), "forward"
        patches = [("backward", self._backward(torch.Tensor.backward))]
        patches += [(n, self._read(n, getattr(torch.Tensor, n))) for n in HOST_READS]
        for name, wrapper in patches:
            self._undo.append((name, name in vars(torch.Tensor), getattr(torch.Tensor, name)))
            setattr(torch.Tensor, name, wrapper)
        # check_nan=False: no NaN check (3 ops) after every backward node; tracebacks only
        self._anomaly = torch.autograd.set_detect_anomaly(True, check_nan=False)
        self._anomaly.__enter__()
        self.__enter__()
        self.on = True

    def stop(self) -> Dict[str, Any]:
        self.on = False
        self.__exit__(None, None, None)
        self._anomaly.__exit__(None, None, None)
        for name, own, original in reversed(self._undo):
            if own:
                setattr(torch.Tensor, name, original)
            else:  # the wrapper shadowed a method of torch._C.TensorBase
                delattr(torch.Tensor, name)
        self._undo.clear()
        return _plain(self.step)


class _PhasedLoader:
    """The trainer's loader with next() counted in another phase; everything else passes through."""

    def __init__(self, loader, phased_next: Callable):
        self._loader, self._next = loader, phased_next

    def __iter__(self):
        return self

    def __next__(self):
        return self._next()

    def __getattr__(self, name):
        return getattr(self._loader, name)


def _syncs_on_cuda(func, name: str, args, kwargs) -> bool:
    """Whether the op reads device values to the host on CUDA (its output size or a
    check depends on them)."""
    if name in SYNCS:
        return True
    if name == "repeat_interleave" and func._overloadname in ("Tensor", "self_Tensor"):
        return kwargs.get("output_size") is None
    if name in MASK_INDEXING and len(args) > 1 and isinstance(args[1], (list, tuple)):
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1])
    return False


def _plain(x):
    return {k: _plain(v) for k, v in x.items()} if isinstance(x, dict) else x


# ---------------------------------------------------------------------------- one rank


def make_cfg(scene: str, steps: int, result_dir: str, batch: int):
    """The user's Config for `steps` train_step calls, none of which refines (statistics accumulate
    every step, as on the ~15k steps between refinements; procs.steady_state); no viewer, eval or save."""
    builtin = scene == "builtin"  # the trainer's default synthetic scene (no --data_dir)
    cfg = trainer_config(result_dir, steps, None if builtin else scene,
                         None if builtin else int(os.environ.get("DATA_FACTOR", 8)))
    cfg.batch_size, cfg.num_workers = batch, 1  # prewarm() fills the cache before anything is timed
    # The distributed step itself (issue 28's goal): issue 33's camera-cost note (Balancer.record,
    # 3 forward ops per step at W > 1: searchsorted, diff, index_copy_) is switched off here
    # unless BALANCE_CAMERAS=1; with it, W = 2 adds 11 + 6 ops (measured at 8c66678).
    cfg.balance_cameras = os.environ.get("BALANCE_CAMERAS") == "1"
    return steady_state(cfg)


def measure(ctx, scene: str, batch: int, warmup: int, steps: int, timed: int) -> Dict[str, Any]:
    """Every rank: warm-up, `timed` plain steps, then `steps` counted ones."""
    from distsplat.train.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="distsplat-step-ops-") as tmp:
        trainer = Trainer(make_cfg(scene, warmup + timed + steps, tmp, batch), ctx)
        try:
            trainer.setup()
            prewarm(trainer)
            plain = []
            for step in range(warmup + timed):
                t0 = time.perf_counter()
                trainer.train_step(step)
                plain.append(time.perf_counter() - t0)
            counter, loader = OpCounter(), trainer.loader
            trainer.loader = _PhasedLoader(loader, counter.in_phase("update", loader.__next__))
            records = []
            for step in range(warmup + timed, warmup + timed + steps):
                assert not trainer._is_refine_step(step)
                counter.start()
                try:
                    trainer.train_step(step)
                finally:
                    records.append(counter.stop())
            trainer.loader = loader
            return {"rank": ctx.rank, "step_ms": [1e3 * t for t in plain[warmup:]], "records": records,
                    "gaussians_local": len(trainer.params["means"]), "n_all": trainer.n_all,
                    "image": [trainer.width, trainer.height], "cameras": len(trainer.train_idx)}
        finally:
            trainer.cleanup()


# ---------------------------------------------------------------------------- summary


def mean_counts(records: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The per-step mean of every count (nested dicts of the same shape)."""
    keys = set().union(*(r.keys() for r in records))
    if any(isinstance(r.get(k), dict) for r in records for k in keys):
        return {k: mean_counts([r.get(k, {}) for r in records]) for k in sorted(keys)}
    return {k: sum(r.get(k, 0) for r in records) / len(records) for k in sorted(keys)}


def _top(d: Dict[str, float], n: Optional[int]) -> Dict[str, float]:
    return dict(sorted(d.items(), key=lambda kv: -kv[1])[:n])


def rank_summary(r: Dict[str, Any]) -> Dict[str, Any]:
    recs = r["records"]
    m = mean_counts(recs)
    totals = [{f"{ph}/{pkg}": n for ph, c in rec["ops"].items() for pkg, n in c.items()} for rec in recs]
    differ = {k: [t.get(k, 0) for t in totals] for k in sorted(set().union(*totals))}
    differ = {k: v for k, v in differ.items() if len(set(v)) > 1}
    return {
        "rank": r["rank"], "gaussians_local": r["gaussians_local"],
        "step_ms_median": statistics.median(r["step_ms"]),
        "steps_counted": len(recs), "steps_differ": bool(differ), "differing_ops_per_step": differ,
        "ops": {ph: m["ops"].get(ph, {}) for ph in PHASES},
        "views": {ph: m["views"].get(ph, {}) for ph in PHASES},
        "sorts": m["sorts"], "float64": m["float64"],
        "host_reads": m["host_reads"], "implicit_syncs": m["implicit_syncs"],
        "sort_sites": m["sort_sites"], "float64_sites": m["float64_sites"],
        "sites": {ph: _top(m["sites"].get(ph, {}), None) for ph in PHASES},
        "view_sites": {ph: _top(m["view_sites"].get(ph, {}), None) for ph in PHASES},
        "op_names": {ph: _top(m["op_names"].get(ph, {}), None) for ph in PHASES},
        "torch_backend_top_sites": {ph: _top(m["backend_sites"].get(ph, {}), 10) for ph in PHASES},
    }


def outside_backend(counts: Dict[str, float]) -> float:
    return sum(n for pkg, n in counts.items() if pkg != "torch_backend")


def added(row: Dict[str, Any], base: Dict[str, Any]) -> Dict[str, Any]:
    """Per phase and package, the mean over ranks of row minus base, torch backend left
    out: what W ranks add with the same cameras per rank."""
    def mean_over_ranks(r, kind, ph):
        pk = collections.Counter()
        for rk in r["ranks"]:
            pk.update(rk[kind][ph])
        return {k: v / len(r["ranks"]) for k, v in pk.items() if k != "torch_backend"}
    out = {}
    for kind in ("ops", "views"):
        for ph in PHASES:
            a, b = mean_over_ranks(row, kind, ph), mean_over_ranks(base, kind, ph)
            diff = {k: a.get(k, 0) - b.get(k, 0) for k in sorted(set(a) | set(b))}
            out[f"{ph}_{kind}"] = {"total": sum(diff.values()), "by_package": diff}
    return out


def main() -> None:
    data = data_dir()
    scenes = os.environ.get("SCENES", "builtin,thermos").split(",")
    ws = [int(w) for w in os.environ.get("WS", "1,2,4").split(",")]
    batch, warmup = int(os.environ.get("BATCH", 1)), int(os.environ.get("WARMUP", 5))
    steps, timed = int(os.environ.get("STEPS", 3)), int(os.environ.get("TIMED", 10))
    load_at_start = [round(x, 2) for x in os.getloadavg()]  # other processes share the cores
    results, line = {}, []
    for scene in scenes:
        path = "builtin" if scene == "builtin" else str(data / scene) if (data / scene).is_dir() else scene
        rows = {}
        for W in ws:
            ranks = run_ranks(measure, W, path, batch, warmup, steps, timed)
            per_rank = [rank_summary(r) for r in ranks]
            rows[W] = {"W": W, "n_all": ranks[0]["n_all"], "image": ranks[0]["image"],
                       "train_cameras": ranks[0]["cameras"],
                       "step_ms_median_max_rank": max(p["step_ms_median"] for p in per_rank), "ranks": per_rank}
            r0 = per_rank[0]
            print(f"{scene} W={W}: " + ", ".join(
                f"{ph} {sum(r0['ops'][ph].values()):.0f} ops ({outside_backend(r0['ops'][ph]):.0f} outside the "
                f"torch backend) + {sum(r0['views'][ph].values()):.0f} views" for ph in PHASES)
                + f"; {sum(r0['host_reads'].values()):.0f} host reads, {sum(r0['implicit_syncs'].values()):.0f} "
                f"implicit syncs; step {rows[W]['step_ms_median_max_rank']:.0f} ms", flush=True)
        extra = {W: added(rows[W], rows[1]) for W in ws if W > 1 and 1 in rows}
        results[scene] = {"scene": path, "by_W": {str(W): r for W, r in rows.items()},
                          "added_by_distribution": {f"W{W}_minus_W1": v for W, v in extra.items()}}
        line.append(f"{scene} " + ", ".join(
            f"W={W} +{v['forward_ops']['total']:.0f} fwd +{v['backward_ops']['total']:.0f} bwd"
            for W, v in extra.items()))
    payload = {
        "device": "cpu", "batch_size_per_rank": batch, "load_avg_1_5_15min_at_start": load_at_start,
        "steps": {"warmup": warmup, "timed": timed, "counted": steps},
        "note": ("Per-step means over the counted non-refine steps, per rank. Packages by the innermost "
                 "Python frame in distsplat/gsplat; backward ops by their autograd node's forward site. "
                 "torch_backend is the CPU reference renderer (gsplat kernels on a GPU); its op count "
                 "depends on the image content (tile groups), the rest should not. Step times: median of "
                 "TIMED plain steps per rank, W gloo processes on this machine's cores (time-sliced when W "
                 "> cores). added_by_distribution: mean over ranks, torch backend left out."),
        "results": results,
    }
    path = write_result(os.environ.get("NAME", "step_ops"), payload)
    print("step_ops: ops added by distribution (outside the torch backend): " + "; ".join(line) + f" -> {path}")


if __name__ == "__main__":
    main()
