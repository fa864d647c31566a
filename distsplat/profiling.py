"""Named ranges of the training step for torch.profiler, placed once in the code the trainer
runs, so that benchmarks time and count that code by name instead of a copy of it.

    train/batch  train/render  train/loss  train/backward  train/divergence
    train/optimizer  train/densify                       (Trainer.train_step)
    distsplat/project  distsplat/count_exchange  distsplat/pack
    distsplat/payload_exchange  distsplat/rasterize       (distributed_rasterize forward)
    distsplat/payload_exchange_backward                   (its backward)

Outside a profiler a range costs one flag check (~0.05 us): `torch.profiler.record_function`
itself dispatches two ops and takes ~7 us, which a lean step does not pay for nothing.
Below every layer: any of them may mark its work.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager, Optional

import torch
from torch.profiler import record_function


def profiled(name: str) -> ContextManager:
    """A record_function range while a profiler records, else nothing."""
    return record_function(name) if torch.autograd._profiler_enabled() else contextlib.nullcontext()


class StepRanges:
    """Consecutive ranges of one step without nesting the code in `with` blocks:
    `ranges("train/loss")` closes the open range and opens the next; `ranges.end()` closes it."""

    def __init__(self) -> None:
        self._open: Optional[ContextManager] = None

    def __call__(self, name: str) -> None:
        self.end()
        if torch.autograd._profiler_enabled():
            self._open = record_function(name)
            self._open.__enter__()

    def end(self) -> None:
        if self._open is not None:
            self._open.__exit__(None, None, None)
            self._open = None
