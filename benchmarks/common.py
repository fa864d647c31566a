"""Shared bits of the Python benchmarks: where results go and what every result records
(machine, command, commit, date, versions), so numbers can be compared honestly."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import torch

from benchmarks.paths import neutral
from benchmarks.results_index import device_label, newest, result_path  # noqa: F401  (newest: for readers)

# BENCH_RESULTS: another folder (the tests' plumbing runs write there, not into the record)
RESULTS = Path(os.environ.get("BENCH_RESULTS") or Path(__file__).resolve().parent / "results")


def machine() -> Dict[str, Any]:
    info: Dict[str, Any] = {
        "host_cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    try:
        # Other processes on the machine (e.g. test suites of other checkouts) share the
        # cores: the load average at write time says how contended the timings were.
        info["load_avg_1_5_15min"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        if names:
            info["host_cpu"] = names[0]
    except OSError:
        pass
    return info


def git_commit() -> str:
    """HEAD (short, `-dirty` with uncommitted changes under distsplat/); on a machine
    without the repository's .git (the GPU machine gets a copy of the working tree),
    $DISTSPLAT_COMMIT, which scripts/gpu_prepare.sh records (.gpu_data/COMMIT, read here too)
    and gpu_validate.sh exports."""
    root = Path(__file__).resolve().parents[1]
    if not os.environ.get("DISTSPLAT_COMMIT") and not (root / ".git").exists():
        for f in (Path(os.environ.get("DISTSPLAT_DATA", root / ".gpu_data")) / "COMMIT", root / ".gpu_data" / "COMMIT"):
            if f.is_file():
                os.environ["DISTSPLAT_COMMIT"] = f.read_text().strip()
                break
    if os.environ.get("DISTSPLAT_COMMIT"):
        return os.environ["DISTSPLAT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "distsplat"], cwd=root, capture_output=True, text=True)
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except OSError:
        return "unknown"


_WRITTEN: Dict[str, Path] = {}  # name -> this process's snapshot: a benchmark that saves as it goes rewrites its own


def write_result(name: str, payload: Dict[str, Any]) -> Path:
    """Writes the run's snapshot with its context and returns the path: in the record
    (benchmarks/results/) a new dated file, <name>_<device>_<date>.json (results_index), never an
    older one; under $BENCH_RESULTS (one call's staging folder, which its own checks read)
    <name>.json, dated by `python benchmarks/results_index.py file` when it joins the record.
    `name` says what was measured, not the device. The machine's folders in it are written as
    placeholders (paths.neutral)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name] + sys.argv),
        "commit": git_commit(),
        "machine": machine(),
        **payload,
    }
    if os.environ.get("BENCH_RESULTS"):
        path = RESULTS / f"{name}.json"
    else:
        path = _WRITTEN.get(name) or result_path(
            name, device_label(record["machine"], str(payload.get("device") or "")), record["date"], RESULTS)
    _WRITTEN[name] = path
    path.write_text(json.dumps(neutral(record), indent=2) + "\n")
    return path


def viewmat_towards_origin(eye) -> "torch.Tensor":
    """[4, 4] float32 world-to-camera of a camera at `eye` looking at the origin, y up in
    the world (distsplat.data.synthetic.look_at, inverted): the benchmarks' orbit cameras."""
    import numpy as np

    from distsplat.data.synthetic import look_at

    c2w = look_at(np.asarray(eye, dtype=np.float64), np.zeros(3), up=(0.0, 1.0, 0.0))
    return torch.from_numpy(np.linalg.inv(c2w)).float()



def gpu_or_plumbing(script: str, switch: str) -> "tuple[torch.device, bool]":
    """A GPU benchmark's device: CUDA with gsplat's ops loaded (and said), or the CPU when the
    environment sets `switch`=1 (a run that checks the script's plumbing, not a measurement).
    Returns (device, plumbing); without a GPU and without the switch, exits saying both."""
    plumbing = os.environ.get(switch) == "1"
    if plumbing or not torch.cuda.is_available():
        if not plumbing:
            sys.exit(f"{script} needs a CUDA GPU (torch.cuda.is_available() is False; {switch}=1 checks "
                     "the plumbing on the CPU)")
        return torch.device("cpu"), True
    from distsplat.render.gsplat_ext import ensure_gsplat_ops

    print(f"gsplat ops: {ensure_gsplat_ops()}", flush=True)
    return torch.device("cuda", 0), False
