"""Per-rank caches: every mode returns the bytes of a plain Pillow decode; a cache holds
only its rank's cameras (W=3 real processes); `auto` picks by the budget and says why."""

import logging
import multiprocessing as mp

import numpy as np
import pytest
import torch

from distsplat.data import CACHE_MODES, ImageCache, ImageLoader, OwnershipError, choose_mode, load_colmap
from distsplat.data.cache import ram_budget

from .data_helpers import CountingSource, global_batches, make_colmap_dataset, owners, pillow_decode

MODES = [m for m in CACHE_MODES if m != "auto"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_colmap_dataset(tmp_path_factory.mktemp("cache") / "d", num_cameras=24, width=96, height=64, factors=())


@pytest.mark.parametrize("mode", MODES + ["auto"])
def test_every_mode_matches_pillow_on_thermos(shared_data, mode):
    root = shared_data / "thermos"
    scene = load_colmap(root, factor=2)
    own = list(range(0, 101, 7))  # 15 cameras keep it quick
    refs = {c: pillow_decode(root / "images_2" / scene.names[c]) for c in own}
    cache = ImageCache(scene.images, scene.specs(), own, mode=mode, device="cpu")
    schedule = [own[i:i + 3] for i in range(0, len(own), 3)] * 2  # two epochs: fill, then hit
    with ImageLoader(cache, schedule, num_workers=3, prefetch=2) as loader:
        for batch in loader:
            assert batch.cameras == schedule[batch.step]
            for c, img in zip(batch.cameras, batch.images):
                assert img.dtype == torch.uint8 and img.shape == (266, 473, 3)
                np.testing.assert_array_equal(img.numpy(), refs[c])
            np.testing.assert_array_equal(batch.stacked().numpy(), np.stack([refs[c] for c in batch.cameras]))
    if cache.mode != "none":
        assert sorted(cache.cached_names()) == sorted(scene.names[c] for c in own)


@pytest.mark.parametrize("mode", MODES)
def test_cache_reads_each_own_image_once(dataset, mode):
    scene = load_colmap(dataset)
    scene.images = src = CountingSource(scene.images)
    own = [1, 4, 9, 16]
    cache = ImageCache(src, scene.specs(), own, mode=mode)
    with ImageLoader(cache, [own, own[::-1], own], num_workers=2) as loader:
        for _ in loader:
            pass
    expect = 3 if mode == "none" else 1
    assert src.reads == {c: expect for c in own}
    held = {"none": 0, "compressed": sum(src.encoded_size(c) for c in own), "decoded": 4 * 96 * 64 * 3, "gpu": 4 * 96 * 64 * 3}
    assert cache.nbytes() == held[mode]


def test_unowned_camera_raises(dataset):
    scene = load_colmap(dataset)
    cache = ImageCache(scene.images, scene.specs(), [0, 2], mode="decoded")
    out = np.empty(scene.spec(1).shape, np.uint8)
    with pytest.raises(OwnershipError, match="camera 1 .* is not owned by this rank"):
        cache.read_into(1, out)
    with pytest.raises(OwnershipError):
        ImageLoader(cache, [[0], [1]], num_workers=1, prefetch=2)
    assert "synthetic_00001.jpg" not in cache.cached_names()


def test_auto_choice_and_log(dataset, caplog):
    assert choose_mode(10, 100, 1000)[0] == "decoded"
    assert choose_mode(10, 100, 50)[0] == "compressed"
    mode, why = choose_mode(10 * 2**20, 100 * 2**20, 2**20)
    assert mode == "none" and "compressed share 10.0 MiB" in why and "budget 1.0 MiB" in why
    scene = load_colmap(dataset)
    own = list(range(8))
    decoded = 8 * 96 * 64 * 3
    with caplog.at_level(logging.INFO, logger="distsplat.data.cache"):
        assert ImageCache(scene.images, scene.specs(), own, mode="auto", budget=decoded).mode == "decoded"
        assert ImageCache(scene.images, scene.specs(), own, mode="auto", budget=decoded - 1).mode == "compressed"
        assert ImageCache(scene.images, scene.specs(), own, mode="auto", budget=100).mode == "none"
    assert "decoded, because the decoded share fits" in caplog.text
    assert "even the compressed share does not fit" in caplog.text and "budget 0.0 MiB" in caplog.text


def test_budget_divided_among_local_ranks(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    one = ram_budget(0.5)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    four = ram_budget(0.5)
    assert one > 0 and abs(four * 4 - one) < one * 0.05  # MemAvailable moves a little between reads


def _rank(rank, world, root, steps, queue):
    scene = load_colmap(root)
    owner = owners(scene.num_cameras, world)
    own = np.flatnonzero(owner == rank).tolist()
    scene.images = src = CountingSource(scene.images)
    cache = ImageCache(src, scene.specs(), own, mode="decoded")
    batches = global_batches(scene.num_cameras, 4, steps)
    mine = [[c for c in b if owner[c] == rank] for b in batches]
    with ImageLoader(cache, mine, num_workers=2) as loader:
        for _ in loader:
            pass
    queue.put((rank, cache.cached_names(), sorted(src.reads), max(src.reads.values())))


def test_ownership_three_processes(dataset):
    """W=3 real processes (no process group): each caches exactly its own images. Forked,
    not spawned, so the children skip re-importing torch (seconds each on 2 cores); they run
    no torch kernels, so fork is safe here."""
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    queue = ctx.Queue()
    steps = 12  # two epochs of 24 cameras in batches of 4
    procs = [ctx.Process(target=_rank, args=(r, 3, str(dataset), steps, queue)) for r in range(3)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    scene = load_colmap(dataset)
    owner = owners(scene.num_cameras, 3)
    all_names = []
    for rank, names, reads, max_reads in results:
        assert len(names) == len(set(names)), "an image cached twice"
        assert sorted(names) == sorted(scene.names[c] for c in np.flatnonzero(owner == rank))
        assert all(owner[c] == rank for c in reads), "a rank read another rank's image"
        assert max_reads == 1  # decoded: read once, then from the cache
        all_names += names
    assert sorted(all_names) == sorted(scene.names)  # disjoint and covering
