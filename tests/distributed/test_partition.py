"""Rebalancing moves rows between gloo ranks so that each holds its contiguous chunk,
every row exactly once and in global order."""

import pytest
import torch

from partition_workers import global_rows

from distsplat.distributed import chunk_bounds


@pytest.mark.parametrize("counts", [[7, 0, 20], [1, 1, 30], [5, 5], [0, 9]])
def test_move_rows_rechunks_in_global_order(run_workers, counts):
    W, n_all = len(counts), sum(counts)
    results = run_workers("partition_workers:rebalance", W, counts)
    expected = global_rows(n_all)
    for r, (seen, moved, contiguous) in enumerate(results):
        assert seen == counts
        assert all(contiguous.values()), contiguous
        start, end = chunk_bounds(n_all, W)[r]
        for k, v in expected.items():
            torch.testing.assert_close(moved[k], v[start:end], rtol=0, atol=0)
