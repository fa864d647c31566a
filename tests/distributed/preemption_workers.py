"""Workers for test_preemption.py: the CLI's run (parse, then Trainer.run: flags, auto-resume,
setup, training) launched again and again in one gloo group, as a requeued job relaunches the
same command, with a real signal sent at a chosen phase by one rank to itself (os.kill: the
handler, the agreement and the save are the real ones; only the moment is chosen)."""

from __future__ import annotations

import contextlib
import os
import signal
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional

import distsplat.train.scoring.evaluate as evaluate_mod
import distsplat.train.files.outputs as outputs_mod
import distsplat.train.trainer as trainer_mod
from distsplat.app import CONFIGS
from distsplat.cli import parse
from distsplat.train.files import checkpoint as ck
from torchrun_cli import TINY_FLAGS

STEPS = {"save": 8, "eval": 14, "max": 20}
# The tiny scene with densification in the window (refine at 15 and 20), so that a comparison covers
# Gaussian ids, the strategy's accumulators and the RNG; eval and save steps inside the run.
FLAGS = ["default", *TINY_FLAGS, "--max_steps", str(STEPS["max"]), "--save_steps", str(STEPS["save"]),
         "--eval_steps", str(STEPS["eval"]), "--strategy.refine_start_iter", "10", "--strategy.refine_every", "5",
         "--strategy.refine_stop_iter", "26", "--strategy.reset_every", "20", "--log_every", "1"]


def args(result: Path, *extra: str) -> List[str]:
    """The command's arguments (every test of issue 44 runs this one run) into `result`."""
    return [*FLAGS, "--result_dir", str(result), *extra]


def run_phases(tmp_path_factory) -> tuple:
    """(base folder, [rank 0's, rank 1's] `phases` observations): base/ref is the uninterrupted run
    every test compares with (conftest.py's session fixture `preempt_runs`)."""
    import time

    from harness import run_workers

    base = tmp_path_factory.mktemp("preempt")
    t0 = time.monotonic()
    out = run_workers("preemption_workers:phases", 2, args(base / "ref"), args(base / "run"), STEPS)
    print(f"preemption phases: {time.monotonic() - t0:.1f} s")
    return base, out


@contextlib.contextmanager
def signal_in(module: Any, name: str, rank: int, sig: int, ctx: Any, when=lambda *a, **k: True):
    """While inside, `module.name` sends `sig` to this process on `rank` the first time it is
    called with arguments that `when` accepts, then runs as before: the signal lands in that
    phase (Python runs the handler at once, between two bytecodes of the main thread)."""
    original, fired = getattr(module, name), []

    def wrapper(*args, **kwargs):
        if ctx.rank == rank and not fired and when(*args, **kwargs):
            fired.append(True)
            os.kill(os.getpid(), sig)
        return original(*args, **kwargs)

    setattr(module, name, wrapper)
    try:
        yield fired
    finally:
        setattr(module, name, original)


def launch(ctx: Any, args: List[str]) -> Dict[str, Any]:
    """One launch of the command `args` on this group: its metrics, or its error's text."""
    cfg = parse(args, CONFIGS)
    try:
        return trainer_mod.Trainer(cfg, ctx).run()
    except ValueError as e:
        return {"error": str(e), "agreed": getattr(e, "agreed", False)}


def state(root: Path) -> Dict[str, Any]:
    """The checkpoints under root: complete steps, what else is there, and whether the newest
    reads and verifies in full (every shard's SHA-256)."""
    steps = [ck._step_of(p) for p in ck.complete_checkpoints(root)]
    newest_ok = None
    if steps:
        meta = ck.read_meta(root)
        ck.read_rows(meta, 0, meta["num_gaussians"], verify=True)
        newest_ok = meta["step"]
    others = sorted(p.name for p in root.iterdir() if ck._step_of(p) is None or not p.name[5:].isdigit()) \
        if root.is_dir() else []
    return {"steps": steps, "newest_verified": newest_ok, "others": others,
            "interim": [ck._step_of(p) for p in ck.complete_checkpoints(root) if ck.is_interim(p)]}


def snapshot(root: Path) -> Dict[str, Optional[int]]:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns if p.is_file() else None) for p in sorted(root.rglob("*"))}


def phases(ctx: Any, ref_args: List[str], args: List[str], steps: Dict[str, int]) -> Dict[str, Any]:
    """The reference run (`ref_args`), then `args` launched again and again with a signal in
    one phase each: setup, a save, an evaluation, the final PLY; then finished, other flags,
    a damaged newest checkpoint. What each launch returned and left behind."""
    out: Dict[str, Any] = {"ref": launch(ctx, ref_args)}
    result = Path(args[args.index("--result_dir") + 1])
    root = result / "ckpts"
    S, E, N = steps["save"], steps["eval"], steps["max"]

    with signal_in(trainer_mod, "load_scene", 1, signal.SIGUSR1, ctx):
        out["setup"] = launch(ctx, args)
    out["setup_state"] = state(root)
    with signal_in(ck, "write_shard", 0, signal.SIGTERM, ctx, lambda root_, s, r, p: s == S):
        out["save"] = launch(ctx, args)
    out["save_state"] = state(root)
    # --save_every_minutes 0.001 (60 ms): interim saves at the steps rank 0's clock asks for
    with signal_in(evaluate_mod, "evaluate", 1, signal.SIGINT, ctx, lambda *a, **k: a[11] == E):  # a[11]: step
        out["eval"] = launch(ctx, args + ["--save_every_minutes", "0.001"])
    out["eval_state"] = state(root)
    with signal_in(outputs_mod, "write_ply_rows", 0, signal.SIGTERM, ctx,
                   lambda path, *a: Path(path).name == f"point_cloud_{N:04d}.ply.tmp"):
        out["ply"] = launch(ctx, args)
    out["ply_state"] = state(root)
    if ctx.rank == 0:
        shutil.copytree(root / f"step_{N:06d}", result.parent / "final_first")  # for the comparison
    ctx_barrier()

    before = snapshot(result)
    out["again"] = launch(ctx, args)
    ctx_barrier()
    out["again_unchanged"] = snapshot(result) == before
    out["other_flags"] = launch(ctx, args + ["--sh_degree", "2", "--strategy.grow_grad2d", "0.0003"])
    out["other_flags_unchanged"] = snapshot(result) == before

    # Stopped while writing the final evaluation (as a SIGKILL there would leave it): the launch
    # resumes at the last step, trains nothing, and writes the final checkpoint, PLY and evaluation.
    if ctx.rank == 0:
        (result / "stats" / f"val_step{N:04d}.json").unlink()
    ctx_barrier()
    out["finish_outputs"] = launch(ctx, args)
    out["finish_outputs_state"] = state(root)
    ctx_barrier()  # every rank has read the checkpoints before one of them is damaged

    if ctx.rank == 1:  # rank 1 alone reads this shard (the same W: each rank its own)
        shard = root / f"step_{N:06d}" / "rank_0001.pt"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))
    ctx_barrier()
    out["damaged"] = launch(ctx, args)
    out["damaged_state"] = state(root)
    return out


def ctx_barrier() -> None:
    from distsplat.distributed import barrier

    barrier()
