"""Tar shards: packing a folder and reading every image back by offset, byte for byte and
pixel for pixel; the number of open files stays bounded whatever the batch size."""

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from distsplat.data import ImageCache, ImageLoader, TarShardSource, load_colmap

from .data_helpers import make_colmap_dataset, pillow_decode

ROOT = Path(__file__).resolve().parents[2]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("shards")
    data = make_colmap_dataset(tmp_path / "d", num_cameras=40, width=96, height=64, factors=())
    out = tmp_path / "shards"
    # the script, as users run it; tiny shards so the 40 images spread over many files
    subprocess.run([sys.executable, str(ROOT / "scripts" / "pack_shards.py"), str(data / "images"), str(out),
                    "--shard-size-mb", "0.01"], check=True, capture_output=True)
    return data, out / "index.json"


def test_pack_and_read_back(packed):
    data, index = packed
    shards = sorted(index.parent.glob("shard-*.tar"))
    assert len(shards) >= 8
    files = sorted((data / "images").iterdir())
    src = TarShardSource(index)
    assert src.names == [f.name for f in files]
    for i, f in enumerate(files):
        assert src.read(i) == f.read_bytes()
        assert src.encoded_size(i) == f.stat().st_size
    # the shards are ordinary tars: tarfile lists the same members
    members = [m.name for s in shards for m in tarfile.open(s).getmembers()]
    assert sorted(members) == src.names


def test_scene_on_shards_decodes_like_pillow(packed):
    data, index = packed
    scene = load_colmap(data)
    src = TarShardSource(index, names=scene.names, max_open=2)
    cache = ImageCache(src, scene.specs(), range(scene.num_cameras), mode="compressed")
    out = np.empty(scene.spec(0).shape, np.uint8)
    for i in range(scene.num_cameras):
        cache.read_into(i, out)
        np.testing.assert_array_equal(out, pillow_decode(data / "images" / scene.names[i]))


def test_open_files_bounded(packed):
    data, index = packed
    scene = load_colmap(data)
    src = TarShardSource(index, names=scene.names, max_open=3)
    base = open_fds()
    big_batch = [list(range(scene.num_cameras))] * 3  # every camera of every shard, three times
    cache = ImageCache(src, scene.specs(), range(scene.num_cameras), mode="none")
    peak = 0
    with ImageLoader(cache, big_batch, num_workers=4, prefetch=2) as loader:
        for _ in loader:
            peak = max(peak, src.num_open_files())
            assert open_fds() - base <= 3 + 4, "more shard files open than max_open + workers"
    assert 1 <= peak <= 3 + 4
    assert src.num_open_files() <= 3
    src.close()
    assert open_fds() <= base


def test_format_1_index_still_reads(packed, tmp_path):
    """An index.json of format 1 (every image as {name: [shard, offset, length]}, as packed
    before the table files) reads the same bytes as the format-2 index beside it."""
    import json
    import shutil

    data, index = packed
    new = TarShardSource(index)
    old_dir = tmp_path / "old"
    shutil.copytree(index.parent, old_dir)
    meta = json.loads(index.read_text())
    table = np.load(index.parent / meta["table"])
    names = (index.parent / meta["names"]).read_text().split("\n")[:-1]
    (old_dir / "index.json").write_text(json.dumps({"format": "distsplat-shards/1", "shards": meta["shards"],
                                                    "images": {n: t.tolist() for n, t in zip(names, table)}}))
    for f in (meta["table"], meta["names"]):
        (old_dir / f).unlink()
    old = TarShardSource(old_dir / "index.json", names=list(reversed(names)))
    assert old.names == list(reversed(new.names))
    for i, name in enumerate(old.names):
        assert old.read(i) == (data / "images" / name).read_bytes()



def test_damaged_image_errors_say_how_to_repair_it(tmp_path):
    """A truncated JPEG in an image folder is re-copied; inside a tar shard the shards are
    packed again: the up-front check and the decode both say so, naming where it is."""
    from distsplat.data import DataError, pack_shards
    from distsplat.data.decode import ImageSpec, decode_into, probe_images
    from distsplat.data.sources import FolderSource

    data = make_colmap_dataset(tmp_path / "d", num_cameras=3, width=48, height=32, factors=())
    images = data / "images"
    names = sorted(p.name for p in images.iterdir())
    broken = images / names[1]
    broken.write_bytes(broken.read_bytes()[:-40])  # cut before the end-of-image marker
    shards = TarShardSource(pack_shards(images, tmp_path / "shards"), names=names)
    folder = FolderSource([images / n for n in names], names=names)
    spec = ImageSpec(names[1], 48, 32, 48, 32)
    for src, where, fix in ((folder, str(broken), "re-copy or re-export the file"),
                            (shards, f"{names[1]} in ", "pack the shards again from intact images "
                                                        "(python scripts/pack_shards.py")):
        with pytest.raises(DataError) as up_front:
            probe_images(src, [1])
        with pytest.raises(DataError) as decoding:
            decode_into(src.read(1), spec, np.empty(spec.shape, np.uint8), src.where(1))
        for e, what in ((up_front, "truncated JPEG"), (decoding, "cannot decode image")):
            msg = str(e.value)
            assert msg.startswith(where) and what in msg and fix in msg, msg
        assert "re-copy" not in str(up_front.value) or src is folder


class _CountingSource:
    """A FolderSource that counts the head bytes the up-front check asks for."""

    def __init__(self, inner):
        self.inner, self.head_bytes = inner, []

    def peek(self, index, head):
        self.head_bytes.append(head)
        return self.inner.peek(index, head)

    def where(self, index):
        return self.inner.where(index)


def test_header_probe_reads_16k_unless_the_header_is_further(tmp_path):
    """probe_images reads the first 16 KiB of each image, and up to 256 KiB only when the
    header lies further (a 100 KB ICC profile before the JPEG's frame header): the right size
    either way, an image whose header is not there still an error naming it."""
    import io

    from PIL import Image

    from distsplat.data import DataError
    from distsplat.data.decode import FIRST_HEADER_BYTES, HEADER_BYTES, probe_images
    from distsplat.data.sources import FolderSource

    rng = np.random.default_rng(0)
    pixels = Image.fromarray(rng.integers(0, 255, (300, 400, 3), dtype=np.uint8))
    plain, profiled, garbage = tmp_path / "plain.jpg", tmp_path / "profiled.jpg", tmp_path / "garbage.jpg"
    pixels.save(plain, quality=95)  # ~100 KB: bigger than the first read
    pixels.save(profiled, quality=95, icc_profile=bytes(rng.integers(0, 255, 100_000, dtype=np.uint8)))
    garbage.write_bytes(b"\xff\xd8\xff" + bytes(rng.integers(0, 255, 40_000, dtype=np.uint8)) + b"\xff\xd9")
    assert plain.stat().st_size > FIRST_HEADER_BYTES
    with pytest.raises(Exception):  # the case exists: the first 16 KiB of it hold no frame header
        Image.open(io.BytesIO(profiled.read_bytes()[:FIRST_HEADER_BYTES]))
    src = _CountingSource(FolderSource([plain, profiled, garbage]))
    assert probe_images(src, [0]) == [(400, 300)] and src.head_bytes == [FIRST_HEADER_BYTES]
    src.head_bytes.clear()
    assert probe_images(src, [1]) == [(400, 300)] and src.head_bytes == [FIRST_HEADER_BYTES, HEADER_BYTES]
    with pytest.raises(DataError, match="garbage.jpg: not a readable image"):
        probe_images(src, [2])
