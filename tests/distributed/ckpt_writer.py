"""A checkpoint writer to be killed (test_checkpoint_faults.py): saves checkpoints in a
loop exactly as Trainer.save does (begin on rank 0, write_shard for each of W ranks,
finalize with keep=2), with contents that are a function of the step alone, so whatever
survives a SIGKILL can be checked row by row (`expected_rows`).

`Hooks` wrap the filesystem calls the checkpoint code makes (os.replace, shutil.rmtree,
torch.save, json.dump, os.fsync, Path.mkdir / write_text) and count them as events; with
`die_at=k` the process SIGKILLs itself at event k, for "mid" events after doing half of
the call's work (half a file written, half a directory deleted). A traced run lists the
events, so a test can die at every one of them in turn.

Run by hand: python tests/distributed/ckpt_writer.py ROOT [FIRST_STEP] (saves forever).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional

import torch

from distsplat.train.files import checkpoint as ck

KEEP = 2
SH_REST = 15  # SH degree 3: shards of ~100 KB, so a kill often lands inside a write
NAMES = {"means": (3,), "scales": (3,), "quats": (4,), "opacities": (), "sh0": (1, 3), "shN": (SH_REST, 3)}


def num_rows(step: int) -> int:
    return 150 + (step * 37) % 101


def counts_for(step: int, world_size: int) -> List[int]:
    """Uneven per-rank counts that change with the step; every 7th step rank 0 holds none."""
    n = num_rows(step)
    if world_size == 1:
        return [n]
    first = 0 if step % 7 == 0 else n * (1 + step % 4) // (2 + world_size)
    rest = n - first
    return [first] + [rest // (world_size - 1) + (r < rest % (world_size - 1)) for r in range(world_size - 1)]


def expected_rows(step: int, start: int, end: int) -> Dict[str, Dict[str, torch.Tensor]]:
    """Global rows [start, end) of step's checkpoint: params, Adam moments, per-Gaussian state."""
    rows = torch.arange(start, end, dtype=torch.float32)
    params, optim = {}, {}
    for i, (name, shape) in enumerate(NAMES.items()):
        width = int(torch.tensor(shape).prod()) if shape else 1
        cols = torch.arange(width, dtype=torch.float32) / 64
        v = (step * 1000 + rows[:, None] + i / 8 + cols).reshape(len(rows), *shape)
        params[name] = v
        optim[name] = {"step": torch.tensor(float(step)), "exp_avg": -v, "exp_avg_sq": 2 * v}
    return {"params": params, "optim": optim, "per_gaussian": {"grad2d": rows + step}}


def state_for(step: int) -> Dict[str, Any]:
    return {"config": {"seed": 3, "step_twice": 2 * step}, "batcher": {"epoch": step // 5, "step": step % 5}}


def save(root: Path, step: int, world_size: int = 2, keep: int = KEEP) -> Path:
    """Trainer.save's sequence, for every simulated rank in turn."""
    counts = counts_for(step, world_size)
    ck.begin(root, step)  # rank 0; then a barrier
    start = 0
    for r, n in enumerate(counts):  # every rank; then a barrier
        rows = expected_rows(step, start, start + n)
        params = torch.nn.ParameterDict({k: torch.nn.Parameter(v) for k, v in rows["params"].items()})
        # Adam's state as the trainer's optimizers hold it (a torch.optim.Adam would cost
        # every forked writer a multi-second first import).
        optimizers = {k: SimpleNamespace(state={p: rows["optim"][k]}) for k, p in params.items()}
        payload = ck.shard_payload(params, optimizers, rows["per_gaussian"])
        payload["rng"] = torch.tensor([step, r])
        ck.write_shard(root, step, r, payload)
        start += n
    return ck.finalize(root, step, counts, state_for(step), keep=keep)  # rank 0; then a barrier


# ---------------------------------------------------------------------------------- kills
def kind(path) -> str:
    """A path as an event name: step numbers kept, the tmp_path prefix dropped."""
    p = Path(path)
    return p.name if ck._NAME.fullmatch(p.name) else f"{p.parent.name}/{p.name}"


class Hooks:
    """Counts the checkpoint code's filesystem calls; SIGKILLs this process at event `die_at`."""

    def __init__(self, die_at: Optional[int] = None):
        self.die_at, self.events = die_at, []  # type: Optional[int], List[str]

    def event(self, name: str, partial: Optional[Callable[[], None]] = None) -> None:
        if len(self.events) == self.die_at:
            if partial is not None:
                partial()
            os.kill(os.getpid(), signal.SIGKILL)
        self.events.append(name)

    def install(self) -> None:
        real_replace, real_rmtree, real_save = os.replace, shutil.rmtree, torch.save
        real_dump, real_fsync = json.dump, os.fsync
        real_mkdir, real_write_text = Path.mkdir, Path.write_text
        hooks = self

        def replace(src, dst, **kw):
            hooks.event(f"replace {kind(src)} -> {kind(dst)}")
            return real_replace(src, dst, **kw)

        def rmtree(path, *args, **kw):
            def half():  # a kill mid-delete, the worst order: shards gone, meta.json left
                files = sorted((p for p in Path(path).rglob("*") if p.is_file()), key=lambda p: p.name == ck.META)
                for p in files[: len(files) // 2 + 1]:
                    p.unlink()

            hooks.event(f"rmtree {kind(path)}")
            hooks.event(f"rmtree {kind(path)} half done", half)
            return real_rmtree(path, *args, **kw)

        def save(obj, f, *args, **kw):
            def half():
                buf = io.BytesIO()
                real_save(obj, buf, *args, **kw)
                f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
                f.flush()

            hooks.event("torch.save shard")
            hooks.event("torch.save shard half written", half)
            return real_save(obj, f, *args, **kw)

        def dump(obj, f, *args, **kw):
            def half():
                text = json.dumps(obj, *args, **kw)
                f.write(text[: len(text) // 2])
                f.flush()

            hooks.event("json.dump meta")
            hooks.event("json.dump meta half written", half)
            return real_dump(obj, f, *args, **kw)

        def fsync(fd):
            hooks.event("fsync")
            return real_fsync(fd)

        def mkdir(self, *args, **kw):
            hooks.event(f"mkdir {kind(self)}")
            return real_mkdir(self, *args, **kw)

        def write_text(self, *args, **kw):
            hooks.event(f"write_text {kind(self)}")
            return real_write_text(self, *args, **kw)

        os.replace, shutil.rmtree, torch.save, json.dump, os.fsync = replace, rmtree, save, dump, fsync
        Path.mkdir, Path.write_text = mkdir, write_text


def write_loop(root: str, steps: List[int], die_at: Optional[int] = None, ready=None,
               trace: Optional[str] = None, sys_path: Optional[List[str]] = None) -> None:
    """Process entry: saves `steps` in order (a forkserver child; the test kills it)."""
    if sys_path:
        sys.path[:0] = [p for p in sys_path if p not in sys.path]
    torch.set_num_threads(1)
    hooks = Hooks(die_at)
    hooks.install()
    if ready is not None:
        ready.set()
    t0 = time.perf_counter()
    for step in steps:
        save(Path(root), step)
    if trace is not None:
        Path(trace).write_text(json.dumps({"events": hooks.events, "seconds": time.perf_counter() - t0}))


def resume_error(ctx, cfg) -> Optional[str]:
    """run_workers worker: sets a Trainer up from cfg.ckpt and agrees on the outcome as
    the CLI does (cli.run); returns the error this rank raised."""
    import copy

    from distsplat.distributed import raise_together
    from distsplat.train.trainer import Trainer

    trainer = Trainer(copy.deepcopy(cfg), ctx)
    try:
        error = None
        try:
            trainer.setup()
        except Exception as e:  # noqa: BLE001
            error = e
        raise_together(ctx, error, "setup")
        return None
    except ValueError as e:
        return str(e)
    finally:
        trainer.cleanup()


if __name__ == "__main__":
    first = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    write_loop(sys.argv[1], list(range(first, first + 10**6)))
