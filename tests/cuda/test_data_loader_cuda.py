"""The loader's CUDA path: pinned batch buffers, host->device copies on a side stream
ordered by events, and the gpu cache mode; pixels must equal a plain Pillow decode."""

import numpy as np
import pytest
import torch

from distsplat.data import ImageCache, ImageLoader, load_colmap

from ..unit.data_helpers import make_colmap_dataset, pillow_decode

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("mode", ["none", "compressed", "decoded", "gpu"])
def test_cuda_loader_matches_pillow(tmp_path, mode):
    root = make_colmap_dataset(tmp_path / "d", num_cameras=12, width=96, height=64, factors=())
    scene = load_colmap(root)
    own = [0, 2, 3, 5, 7, 8, 11]
    cache = ImageCache(scene.images, scene.specs(), own, mode=mode, device="cuda")
    schedule = [own[:3], [], own[3:], own[::-1], own[1:4]]
    with ImageLoader(cache, schedule, num_workers=3, prefetch=2, device="cuda") as loader:
        assert loader.pin
        for batch in loader:
            # work on the consumer's stream, as the trainer would: must see the copied bytes
            imgs = [im.float().mul_(1.0) for im in batch.images]
            for c, im in zip(batch.cameras, imgs):
                assert im.is_cuda
                np.testing.assert_array_equal(im.to(torch.uint8).cpu().numpy(), pillow_decode(root / "images" / scene.names[c]))
            torch.cuda._sleep(1_000_000)  # a long kernel: the next batches' copies overlap it
