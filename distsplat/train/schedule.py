"""The batch sequence of a run: which global batch each training step draws.

The shared-seed CameraBatcher (distributed/batcher.py) gives the batch of any (epoch, step within
it) as a pure function; a run maps its training steps onto that sequence from where it started:
step `start_step` draws the batcher's position `batch_start` (epoch * steps_per_epoch + step), 0
for a fresh run, the saved one for a resumed run. The image loader asks ahead by step, the trainer
draws each step's batch once (`draw`), and a checkpoint saves the position after the last step
drawn (Stateful: state_dict / load_state_dict, the batcher's own state with it).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from ..distributed import CameraBatch, CameraBatcher


class Schedule:
    def __init__(self, batcher: CameraBatcher):
        self.batcher = batcher
        self.start_step = 0  # the run's first training step
        self.batch_start = 0  # the batcher's position at start_step
        self.done = 0  # steps drawn: the position a checkpoint saves

    def start(self, step: int) -> None:
        """Training (re)starts at `step` (a resumed checkpoint's, or 0), at the loaded position."""
        self.start_step = self.done = step

    def index(self, step: int) -> int:
        """The batcher's position (epoch * steps_per_epoch + step within it) of training step `step`."""
        return self.batch_start + step - self.start_step

    def position(self, step: int) -> Tuple[int, int]:
        """(epoch, step within it) of training step `step` in the batcher's sequence."""
        return divmod(self.index(step), self.batcher.steps_per_epoch)

    def batch(self, step: int) -> CameraBatch:
        """The global batch of training step `step` (a pure function: the loader asks ahead)."""
        return self.batcher.batch(*self.position(step))

    def draw(self, step: int) -> CameraBatch:
        """The batch training step `step` trains on; a checkpoint after it continues at step + 1."""
        self.done = step + 1
        return self.batch(step)

    def own(self, step: int, rank: int) -> List[int]:
        """Positions among the training cameras of `rank`'s cameras at training step `step`."""
        return self.batcher.own_batch(*self.position(step), rank)

    def state_dict(self) -> Dict[str, Any]:
        epoch, in_epoch = self.position(self.done)
        return {**self.batcher.state_dict(), "epoch": epoch, "step": in_epoch}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """The saved position (another W: the next epoch's start, batcher.load_state_dict)."""
        self.batcher.load_state_dict(state)
        self.batch_start = self.batcher.epoch * self.batcher.steps_per_epoch + self.batcher.step
