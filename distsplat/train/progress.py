"""The training loop's progress on rank 0's terminal or log, and the mean loss it reports.

A tqdm bar on a terminal; in logs (CI, torchrun to files) one line per --log_every step. The
loss is summed on the device every step and read once per log step (one sync); a step the
divergence guard skipped (faults.py) is left out of the average, masked on the device.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Callable, Dict, Optional

import torch
from torch import Tensor

log = logging.getLogger("distsplat.train.trainer")  # the trainer's log lines, as before the split


class Progress:
    """Every rank keeps the loss sums; only rank 0 (`main`) shows the bar or the log lines."""

    def __init__(self, main: bool, start_step: int, max_steps: int, device: torch.device):
        self.start_step, self.max_steps, self.device = start_step, max_steps, device
        self.bar = None
        if main:
            from tqdm import tqdm

            self.bar = tqdm(total=max_steps, initial=start_step, dynamic_ncols=True, disable=not sys.stderr.isatty())
        self.t_start = time.perf_counter()
        self._zero()

    def _zero(self) -> None:
        self.loss_sum, self.loss_n = torch.zeros((), device=self.device), torch.zeros((), device=self.device)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t_start

    def add(self, loss: Tensor, found: Optional[Tensor]) -> None:
        """One step's loss; `found` [] on the device: 1.0 for a NaN/Inf step (None: no check)."""
        if found is None:
            self.loss_sum, self.loss_n = self.loss_sum + loss, self.loss_n + 1
        else:  # masked on the device: a skipped step's loss is left out of the average
            self.loss_sum = self.loss_sum + torch.where(found > 0, 0.0, loss)
            self.loss_n = self.loss_n + (1.0 - found)

    def is_log_step(self, done: int, log_every: int) -> bool:
        """The first step logs too: a slow run (CPU, big images) shows it is alive and its pace
        before --log_every steps; a step count, not a clock, so every rank agrees (the work
        summary at a log step is a collective)."""
        return done % log_every == 0 or done == self.max_steps or done == self.start_step + 1

    def report(self, done: int, n_all: int, metrics: Dict[str, Any], work: Callable[[], Dict[str, float]]) -> None:
        """At a log step (every rank): the mean loss since the last one (one sync; nan when
        every step was skipped), the pace and `work()` (balance.py's summary) into `metrics`; rank 0 shows them."""
        metrics["loss"] = (self.loss_sum / self.loss_n).item()
        self._zero()
        metrics["steps_per_s"] = (done - self.start_step) / self.elapsed()
        metrics.update(work())  # the work summary: a collective
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{metrics['loss']:.4f}", GS=n_all)
            if self.bar.disable:
                log.info("step %d/%d: loss %.4f, %.2f steps/s, %d Gaussians; work max/mean: projected "
                         "%.2f, rasterized %.2f", done, self.max_steps, metrics["loss"], metrics["steps_per_s"],
                         n_all, metrics["projected_max_over_mean"], metrics["rasterized_max_over_mean"])

    def update(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
