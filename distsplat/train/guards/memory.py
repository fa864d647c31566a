"""The memory guard of one rank (docs/design.md: densification on local Gaussians only): before a
refine step grows this rank's Gaussians, the strategy asks `MemoryGuard.allow(params,
n_new)`; when the rank's usage plus what the growth would add passes `fraction` x its limit,
growth stops on this rank (pruning and MCMC relocation go on), as Grendel-GS does, with a
WARNING naming the numbers, and resumes once memory frees up. No collective: each rank
decides for itself, only on refine steps (one usage read, no per-step host sync).

Bytes one more Gaussian costs at the peak of a step (`bytes_per_gaussian`), for P floats of
parameters per Gaussian (means 3, scales 3, quats 4, opacities 1, sh0 3, shN 3(K-1): P = 11
+ 3K, K = (sh_degree+1)^2) of e bytes each:

    B = e * [4 P                  parameter, its gradient, Adam's exp_avg and exp_avg_sq
             + 2 (4 + 3K)         the step's activated copies (exp scales, sigmoid opacities,
                                  SH colours [K, 3]) and their gradients
             + A]                 per-Gaussian strategy state in e-byte units: the int64 id (2),
                                  and the default strategy's grad2d, count (+ radii)

float32, sh_degree 3 (K = 16, P = 59): B = 4 (236 + 104 + 4) = 1376 bytes (default), 1368
(MCMC). With --app_opt the colour rows are features [32] and colours [3] instead of SH
(P = 11 + 35 = 46, the activated copies 2 (4 + 35)): the code reads each row's width from
the parameters themselves, so either layout is counted as it is. Growth also copies one
parameter at a time (torch.cat keeps the old tensor alive while the new one is built), so a
growth of n_new Gaussians on a rank holding N needs

    estimate = n_new * B + N * R,     R = the widest parameter row (shN: 4 * 45 = 180 bytes)

on top of what the rank uses now: CUDA `torch.cuda.memory_reserved` (the caching
allocator's pool, which keeps the last steps' peak), CPU the process's resident set
(/proc/self/statm). The limit defaults to the device's total memory (CUDA) or
min(MemTotal, cgroup limit) / LOCAL_WORLD_SIZE (CPU).

On CPU the resident set is read between steps, after the step's transient memory is freed,
so the guard adds the renderer's bounded working memory (`working`, render_working_bytes):
the torch backend's compositing holds at most torch_backend.WORKING_BYTES per render call
(issue 34), and a step makes one call per image size in its batch. Every decision and
warning (allow, fits, check_setup) counts it.
"""

from __future__ import annotations

import logging
import os
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import Tensor

from ...data.cache import local_world_size, mem_total
from ...distributed import staging
from ...render import torch_backend

log = logging.getLogger(__name__)

GiB = float(2**30)
# Parameters the renderer activates each step (activated() in gaussians.py): their copies
# and the copies' gradients live until the backward pass ends.
# With --app_opt, features and colors are concatenated instead of sh0 and shN (the
# appearance MLP's activations are per pair, not per Gaussian: not counted here).
ACTIVATED = ("scales", "opacities", "sh0", "shN", "features", "colors")


def rss_bytes() -> int:
    """Resident memory of this process (/proc/self/statm), in bytes."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # peak, KiB on Linux


def usage_bytes(device: torch.device) -> int:
    """What this rank holds now: the CUDA caching allocator's pool, or the process RSS."""
    if device.type == "cuda":
        return int(torch.cuda.memory_reserved(device))
    return rss_bytes()


def ranks_sharing_gpu(device: torch.device) -> int:
    """Ranks of this node on `device`: 1, or in shared-GPU mode (DISTSPLAT_SHARED_GPU=1,
    local rank l on cuda:(l % device_count)) those of the LOCAL_WORLD_SIZE local ranks that
    map to it. Per node: other nodes' ranks have their own GPUs."""
    if staging.shared_device() is None:
        return 1
    n_gpus = max(1, torch.cuda.device_count())
    index = device.index if device.index is not None else torch.cuda.current_device()
    return max(1, sum(1 for l in range(local_world_size()) if l % n_gpus == index))


def default_limit(device: torch.device) -> Tuple[int, str]:
    """(bytes, where it comes from) of one rank's memory."""
    if device.type == "cuda":
        _free, total = torch.cuda.mem_get_info(device)
        sharing = ranks_sharing_gpu(device)
        if sharing > 1:  # shared-GPU mode: the node's ranks split each GPU's memory
            return int(total / sharing), f"the total memory of {device} / {sharing} ranks sharing it"
        return int(total), f"the total memory of {device}"
    ranks = local_world_size()
    return int(mem_total() / ranks), f"min(MemTotal, cgroup limit) / {ranks} local rank(s)"


def render_working_bytes(backend: str, device: torch.device, calls: int) -> int:
    """Bytes a step's renders hold at their peak that a reading between steps does not see:
    the torch backend's compositing budget per call on CPU (RSS). 0 on CUDA, whose reserved
    pool keeps the step's peak (and for gsplat, whose kernels' memory that pool holds)."""
    if device.type == "cuda" or backend == "gsplat":
        return 0
    return torch_backend.WORKING_BYTES * max(1, calls)


def fmt_bytes(n: float) -> str:
    """GiB from 1 GiB up, MiB below (small growths stay readable)."""
    return f"{n / GiB:.2f} GiB" if abs(n) >= GiB else f"{n / 2**20:.1f} MiB"


def _row_bytes(p: Tensor) -> int:
    return int(p.shape[1:].numel()) * p.element_size()


def bytes_per_gaussian(params: Dict[str, Tensor], accumulators: int = 0) -> Tuple[int, int]:
    """(B, R) of the module docstring: bytes one more Gaussian costs at a step's peak, and
    the widest parameter row (copied while growth rebuilds that parameter)."""
    rows = {name: _row_bytes(p) for name, p in params.items()}
    state = 4 * sum(rows.values())  # parameter, gradient, exp_avg, exp_avg_sq
    activations = 2 * sum(rows[k] for k in ACTIVATED if k in rows)
    return state + activations + 4 * accumulators, max(rows.values())


def held_bytes(params: Dict[str, Tensor], optimizers: Dict[str, torch.optim.Optimizer],
               state: Dict[str, object]) -> int:
    """Bytes of the per-Gaussian tensors that exist now: parameters, gradients, optimizer
    state and the strategy's per-Gaussian accumulators."""
    n = len(params["means"])
    total = 0
    for name, p in params.items():
        total += p.numel() * p.element_size()
        if p.grad is not None:
            total += p.grad.numel() * p.grad.element_size()
        for v in optimizers[name].state.get(p, {}).values():
            if isinstance(v, Tensor) and v.shape[:1] == (n,):
                total += v.numel() * v.element_size()
    for v in state.values():
        if isinstance(v, Tensor) and v.dim() >= 1 and v.shape[0] == n:
            total += v.numel() * v.element_size()
    return total


class MemoryGuard:
    """Decides, at each refine step, whether this rank may grow its Gaussians.

    `measure` (a callable returning bytes in use) and `limit` are plain attributes, so tests
    replace them to make the decision deterministic. `blocked` is the latest decision.
    `working`: bytes the step's renders add at their peak beyond `measure` (render_working_bytes)."""

    def __init__(self, limit: int, fraction: float, rank: int, *, accumulators: int = 0,
                 advice: str = "", measure: Optional[Callable[[], int]] = None,
                 device: Optional[torch.device] = None, limit_source: str = "--memory_limit_gb",
                 working: int = 0):
        self.limit, self.fraction, self.rank = int(limit), float(fraction), rank
        self.working = int(working)
        self.accumulators, self.advice, self.limit_source = accumulators, advice, limit_source
        dev = device if device is not None else torch.device("cpu")
        self.measure: Callable[[], int] = measure or (lambda: usage_bytes(dev))
        self.blocked = False
        self.transitions = 0  # how many times growth stopped or resumed

    @property
    def allowed_bytes(self) -> float:
        return self.fraction * self.limit

    def estimate(self, params: Dict[str, Tensor], n_new: int) -> int:
        """Bytes a growth by n_new Gaussians adds at its peak (module docstring)."""
        if n_new <= 0:
            return 0
        b, r = bytes_per_gaussian(params, self.accumulators)
        return n_new * b + len(params["means"]) * r

    def fits(self, params: Dict[str, Tensor], n_new: int) -> bool:
        """Whether n_new more Gaussians fit now (no logging, no state change)."""
        return self.measure() + self.working + self.estimate(params, n_new) <= self.allowed_bytes

    def allow(self, params: Dict[str, Tensor], n_new: int) -> bool:
        """The strategies' growth_check: True to grow by n_new, False to skip this growth.
        Logs once when growth stops and once when it resumes."""
        used = self.measure()
        need = self.estimate(params, n_new)
        ok = used + self.working + need <= self.allowed_bytes
        if ok == self.blocked:  # a transition
            self.blocked = not ok
            self.transitions += 1
            log.warning(self._message(params, used, need, n_new, stopped=not ok))
        return ok

    def _message(self, params: Dict[str, Tensor], used: int, need: int, n_new: int, stopped: bool) -> str:
        b, r = bytes_per_gaussian(params, self.accumulators)
        n = len(params["means"])
        nums = (f"{fmt_bytes(used)} used{self._working_part()} + {fmt_bytes(need)} for {n_new} new Gaussians "
                f"({b} B each + {r} B per held Gaussian while copying)")
        where = f"{self.fraction:.0%} of its {fmt_bytes(self.limit)} limit ({fmt_bytes(self.allowed_bytes)})"
        if stopped:
            return (f"[rank {self.rank}] memory guard: densification stops growing on this rank at {n} "
                    f"Gaussians: {nums} would pass {where}; pruning and relocation continue. To grow "
                    f"further: use more ranks, raise --memory_limit_gb if the device has more memory (the "
                    f"limit is {self.limit_source}), or {self.advice}")
        return (f"[rank {self.rank}] memory guard: densification grows again on this rank at {n} "
                f"Gaussians: {nums} fit within {where}")

    def _working_part(self) -> str:
        return f" + {fmt_bytes(self.working)} the renderer's working memory per step" if self.working else ""

    def check_setup(self, params: Dict[str, Tensor], optimizers: Dict[str, torch.optim.Optimizer],
                    state: Dict[str, object]) -> Optional[str]:
        """Before training: warns (and returns the message) when the initial Gaussians, with
        the gradients, optimizer state and activations the first step adds, already pass
        the limit; ValueError when they alone need more than the whole limit (a GPU with too
        little memory: the first step would run out of it)."""
        n = len(params["means"])
        b, _ = bytes_per_gaussian(params, self.accumulators)
        if n * b > self.limit:  # the Gaussians alone: the first step cannot fit, end before training
            raise ValueError(
                f"rank {self.rank}'s {n} initial Gaussians need {fmt_bytes(n * b)} with their gradients, optimizer "
                f"state and activations ({b} B each), more than its {fmt_bytes(self.limit)} of memory "
                f"({self.limit_source}); use more ranks (or GPUs with more memory), fewer initial points "
                "(--init_num_pts, a sparser point cloud) or a smaller --sh_degree")
        used = self.measure()
        pending = max(0, n * b - held_bytes(params, optimizers, state))
        if used + self.working + pending <= self.allowed_bytes:
            return None
        msg = (f"[rank {self.rank}] memory guard: the {n} initial Gaussians need {fmt_bytes(n * b)} with "
               f"their gradients, optimizer state and activations ({b} B each); with {fmt_bytes(used)} already "
               f"in use{self._working_part()} this rank needs ~{fmt_bytes(used + self.working + pending)}, past {self.fraction:.0%} of its "
               f"{fmt_bytes(self.limit)} limit ({self.limit_source}): training may run out of memory, and "
               f"densification will not grow. Use more ranks, fewer initial points (--init_num_pts, a sparser "
               f"point cloud) or a smaller --sh_degree, or raise --memory_limit_gb if the device has more memory")
        log.warning(msg)
        return msg
