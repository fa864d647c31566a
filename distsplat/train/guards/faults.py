"""Faults of long runs that must not end them, or must end them cleanly (issue 21).

A full disk while saving.  A checkpoint or PLY write that fails because the disk is full,
over quota or read-only, or the file past a size limit (ENOSPC, EDQUOT, EROFS, EFBIG) skips
that save on EVERY rank and the run goes on: rank 0 warns naming the file and the bytes it
needed, the next save step tries again, and the end of the run lists the saves that failed.
The error is recognised however a real file system delivers it (disk_full.py: in the
exception chain, wrapped by torch's zip writer, a short write), and each write is preceded
by a look at the free space (statvfs against its bytes plus a stated margin), so a disk that
is plainly too full is skipped without a byte written. A write can fail on one rank
only, so each phase of a save ends in one agreement (files/save_guard.py, `SaveGuard.run`: an all-reduce of W
small rows, in place of the barrier that separated the phases anyway) and a checkpoint is
finalized only once every shard is written. The last complete checkpoint is never touched:
the new one lives in its `.tmp` directory until `checkpoint.finalize` renames it.

A diverging step.  A step whose loss or gradients hold NaN or Inf on any rank is skipped by
every rank: no Adam update (nor its step count), nothing added to the densification
statistics, no MCMC noise, its loss left out of the logged average. `DivergenceGuard.check`
folds a finiteness check of this rank's loss and gradients into one all-reduce of W flags
and returns the step's `found_inf`, a 0-dim tensor on the device that the step uses where it
is (GradScaler's protocol: torch's fused Adam skips its update in its kernel when it is 1;
strategies.py masks the statistics with it) and never reads on the host (--max_bad_steps 0
turns the check off). It is a new collective per step because none of the existing ones can
carry it: the count exchange and the payload run before the loss exists, and the reverse
payload before the gradients are complete; the flag is only known once backward has
finished on every rank. What a refinement or opacity reset due at a bad step does is no
longer skipped: it runs from the statistics of the good steps before it.

The host reads the flags afterwards, for the warnings and --max_bad_steps (`poll`, called by
the loop after each step): a non-blocking copy into pinned memory and a CUDA event per step
(`FlagReader`), read in step order once the event has completed, waited for only at log
intervals, saves, evaluations and the end of the run, and past READ_LAG steps (in practice
landed long before). Ranks read at their own pace, so the stop is decided on flags every rank
has read at the same step: once --max_bad_steps bad steps in a row are read, every rank
saves the last good state (a bad step changed nothing) and raises `DivergenceError` at the
same step. On CPU every copy is complete: each step's flags are read and decided right
after it, exactly when the read inside the step used to decide.

A stop signal, a timed save (issue 44).  The same all-reduce carries two more numbers per
step: how many ranks got a stop signal, and whether rank 0's clock says a
--save_every_minutes checkpoint is due (train/guards/preemption.py). They are read and settled with
the flags, so every rank stops or saves at the same step, at no extra collective (the reason
this per-step all-reduce, not a new one, carries them); with --max_bad_steps 0 it still runs
for them, without the finiteness test.
"""

from __future__ import annotations

import logging
from collections import deque
from pathlib import Path
from typing import Any, Callable, Deque, Dict, List, Optional, Protocol, Tuple

import torch
from torch import Tensor

from ...distributed import DistContext, all_reduce_sum

log = logging.getLogger(__name__)

class DivergenceError(RuntimeError):
    """Training stopped after --max_bad_steps steps in a row with NaN/Inf loss or gradients."""


READ_LAG = 8  # steps: on CUDA, the flags of step s are read by the end of step s + READ_LAG


class FlagReader:
    """Per-step [W] flags of the device, read on the host once their copy has landed, in
    step order: a non-blocking copy into pinned memory and an event per step on CUDA; on
    CPU the flags themselves, already complete. `events` (tests): a callable returning an
    object with query() and synchronize(), recorded after the copy."""

    def __init__(self, device: torch.device, events: Optional[Callable[[], Any]] = None):
        self.device = device
        self.events = events if events is not None else (_cuda_event if device.type == "cuda" else None)
        self._pending: Deque[Tuple[int, Tensor, Any]] = deque()  # (step, host flags [W], event or None)
        self._free: List[Tensor] = []  # pinned buffers whose copy was read: reused

    def push(self, step: int, flags: Tensor) -> None:
        """Queues step `step`'s flags [W] (on the device) for the host; never waits."""
        if self.device.type == "cuda":
            host = self._free.pop() if self._free else torch.empty(flags.shape, dtype=flags.dtype, pin_memory=True)
            host.copy_(flags, non_blocking=True)
        else:
            host = flags.detach()  # already on the host, complete
        self._pending.append((step, host, self.events() if self.events is not None else None))

    def pop(self, wait_before: int = 0) -> Optional[Tuple[int, List[float]]]:
        """The oldest queued (step, flags) whose copy has landed; None when there is none. A
        step before `wait_before` is waited for (a blocking read, once)."""
        if not self._pending:
            return None
        step, host, event = self._pending[0]
        if event is not None and not event.query():
            if step >= wait_before:
                return None
            event.synchronize()
        self._pending.popleft()
        flags = host.tolist()  # a landed copy: no device sync
        if self.device.type == "cuda":
            self._free.append(host)  # its copy is done: the buffer serves a later step
        return step, flags

    def __len__(self) -> int:
        return len(self._pending)


def _cuda_event() -> "torch.cuda.Event":
    event = torch.cuda.Event()
    event.record()  # on the current stream, after the copy
    return event


class StepRequests(Protocol):
    """What else rides on the divergence check's all-reduce (train/guards/preemption.py): this rank's
    requests of a step, summed over the ranks and read back in step order like the flags."""

    def local(self) -> Tuple[bool, bool]:
        """(stop, save) this rank asks for at this step."""

    def read(self, step: int, stops: float, saves: float) -> None:
        """Step `step`'s sums over the ranks, read on the host in step order."""

    def settle(self, agreed: int) -> None:
        """Every flag of the steps before `agreed` has been read, on every rank alike."""


class DivergenceGuard:
    """Finds steps whose loss or gradients are not finite on any rank, the same step on all:
    on the device in the step (`check`), on the host later (`poll`). With `requests`, its
    all-reduce carries two more numbers per step, the ranks' stop and save requests
    (preemption.py), read and settled with the flags: at no extra collective, and on every
    rank at the same step. The all-reduce then runs with --max_bad_steps 0 too (the
    finiteness test is off, the requests still ride)."""

    def __init__(self, ctx: DistContext, device: torch.device, max_bad_steps: int,
                 requests: Optional[StepRequests] = None):
        self.ctx, self.device, self.max_bad = ctx, device, max_bad_steps
        self.requests = requests
        self.in_a_row = 0
        self.skipped = 0
        self.first_bad: Optional[int] = None  # first step of the current run of bad steps
        self.last_bad: Optional[int] = None  # last bad step read
        self.bad_ranks: List[int] = []
        self.found: Optional[Tensor] = None  # [] the last checked step's found_inf, on the device
        self.reader = FlagReader(device)

    def check(self, step: int, loss: Tensor, params: Dict[str, Tensor]) -> Optional[Tensor]:
        """After backward: found_inf [] float32 on the device, 1.0 when any rank's loss or
        gradients hold NaN/Inf (the same on every rank), else 0.0; also kept as `found`.
        One all-reduce of W flags and no host read: the flags are queued for `poll`. None
        without either when the check is off (--max_bad_steps 0) and no requests ride on it.
        With requests the all-reduced vector is [W + 2]: the flags, then the number of ranks
        asking to stop and to save."""
        self.found = None
        check = self.max_bad > 0
        if not check and self.requests is None:
            return None
        W, r = self.ctx.world_size, self.ctx.rank
        flags = torch.zeros(W + (2 if self.requests is not None else 0), device=self.device)  # [W (+ 2)]
        if check:
            # Sums propagate NaN and Inf: one finiteness test of W+1 scalars, no [N] mask kept.
            sums = [loss.detach().float().reshape(())]
            sums += [p.grad.detach().float().sum() for p in params.values() if p.grad is not None]
            flags[r] = (~torch.isfinite(torch.stack(sums))).any().float()
        if self.requests is not None:  # host bools: a write only when one is set (rarely)
            stop, save = self.requests.local()
            if stop:
                flags[W] = 1.0
            if save:
                flags[W + 1] = 1.0
        flags = all_reduce_sum(flags)  # every rank's flag (and the requests' sums)
        self.reader.push(step, flags)
        if not check:
            return None
        self.found = (flags[:W].sum() > 0).float()  # []
        return self.found

    def poll(self, done: int, flush: bool) -> bool:
        """On the host after step `done - 1`: reads the queued flags in step order (rank 0 warns
        per bad step) and says whether the run must stop. At `flush` (log intervals, saves,
        evaluations, the end) every flag is read, waiting for the copies; otherwise those that
        have landed, and those of steps more than READ_LAG back even if not (in practice
        landed long before: each step's forward waits for its count exchange). Reading stops
        at divergence (a later good step must not hide it). True when --max_bad_steps bad
        steps in a row were read, the last of them before `agreed` (`done` at a flush or on
        CPU, where every copy is complete, else done - READ_LAG): every rank has read every
        flag before `agreed`, so every rank stops at the same step, whenever each rank's
        copies land."""
        lazy = self.reader.events is not None and not flush
        agreed = done - READ_LAG if lazy else done
        while not self.diverged:
            item = self.reader.pop(wait_before=agreed)
            if item is None:
                break
            self._read(*item)
        if self.requests is not None:
            self.requests.settle(agreed)
        return self.diverged and self.last_bad < agreed

    def _read(self, step: int, flags: List[float]) -> None:
        W = self.ctx.world_size
        if self.requests is not None:
            self.requests.read(step, flags[W], flags[W + 1])
        ranks = [q for q, f in enumerate(flags[:W]) if f]
        if not ranks:
            self.in_a_row, self.first_bad = 0, None
            return
        self.in_a_row += 1
        self.skipped += 1
        self.bad_ranks, self.last_bad = ranks, step
        if self.first_bad is None:
            self.first_bad = step
        if self.ctx.is_main:
            log.warning("step %d skipped: the loss or gradients are NaN/Inf on rank(s) %s (%d bad step(s) in a "
                        "row; the run stops at --max_bad_steps %d)", step, ranks, self.in_a_row, self.max_bad)

    @property
    def diverged(self) -> bool:
        return 0 < self.max_bad <= self.in_a_row

    def error(self, saved: bool, saved_to: Path, last_complete: str) -> DivergenceError:
        """The error that ends the run; `saved`: whether the last good state was checkpointed
        (to `saved_to`; on CUDA possibly past the last bad step read: the steps between were
        good, or skipped too); `last_complete`: save_guard.last_complete's words."""
        if saved:
            kept = f"The last good state is saved: resume with --ckpt {saved_to}"
        else:
            kept = f"Saving the last good state failed (see the warning above); {last_complete}"
        e = DivergenceError(
            f"training diverged: {self.in_a_row} steps in a row (steps {self.first_bad} to {self.last_bad}) had "
            f"NaN/Inf loss or gradients (last on rank(s) {', '.join(map(str, self.bad_ranks))}), --max_bad_steps "
            f"{self.max_bad}; none of them changed the Gaussians. {kept}. Lower the learning rates (e.g. "
            "--means_lr, --scales_lr) or check the input images and poses")
        e.agreed = True  # every rank raises it at the same step: no traceback (cli.main)
        return e
