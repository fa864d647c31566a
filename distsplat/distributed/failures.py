"""When a rank fails: agree on errors where the ranks can still talk, and name the failing
rank where they cannot.

Two situations, two tools:

- **Before the first collective that could hang** (setup: reading the scene, the images'
  headers, a checkpoint), every rank reaches `raise_together` with its own outcome. One
  all-reduce of a [W] vector says which ranks failed; only then does the lowest failing
  rank broadcast its message. Every rank raises the same error, so every rank prints the
  same line and none is left waiting in a later collective.
- **During training**, a rank that raises (or is killed) simply exits; torchrun sees it and
  stops the others, and peers blocked in a collective get an error from gloo/NCCL (a closed
  connection at once, or the collective timeout for a rank that is alive but stuck).
  `describe_failure` then turns the peer's opaque "Connection closed by peer" into a line
  naming the rank that failed: every failing rank leaves a record in the process group's
  key-value store (which torchrun's agent hosts, so it outlives the workers), and a rank
  that failed only because a peer did reads those records. `record_for_launcher` writes
  the line into torchrun's error file, so torchrun's own summary shows it too.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist

from .context import DistContext, all_reduce_sum, broadcast, world_size

log = logging.getLogger(__name__)

MESSAGE_BYTES = 4096  # the broadcast message buffer; longer messages are cut
FAILURE_KEY = "distsplat/failed/"  # in the group's store: its keys are per torchrun attempt (context.py)
FAILURES_COUNT = "distsplat/failures"  # how many ranks left a record
BAD_INPUT, OTHER = 1, 2  # per-rank failure kinds in raise_together's vector

# What gloo says (as a plain RuntimeError) when the other side of a collective is gone or
# late; NCCL's errors arrive as torch.distributed.DistError subclasses.
_PEER_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Timed out waiting",
                 "Broken pipe", "Connection refused")


class PeerFailure(RuntimeError):
    """Raised on the ranks that did not fail themselves, after another rank did."""


def raise_together(ctx: DistContext, error: Optional[BaseException], what: str = "setup") -> None:
    """Every rank calls this with the exception it caught in `what` (or None). If any rank
    failed, every rank raises: a ValueError with the same message (the lowest failing rank's)
    when the failure was bad input (ValueError) on every failing rank, prefixed `rank r: `
    unless every rank failed; otherwise a failing rank re-raises its own exception (keeping
    its traceback) and the others raise PeerFailure naming the lowest failing rank. Costs one all-reduce of W int64s when
    nobody failed. No collective may run between the start of `what` and this call."""
    W = ctx.world_size
    if W == 1 or not dist.is_initialized():
        if error is not None:
            raise error
        return
    kinds = torch.zeros(W, dtype=torch.int64, device=ctx.device)  # [W]
    if error is not None:
        kinds[ctx.rank] = BAD_INPUT if isinstance(error, ValueError) else OTHER
    kinds = all_reduce_sum(kinds).tolist()  # the helpers stage it in shared-GPU mode
    failed = [r for r, k in enumerate(kinds) if k]
    if not failed:
        return
    first = failed[0]
    buf = torch.zeros(MESSAGE_BYTES, dtype=torch.uint8, device=ctx.device)  # [MESSAGE_BYTES]
    if ctx.rank == first:
        text = str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"
        raw = (text or type(error).__name__).encode("utf-8", "replace")[:MESSAGE_BYTES]
        buf[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    broadcast(buf, src=first)
    message = bytes(buf.cpu().numpy()).rstrip(b"\0").decode("utf-8", "replace")
    all_bad_input = all(kinds[r] == BAD_INPUT for r in failed)
    if all_bad_input:
        if len(failed) < W:  # every rank failing means the input is bad for all alike
            message = f"{_ranks(failed)}: {message}"
        agreed = ValueError(message)
        agreed.agreed = True  # type: ignore[attr-defined]  # the same on every rank
        raise agreed from None
    if error is not None:
        raise error
    raise PeerFailure(f"{_ranks(failed)} failed during {what}: {message}")


def _ranks(ranks: List[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def is_peer_failure(error: BaseException) -> bool:
    """True for errors that mean another rank failed or stalls: a collective that broke
    or timed out, rather than a bug or bad input on this rank."""
    if isinstance(error, PeerFailure):
        return True
    dist_errors = tuple(getattr(dist, n) for n in ("DistError",) if hasattr(dist, n))
    if dist_errors and isinstance(error, dist_errors):
        return True
    return isinstance(error, RuntimeError) and any(m in str(error) for m in _PEER_MARKERS)


def _store():
    """The default process group's key-value store, or None (no group, or it is gone)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception:  # noqa: BLE001 - diagnostics must never raise
        return None


def describe_failure(ctx: DistContext, error: BaseException, where: str, wait_s: float = 5.0) -> str:
    """One line for this rank's log saying what failed, where, and, when this rank only
    stopped because a peer did, which rank it was. Leaves this rank's record in the store
    first. Waits up to `wait_s` for a record naming a rank that failed by itself."""
    peer = is_peer_failure(error)
    text = f"{type(error).__name__}: {_first_line(error)}"
    store = _store()
    if store is None or world_size() == 1:
        return f"rank {ctx.rank} failed {where}: {text}"
    try:
        store.set(f"{FAILURE_KEY}{ctx.rank}", json.dumps({"peer": peer, "error": text, "where": where}))
        store.add(FAILURES_COUNT, 1)  # one key for `failure_recorded` to read
    except Exception:  # noqa: BLE001 - the store may be gone with its host
        store = None
    if not peer:
        return f"rank {ctx.rank} failed {where}: {text}"
    causes, silent = _peer_records(store, ctx, wait_s) if store is not None else ([], [])
    head = f"rank {ctx.rank} stopped {where} because a peer failed ({_first_line(error)})"
    if causes:
        return head + "; " + "; ".join(f"rank {r} failed {w}: {e}" for r, w, e in causes)
    if silent:
        return (head + f"; {_ranks(silent)} reported no error: killed (e.g. out of memory, "
                f"SIGKILL) or stuck; see {'their' if len(silent) > 1 else 'its'} log")
    return head + "; every rank reports a broken collective: the ranks ran different collectives (a bug)"


def failure_recorded() -> bool:
    """Whether any rank has left a failure record (describe_failure) in the process group's
    store: the run is failing. One round trip; False without a store or when it is gone. Safe
    from a thread other than the main one (preemption.py's watcher asks it while the main
    thread may be stuck)."""
    store = _store()
    if store is None:
        return False
    try:
        return store.add(FAILURES_COUNT, 0) > 0
    except Exception:  # noqa: BLE001 - the store may be gone with its host
        return False


def _peer_records(store, ctx: DistContext, wait_s: float) -> Tuple[List[Tuple[int, str, str]], List[int]]:
    """(ranks that failed by themselves with where and error, ranks with no record)."""
    deadline = time.monotonic() + wait_s
    while True:
        causes, silent = [], []
        for r in range(ctx.world_size):
            if r == ctx.rank:
                continue
            key = f"{FAILURE_KEY}{r}"
            try:
                if not store.check([key]):
                    silent.append(r)
                    continue
                rec = json.loads(store.get(key).decode())
            except Exception:  # noqa: BLE001
                silent.append(r)
                continue
            if not rec.get("peer"):
                causes.append((r, rec.get("where", "?"), rec.get("error", "?")))
        if causes or time.monotonic() >= deadline:
            return causes, silent
        time.sleep(0.2)


def _first_line(error: BaseException) -> str:
    """The error's first line without a backend's source location ('[.../pair.cc:553] ')
    or its advice after the first sentence."""
    lines = str(error).strip().splitlines()
    line = lines[0] if lines else ""
    if line.startswith("[") and "] " in line:
        line = line.split("] ", 1)[1]
    if is_peer_failure(error) and ". " in line:
        line = line.split(". ", 1)[0]
    return line[:500]


def record_for_launcher(message: str) -> None:
    """Puts `message` in torchrun's error file for this rank (TORCHELASTIC_ERROR_FILE), so
    torchrun's failure summary shows it instead of 'To enable traceback see ...'."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    try:  # the layout torch's own @record writes: torchrun then shows "py_callstack" as the
        # failure's traceback and can set the exit code in it (a plain string message makes
        # it warn "has a new message format" and skip that)
        with open(path, "w") as f:
            json.dump({"message": {"message": message, "extraInfo": {
                "py_callstack": message, "timestamp": str(int(time.time()))}}}, f)
    except OSError:
        pass
