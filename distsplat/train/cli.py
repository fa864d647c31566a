"""The trainer's command line (wrapped by `distsplat.app`, which adds the viewer): parse (tyro, subcommands `default`
and `mcmc` as gsplat's simple_trainer), then run one rank's training. Runs unchanged under
`python` (one process) and `torchrun --nproc_per_node=W` (gloo on CPU, nccl on GPUs)."""

from __future__ import annotations

import logging
import sys
import traceback
from typing import Any, Callable, Dict, Optional, Sequence

from ..distributed import (
    describe_failure,
    destroy,
    init_distributed,
    is_peer_failure,
    raise_together,
    record_for_launcher,
    setup_logging,
)
from .config import Config, default_config, mcmc_config
from .outputs import check_result_dir
from .shared_dir import check_shared

log = logging.getLogger("distsplat.train")

CONFIGS = {
    "default": ("Gaussian splatting with gsplat's default densification (clone, split, prune).",
                default_config()),
    "mcmc": ("Gaussian splatting as MCMC (relocate and add Gaussians up to --strategy.cap_max).",
             mcmc_config()),
}


def parse(args: Optional[Sequence[str]] = None) -> Config:
    import tyro

    return tyro.extras.overridable_config_cli(CONFIGS, args=args)


# An extension attaches to the trainer before setup (e.g. the live viewer, a layer above
# this one, wired in by distsplat.app) and returns a function that releases it, or None.
Extension = Callable[[Config, Any, Any], Optional[Callable[[], None]]]


def run(cfg: Config, extensions: Sequence[Extension] = ()) -> Dict[str, Any]:
    """Trains with cfg on this process's rank. Bad input (config, data, checkpoint) raises
    ValueError with the same message on every rank, before any collective can hang: setup
    runs no collective, and its outcome is agreed by every rank at its end. An exception
    later (in training) carries `report`, a line naming the rank that failed and where."""
    from .trainer import Trainer

    ctx = init_distributed()
    setup_logging(ctx)
    trainer = Trainer(cfg, ctx)
    closers = []
    try:
        error = None
        try:  # every rank finds the same bad flag; agreeing lets each one say so
            cfg.adjust_steps(cfg.steps_scaler)
            cfg.validate()
            check_result_dir(cfg.result_dir)
        except ValueError as e:
            error = e
        raise_together(ctx, error, "checking the flags")
        check_shared(ctx, cfg.result_dir)  # several nodes: one result dir for all (shared_dir.py)
        if cfg.eval_only or cfg.render_only:  # nothing to watch: examples/simple_viewer.py shows a checkpoint
            cfg.disable_viewer = True
        for extension in extensions:  # each agrees on its own start-up errors
            closers.append(extension(cfg, ctx, trainer))
        error = None
        try:
            trainer.setup()
        except Exception as e:  # noqa: BLE001 - every rank must reach the agreement
            error = e
        raise_together(ctx, error, "setup")
        if cfg.eval_only:
            return trainer.eval_only()
        if cfg.render_only:
            return trainer.render_only()
        return trainer.train()
    except Exception as e:
        e.report = describe_failure(ctx, e, trainer.where)  # type: ignore[attr-defined]
        raise
    finally:
        for close in reversed(closers):
            if close is not None:
                close()
        trainer.cleanup()
        destroy(ctx)


def main(args: Optional[Sequence[str]] = None, extensions: Sequence[Extension] = ()) -> None:
    """Parses, runs, and turns a failure into one line naming the rank and what to do: exit
    2 for bad input (no traceback), 1 otherwise (a traceback only on the rank whose own
    code failed; a rank stopped by a peer's failure names that peer instead)."""
    cfg = parse(args)
    try:
        metrics = run(cfg, extensions)
    except ValueError as e:  # bad input: one line naming the flag/file, not a traceback
        rank = 0 if getattr(e, "agreed", False) else _rank()  # agreed: the same on all ranks
        _fail(f"distsplat: error{f' on rank {rank}' if rank else ''}: {e}", 2)
    except Exception as e:  # noqa: BLE001 - any failure ends in one line naming the rank
        if not is_peer_failure(e) and not getattr(e, "agreed", False):  # agreed: a clear line says it all
            traceback.print_exc()
        report = getattr(e, "report", None) or f"rank {_rank()} failed: {type(e).__name__}: {e}"
        _fail(f"distsplat: {report}", 1)
    if _rank() == 0 and "val_psnr" in metrics:
        lpips = metrics.get("val_lpips")
        took = f" in {metrics['val_elapsed']:.1f} s" if "val_elapsed" in metrics else " (eval only)"
        print(f"final: PSNR {metrics['val_psnr']:.3f} SSIM {metrics['val_ssim']:.4f}"
              f"{'' if lpips is None else f' LPIPS {lpips:.4f}'} Gaussians {metrics['val_num_GS']}{took} "
              f"-> {cfg.result_dir}")


def _fail(line: str, code: int) -> None:
    # One write: print's separate newline lets the ranks' lines run into each other.
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    record_for_launcher(line)  # torchrun's summary shows the line, not "To enable traceback"
    sys.exit(code)


def _rank() -> int:
    import os

    return int(os.environ.get("RANK", "0"))


if __name__ == "__main__":
    main()
