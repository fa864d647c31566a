"""The trainer's own step, timed and counted by the ranges it marks (distsplat/profiling.py),
for the GPU benchmarks (bench_step_vs_gsplat, scaling_gpu; studies/steps/: count_syncs, profile_gpu):
they run `Trainer.train_step` under torch.profiler and read these ranges, never a copy of the step.
`SyncCounter` (the end of this file) counts a step's host syncs for count_syncs and gsplat_peer.

    train/batch  train/render  train/loss  train/backward  train/divergence
    train/optimizer  train/densify                       (Trainer.train_step)
    distsplat/project  distsplat/count_exchange  distsplat/pack
    distsplat/payload_exchange  distsplat/rasterize       (distributed_rasterize forward)
    distsplat/payload_exchange_backward                   (its backward)

and four of the benchmarks' own: `bench/step` around each call of train_step,
`bench/collective` around each collective while ranks take turns (`taking_turns`),
`bench/sync`, a mark where count_syncs saw a host sync, and `bench/staged`, a mark where a
collective of shared-GPU mode went through host memory (count_syncs' W = 2 case:
distsplat/distributed/staging.py's to_host, one sync each on CUDA). A range that a run lacks is reported
as missing (`missing`), never an error: the ranges of the distributed render may not exist in
every version of it.

A step is cut into leaves at every range boundary; a leaf is named after the innermost range
around it, with three refinements: the time of train/render outside its distsplat ranges is
`train/render:other`; train/backward is split at the payload exchange's backward into
`train/backward:before_exchange` and `train/backward:after_exchange` (one `train/backward`
without an exchange, W = 1); time inside a collective is `collective:<enclosing leaf>`.
Per leaf three times (ms):

    ms         how much later the step completes because of the leaf: the running maximum of
               the host's end of each leaf and the device end of the kernels launched in it
               (and before), differenced leaf by leaf. The leaves of a step add up to the
               step's time from its start to its last kernel, launch gaps included; on a CPU
               (no kernels) it is the host time.
    cpu_ms     the host's time in the leaf.
    device_ms  kernel (and copy) time on the device of what the leaf launched (CUDA only).

Device work is attributed to a leaf by the host time of the op that launched it (the
profiler links each kernel to that op), whatever thread ran the op: the autograd engine's
device thread runs the CUDA backward while the main thread sits in train/backward.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import functools
import linecache
import statistics
import threading
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch

STEP_RANGES = ("train/batch", "train/render", "train/loss", "train/backward", "train/divergence",
               "train/optimizer", "train/densify")
RENDER_RANGES = ("distsplat/project", "distsplat/count_exchange", "distsplat/pack", "distsplat/payload_exchange",
                 "distsplat/rasterize")
BACKWARD_RANGES = ("distsplat/payload_exchange_backward",)
EXCHANGE_RANGES = ("distsplat/count_exchange", "distsplat/payload_exchange", "distsplat/payload_exchange_backward")
STEP = "bench/step"
COLLECTIVE = "bench/collective"
SYNC = "bench/sync"
SYNC_WARNING = "synchronizing CUDA operation"  # what torch.cuda.set_sync_debug_mode("warn") says
STAGED = "bench/staged"
MARKS = (SYNC, STAGED)  # points in time, not ranges: counted in the leaf around them, never cut one
TRAINER_RANGES = STEP_RANGES + RENDER_RANGES + BACKWARD_RANGES
NAMES = frozenset(TRAINER_RANGES + (STEP, COLLECTIVE) + MARKS)
# The ranges one rank's step marks: at W = 1 the distributed render exchanges nothing.
EXPECTED = {1: STEP_RANGES + ("distsplat/project", "distsplat/rasterize"), "W>1": TRAINER_RANGES}


def expected(world_size: int) -> Tuple[str, ...]:
    return EXPECTED[1] if world_size == 1 else EXPECTED["W>1"]


@dataclass(frozen=True)
class Span:
    """A named range on the host, in microseconds of the profiler's clock."""

    name: str
    start: float
    end: float


@dataclass(frozen=True)
class DeviceOp:
    """A kernel, copy or memset on the device: when its op was launched on the host, when it ran."""

    name: str
    launch: float
    start: float
    end: float


# ------------------------------------------------------------------------------ reading a profile


def spans_and_ops(prof) -> Tuple[List[Span], List[DeviceOp]]:
    """The named ranges and the device ops of a finished torch.profiler.profile. A device op's
    launch is the host time of its CUDA runtime call (cudaLaunchKernel, cudaMemcpyAsync...,
    which shares its correlation id), else of the op or range the profiler linked it to, else
    its own start (it ran after its launch: never in a leaf before the one that launched it).
    The device side of user annotations (torch's `gpu_user_annotation`: spans over the kernels
    of a record_function range, e.g. the optimizer's) is not an op of its own."""
    from torch.autograd import DeviceType

    events = prof.events()
    cpu = [e for e in events if e.device_type == DeviceType.CPU]
    spans = [Span(e.name, e.time_range.start, e.time_range.end) for e in cpu if e.name in NAMES]
    annotations = {e.name for e in cpu if getattr(e, "is_user_annotation", False)} | set(NAMES)
    runtime = {e.id: e.time_range.start for e in cpu if getattr(e, "linked_correlation_id", 0) > 0}
    linked_to = {e.id: e.time_range.start for e in cpu if getattr(e, "linked_correlation_id", 0) == 0}
    ops = []
    for e in events:
        if e.device_type != DeviceType.CUDA or e.name in annotations or getattr(e, "is_user_annotation", False):
            continue
        launch = runtime.get(e.id)
        if launch is None:
            launch = linked_to.get(getattr(e, "linked_correlation_id", 0), e.time_range.start)
        ops.append(DeviceOp(e.name, launch, e.time_range.start, e.time_range.end))
    return spans, ops


# ------------------------------------------------------------------------------ leaves of a step


def _label(chain: Sequence[Span], t: float, inner: Sequence[Span]) -> str:
    """The leaf name at host time t, from the ranges around it (outermost first)."""
    names = [s.name for s in chain if s.name not in (STEP,) + MARKS]
    if not names:
        return "bench/other"
    if names[-1] == COLLECTIVE:
        return "collective:" + _label([s for s in chain if s.name != COLLECTIVE], t, inner)
    name = names[-1]
    if name == "train/render":
        return "train/render:other"
    if name == "train/backward":
        backward = next(s for s in reversed(chain) if s.name == "train/backward")
        exchanges = [s.start for s in inner if s.name in BACKWARD_RANGES
                     and backward.start <= s.start <= backward.end]
        if not exchanges:
            return "train/backward"
        return "train/backward:before_exchange" if t < min(exchanges) else "train/backward:after_exchange"
    return name


def _around(spans: Sequence[Span], a: float, b: float) -> List[Span]:
    """Ranges covering [a, b], outermost first (longest first; ties: earliest start)."""
    out = [s for s in spans if s.start <= a and s.end >= b and s.end > s.start]
    return sorted(out, key=lambda s: (-(s.end - s.start), s.start))


def analyse(spans: Sequence[Span], ops: Sequence[DeviceOp] = (), kernels: bool = False) -> List[Dict[str, Any]]:
    """One record per `bench/step` range, in time order:

        step_ms, leaves {leaf: ms}, cpu_ms {leaf: ms}, device_ms {leaf: ms},
        ranges {range name: ms of every leaf inside it},
        collectives {leaf: count}, syncs {leaf: count}, staged {leaf: count}, seen [range names],
        device_ops (how many were attributed to the step), kernels {leaf: {kernel name: ms}}
        (with kernels=True)
    """
    steps = sorted((s for s in spans if s.name == STEP), key=lambda s: s.start)
    op_list = sorted(ops, key=lambda o: o.launch)
    launches = [o.launch for o in op_list]
    out: List[Dict[str, Any]] = []
    carry = float("-inf")  # completion of everything before this step (host or device)
    for step in steps:
        inner = [s for s in spans if s is not step and s.name != STEP and s.start >= step.start and s.end <= step.end]
        timed = [s for s in inner if s.name not in MARKS]
        bounds = sorted({step.start, step.end} | {s.start for s in timed} | {s.end for s in timed})
        leaves: List[Tuple[float, float, str, List[str]]] = []
        for a, b in zip(bounds, bounds[1:]):
            if b <= a:
                continue
            chain = _around([step] + timed, a, b)
            leaves.append((a, b, _label(chain, a, inner), [s.name for s in chain]))
        rec: Dict[str, Any] = {"leaves": {}, "cpu_ms": {}, "device_ms": {}, "ranges": {}, "collectives": {},
                               "syncs": {}, "staged": {}, "seen": sorted({s.name for s in inner} & set(TRAINER_RANGES))}
        if kernels:
            rec["kernels"] = {}
        c0 = c = max(carry, step.start)
        i = bisect.bisect_left(launches, step.start)
        for a, b, label, names in leaves:
            end = b
            busy = 0.0
            while i < len(op_list) and op_list[i].launch < b:
                o = op_list[i]
                end = max(end, o.end)
                busy += o.end - o.start
                if kernels:
                    k = rec["kernels"].setdefault(label, {})
                    k[o.name] = k.get(o.name, 0.0) + (o.end - o.start) / 1e3
                i += 1
            new = max(c, end)
            ms = (new - c) / 1e3
            c = new
            _add(rec["leaves"], label, ms)
            _add(rec["cpu_ms"], label, (b - a) / 1e3)
            if ops:
                _add(rec["device_ms"], label, busy / 1e3)
            for name in dict.fromkeys(n for n in names if n in TRAINER_RANGES):
                _add(rec["ranges"], name, ms)
        for s in inner:
            if s.name in (COLLECTIVE,) + MARKS:
                key = {COLLECTIVE: "collectives", SYNC: "syncs", STAGED: "staged"}[s.name]
                outer = [x for x in _around([step] + timed, s.start, s.start) if x is not s]
                _add(rec[key], _label(outer, s.start, inner), 1)
        rec["step_ms"] = (c - c0) / 1e3
        rec["device_ops"] = i - bisect.bisect_left(launches, step.start)
        carry = c
        out.append(rec)
    return out


def _add(d: Dict[str, float], key: str, value: float) -> None:
    d[key] = d.get(key, 0.0) + value


def missing(records: Sequence[Dict[str, Any]], names: Iterable[str]) -> List[str]:
    """The ranges of `names` that no step of `records` marked."""
    seen = {n for r in records for n in r["seen"]}
    return [n for n in names if n not in seen]


def medians(records: Sequence[Dict[str, Any]], key: str = "leaves") -> Dict[str, float]:
    """Per leaf (or range), the median over the steps (0 in a step without it)."""
    names = list(dict.fromkeys(k for r in records for k in r[key]))
    return {n: statistics.median(r[key].get(n, 0.0) for r in records) for n in names}


# ------------------------------------------------------------------------------ running steps


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def record_steps(step_fn: Callable[[int], Any], steps: Iterable[int], device: torch.device,
                 after_step: Optional[Callable[[int], Any]] = None):
    """Runs step_fn(step) for each step under torch.profiler (device activity on CUDA), each
    inside a `bench/step` range, and returns the finished profiler (read it with
    spans_and_ops and analyse, which take a while: outside anything timed). after_step(step)
    runs after each step, outside its range (e.g. reading what the step left behind)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    with profile(activities=activities) as prof:
        for s in steps:
            with record_function(STEP):
                step_fn(s)
            if after_step is not None:
                after_step(s)
        sync(device)
    return prof


def profile_steps(step_fn: Callable[[int], Any], steps: Iterable[int], device: torch.device,
                  kernels: bool = False, after_step: Optional[Callable[[int], Any]] = None
                  ) -> Tuple[List[Dict[str, Any]], Any]:
    """record_steps, then analyse: (the steps' records, the profiler)."""
    prof = record_steps(step_fn, steps, device, after_step)
    spans, ops = spans_and_ops(prof)
    return analyse(spans, ops, kernels=kernels), prof


def timed_steps(step_fn: Callable[[int], Any], steps: Iterable[int], device: torch.device) -> List[float]:
    """Wall time (ms) of each step without a profiler, the device synchronized before and
    after each (as gsplat's trainer is by its per-step loss.item())."""
    import time

    out = []
    for s in steps:
        sync(device)
        t0 = time.perf_counter()
        step_fn(s)
        sync(device)
        out.append(1e3 * (time.perf_counter() - t0))
    return out


# ------------------------------------------------------------------------------ ranks taking turns

COLLECTIVES = ("all_to_all_single", "all_to_all", "all_reduce", "all_gather", "all_gather_into_tensor",
               "all_gather_object", "broadcast", "broadcast_object_list", "barrier", "monitored_barrier",
               "reduce_scatter_tensor", "reduce", "gather", "scatter")


@contextlib.contextmanager
def taking_turns(token, device: torch.device) -> Iterator[None]:
    """W rank processes sharing one device compute one at a time: inside, this process works
    only while it holds `token` (a lock shared by the W processes). Each torch.distributed
    collective is wrapped: the device is synchronized (this rank's kernels are done), the
    token given up, the collective run (it returns once every rank has reached it, each in
    its turn), the token taken again; all inside a `bench/collective` range, whose time is
    the exchange's and the other ranks' turns, not this rank's work. So a leaf's time is
    this rank's alone on the device, as on a GPU of its own. Synchronous collectives only
    (distsplat issues no async_op)."""
    import torch.distributed as dist

    from distsplat.profiling import profiled

    if token is None:
        yield
        return
    inside = threading.local()

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def in_turn(*args: Any, **kwargs: Any) -> Any:
            if getattr(inside, "depth", 0):
                return fn(*args, **kwargs)
            inside.depth = 1
            try:
                with profiled(COLLECTIVE):
                    sync(device)
                    token.release()
                    try:
                        return fn(*args, **kwargs)
                    finally:
                        token.acquire()
            finally:
                inside.depth = 0

        return in_turn

    originals = {n: getattr(dist, n) for n in COLLECTIVES if hasattr(dist, n)}
    token.acquire()
    for n, fn in originals.items():
        setattr(dist, n, wrap(fn))
    try:
        yield
    finally:
        for n, fn in originals.items():
            setattr(dist, n, fn)
        sync(device)
        token.release()


class SyncCounter:
    """Counts the host syncs CUDA's sync debug mode reports between start() and stop(): the
    count, where they came from (the line that warned) and the Python stack of each (a sync
    inside a library function warns at that function's line: the stack names our caller).
    While a profiler records, each sync also leaves a `bench/sync` mark in it. Without CUDA
    nothing is reported (the plumbing still runs)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.caught: List[Any] = []
        self._scope: Optional[warnings.catch_warnings] = None

    def _hook(self, message, category, filename, lineno, file=None, line=None) -> None:
        if SYNC_WARNING not in str(message):  # not a sync (e.g. the debug mode's own notice)
            return
        stack = [f"{Path(f.filename).parent.name}/{Path(f.filename).name}:{f.lineno} {f.name}"
                 for f in traceback.extract_stack()[:-1]]
        self.caught.append((filename, lineno, stack[-8:]))
        if torch.autograd._profiler_enabled():
            with torch.profiler.record_function(SYNC):
                pass

    def start(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self.caught = []
        self._scope = warnings.catch_warnings()
        self._scope.__enter__()
        warnings.simplefilter("always")
        warnings.showwarning = self._hook
        if self.cuda:
            torch.cuda.set_sync_debug_mode("warn")

    def stop(self) -> Dict[str, Any]:
        try:
            if self.cuda:
                torch.cuda.set_sync_debug_mode(0)
        finally:
            if self._scope is not None:
                self._scope.__exit__(None, None, None)  # filters and showwarning as they were
                self._scope = None
        if self.cuda:
            torch.cuda.synchronize()
        where = collections.Counter(
            f"{Path(f).parent.name}/{Path(f).name}:{n}: {linecache.getline(f, n).strip()[:100]}"
            for f, n, _ in self.caught)
        return {"count": len(self.caught), "where": dict(where.most_common()),
                "stacks": [st for _, _, st in self.caught]}
