"""Checkpoints that survive a kill and resume on any number of ranks (DESIGN.md
invariant 5: nothing lost).

Layout: `R/ckpts/step_NNNNNN/` holds `rank_RRRR.pt` (that rank's contiguous rows of every
parameter, their Adam moments and per-Gaussian strategy state) and `meta.json` (step,
world size, row ranges, SHA-256 of every shard, and the caller's state: config, batcher,
RNG). A checkpoint is written into `step_NNNNNN.tmp/` and renamed once complete, so a
directory without `.tmp` is always whole; older ones are pruned only after that.

These functions do no collectives: the trainer runs them on every rank with barriers in
between (write_shard on all ranks -> barrier -> finalize on rank 0 -> barrier). Reading is
by global row range, so W' ranks each read `chunk_bounds(N_all, W')` from W shards.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
from torch import Tensor

META = "meta.json"
FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and what to do."""


def step_dir(ckpt_root: Path, step: int) -> Path:
    return Path(ckpt_root) / f"step_{step:06d}"


def tmp_dir(ckpt_root: Path, step: int) -> Path:
    return Path(ckpt_root) / f"step_{step:06d}.tmp"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def shard_payload(
    params: torch.nn.ParameterDict,
    optimizers: Dict[str, torch.optim.Optimizer],
    per_gaussian: Optional[Dict[str, Tensor]] = None,
) -> Dict[str, Any]:
    """This rank's rows: parameters, Adam moments (row-aligned) and step counts, and any
    per-Gaussian state [N, ...] (e.g. a densification strategy's accumulators)."""
    optim: Dict[str, Dict[str, Any]] = {}
    for name, opt in optimizers.items():
        state = opt.state.get(params[name], {})
        optim[name] = {
            k: (v.detach().cpu() if isinstance(v, Tensor) else v) for k, v in state.items()
        }
    return {
        "params": {k: v.detach().cpu() for k, v in params.items()},
        "optim": optim,
        "per_gaussian": {k: v.detach().cpu() for k, v in (per_gaussian or {}).items()},
    }


def write_shard(ckpt_root: Path, step: int, rank: int, payload: Dict[str, Any]) -> str:
    """Writes rank_RRRR.pt into the step's .tmp directory (created by any rank, first
    cleared by rank 0 via `begin`), fsynced; returns its SHA-256."""
    d = tmp_dir(ckpt_root, step)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"rank_{rank:04d}.pt"
    with open(path, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    digest = _sha256(path)
    (d / f"rank_{rank:04d}.sha256").write_text(digest + "\n")
    return digest


def begin(ckpt_root: Path, step: int) -> None:
    """Rank 0, before any shard: drop a half-written .tmp of this step left by a kill."""
    d = tmp_dir(ckpt_root, step)
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)


def finalize(
    ckpt_root: Path, step: int, counts: List[int], state: Dict[str, Any], keep: int = 2
) -> Path:
    """Rank 0, after every rank's write_shard: meta.json with row ranges and checksums,
    then the atomic rename; prunes all but the `keep` newest complete checkpoints."""
    d, final = tmp_dir(ckpt_root, step), step_dir(ckpt_root, step)
    starts = [sum(counts[:r]) for r in range(len(counts))]
    shards = []
    for r, (s, n) in enumerate(zip(starts, counts)):
        digest = (d / f"rank_{r:04d}.sha256").read_text().strip()
        shards.append({"file": f"rank_{r:04d}.pt", "start": s, "end": s + n, "sha256": digest})
    meta = {
        "format": FORMAT, "step": step, "world_size": len(counts),
        "num_gaussians": sum(counts), "shards": shards, "state": state,
    }
    with open(d / META, "w") as f:
        json.dump(meta, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(d)
    if final.exists():  # the same step saved again (e.g. resumed and saved at once)
        shutil.rmtree(final)
    os.replace(d, final)
    _fsync_dir(Path(ckpt_root))
    for old in complete_checkpoints(ckpt_root)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def complete_checkpoints(ckpt_root: Path) -> List[Path]:
    """Complete checkpoint directories, oldest first (a .tmp directory never counts)."""
    root = Path(ckpt_root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_")
             and not p.name.endswith(".tmp") and (p / META).is_file()]
    return sorted(found, key=lambda p: p.name)


def read_meta(path: Path) -> Dict[str, Any]:
    """meta.json of a checkpoint directory (or of the newest one under a ckpts/ root)."""
    path = Path(path)
    if not (path / META).is_file():
        found = complete_checkpoints(path)
        if not found:
            raise CheckpointError(
                f"no complete checkpoint at {path}: expected a directory with {META} "
                "(R/ckpts/step_NNNNNN) or a ckpts/ directory holding one"
            )
        path = found[-1]
    try:
        meta = json.loads((path / META).read_text())
        meta["dir"] = str(path)
        if meta.get("format") != FORMAT or not meta.get("shards"):
            raise KeyError("format")
    except (OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"{path / META} is not a distsplat checkpoint meta file ({e})") from None
    return meta


def read_rows(meta: Dict[str, Any], start: int, end: int, verify: bool = True) -> Dict[str, Any]:
    """Global rows [start, end) of every saved tensor, gathered from the shards that
    hold them, as a shard payload (re-chunking for any world size)."""
    d = Path(meta["dir"])
    shards = [s for s in meta["shards"] if s["start"] < end and start < s["end"]]
    if start == end:
        shards = meta["shards"][:1]  # no rows on this rank: one shard gives the shapes
    if sum(min(end, s["end"]) - max(start, s["start"]) for s in shards) != end - start:
        raise CheckpointError(f"rows [{start}, {end}) are not all in the checkpoint at {d}")
    pieces: List[Dict[str, Any]] = []
    for shard in shards:
        path = d / shard["file"]
        if verify:
            if not path.is_file():
                raise CheckpointError(f"{path} is missing: the checkpoint at {d} is incomplete")
            if _sha256(path) != shard["sha256"]:
                raise CheckpointError(
                    f"{path} does not match its checksum in {d / META}: the file is corrupt or "
                    "truncated; resume from an earlier checkpoint"
                )
        payload = torch.load(path, map_location="cpu", weights_only=True)
        a = max(start, shard["start"]) - shard["start"]
        b = max(min(end, shard["end"]) - shard["start"], a)
        pieces.append(_slice_rows(payload, a, b))
    return _cat_rows(pieces)


def _slice_rows(payload: Dict[str, Any], a: int, b: int) -> Dict[str, Any]:
    def rows(v):
        return v[a:b] if isinstance(v, Tensor) and v.dim() > 0 else v

    return {
        "params": {k: v[a:b] for k, v in payload["params"].items()},
        "optim": {k: {s: rows(v) for s, v in st.items()} for k, st in payload["optim"].items()},
        "per_gaussian": {k: v[a:b] for k, v in payload["per_gaussian"].items()},
    }


def _cat_rows(pieces: List[Dict[str, Any]]) -> Dict[str, Any]:
    first = pieces[0]

    def cat(values):
        return torch.cat(values) if isinstance(values[0], Tensor) and values[0].dim() > 0 else values[0]

    return {
        "params": {k: torch.cat([p["params"][k] for p in pieces]) for k in first["params"]},
        "optim": {
            k: {s: cat([p["optim"][k][s] for p in pieces]) for s in first["optim"][k]}
            for k in first["optim"]
        },
        "per_gaussian": {k: torch.cat([p["per_gaussian"][k] for p in pieces]) for k in first["per_gaussian"]},
    }


def load_rows_into(
    rows: Dict[str, Any],
    params: torch.nn.ParameterDict,
    optimizers: Dict[str, torch.optim.Optimizer],
    device: Optional[torch.device] = None,
) -> Dict[str, Tensor]:
    """Replaces params (new row count allowed) and their Adam state with `rows`; returns
    the per-Gaussian state. Optimizers keep their hyper-parameters (lr, betas, eps)."""
    for name, value in rows["params"].items():
        if name not in params:
            raise CheckpointError(f"checkpoint holds parameter {name!r} that this model does not have")
        p = torch.nn.Parameter(value.to(device or params[name].device))
        opt = optimizers[name]
        old = params[name]
        opt.state.pop(old, None)
        for group in opt.param_groups:
            group["params"] = [p if q is old else q for q in group["params"]]
        state = rows["optim"].get(name) or {}
        if state:
            opt.state[p] = {k: (v.to(p.device) if isinstance(v, Tensor) and k != "step" else v)
                            for k, v in state.items()}
        params[name] = p
    return {k: v.to(device) if device is not None else v for k, v in rows["per_gaussian"].items()}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
