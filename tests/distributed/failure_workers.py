"""Workers for test_rank_failure.py (run on every gloo rank by the harness)."""

from distsplat.distributed import PeerFailure, barrier, raise_together


def agree(ctx, failing: dict):
    """Rank r fails with failing[r] = ("value"|"runtime", message) or succeeds; returns what
    raise_together made of it on this rank, then proves the group is still in step."""
    error = None
    kind, text = failing.get(ctx.rank, (None, None))
    if kind == "value":
        error = ValueError(text)
    elif kind == "runtime":
        error = RuntimeError(text)
    try:
        raise_together(ctx, error, "setup")
        out = {"raised": None}
    except PeerFailure as e:
        out = {"raised": "PeerFailure", "message": str(e)}
    except ValueError as e:
        out = {"raised": "ValueError", "message": str(e), "agreed": getattr(e, "agreed", False)}
    except RuntimeError as e:
        out = {"raised": "RuntimeError", "message": str(e), "same_object": e is error}
    barrier()
    return out
