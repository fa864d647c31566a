"""Checkpoints that survive a kill and resume on any number of ranks (docs/design.md
invariant 5: nothing lost).

Layout: `R/ckpts/step_NNNNNN/` holds `rank_RRRR.pt` (that rank's contiguous rows of every
parameter, their Adam moments and per-Gaussian strategy state) and `meta.json` (step,
world size, row ranges, SHA-256 of every shard, the caller's state: config, batcher, RNG,
and `meta_sha256`, a checksum of meta.json's own content).

Kill safety rests on one rule: a directory named exactly `step_NNNNNN` is whole, and
it only ever appears or disappears by one rename.
  - A checkpoint is written into `step_NNNNNN.tmp/` (shards, then meta.json last, each
    fsynced) and renamed into place once complete.
  - Saving a step that exists (a run resumed from an earlier checkpoint reaches it again)
    first renames the old one to `step_NNNNNN.replaced`, which counts as that step until
    the new one is in place; it is deleted after.
  - Pruning renames a checkpoint to `step_NNNNNN.pruned` before deleting it, so a kill
    mid-delete never leaves a meta.json beside missing shards. Only checkpoints at or
    below the step just written are pruned: newer ones belong to another run writing
    into the same directory. An *interim* checkpoint (meta.json's `interim`: saved by
    --save_every_minutes or at a stop signal, train/guards/preemption.py) only bridges the time
    to the next regular one: it is kept while newer than every regular checkpoint (the
    `keep` newest of those), and a regular one is only pruned by regular ones.
  - `begin` (rank 0, before every save) deletes what earlier kills left (`.tmp`, `.pruned`)
    and puts back a `.replaced` whose new version never arrived.

These functions do no collectives: the trainer runs them on every rank with barriers in
between (begin on rank 0 -> barrier -> write_shard on all ranks -> barrier -> finalize on
rank 0 -> barrier). Reading is by global row range, so W' ranks each read
`chunk_bounds(N_all, W')` from W shards. A checkpoint that fails its checks raises
CheckpointError naming the file and what to do (`verify_shards`: the first bad shard of
those a rank reads; the trainer's setup agreement makes every rank raise it).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import Tensor

from ..guards.disk_full import CheckedWriter

META = "meta.json"
FORMAT = 2  # 2: meta.json holds meta_sha256 (format 1 had none; still read)
READABLE_FORMATS = (1, 2)
TMP, REPLACED, PRUNED = ".tmp", ".replaced", ".pruned"
_NAME = re.compile(r"step_(\d{6,})(\.tmp|\.replaced|\.pruned)?")
MISSING, CORRUPT = 1, 2  # shard problems, as check_shards reports them


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and what to do."""


def step_dir(ckpt_root: Path, step: int) -> Path:
    return Path(ckpt_root) / f"step_{step:06d}"


def tmp_dir(ckpt_root: Path, step: int) -> Path:
    return Path(ckpt_root) / f"step_{step:06d}{TMP}"


def _aside(final: Path, suffix: str) -> Path:
    return final.with_name(final.name + suffix)


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
    per-Gaussian state [N, ...] (a densification strategy's accumulators, every Gaussian's
    int64 id: read on any W, rows keep their ids)."""
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


# ------------------------------------------------------------------------------ writing
def begin(ckpt_root: Path, step: int) -> None:
    """Rank 0, before any shard: clears what earlier kills left, then an empty .tmp."""
    root = Path(ckpt_root)
    root.mkdir(parents=True, exist_ok=True)
    for p in sorted(root.iterdir()):
        m = _NAME.fullmatch(p.name)
        if not m or not m[2] or not p.is_dir():
            continue
        final = step_dir(root, int(m[1]))
        if m[2] == REPLACED and not final.exists():  # killed between the two renames
            os.replace(p, final)
        else:
            shutil.rmtree(p)
    tmp_dir(root, step).mkdir()


def write_shard(ckpt_root: Path, step: int, rank: int, payload: Dict[str, Any]) -> str:
    """Writes rank_RRRR.pt into the step's .tmp directory (created by `begin`), fsynced;
    returns its SHA-256."""
    d = tmp_dir(ckpt_root, step)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"rank_{rank:04d}.pt"
    # Unbuffered: a failed save leaves nothing buffered for the close to fail on again (torch
    # writes each record in a few calls); a full disk surfaces as its OSError, not torch's words.
    with open(path, "wb", buffering=0) as f:
        out = CheckedWriter(f, path)
        try:
            torch.save(payload, out)
        except Exception as e:  # noqa: BLE001 - re-raised, as the file system's error where there is one
            out.reraise(e)
        f.flush()
        os.fsync(f.fileno())
    digest = _sha256(path)
    (d / f"rank_{rank:04d}.sha256").write_text(digest + "\n")
    return digest


def finalize(
    ckpt_root: Path, step: int, counts: List[int], state: Dict[str, Any], keep: int = 2, interim: bool = False
) -> Path:
    """Rank 0, after every rank's write_shard: meta.json with row ranges and checksums,
    then the atomic rename; prunes the complete checkpoints at or below `step` that
    `prunable` lists (keep <= 0 keeps all). `interim`: a checkpoint that only bridges the
    time to the next regular one (--save_every_minutes, a stop signal)."""
    root = Path(ckpt_root)
    d, final = tmp_dir(root, step), step_dir(root, step)
    starts = [sum(counts[:r]) for r in range(len(counts))]
    shards = []
    for r, (s, n) in enumerate(zip(starts, counts)):
        digest = (d / f"rank_{r:04d}.sha256").read_text().strip()
        shards.append({"file": f"rank_{r:04d}.pt", "start": s, "end": s + n, "sha256": digest})
    meta = {
        "format": FORMAT, "step": step, "world_size": len(counts),
        "num_gaussians": sum(counts), "shards": shards, "state": state,
    }
    if interim:
        meta["interim"] = True
    meta["meta_sha256"] = _meta_digest(meta)
    with open(d / META, "w") as f:
        json.dump(meta, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(d)
    old = _aside(final, REPLACED)
    if final.exists():  # the same step saved again: the old one stays whole until replaced
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
    os.replace(d, final)
    _fsync_dir(root)
    if old.exists():
        shutil.rmtree(old)
    if keep > 0:
        for p in prunable([p for p in complete_checkpoints(root) if _step_of(p) <= step], keep):
            _remove(p)
    return final


def prunable(done: Sequence[Path], keep: int) -> List[Path]:
    """Of complete checkpoints `done` (oldest first), those to prune: all but the `keep`
    newest regular ones and the `keep` newest interim ones newer than every regular one (an
    interim checkpoint bridges the time to the next regular save, and never pushes a
    --save_steps one out)."""
    interim = {p: is_interim(p) for p in done}
    regular = [p for p in done if not interim[p]]
    last = _step_of(regular[-1]) if regular else -1
    kept = set(regular[-keep:]) | set([p for p in done if interim[p] and _step_of(p) > last][-keep:])
    return [p for p in done if p not in kept]


def is_interim(ckpt: Path) -> bool:
    """Whether the checkpoint at `ckpt` is interim (meta.json's flag); an unreadable
    meta.json counts as regular (kept: nothing is deleted on a guess)."""
    try:
        return json.loads((Path(ckpt) / META).read_text()).get("interim") is True
    except (OSError, ValueError, AttributeError):
        return False


def _remove(ckpt: Path) -> None:
    """Deletes a checkpoint: one rename takes it out of complete_checkpoints, then the
    files go (a kill mid-delete leaves only a .pruned directory for `begin` to clear)."""
    gone = ckpt.parent / f"step_{_step_of(ckpt):06d}{PRUNED}"
    if gone.exists():
        shutil.rmtree(gone)
    os.replace(ckpt, gone)
    shutil.rmtree(gone, ignore_errors=True)


# ------------------------------------------------------------------------------ finding
def _step_of(path: Path) -> Optional[int]:
    m = _NAME.fullmatch(Path(path).name)
    return int(m[1]) if m else None


def complete_checkpoints(ckpt_root: Path) -> List[Path]:
    """Complete checkpoint directories, oldest first: `step_NNNNNN` with a meta.json, or
    its `.replaced` while the step is being saved again (never a .tmp or .pruned)."""
    root = Path(ckpt_root)
    if not root.is_dir():
        return []
    final: Dict[int, Path] = {}
    replaced: Dict[int, Path] = {}
    for p in root.iterdir():
        m = _NAME.fullmatch(p.name)
        if m and m[2] in (None, REPLACED) and (p / META).is_file():
            (replaced if m[2] else final)[int(m[1])] = p
    found = {**replaced, **final}
    return [found[s] for s in sorted(found)]


def newer_checkpoints(ckpt_root: Path, step: int) -> List[Path]:
    """Complete checkpoints above `step` (another run's, when this run is at `step`)."""
    return [p for p in complete_checkpoints(ckpt_root) if _step_of(p) > step]


def _advice(ckpt: Path) -> str:
    """What to do instead of using the checkpoint at `ckpt`."""
    step = _step_of(ckpt)
    earlier = [p for p in complete_checkpoints(ckpt.parent)
               if p != ckpt and (step is None or _step_of(p) < step)]
    if earlier:
        return f"resume from the earlier checkpoint --ckpt {earlier[-1]} or start without --ckpt"
    return "start without --ckpt (no earlier complete checkpoint is next to it)"


def check_steps_left(ckpt_dir: str, step: int, max_steps: int, steps_scaler: float = 1.0) -> None:
    """CheckpointError unless a resume from the checkpoint of `step` has steps to train:
    --max_steps is the step to stop at, so a checkpoint at or past it would train nothing
    (and once exited 0 having done nothing, issue 32). The same on every rank (each reads
    the same meta.json), before anything is written."""
    if step < max_steps:
        return
    if steps_scaler == 1.0:
        stop = f"--max_steps {max_steps}"
        more = f"--max_steps {step + 1000} to train 1000 more steps (step + N for N more)"
    else:  # the user typed the unscaled number
        stop = f"--max_steps x --steps_scaler {steps_scaler:g} = {max_steps}"
        more = (f"--max_steps {math.ceil((step + 1000) / steps_scaler)} to train ~1000 more steps "
                f"((step + N) / {steps_scaler:g} for N more)")
    raise CheckpointError(
        f"--ckpt {ckpt_dir} holds step {step}, and {stop} is not past it: nothing to train. --max_steps is "
        f"the step to stop at, not a number of steps to add: pass {more}, or --eval_only / --render_only "
        "to score or render this checkpoint")


# ------------------------------------------------------------------------------ reading
def read_meta(path: Path) -> Dict[str, Any]:
    """meta.json of a checkpoint directory (or of the newest complete one under a ckpts/
    root), checked: readable, its own checksum, a consistent shard table. A corrupt one
    is refused (never silently skipped for an older one), naming the file and the
    earlier checkpoint to use instead."""
    path = Path(path)
    if not (path / META).is_file():
        if path.is_dir() and (_step_of(path) is not None or any(path.glob("rank_*.pt"))):
            raise CheckpointError(f"{path / META} is missing: the checkpoint at {path} is incomplete "
                                  f"(killed while it was written?); {_advice(path)}")
        found = complete_checkpoints(path)
        if not found:
            partial = sorted(p.name for p in path.glob("step_*" + TMP)) if path.is_dir() else []
            raise CheckpointError(
                f"no complete checkpoint at {path}{'' if path.exists() else ' (no such directory)'}: "
                f"expected a directory with {META} "
                "(R/ckpts/step_NNNNNN) or a ckpts/ directory holding one"
                + (f" (only unfinished ones: {', '.join(partial)})" if partial else "")
            )
        path = found[-1]
    meta = _load_meta(path / META, _advice(path))
    meta["dir"] = str(path)
    return meta


def _load_meta(file: Path, advice: str) -> Dict[str, Any]:
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file} cannot be read ({e}); {advice}") from None
    try:
        meta = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested past Python's limit
        raise CheckpointError(f"{file} is truncated or corrupt (not valid JSON); {advice}") from None
    if not isinstance(meta, dict) or "format" not in meta:
        raise CheckpointError(f"{file} is not a distsplat checkpoint meta file; {advice}")
    fmt = meta["format"]
    if fmt not in READABLE_FORMATS:
        if isinstance(fmt, int) and fmt > FORMAT:
            raise CheckpointError(f"{file} has checkpoint format {fmt}, newer than this distsplat "
                                  f"reads ({', '.join(map(str, READABLE_FORMATS))}): upgrade distsplat")
        raise CheckpointError(f"{file} is not a distsplat checkpoint meta file (format {fmt!r}); {advice}")
    if fmt >= 2:
        digest = meta.pop("meta_sha256", None)
        if digest != _meta_digest(meta):
            raise CheckpointError(f"{file} does not match its own checksum (meta_sha256): the file is "
                                  f"corrupt; {advice}")
    problem = _table_problem(meta)
    if problem:
        raise CheckpointError(f"{file} is corrupt ({problem}); {advice}")
    return meta


def _table_problem(meta: Dict[str, Any]) -> Optional[str]:
    """Why the shard table cannot describe W contiguous row ranges, or None."""
    try:
        shards, n = meta["shards"], meta["num_gaussians"]
        if not isinstance(meta["step"], int) or meta["step"] < 0 or not isinstance(meta["state"], dict):
            return "bad step or state"
        if not isinstance(shards, list) or not shards or len(shards) != meta["world_size"]:
            return f"{len(shards) if isinstance(shards, list) else 'no'} shards for world_size {meta['world_size']}"
        row = 0
        for r, s in enumerate(shards):
            if s["file"] != f"rank_{r:04d}.pt" or s["start"] != row or not s["start"] <= s["end"]:
                return f"shard {r} ({s.get('file')}) does not continue the row ranges at row {row}"
            if not re.fullmatch(r"[0-9a-f]{64}", str(s["sha256"])):
                return f"shard {r} has no SHA-256"
            row = s["end"]
        if row != n:
            return f"the shards hold {row} rows, num_gaussians is {n}"
    except (KeyError, TypeError) as e:
        return f"missing or malformed field {e}"
    return None


def _meta_digest(meta: Dict[str, Any]) -> str:
    """SHA-256 of meta's content (whatever JSON whitespace), without meta_sha256 itself."""
    body = {k: v for k, v in meta.items() if k not in ("meta_sha256", "dir")}
    body = json.loads(json.dumps(body))  # as read back: tuples -> lists, int keys -> str
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def shards_for_rows(meta: Dict[str, Any], start: int, end: int) -> List[int]:
    """Indices of the shards holding global rows [start, end) (one shard when empty: it
    gives the tensors' shapes)."""
    if start == end:
        return [0]
    return [i for i, s in enumerate(meta["shards"]) if s["start"] < end and start < s["end"]]


def check_shards(meta: Dict[str, Any], indices: Sequence[int]) -> Dict[int, int]:
    """{shard index: MISSING or CORRUPT} for the listed shards that fail their checksum
    (empty when all are intact). Reads each listed shard once."""
    d = Path(meta["dir"])
    problems: Dict[int, int] = {}
    for i in sorted(set(indices)):
        path = d / meta["shards"][i]["file"]
        if not path.is_file():
            problems[i] = MISSING
        elif _sha256(path) != meta["shards"][i]["sha256"]:
            problems[i] = CORRUPT
    return problems


def verify_shards(meta: Dict[str, Any], indices: Sequence[int]) -> None:
    """Raises the CheckpointError of the first listed shard that is missing or fails its
    checksum (counting the others); returns when all are intact."""
    problems = check_shards(meta, indices)
    if problems:
        first = min(problems)
        raise shard_error(meta, first, problems[first], len(problems) - 1)


def shard_error(meta: Dict[str, Any], index: int, problem: int, others: int = 0) -> CheckpointError:
    """The error for shard `index` (the same text on every rank that builds it)."""
    d = Path(meta["dir"])
    path = d / meta["shards"][index]["file"]
    also = f" (and {others} more shard{'s' if others > 1 else ''})" if others else ""
    if problem == MISSING:
        what = f"{path} is missing{also}: the checkpoint at {d} is incomplete"
    else:
        what = (f"{path}{also} does not match its checksum in {d / META}: the file is corrupt or "
                "truncated")
    return CheckpointError(f"{what}; {_advice(d)}")


def load_shard(meta: Dict[str, Any], index: int) -> Dict[str, Any]:
    """One shard's payload as saved (no checksum: see check_shards)."""
    path = Path(meta["dir"]) / meta["shards"][index]["file"]
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means a bad file
        raise CheckpointError(f"{path} cannot be loaded ({type(e).__name__}: {e}); "
                              f"{_advice(Path(meta['dir']))}") from None


def read_rows(meta: Dict[str, Any], start: int, end: int, verify: bool = True) -> Dict[str, Any]:
    """Global rows [start, end) of every saved tensor, gathered from the shards that
    hold them, as a shard payload (re-chunking for any world size). `verify` checks the
    shards' SHA-256 first (pass False when verify_shards already did)."""
    if not 0 <= start <= end <= meta["num_gaussians"]:
        raise CheckpointError(f"rows [{start}, {end}) are not all in the checkpoint at {meta['dir']} "
                              f"({meta['num_gaussians']} rows)")
    indices = shards_for_rows(meta, start, end)
    if verify:
        verify_shards(meta, indices)
    pieces: List[Dict[str, Any]] = []
    for i in indices:
        shard = meta["shards"][i]
        payload = load_shard(meta, i)
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
            # torch keeps Adam's step counter on the host, except a fused Adam's: on the device
            on_device = bool(opt.defaults.get("fused"))
            opt.state[p] = {k: (v.to(p.device) if isinstance(v, Tensor) and (k != "step" or on_device) else v)
                            for k, v in state.items()}
        params[name] = p
    return {k: v.to(device) if device is not None else v for k, v in rows["per_gaussian"].items()}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
