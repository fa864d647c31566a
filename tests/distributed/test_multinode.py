"""Several nodes, simulated on one machine: two torchrun agents (`--nnodes 2 --node_rank
0|1 --nproc_per_node 2`, a static rendezvous on 127.0.0.1) run the real CLI as one W=4 job.
The result must be the one of a single-node W=4 run, and what is per node (LOCAL_RANK,
LOCAL_WORLD_SIZE: the device, the memory budgets) must be taken per node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from torchrun_cli import TINY_FLAGS, torchrun, torchrun_nodes

STEPS = 30
# Densification runs too (a refine at steps 10 and 20), so the counts of Gaussians per rank
# and the rebalancing that follows must agree across the two launches as well.
FLAGS = ["default", "--max_steps", str(STEPS), "--eval_steps", str(STEPS), "--save_steps", str(STEPS),
         "--log_every", "10", *TINY_FLAGS, "--strategy.refine_start_iter", "10", "--strategy.refine_every", "10"]


def _shards(out: Path) -> list:
    ck = out / "ckpts" / f"step_{STEPS:06d}"
    meta = json.loads((ck / "meta.json").read_text())
    return [torch.load(ck / s["file"], weights_only=True)["params"] for s in meta["shards"]]


@pytest.mark.slow
def test_two_nodes_of_two_ranks_equal_one_node_of_four(tmp_path):
    one = torchrun([*FLAGS, "--result_dir", str(tmp_path / "one")], nproc=4)
    assert one.returncode == 0, one.stderr[-3000:]
    nodes = torchrun_nodes([*FLAGS, "--result_dir", str(tmp_path / "two")], nnodes=2, nproc=2)
    for n, p in enumerate(nodes):
        assert p.returncode == 0, f"node {n}:\n{p.stderr[-3000:]}"
    # Per-node budgets: rank 0 logs its memory limit as the node's RAM over its local ranks.
    assert "/ 4 local rank(s)" in one.stderr
    assert "/ 2 local rank(s)" in nodes[0].stderr
    # Same W, same global rank of every process (node_rank * 2 + local_rank), same global
    # batches and the same gloo algorithms: the same floating-point operations in the same
    # order, so the results are bitwise equal; where a rank took its budget, its device or
    # its rank from the wrong variable, a shard would differ or be missing.
    a, b = _shards(tmp_path / "one"), _shards(tmp_path / "two")
    assert len(a) == len(b) == 4
    for r, (pa, pb) in enumerate(zip(a, b)):
        assert pa.keys() == pb.keys()
        for k in pa:
            assert torch.equal(pa[k], pb[k]), f"rank {r}: {k} differs"
    va = json.loads((tmp_path / "one" / "stats" / f"val_step{STEPS:04d}.json").read_text())
    vb = json.loads((tmp_path / "two" / "stats" / f"val_step{STEPS:04d}.json").read_text())
    assert (va["psnr"], va["ssim"], va["num_GS"]) == (vb["psnr"], vb["ssim"], vb["num_GS"])
    ply = f"point_cloud_{STEPS:04d}.ply"
    assert (tmp_path / "one" / "ply" / ply).read_bytes() == (tmp_path / "two" / "ply" / ply).read_bytes()
    for r in range(4):  # every rank of both nodes wrote its stats into the one result dir
        assert (tmp_path / "two" / "stats" / f"train_step{STEPS:04d}_rank{r}.json").is_file()
