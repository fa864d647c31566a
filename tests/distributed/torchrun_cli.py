"""The real CLI (`examples/simple_trainer.py`) under torchrun, for the tests that run it
end to end (test_trainer.py, test_bad_input_catalog.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, Mapping, Optional, Sequence

import torch

REPO = Path(__file__).resolve().parents[2]
TRAINER = REPO / "examples" / "simple_trainer.py"

# The built-in synthetic scene, small enough for a CPU step in milliseconds.
TINY_FLAGS = [
    "--synthetic.kind", "ball", "--synthetic.num_cameras", "12", "--synthetic.num_gaussians", "400",
    "--synthetic.width", "32", "--synthetic.height", "24", "--sh_degree", "1",
    "--num_workers", "1", "--prefetch", "1", "--disable_viewer",
]


def torchrun_cmd(args: Sequence[str], nproc: int = 2, script: Path = TRAINER, prefix: Sequence[str] = ()) -> list:
    return [*prefix, sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            str(script), *args]


def torchrun_env(timeout_s: float = 60, extra: Optional[Mapping[str, str]] = None) -> dict:
    """One thread per rank (the CPU is shared) and a collective timeout that turns a hang
    into an error well within a test's time limit."""
    return dict(os.environ, OMP_NUM_THREADS="1", DISTSPLAT_TIMEOUT_S=str(timeout_s), **(extra or {}))


def torchrun(args: Sequence[str], nproc: int = 2, timeout: float = 180, collective_timeout_s: float = 60,
             script: Path = TRAINER, extra_env: Optional[Mapping[str, str]] = None, prefix: Sequence[str] = (),
             preexec_fn: Optional[Callable[[], None]] = None) -> subprocess.CompletedProcess:
    """Runs the CLI (or `script`, a wrapper of it) to the end; past `timeout` the whole job
    (launcher and ranks, its own session) is killed and TimeoutExpired raised. `prefix`
    goes before the command (tests/small_fs.py: a small file system of its own);
    `preexec_fn` runs in the child before it starts (e.g. a resource limit)."""
    with subprocess.Popen(torchrun_cmd(args, nproc, script, prefix), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=torchrun_env(collective_timeout_s, extra_env), cwd=REPO,
                          start_new_session=True, preexec_fn=preexec_fn) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def free_port() -> int:
    """A TCP port nobody listens on now (the OS picks it), for a static rendezvous."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_nodes(args: Sequence[str], nnodes: int = 2, nproc: int = 2, timeout: float = 240,
                   collective_timeout_s: float = 60, cwds: Optional[Sequence[Path]] = None,
                   extra_env: Optional[Mapping[str, str]] = None,
                   node_args: Optional[Sequence[Sequence[str]]] = None,
                   prefixes: Optional[Sequence[Sequence[str]]] = None) -> list:
    """`nnodes` torchrun agents on this machine, as on `nnodes` machines: `--nnodes N
    --node_rank i --nproc_per_node nproc`, a static rendezvous on 127.0.0.1 (node 0's agent
    hosts the store). Each agent runs in `cwds[i]` (default: the repo), so a relative path
    is a different folder on each "node"; `node_args[i]` are appended to node i's trainer
    arguments (a launch script that builds a flag per node), `prefixes[i]` put before its
    command (e.g. `unshare --mount ...`: a node with its own view of a folder). Returns one
    CompletedProcess per node; past `timeout` every agent and its ranks are killed and
    TimeoutExpired raised."""
    import tempfile
    import time

    port = free_port()
    env = torchrun_env(collective_timeout_s, extra_env)
    procs, logs = [], []
    try:
        for node in range(nnodes):
            cmd = [*(prefixes[node] if prefixes is not None else ()),
                   sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--node_rank={node}",
                   f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1", f"--master_port={port}",
                   str(TRAINER), *args, *(node_args[node] if node_args is not None else ())]
            # Files, not pipes: an agent blocked on a full pipe would stall the other's collectives.
            out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            logs.append((out, err))
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env,
                                          cwd=cwds[node] if cwds is not None else REPO, start_new_session=True))
        deadline = time.monotonic() + timeout
        for proc in procs:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        results = []
        for proc, (out, err) in zip(procs, logs):
            out.seek(0)
            err.seek(0)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read()))
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for out, err in logs:
            out.close()
            err.close()


def checkpoint_tensors(ckpt: Path) -> Dict[str, torch.Tensor]:
    """Every tensor of a checkpoint's shards (parameters, Adam moments, ids, accumulators, RNG)."""
    meta = json.loads((ckpt / "meta.json").read_text())
    out = {}
    for s in meta["shards"]:
        payload = torch.load(ckpt / s["file"], weights_only=True)
        for group in ("params", "per_gaussian"):
            out.update({f"{s['file']}/{group}/{k}": v for k, v in payload[group].items()})
        for k, st in payload["optim"].items():
            out.update({f"{s['file']}/optim/{k}/{n}": v for n, v in st.items()})
        out[f"{s['file']}/rng"] = payload["rng"]["cpu"]
    return out
