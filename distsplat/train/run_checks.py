"""What a run agrees on before it trains (docs/design.md, start-up steps 1-4): the flags,
checked on every rank and agreed (`check_flags`, with rank 0's schedule line and the shared
result dir of several nodes), and the outcome of setup (`agree`). Each check raises the same
ValueError on every rank, so a bad input is one `distsplat: error` line before anything is
written, and no rank hangs in a collective its peers never reach."""

from __future__ import annotations

import logging
from typing import Callable

from ..distributed import DistContext, raise_together
from .config import Config
from .files.outputs import check_result_dir
from .guards.shared_dir import check_shared

log = logging.getLogger("distsplat.train")  # the schedule's line, as the CLI logged it


def check_flags(cfg: Config, ctx: DistContext) -> None:
    """Scales the schedule for W and validates the flags and --result_dir on every rank (one
    agreement); rank 0 says the schedule; several nodes: one result dir for all (shared_dir.py)."""
    def check() -> None:
        cfg.adjust_steps(cfg.schedule_factor(ctx.world_size))
        cfg.validate()
        check_result_dir(cfg.result_dir)

    agree(ctx, check, "checking the flags", ValueError)
    if ctx.is_main and not (cfg.eval_only or cfg.render_only):
        log.info("%s", cfg.describe_schedule(ctx.world_size))
    check_shared(ctx, cfg.result_dir)


def agree(ctx: DistContext, step: Callable[[], None], what: str, catch: type = Exception) -> None:
    """Runs `step` on every rank, then agrees its outcome: any rank's error (of type `catch`;
    others propagate at once) is raised on every rank (distributed/failures.py: raise_together)."""
    error = None
    try:
        step()
    except catch as e:  # noqa: BLE001 - every rank must reach the agreement
        error = e
    raise_together(ctx, error, what)
