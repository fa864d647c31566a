"""The prefetching loader: batch order and pixels, mid-epoch resume, no I/O for steps
without own cameras, bounded read-ahead, errors surfaced on the consumer, clean close."""

import threading

import numpy as np
import pytest

from distsplat.data import ImageCache, ImageLoader, load_colmap

from .data_helpers import CountingSource, global_batches, make_colmap_dataset, owners, pillow_decode


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_colmap_dataset(tmp_path_factory.mktemp("loader") / "d", num_cameras=16, width=48, height=32, factors=())


def rank_schedule(num_cameras, rank=1, world=2, steps=20):
    owner = owners(num_cameras, world)
    batches = global_batches(num_cameras, 3, steps, seed=5)
    return [[c for c in b if owner[c] == rank] for b in batches], np.flatnonzero(owner == rank).tolist()


def run(loader):
    out = []
    for batch in loader:
        out.append((batch.step, [int(c) for c in batch.cameras], [im.numpy().copy() for im in batch.images]))
    return out


@pytest.mark.parametrize("mode", ["none", "compressed", "decoded", "gpu"])
def test_resume_mid_epoch_yields_the_same_rest(dataset, mode):
    scene = load_colmap(dataset)
    schedule, own = rank_schedule(scene.num_cameras)
    full = run(ImageLoader(ImageCache(scene.images, scene.specs(), own, mode=mode), schedule, num_workers=2, prefetch=3))
    assert [s for s, _, _ in full] == list(range(len(schedule)))
    k = 7  # mid-epoch: 16 cameras / batch 3 = 5 steps an epoch
    resumed = run(ImageLoader(ImageCache(scene.images, scene.specs(), own, mode=mode), lambda s: schedule[s],
                              start_step=k, end_step=len(schedule), num_workers=3, prefetch=2))
    assert len(resumed) == len(full) - k
    for (s1, c1, im1), (s2, c2, im2) in zip(full[k:], resumed):
        assert (s1, c1) == (s2, c2)
        for a, b in zip(im1, im2):
            np.testing.assert_array_equal(a, b)
    for _, cams, ims in full:
        for c, im in zip(cams, ims):
            np.testing.assert_array_equal(im, pillow_decode(dataset / "images" / scene.names[c]))


def test_step_without_own_cameras_does_no_io(dataset):
    scene = load_colmap(dataset)
    src = CountingSource(scene.images)
    cache = ImageCache(src, scene.specs(), [2, 3], mode="none")
    schedule = [[2], [], [], [3], []]
    with ImageLoader(cache, schedule, num_workers=2, prefetch=1) as loader:
        for batch in loader:
            # reads so far: the steps consumed, plus at most the one step ahead
            done = sum(len(s) for s in schedule[: batch.step + 1])
            assert done <= sum(src.reads.values()) <= done + len(schedule[batch.step + 1] if batch.step + 1 < 5 else [])
            if not batch.cameras:
                assert batch.images == [] and batch.stacked().shape[0] == 0
    assert src.reads == {2: 1, 3: 1}  # the three empty steps read nothing


def test_read_ahead_is_bounded_by_prefetch(dataset):
    scene = load_colmap(dataset)
    src = CountingSource(scene.images)
    cache = ImageCache(src, scene.specs(), range(16), mode="none")
    schedule = [[i] for i in range(16)]
    loader = ImageLoader(cache, schedule, num_workers=4, prefetch=3)
    for p in list(loader._pending):
        p.done.wait(10)
    assert sorted(src.reads) == [0, 1, 2]
    next(loader)
    for p in list(loader._pending):
        p.done.wait(10)
    assert sorted(src.reads) == [0, 1, 2, 3]
    loader.close()
    assert list(loader) == []


def test_worker_error_reaches_consumer_and_close_stops_threads(dataset, tmp_path):
    scene = load_colmap(dataset)
    before = threading.active_count()
    cache = ImageCache(scene.images, scene.specs(), [0, 1], mode="decoded")
    (dataset / "images" / scene.names[1]).rename(tmp_path / "moved.jpg")  # vanishes after the checks
    try:
        loader = ImageLoader(cache, [[0], [1], [0]], num_workers=2)
        assert next(loader).cameras == [0]
        with pytest.raises(Exception, match=scene.names[1]):
            next(loader)
        assert list(loader) == []  # closed after the error
    finally:
        (tmp_path / "moved.jpg").rename(dataset / "images" / scene.names[1])
    assert threading.active_count() <= before


def test_stacked_is_a_view_of_the_batch_buffer(dataset):
    scene = load_colmap(dataset)
    cache = ImageCache(scene.images, scene.specs(), [4, 5, 6], mode="decoded")
    with ImageLoader(cache, [[4, 5, 6]], num_workers=2) as loader:
        batch = next(loader)
        st = batch.stacked()
        assert st.shape == (3, 32, 48, 3)
        assert st.data_ptr() == batch.images[0].data_ptr()  # no collate copy


def test_ownership_is_checked_on_the_consumer_for_any_camera_index(dataset):
    """The per-step check is a byte per scene camera: a camera of another rank, a negative
    index and one past the scene all raise the cache's OwnershipError from next()."""
    from distsplat.data import OwnershipError

    scene = load_colmap(dataset)
    cache = ImageCache(scene.images, scene.specs(), [2, 3], mode="none")
    for bad in (4, -1, -14, scene.num_cameras, 10 ** 6):
        loader = ImageLoader(cache, [[2], [3], [3, bad]], num_workers=1, prefetch=1)
        assert next(loader).cameras == [2]
        with pytest.raises(OwnershipError):
            next(loader)  # asks for step 2 ahead
        assert list(loader) == []  # closed after the error


@pytest.mark.parametrize("mode", ["none", "decoded"])
def test_stacked_view_equals_the_stacked_images(dataset, mode):
    """The worker that finishes a batch builds its stacked view once; it is the images in
    batch order, and a batch of mixed sizes has none (stacked() then refuses as before)."""
    scene = load_colmap(dataset)
    cache = ImageCache(scene.images, scene.specs(), range(16), mode=mode)
    schedule = [[5, 1, 9], [0], [], [15, 14, 13, 12]]
    with ImageLoader(cache, schedule, num_workers=3, prefetch=2) as loader:
        for batch in loader:
            st = batch.stacked()
            assert st.shape == ((len(batch.cameras), 32, 48, 3) if batch.cameras else (0, 0, 0, 3))
            for im, c, s in zip(batch.images, batch.cameras, st):
                np.testing.assert_array_equal(s.numpy(), im.numpy())
                np.testing.assert_array_equal(im.numpy(), pillow_decode(dataset / "images" / scene.names[c]))


def test_a_loader_dropped_without_close_ends_its_threads(dataset):
    import gc

    scene = load_colmap(dataset)
    before = threading.active_count()
    loader = ImageLoader(ImageCache(scene.images, scene.specs(), range(4), mode="none"), [[0], [1], [2]],
                         num_workers=3, prefetch=2)
    next(loader)
    threads = list(loader._pool._threads)
    for p in list(loader._pending):
        p.done.wait(10)
    del loader, p
    gc.collect()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads) and threading.active_count() <= before


def test_a_cached_batch_is_copied_by_one_worker_and_decoding_uses_the_pool(dataset):
    """Steady state (every image of the batch in the decoded cache): one worker copies the
    whole batch, so one thread, not one per image, competes with the consumer for Python's
    lock; a batch still to decode is spread over the pool (a slow decode shows it: with
    4 workers, 4 images of a batch are decoded at once)."""
    import time

    scene = load_colmap(dataset)
    cache = ImageCache(scene.images, scene.specs(), range(16), mode="decoded")
    decoding, most = [0], [0]
    read_into, lock = cache.read_into, threading.Lock()
    source_read = cache.source.read

    def slow_read(i):  # a decode that takes long enough for the pool's threads to overlap
        with lock:
            decoding[0] += 1
            most[0] = max(most[0], decoding[0])
        time.sleep(0.05)
        with lock:
            decoding[0] -= 1
        return source_read(i)

    def recording(cam, out):  # prefetch 1: a batch's reads start once the one before is done
        with lock:
            calls.append(threading.get_ident())
        read_into(cam, out)

    cache.read_into, cache.source.read = recording, slow_read
    calls = []
    schedule = [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3], [4, 5, 6, 7], [3, 2, 1, 0]]
    with ImageLoader(cache, schedule, num_workers=4, prefetch=1) as loader:
        for batch in loader:
            for im, c in zip(batch.images, batch.cameras):
                np.testing.assert_array_equal(im.numpy(), pillow_decode(dataset / "images" / scene.names[c]))
    threads = {s: set(calls[4 * s: 4 * s + 4]) for s in range(len(schedule))}
    assert most[0] >= 2  # the first epoch decoded on several threads at once
    assert all(len(threads[s]) == 1 for s in (2, 3, 4)), threads  # cached: one thread a batch
