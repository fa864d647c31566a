"""The trainer's command line (wrapped by `distsplat.app`, which adds the viewer): parse (tyro, subcommands `default`
and `mcmc` as gsplat's simple_trainer), then run one rank's training. Runs unchanged under
`python` (one process) and `torchrun --nproc_per_node=W` (gloo on CPU, nccl on GPUs)."""

from __future__ import annotations

import logging
import sys
from typing import Any, Callable, Dict, Optional, Sequence

from ..distributed import destroy, init_distributed, setup_logging
from .config import Config, default_config, mcmc_config
from .outputs import check_result_dir

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
    ValueError with the same message on every rank, before any collective can hang."""
    from .trainer import Trainer

    cfg.adjust_steps(cfg.steps_scaler)
    cfg.validate()
    check_result_dir(cfg.result_dir)
    ctx = init_distributed()
    setup_logging(ctx)
    trainer = Trainer(cfg, ctx)
    closers = []
    try:
        for extension in extensions:
            closers.append(extension(cfg, ctx, trainer))
        trainer.setup()
        return trainer.train()
    finally:
        for close in reversed(closers):
            if close is not None:
                close()
        trainer.cleanup()
        destroy(ctx)


def main(args: Optional[Sequence[str]] = None, extensions: Sequence[Extension] = ()) -> None:
    cfg = parse(args)
    try:
        metrics = run(cfg, extensions)
    except ValueError as e:  # bad input: one line naming the flag/file, not a traceback
        rank = _rank()
        # One write: print's separate newline lets the ranks' lines run into each other.
        sys.stderr.write(f"distsplat: error{f' on rank {rank}' if rank else ''}: {e}\n")
        sys.stderr.flush()
        sys.exit(2)
    if _rank() == 0 and "val_psnr" in metrics:
        print(f"final: PSNR {metrics['val_psnr']:.3f} SSIM {metrics['val_ssim']:.4f} "
              f"Gaussians {metrics['val_num_GS']} in {metrics['val_elapsed']:.1f} s "
              f"-> {cfg.result_dir}")


def _rank() -> int:
    import os

    return int(os.environ.get("RANK", "0"))


if __name__ == "__main__":
    main()
