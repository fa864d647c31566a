"""The one way tests start W gloo processes: `run_workers("module:function", W, *args)`.

Each rank runs in its own process (forked from a forkserver that imported torch once,
so a spawn costs a fork, not a torch import), joins a gloo group on a free localhost
port through `init_distributed()` (the torchrun environment variables are set exactly as
torchrun sets them), calls `function(ctx, *args)` and writes its return value to a file.
The parent returns the per-rank results in rank order, or fails with every failing
rank's traceback labelled `[rank r]`. A run that outlives `timeout_s` is killed and fails
the test: a hang never hangs CI. Spawning is the expensive part, so tests group many
checks into one worker call.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, List

import torch
import torch.multiprocessing as mp

HERE = Path(__file__).resolve().parent
DEFAULT_TIMEOUT_S = 150.0
# Collectives give up well before the harness does, so a desynchronised group shows up
# as a rank's error message rather than only as a kill.
COLLECTIVE_TIMEOUT_S = 60.0
# What the forkserver imports once, so that a rank costs a fork and not these imports.
# torch._dynamo is the big one (~1 s of CPU): torch.optim.Adam's constructor imports it on
# first use, i.e. in every rank that builds optimizers. None of these touches CUDA, so the
# forkserver's children may still use it. One list for every forkserver user in this
# folder (there is one forkserver per test process; whoever starts it first sets it).
FORKSERVER_PRELOAD = ["torch", "torch._dynamo", "scipy.spatial", "distsplat.distributed", "distsplat.render",
                      "distsplat.train.trainer", "distsplat.train.files.checkpoint"]


class WorkerFailure(AssertionError):
    """One or more ranks failed, died or hung."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world_size: int, port: int, worker: str, args: tuple, out_dir: str,
           sys_path: List[str], shared_gpu: bool = False) -> None:
    os.environ.update({
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
        "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
        "DISTSPLAT_TIMEOUT_S": str(COLLECTIVE_TIMEOUT_S),
    })
    sys.path[:0] = [p for p in sys_path if p not in sys.path]
    torch.set_num_threads(1)  # W processes share the CI machine's 2 cores
    out = Path(out_dir) / f"rank{rank}.pt"
    ctx = None
    try:
        import importlib

        from distsplat.distributed import destroy, init_distributed

        module, fn = worker.split(":")
        ctx = init_distributed(backend="gloo", shared_gpu=shared_gpu)
        result = getattr(importlib.import_module(module), fn)(ctx, *args)
        torch.save({"ok": True, "result": result}, out)
    except BaseException:  # noqa: BLE001 - reported to the parent with the rank
        torch.save({"ok": False, "error": traceback.format_exc()}, out)
    finally:
        if ctx is not None:
            destroy(ctx)


def run_workers(worker: str, world_size: int, *args: Any,
                timeout_s: float = DEFAULT_TIMEOUT_S, shared_gpu: bool = False) -> List[Any]:
    """Runs `worker` ("module:function", module importable from tests/distributed) on
    `world_size` gloo ranks; returns [result of rank 0, ..., rank W-1]. `shared_gpu`
    puts every rank on one GPU in shared-GPU mode (tests/cuda); the forkserver never
    touches CUDA, so its children may."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    sys_path = [str(HERE)] + sys.path
    with tempfile.TemporaryDirectory(prefix="distsplat-test-") as out_dir:
        port = free_port()
        procs = [
            ctx.Process(target=_entry, daemon=True,
                        args=(r, world_size, port, worker, args, out_dir, sys_path, shared_gpu))
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)

        results, errors = [], []
        for r, p in enumerate(procs):
            path = Path(out_dir) / f"rank{r}.pt"
            if not path.exists():
                why = "hung" if r in hung else f"died with exit code {p.exitcode}"
                errors.append(f"[rank {r}] {why} without a result")
                results.append(None)
                continue
            record = torch.load(path, weights_only=False)
            if record["ok"]:
                results.append(record["result"])
            else:
                errors.append(f"[rank {r}] " + record["error"])
                results.append(None)
        if hung:
            errors.insert(0, f"{worker} with W={world_size}: ranks {hung} still running "
                             f"after {timeout_s:.0f} s (a hang?) and were killed")
        if errors:
            raise WorkerFailure("\n".join(errors))
        return results
