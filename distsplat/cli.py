"""The trainer's command line (wrapped by `distsplat.app`, which adds the viewer): parse (tyro, subcommands `default`
and `mcmc` as gsplat's simple_trainer; gsplat's flags that distsplat does not take: gsplat_flags.py), run one
rank's training (`Trainer.run` owns its lifecycle), and turn a failure into one line and an
exit code (2: bad input, 1: any other failure, 75: stopped by a signal with its checkpoint saved,
train/guards/preemption.py). Runs unchanged under `python` (one process)
and `torchrun --nproc_per_node=W` (gloo on CPU, nccl on GPUs). It sits beside the app, above
train/ (docs/design.md layers): train never parses the command line."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time
import traceback
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence

from .distributed import destroy, init_distributed, is_peer_failure, record_for_launcher, setup_logging
from .gsplat_flags import translate as translate_gsplat_flags
from .train.config import Config, default_config, mcmc_config
from .train.guards.preemption import EXIT_PREEMPTED

if TYPE_CHECKING:
    from .train.trainer import Extension

CONFIGS = {
    "default": ("Gaussian splatting with gsplat's default densification (clone, split, prune).",
                default_config()),
    "mcmc": ("Gaussian splatting as MCMC (relocate and add Gaussians up to --strategy.cap_max).",
             mcmc_config()),
}


def parse(args: Optional[Sequence[str]] = None, configs: Optional[Dict[str, tuple]] = None) -> Config:
    """The config of the command line. Every rank parses it alike, so only rank 0 prints
    what tyro says (--help, a typo'd flag's box); a bad command line exits 2 (tyro's code)
    with the box's first line in torchrun's error file, so its summary shows the cause.
    `configs`: {subcommand: (description, defaults)}, CONFIGS unless the app composes more."""
    import tyro

    kept, notes = translate_gsplat_flags(sys.argv[1:] if args is None else list(args))
    main = _rank() == 0
    if main:
        for note in notes:
            sys.stderr.write(f"distsplat: {note}\n")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), \
                (contextlib.nullcontext() if main else contextlib.redirect_stdout(io.StringIO())):
            return tyro.extras.overridable_config_cli(configs or CONFIGS, args=kept)
    except SystemExit as e:
        if main:
            sys.stderr.write(err.getvalue())
            sys.stderr.flush()
        if e.code not in (0, None):
            record_for_launcher(f"distsplat: error: {tyro_summary(err.getvalue())}; see --help")
            if not main:
                time.sleep(QUIET_EXIT_DELAY_S)  # rank 0 prints the box (see _fail)
        raise


def tyro_summary(text: str) -> str:
    """The first line of tyro's error box under its title ("Unrecognized options: --max_stepz,
    5"), without the box's borders."""
    lines = [line.strip(" │╭╮╰╯─-\t") for line in text.splitlines()]
    lines = [line for line in lines if line]
    return lines[1] if len(lines) > 1 else (lines[0] if lines else "the command line was not understood")


# A rank that leaves an agreed error to rank 0 waits this long before it exits (torchrun
# ends the job when the first rank exits; rank 0 exits within milliseconds of its line).
QUIET_EXIT_DELAY_S = 5.0


def run(cfg: Config, extensions: Sequence[Extension] = ()) -> Dict[str, Any]:
    """Trains with cfg on this process's rank (Trainer.run: bad input raises ValueError with
    the same message on every rank; a later exception carries `report`, a line naming the
    rank that failed and where), inside this process's process group."""
    from .train.trainer import Trainer

    ctx = init_distributed()
    setup_logging(ctx)
    trainer = Trainer(cfg, ctx)
    try:
        return trainer.run(extensions)
    finally:
        destroy(ctx)


def main(args: Optional[Sequence[str]] = None, extensions: Sequence[Extension] = (),
         configs: Optional[Dict[str, tuple]] = None) -> None:
    """Parses, runs, and turns a failure into one line naming the rank and what to do: exit
    2 for bad input (no traceback), 1 otherwise (a traceback only on the rank whose own
    code failed; a rank stopped by a peer's failure names that peer instead). A run stopped
    by a signal says one line (rank 0) and exits EXIT_PREEMPTED on every rank."""
    try:
        cfg = parse(args, configs)
    except ValueError as e:  # a gsplat flag distsplat does not take (gsplat_flags.py): the same on every rank
        _fail(f"distsplat: error: {e}", 2, quiet=_local_rank() != 0)
    try:
        metrics = run(cfg, extensions)
    except ValueError as e:  # bad input: one line naming the flag/file, not a traceback
        exit_bad_input(e)
    except Exception as e:  # noqa: BLE001 - any failure ends in one line naming the rank
        if not is_peer_failure(e) and not getattr(e, "agreed", False):  # agreed: a clear line says it all
            traceback.print_exc()
        report = getattr(e, "report", None) or f"rank {_rank()} failed: {type(e).__name__}: {e}"
        _fail(f"distsplat: {report}", 1)
    if "preempted" in metrics:  # every rank saved the same step: rank 0 says it, every rank exits alike
        _fail(f"distsplat: {metrics['preempted']['line']}", EXIT_PREEMPTED, quiet=_rank() != 0, wait=False)
    if _rank() == 0 and "val_psnr" in metrics:
        lpips = metrics.get("val_lpips")
        took = f" in {metrics['val_elapsed']:.1f} s" if "val_elapsed" in metrics else " (eval only)"
        print(f"final: PSNR {metrics['val_psnr']:.3f} SSIM {metrics['val_ssim']:.4f}"
              f"{'' if lpips is None else f' LPIPS {lpips:.4f}'} Gaussians {metrics['val_num_GS']}{took} "
              f"-> {cfg.result_dir}")


def exit_bad_input(e: ValueError) -> None:
    """Bad input ends the process with one `distsplat: error` line and exit code 2: rank 0's
    alone when every rank agreed on it (`e.agreed`), else this rank's, naming it. For entry
    points beside the trainer's too (examples/simple_viewer.py)."""
    agreed = getattr(e, "agreed", False)  # the same on all ranks: rank 0 says it, once
    rank = 0 if agreed else _rank()
    _fail(f"distsplat: error{f' on rank {rank}' if rank else ''}: {e}", 2, quiet=agreed and _local_rank() != 0)


def _fail(line: str, code: int, quiet: bool = False, wait: bool = True) -> None:
    """Exits with `code` after writing `line` to stderr (unless `quiet`: another rank says
    the same) and into torchrun's error file (always: its summary lists every rank). A quiet
    rank waits for rank 0 to say it first, unless not `wait` (a stop in a grace period)."""
    if not quiet:  # one write: print's separate newline lets the ranks' lines run into each other
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    record_for_launcher(line)  # torchrun's summary shows the line, not "To enable traceback"
    if quiet and wait:  # torchrun stops the other ranks when the first one exits: let rank 0 say it first
        time.sleep(QUIET_EXIT_DELAY_S)
    sys.exit(code)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _local_rank() -> int:
    """Each node's first rank says an agreed error: one line in every node's log."""
    return int(os.environ.get("LOCAL_RANK", "0"))


if __name__ == "__main__":
    main()
