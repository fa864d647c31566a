"""Preemption (issue 44; docs/robustness.md "Preemption"): a stop signal saves, and a clock saves.

A cluster stops a job with a signal and later starts the same command again (Slurm's preemption
and time limit, Kubernetes, spot nodes). SIGTERM, SIGINT and SIGUSR1 on any rank (torchrun
forwards SIGTERM and SIGINT to its workers, SIGUSR1 with `--signals_to_handle`; under srun every
rank may get the signal itself) make every rank finish its step, stop at the same step
boundary, save one checkpoint (no PLY: it must fit a grace period) and return; the CLI says one
line and exits EXIT_PREEMPTED, and the same command resumes (auto_resume.py).

The handler only records the signal: Python runs it in the main thread between bytecodes, so
a rank inside a collective, a decode or a save sees it when that call returns (the step, save
or evaluation in progress finishes first). This rank's request rides on the per-step all-reduce
of the divergence check (faults.py, `StepRequests`): ranks that saw the signal at different
steps, or one rank alone, stop at one step, and no rank is left in a collective the others
skip. A second SIGINT (or a SIGTERM after a SIGINT: torchrun's answer to a second Ctrl-C) ends
the process at once, as the default handler would; a repeated SIGTERM or SIGUSR1 (srun and
torchrun may both deliver one) changes nothing.

--save_every_minutes: rank 0's clock asks for a checkpoint once that long has passed since the
last save, and the request rides the same way, so every rank saves at the same step. Those
checkpoints, and a stop's, are interim: pruned once a newer regular one is whole
(checkpoint.prunable).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

from ...distributed import failure_recorded

log = logging.getLogger("distsplat.train.trainer")  # the trainer's log lines

# sysexits.h's EX_TEMPFAIL, "a temporary failure: the same command later goes on": distinct from 0
# (done), 1 (a failure), 2 (bad input) and from a shell's 128 + N for a process a signal killed.
EXIT_PREEMPTED = 75
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


WATCH_S = 0.5  # how often a rank with a pending stop looks for a failure record


class StopSignals:
    """The first stop signal this process got (`signum`, `at`); handlers that only record it.

    A rank stuck in Python while a stop is pending (a hang, or a peer's failure it has not run
    into yet) would outlive torchrun's SIGTERM until its SIGKILL (30 s): once a signal came, a
    watcher thread (`failed`: any rank left a failure record, distributed/failures.py) ends
    this process as the signal used to, since no checkpoint can follow. A rank blocked in C (a
    collective) cannot run the handler at all: torchrun's SIGKILL ends it."""

    def __init__(self, failed: Optional[Callable[[], bool]] = None) -> None:
        self.signum: Optional[int] = None
        self.at: Optional[float] = None  # time.monotonic() of the first
        self._previous: Dict[int, Any] = {}
        self._failed = failed
        self._woken = threading.Event()  # the handler's flag for the watcher
        self._done = threading.Event()

    def install(self) -> bool:
        """Handlers for STOP_SIGNALS; False (nothing installed) outside the main thread, where
        Python allows none (a trainer run from a library thread stops as before)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        if self._failed is not None:
            threading.Thread(target=self._watch, name="distsplat-stop-watch", daemon=True).start()
        return True

    def _watch(self) -> None:
        self._woken.wait()
        while not self._done.wait(WATCH_S):
            if self._failed():  # silent, as the signal's default action (the failing ranks say why)
                os._exit(128 + self.signum)

    def restore(self) -> None:
        """The handlers from before install(); after a stop, repeated SIGTERM / SIGUSR1 stay
        ignored (the run is exiting with its checkpoint saved: a late duplicate must not turn
        its exit code into a kill)."""
        self._done.set()
        self._woken.set()
        for sig, old in self._previous.items():
            if self.signum is not None and sig != signal.SIGINT:
                old = signal.SIG_IGN
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        self._previous.clear()

    def abandon(self) -> None:
        """The run is failing and can save nothing: the handlers from before install(), and a
        stop signal already recorded acts now as it would have without them (torchrun's
        SIGTERM to the survivors of a dead rank ends them at once, so a restart is not delayed)."""
        self._done.set()
        self._woken.set()
        pending = self.signum if self._previous else None
        self._previous, previous = {}, self._previous
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        if pending is not None and signal.getsignal(pending) == signal.SIG_DFL:
            signal.raise_signal(pending)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum, self.at = signum, time.monotonic()
            self._woken.set()
        if signum == signal.SIGINT:  # a second Ctrl-C (torchrun: its SIGTERM after a second one) ends at once
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


class Preemption:
    """One rank's side of the stop and the clock: its requests for the per-step all-reduce
    (`local`, faults.StepRequests), what every rank read back (`read`, `settle`), and the
    decisions every rank takes alike (`stop_due`, `save_due`)."""

    def __init__(self, is_main: bool, save_every_minutes: float):
        self.is_main = is_main
        self.interval_s = save_every_minutes * 60.0 if save_every_minutes and save_every_minutes > 0 else None
        self.signals = StopSignals(failure_recorded)
        self.last_save = time.monotonic()
        self._stop: Optional[Tuple[int, int, float]] = None  # (step, ranks asking, when read) of the first stop
        self._save: Optional[int] = None  # the first step asking for a save since the last save
        self._floor = 0  # save requests of steps before the last save were answered by it
        self._agreed = 0  # every rank has read the requests of the steps before this one

    def install(self, cfg: Any) -> None:
        """From here a stop signal saves and stops (not for --eval_only / --render_only: they
        train nothing, and stop as before)."""
        if not (cfg.eval_only or cfg.render_only):
            self.signals.install()

    def restore(self) -> None:
        self.signals.restore()

    def abandon(self) -> None:
        """The run failed: signals act as before install(), a recorded one at once (StopSignals.abandon)."""
        self.signals.abandon()

    def start(self) -> None:
        """The clock of --save_every_minutes starts with the training loop."""
        self.last_save = time.monotonic()

    # ---------------------------------------------------- faults.StepRequests
    def local(self) -> Tuple[bool, bool]:
        """(stop, save) this rank asks for at this step: a signal seen, rank 0's clock past
        --save_every_minutes."""
        due = self.is_main and self.interval_s is not None and time.monotonic() - self.last_save >= self.interval_s
        return self.signals.signum is not None, due

    def read(self, step: int, stops: float, saves: float) -> None:
        if stops and self._stop is None:
            self._stop = (step, int(stops), time.monotonic())
        if saves and self._save is None and step >= self._floor:
            self._save = step

    def settle(self, agreed: int) -> None:
        self._agreed = agreed

    # ---------------------------------------------------- every rank alike
    def stop_due(self) -> bool:
        """A stop was asked for by any rank at a step every rank has read: stop now."""
        return self._stop is not None and self._stop[0] < self._agreed

    def save_due(self) -> bool:
        """Rank 0's clock asked for a save at a step every rank has read: save now."""
        return self._save is not None and self._save < self._agreed

    def saved(self, step: int, interim: bool = False) -> None:
        """A save of `step` (any kind) restarts the clock and answers the requests before it; rank 0
        says when an interim one was the clock's (a stop says its own line)."""
        if interim and self.is_main and not self.stop_due():
            log.info("step %d: interim checkpoint saved (--save_every_minutes %g: pruned once a newer regular "
                     "one is whole)", step, self.interval_s / 60.0 if self.interval_s else 0)
        self.last_save = time.monotonic()
        self._floor, self._save = step, None

    def stopped(self, saved: bool, step: int, saved_to: Path, last_complete: str,
                metrics: Dict[str, Any]) -> Dict[str, Any]:
        """The run's metrics with `preempted`: the step, whether its checkpoint is complete (at
        `saved_to`; else `last_complete`: save_guard.last_complete's words), and the line the CLI
        says (rank 0's, with its signal or the count of ranks that got one)."""
        ranks = self._stop[1] if self._stop else 0
        if self.signals.signum is not None:
            why, since = signal.Signals(self.signals.signum).name, self.signals.at
        else:
            why = f"a signal on {ranks} other rank{'s' if ranks > 1 else ''}"
            since = self._stop[2] if self._stop else time.monotonic()
        took = time.monotonic() - since
        if saved:
            line = (f"preempted at step {step} by {why}: checkpoint saved to {saved_to} in "
                    f"{took:.1f} s; the same command resumes")
        else:
            line = (f"preempted at step {step} by {why}: its checkpoint could not be saved (see the warning above); "
                    f"{last_complete}, and the same command resumes from it")
        metrics["preempted"] = {"step": step, "saved": saved, "seconds": took, "line": line}
        return metrics
