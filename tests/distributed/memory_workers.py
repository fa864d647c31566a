"""Workers for test_memory_guard.py: tiny trainer runs where one rank's memory use is
injected (MemoryGuard.measure), so the guard's decisions do not depend on RSS noise."""

from __future__ import annotations

import copy
import logging
from typing import Any, Dict, List

import torch

from distsplat.distributed import gather_counts
from distsplat.train.config import Config
from distsplat.train.trainer import Trainer


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def one_rank_full(ctx, cfg: Config, full_rank: int) -> Dict[str, Any]:
    """Trains with rank `full_rank` reporting twice its limit in use (every other rank
    reports nothing); returns the Gaussian count after every step and the warnings."""
    records = _Records()
    logger = logging.getLogger("distsplat")
    logger.addHandler(records)
    trainer = Trainer(copy.deepcopy(cfg), ctx)
    counts: List[int] = []
    trainer.step_hooks.append(lambda t, step: counts.append(len(t.params["means"])))
    try:
        trainer.setup()
        guard = trainer.memory_guard
        used = 2 * guard.limit if ctx.rank == full_rank else 0
        guard.measure = lambda: used
        trainer.train()
        return {"counts": counts, "blocked": guard.blocked, "transitions": guard.transitions,
                "final_counts": gather_counts(len(trainer.params["means"]), torch.device("cpu")),
                "warnings": records.messages}
    finally:
        logger.removeHandler(records)
        trainer.cleanup()
