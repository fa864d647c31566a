"""Per-rank caches: every mode returns the bytes of a plain Pillow decode; a cache holds
only its rank's cameras (W=3 real processes); `auto` picks by the budget and says why; an
explicit mode that does not fit its memory falls back and says why."""

import logging
import multiprocessing as mp

import numpy as np
import pytest
import torch

from distsplat.data import CACHE_MODES, ImageCache, ImageLoader, OwnershipError, choose_mode, fit_mode, load_colmap
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


# ------------------------------------------------------------------ memory checks of explicit modes

def test_fit_mode_falls_down_the_ladder():
    c, d = 10 * 2**20, 100 * 2**20
    assert fit_mode("decoded", c, d, d) == ("decoded", "")
    assert fit_mode("gpu", c, d, d, host_budget=0) == ("gpu", "")
    assert fit_mode("gpu", c, d, d - 1, host_budget=d)[0] == "decoded"  # no device room, RAM has it
    assert fit_mode("gpu", c, d, d - 1, host_budget=c)[0] == "compressed"
    assert fit_mode("decoded", c, d, d - 1)[0] == "compressed"
    assert fit_mode("compressed", c, d, c - 1)[0] == "none"
    assert fit_mode("none", c, d, 0) == ("none", "")
    mode, why = fit_mode("gpu", c, d, 50 * 2**20, host_budget=5 * 2**20)
    assert mode == "none"
    assert "decoded share (100.0 MiB) does not fit its device memory budget (50.0 MiB)" in why
    assert "using none instead" in why and "--cache decoded" in why and "--data_factor" in why


def test_explicit_decoded_with_a_tiny_budget_falls_back_and_says_why(dataset, caplog):
    scene = load_colmap(dataset)
    own = list(range(8))
    decoded = 8 * 96 * 64 * 3
    with caplog.at_level(logging.INFO, logger="distsplat.data.cache"):
        cache = ImageCache(scene.images, scene.specs(), own, mode="decoded", budget=decoded - 1, rank=1)
        assert cache.mode == "compressed"
        assert ImageCache(scene.images, scene.specs(), own, mode="decoded", budget=decoded).mode == "decoded"
        assert ImageCache(scene.images, scene.specs(), own, mode="compressed", budget=10, rank=1).mode == "none"
        # gpu on a CPU device: its "device memory" is RAM; the budget overrides both.
        assert ImageCache(scene.images, scene.specs(), own, mode="gpu", budget=decoded - 1).mode == "compressed"
    records = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(records) == 3
    assert records[0].startswith("[rank 1] image cache: --cache decoded for 8 own cameras: its decoded share "
                                 "(144.0 KiB) does not fit its RAM budget (144.0 KiB); using compressed instead")
    assert "more ranks, a larger --data_factor, or --cache compressed" in records[0]
    assert "using none instead (no images held)" in records[1]
    # The fallback serves the same pixels.
    out = np.empty(scene.spec(3).shape, np.uint8)
    cache.read_into(3, out)
    np.testing.assert_array_equal(out, pillow_decode(dataset / "images" / scene.names[3]))
    assert cache.nbytes() == scene.images.encoded_size(3)


def test_gpu_mode_checks_free_cuda_memory_before_allocating(dataset, monkeypatch, caplog):
    """The CUDA branch of the gpu-mode check, on any machine: mem_get_info says 256 KiB are
    free, so the cache falls back to host RAM before any device tensor exists."""
    calls = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: calls.append(dev) or (2**18, 80 * 2**30))
    scene = load_colmap(dataset)
    own = list(range(24))  # 24 x 96 x 64 x 3 = 0.42 MiB decoded: 90% of 0.25 MiB free does not hold it
    with caplog.at_level(logging.WARNING, logger="distsplat.data.cache"):
        cache = ImageCache(scene.images, scene.specs(), own, mode="gpu", device="cuda:0", rank=0)
    assert cache.mode == "decoded" and cache.device is None and calls == [torch.device("cuda:0")]
    assert "its decoded share (432.0 KiB) does not fit its device memory budget (230.4 KiB); using decoded instead" in caplog.text


def test_cgroup_limits_cap_the_available_memory(tmp_path, monkeypatch):
    from distsplat.data import cache as cache_mod

    v2 = tmp_path / "v2"
    (v2 / "job" / "rank").mkdir(parents=True)
    (v2 / "job" / "memory.max").write_text(f"{2 * 2**30}\n")
    (v2 / "job" / "memory.current").write_text(f"{2**30}\n")
    (v2 / "job" / "memory.stat").write_text(f"anon 1\ninactive_file {2**28}\n")
    (v2 / "job" / "rank" / "memory.max").write_text("max\n")  # unlimited itself: the parent's limit holds
    (v2 / "memory.max").write_text("max\n")
    (tmp_path / "cg2").write_text("0::/job/rank\n")
    assert cache_mod.cgroup_memory(v2, tmp_path / "cg2") == (2 * 2**30, 2**30 - 2**28)

    v1 = tmp_path / "v1"
    (v1 / "memory" / "docker" / "abc").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # no limit
    (v1 / "memory" / "docker" / "abc" / "memory.limit_in_bytes").write_text(f"{2**30}\n")
    (v1 / "memory" / "docker" / "abc" / "memory.usage_in_bytes").write_text(f"{2**29}\n")
    (tmp_path / "cg1").write_text("4:memory:/docker/abc\n1:cpu:/\n0::/\n")
    assert cache_mod.cgroup_memory(v1, tmp_path / "cg1") == (2**30, 2**29)
    (tmp_path / "none").write_text("4:memory:/\n")
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cache_mod.cgroup_memory(v1, tmp_path / "none") is None

    # The container sees the host's MemAvailable; the cgroup's headroom is what counts.
    monkeypatch.setattr(cache_mod, "cgroup_memory", lambda: (2**30, 2**29 + 2**28))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert cache_mod.mem_available() == 2**28 and cache_mod.mem_total() == 2**30
    assert ram_budget(0.5) == 2**26


@pytest.mark.parametrize("mode", ["compressed", "decoded", "auto"])
def test_the_cache_fills_as_images_are_first_used(dataset, mode, monkeypatch):
    """No up-front fill (issue 35): building the cache reads no image, whatever the mode or
    budget (the budget is checked against sizes, not reads); each step's images are read
    when the loader first needs them and held from then on, so the first epoch reads from
    disk and a second one only from memory. Under a budget that fits the compressed share
    and not the decoded one, auto picks compressed, still without a read."""
    scene = load_colmap(dataset)
    scene.images = src = CountingSource(scene.images)
    own = [0, 3, 5, 8, 13, 21]
    compressed = sum(src.encoded_size(c) for c in own)
    budget = compressed + 1 if mode == "auto" else None  # decoded (6 x 96 x 64 x 3) does not fit
    cache = ImageCache(src, scene.specs(), own, mode=mode, budget=budget)
    assert src.reads == {} and cache.nbytes() == 0
    if mode == "auto":
        assert cache.mode == "compressed"
    per_image = {c: (src.encoded_size(c) if cache.mode == "compressed" else 96 * 64 * 3) for c in own}
    schedule = [own[:2], own[2:4], own[4:]]
    with ImageLoader(cache, schedule, num_workers=1, prefetch=1) as loader:
        for k, batch in enumerate(loader):
            read = set(src.reads)
            # what the first k + 1 steps needed, plus at most the prefetched next step's
            needed = {c for step in schedule[:k + 1] for c in step}
            assert needed <= read <= needed | set(schedule[min(k + 1, 2)])
    assert src.reads == {c: 1 for c in own}
    assert cache.nbytes() == sum(per_image.values())
    with ImageLoader(cache, schedule[::-1], num_workers=1, prefetch=1) as loader:  # epoch 2: memory only
        for _ in loader:
            pass
    assert src.reads == {c: 1 for c in own}
