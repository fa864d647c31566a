"""The loader's side-stream prefetch must make the consumer's stream wait for the copy
(distsplat/data/loader.py: `_finish` copies on a side stream and records an event,
`__next__` makes the current stream wait on it). A fast GPU can hide a missing wait, so
the side stream is held back on purpose: before each batch's copy it fills the block the
copy will land in with 0xAB (a freed block is reused by the next allocation of its size on
its stream) and then sleeps ~0.1 s (torch.cuda._sleep). The consumer reads every image
with a kernel on its own stream at once:
- with the loader as it is, it must see Pillow's pixels;
- with `wait_event` switched off, it must NOT (at least one batch shows the fill): the
  proof that the first test can fail on this GPU. Needs a GPU."""

import numpy as np
import pytest
import torch

from distsplat.data import ImageCache, ImageLoader, load_colmap
from distsplat.data.loader import ImageLoader as _Loader

from ..unit.data_helpers import make_colmap_dataset, pillow_decode

pytestmark = pytest.mark.cuda

SLEEP_CYCLES = 200_000_000  # ~0.1 s at 1.5-2 GHz
FILL = 0xAB


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    # 320x240x3 bytes per image, 3 per batch: ~0.7 MB per copy (the same block size every
    # batch, so the filled block is the one the copy gets).
    root = make_colmap_dataset(tmp_path_factory.mktemp("loader") / "d", num_cameras=9,
                               width=320, height=240, factors=())
    return root, load_colmap(root)


def _delayed_finish(monkeypatch):
    original = _Loader._finish

    def finish(self, p):
        if self.cuda and p.error is None:
            spans = [im for im in p.images if isinstance(im, tuple)]
            if spans:
                total = max(b for _, b in spans)
                with torch.cuda.stream(self._stream):
                    junk = torch.full((total,), FILL, dtype=torch.uint8, device=self.device)
                    del junk  # back to this stream's pool: the copy's allocation reuses it
                    torch.cuda._sleep(SLEEP_CYCLES)
        original(self, p)

    monkeypatch.setattr(_Loader, "_finish", finish)


def _run(dataset, mode):
    root, scene = dataset
    own = list(range(9))
    schedule = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [2, 5, 8], [1, 4, 7], [0, 3, 6]]
    cache = ImageCache(scene.images, scene.specs(), own, mode=mode, device="cuda")
    seen, expected = [], []
    with ImageLoader(cache, schedule, num_workers=3, prefetch=2, device="cuda") as loader:
        for batch in loader:
            # A kernel on the consumer's stream, issued at once: it runs after the copy only
            # if the stream waits for the side stream's event.
            seen.append([im.clone() for im in batch.images])
            expected.append([pillow_decode(root / "images" / scene.names[c]) for c in batch.cameras])
    torch.cuda.synchronize()
    return [[im.cpu().numpy() for im in batch] for batch in seen], expected


@pytest.mark.parametrize("mode", ["none", "decoded"])
def test_consumer_sees_the_copied_pixels_despite_a_slow_side_stream(dataset, monkeypatch, mode):
    _delayed_finish(monkeypatch)
    seen, expected = _run(dataset, mode)
    for step, (got, want) in enumerate(zip(seen, expected)):
        for im, ref in zip(got, want):
            np.testing.assert_array_equal(im, ref, err_msg=f"step {step}")


def test_without_wait_event_the_consumer_reads_too_early(dataset, monkeypatch):
    """The sensitivity check of the test above: if this fails, the delay did not expose
    a missing wait on this GPU and the test above proves nothing here."""
    _delayed_finish(monkeypatch)
    monkeypatch.setattr(torch.cuda.Stream, "wait_event", lambda self, event: None)
    seen, expected = _run(dataset, "none")
    wrong = [step for step, (got, want) in enumerate(zip(seen, expected))
             if any(not np.array_equal(im, ref) for im, ref in zip(got, want))]
    filled = [step for step in wrong if any((im == FILL).mean() > 0.5 for im in seen[step])]
    assert wrong, "no batch was read before its copy landed: the delay hid nothing"
    print(f"read too early: steps {wrong}, showing the fill: {filled}")
