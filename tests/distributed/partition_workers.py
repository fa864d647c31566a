"""Workers for test_partition.py (run on every gloo rank by the harness)."""

import torch

from distsplat.distributed import chunk_bounds, gather_counts, move_rows, rank, world_size


def global_rows(n_all: int):
    """Rows that identify themselves: row i holds i in every column."""
    i = torch.arange(n_all, dtype=torch.float32)
    return {"a": i[:, None].repeat(1, 3), "b": i.clone(), "c": i[:, None, None].repeat(1, 2, 2)}


def rebalance(ctx, counts):
    """Rank r starts with counts[r] consecutive global rows, ends with its chunk."""
    W, me = world_size(), rank()
    start = sum(counts[:me])
    mine = {k: v[start : start + counts[me]] for k, v in global_rows(sum(counts)).items()}
    seen = gather_counts(counts[me], torch.device("cpu"))
    moved = move_rows(mine, seen, chunk_bounds(sum(counts), W))
    contiguous = {k: v.is_contiguous() for k, v in moved.items()}  # what torch's fused Adam needs
    return seen, {k: v for k, v in moved.items()}, contiguous
