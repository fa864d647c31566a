"""Which node each rank runs on, for setup checks that span machines (a result dir every
node must share, the images each node must hold).

torchrun numbers nodes (GROUP_RANK, its `--node_rank`) and ranks within a node
(LOCAL_RANK); the hostname tells a user which machine that is. `gather_text` collects one
short string per rank on every rank with ONE all-reduce of a [W, nbytes] byte table (each
rank fills its own row): a setup-time tool, never used per step (docs/design.md invariant 2).
"""

from __future__ import annotations

import os
import socket
from typing import Dict, List, Sequence

import torch

from .context import DistContext, all_reduce_sum

TEXT_BYTES = 512  # per rank in gather_text; longer strings are cut


def node_rank() -> int:
    """This process's node index (torchrun's GROUP_RANK, i.e. --node_rank); 0 without torchrun."""
    return int(os.environ.get("GROUP_RANK", "0"))


def node_name() -> str:
    """'node i (host h)' for messages."""
    return f"node {node_rank()} (host {socket.gethostname()})"


def gather_text(ctx: DistContext, text: str, nbytes: int = TEXT_BYTES) -> List[str]:
    """Every rank's `text` (UTF-8, cut to `nbytes`), in rank order, on every rank."""
    if ctx.world_size == 1:
        return [text]
    table = torch.zeros(ctx.world_size, nbytes, dtype=torch.uint8, device=ctx.device)  # [W, nbytes]
    raw = text.encode("utf-8", "replace")[:nbytes]
    if raw:
        table[ctx.rank, : len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(ctx.device)
    table = all_reduce_sum(table).cpu().numpy()  # one row per rank, zeros elsewhere: the sum is a gather
    return [bytes(row).rstrip(b"\0").decode("utf-8", "replace") for row in table]


def group_by_node(ranks: Sequence[int], nodes: Sequence[str]) -> str:
    """'ranks 2, 3 on node 1 (host h); rank 5 on node 2 (host g)' for ranks whose node
    names (`nodes`, indexed by rank) are given."""
    by: Dict[str, List[int]] = {}
    for r in ranks:
        by.setdefault(nodes[r], []).append(r)
    parts = []
    for name, rs in by.items():
        who = f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs))
        parts.append(f"{who} on {name}")
    return "; ".join(parts)
