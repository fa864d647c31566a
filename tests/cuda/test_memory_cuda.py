"""The memory checks on a real GPU: the gpu cache fits and allocates when free memory holds
it, falls back when the budget does not; usage and the default limit come from CUDA."""

import pytest
import torch

from distsplat.data import ImageCache, load_colmap
from distsplat.train.guards.memory import default_limit, usage_bytes

pytestmark = pytest.mark.cuda


def test_gpu_cache_checks_device_memory(shared_data):
    scene = load_colmap(shared_data / "thermos", factor=2)
    own = list(range(0, 101, 7))
    cache = ImageCache(scene.images, scene.specs(), own, mode="gpu", device="cuda")
    assert cache.mode == "gpu" and cache.device.type == "cuda"
    small = ImageCache(scene.images, scene.specs(), own, mode="gpu", device="cuda", budget=cache.decoded_bytes - 1)
    assert small.mode == "compressed" and small.device is None


def test_usage_and_limit_come_from_cuda():
    dev = torch.device("cuda", torch.cuda.current_device())
    x = torch.empty(64 * 2**20, dtype=torch.uint8, device=dev)
    assert usage_bytes(dev) >= x.numel()
    limit, source = default_limit(dev)
    assert limit == torch.cuda.mem_get_info(dev)[1] and "total memory" in source
