"""Per-node memory budgets: LOCAL_WORLD_SIZE divides a node's memory, never the global W;
in shared-GPU mode the ranks on one GPU split its memory. No process group, no GPU needed
(the CUDA queries are replaced)."""

from __future__ import annotations

import pytest
import torch

from distsplat.data.cache import mem_total
from distsplat.distributed import staging
from distsplat.train.guards import memory


def test_cpu_limit_divides_the_node_memory_by_its_local_ranks(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")  # 2 nodes x 4: the global W must not matter
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    limit, source = memory.default_limit(torch.device("cpu"))
    assert limit == mem_total() // 4 and "/ 4 local rank(s)" in source


@pytest.mark.parametrize("local_ranks, gpus, index, expect", [(4, 1, 0, 4), (4, 2, 1, 2), (3, 2, 0, 2), (3, 2, 1, 1)])
def test_shared_gpu_limit_is_split_between_the_ranks_on_that_gpu(monkeypatch, local_ranks, gpus, index, expect):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_ranks))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * 2**30, 80 * 2**30))
    device = torch.device("cuda", index)
    staging.set_shared_device(device)
    try:
        limit, source = memory.default_limit(device)
    finally:
        staging.set_shared_device(None)
    assert limit == int(80 * 2**30 / expect)
    assert (f"/ {expect} ranks sharing it" in source) == (expect > 1)
    limit, _ = memory.default_limit(device)  # not shared: the whole GPU
    assert limit == 80 * 2**30
