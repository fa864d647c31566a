"""Contiguous Gaussian chunks."""

import pytest
import torch

from distsplat.distributed import chunk_bounds, local_chunk


@pytest.mark.parametrize("n,W", [(10, 3), (3, 5), (0, 2), (12, 4), (1, 1), (1000, 7)])
def test_chunk_bounds_near_equal_contiguous_cover(n, W):
    bounds = chunk_bounds(n, W)
    assert len(bounds) == W and bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:])), "contiguous, in rank order"
    sizes = [e - s for s, e in bounds]
    assert max(sizes) - min(sizes) <= 1 and sorted(sizes, reverse=True) == sizes


def test_chunk_bounds_values():
    assert chunk_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert chunk_bounds(2, 3) == [(0, 1), (1, 2), (2, 2)]


@pytest.mark.parametrize("n,W", [(-1, 2), (4, 0), (4.0, 2), (True, 2)])
def test_chunk_bounds_rejects(n, W):
    with pytest.raises(ValueError):
        chunk_bounds(n, W)


def test_local_chunks_concatenate_to_the_whole():
    cloud = {"means": torch.randn(11, 3), "colors": torch.rand(11, 3)}
    W = 4
    parts = [local_chunk(cloud, r, W) for r in range(W)]
    for key in cloud:
        assert torch.equal(torch.cat([p[key] for p in parts]), cloud[key])
    assert [len(p["means"]) for p in parts] == [3, 3, 3, 2]
    assert torch.equal(local_chunk(cloud["means"], 1, W), cloud["means"][3:6])
    a, b = local_chunk([cloud["means"], cloud["colors"]], 3, W)
    assert torch.equal(a, cloud["means"][9:]) and torch.equal(b, cloud["colors"][9:])


def test_local_chunk_rejects_mismatched_rows_and_bad_rank():
    with pytest.raises(ValueError, match="same number of rows"):
        local_chunk({"a": torch.zeros(3), "b": torch.zeros(4)}, 0, 2)
    with pytest.raises(ValueError, match="rank"):
        local_chunk(torch.zeros(3), 2, 2)
