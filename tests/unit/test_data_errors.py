"""Bad inputs: each is a DataError naming the file, raised while the scene/source is
built (before any collective), or, for damage only a decode can see, by the loader."""

import os
import shutil
import struct

import numpy as np
import pytest

from distsplat.data import DataError, ImageCache, ImageLoader, TarShardSource, load_blender, load_colmap, pack_shards
from distsplat.data import colmap_io

from .data_helpers import make_colmap_dataset


@pytest.fixture
def dataset(tmp_path):
    return make_colmap_dataset(tmp_path / "d", num_cameras=6)


def test_missing_image(dataset):
    victim = dataset / "images_2" / "synthetic_00003.jpg"
    victim.unlink()
    with pytest.raises(DataError, match="synthetic_00003.jpg is missing"):
        load_colmap(dataset, factor=2)


def test_truncated_jpeg(dataset):
    victim = dataset / "images" / "synthetic_00002.jpg"
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"synthetic_00002.jpg: truncated JPEG"):
        load_colmap(dataset)


def test_truncated_png(tmp_path):
    from PIL import Image

    from distsplat.data import FolderSource
    from distsplat.data.decode import probe_images

    path = tmp_path / "a.png"
    Image.new("RGB", (32, 24), (200, 10, 10)).save(path)
    assert probe_images(FolderSource([path]), [0]) == [(32, 24)]
    path.write_bytes(path.read_bytes()[:-20])  # the header still parses
    with pytest.raises(DataError, match="a.png: truncated PNG"):
        probe_images(FolderSource([path]), [0])


def test_garbage_image_message_names_no_buffer(dataset):
    victim = dataset / "images" / "synthetic_00004.jpg"
    victim.write_bytes(b"GIF00" + bytes(200))
    with pytest.raises(DataError, match=r"synthetic_00004.jpg: not a readable image \(starts with b'GIF00") as e:
        load_colmap(dataset)
    assert "BytesIO" not in str(e.value)


def test_corrupt_jpeg_header(dataset):
    victim = dataset / "images" / "synthetic_00004.jpg"
    victim.write_bytes(b"\xff\xd8\xff" + os.urandom(200) + b"\xff\xd9")
    with pytest.raises(DataError, match="synthetic_00004.jpg: not a readable image"):
        load_colmap(dataset)


def test_corrupt_jpeg_body_found_by_decode(dataset):
    """Damage that leaves header and trailer intact passes the up-front check; the owning
    rank's decode raises it, naming the file, out of the loader on the consumer's thread."""
    victim = dataset / "images" / "synthetic_00001.jpg"
    data = bytearray(victim.read_bytes())
    sos = data.find(b"\xff\xda")
    start = sos + 2 + int.from_bytes(data[sos + 2: sos + 4], "big")  # first byte of entropy-coded data
    data[start: start + 2] = b"\xff\xd8"  # a start-of-image marker inside the scan: libjpeg gives up
    victim.write_bytes(bytes(data))
    scene = load_colmap(dataset)
    cache = ImageCache(scene.images, scene.specs(), [1], mode="decoded")
    with pytest.raises(DataError, match="synthetic_00001.jpg: cannot decode"):
        with ImageLoader(cache, [[1]], num_workers=1) as loader:
            next(loader)


def test_size_matching_no_downscale(dataset):
    from PIL import Image

    victim = dataset / "images_2" / "synthetic_00000.jpg"
    Image.new("RGB", (40, 40)).save(victim)
    with pytest.raises(DataError, match="synthetic_00000.jpg: image is 40x40 but its camera is 64x48; no downscale"):
        load_colmap(dataset, factor=2)


def test_images_bin_names_unknown_camera(dataset):
    model = colmap_io.read_model(dataset / "sparse" / "0")
    model.images[3].camera_id = 7
    colmap_io.write_model_bin(model, dataset / "sparse" / "0")
    with pytest.raises(DataError, match=r"images.bin: image 'synthetic_00002.jpg' names camera 7"):
        load_colmap(dataset)


def test_unsupported_camera_model(dataset):
    model = colmap_io.read_model(dataset / "sparse" / "0")
    model.cameras[1] = colmap_io.Camera(1, "FOV", 64, 48, np.array([50.0, 50, 32, 24, 0.1]))
    colmap_io.write_model_bin(model, dataset / "sparse" / "0")
    with pytest.raises(DataError, match="cameras.bin: camera 1 uses model FOV, which distsplat does not support"):
        load_colmap(dataset)


def test_unknown_camera_model_id(dataset):
    path = dataset / "sparse" / "0" / "cameras.bin"
    data = bytearray(path.read_bytes())
    data[12:16] = struct.pack("<i", 99)  # model id of the first camera
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match="cameras.bin: camera 1 has unknown camera model id 99"):
        load_colmap(dataset)


def test_truncated_model_file(dataset):
    path = dataset / "sparse" / "0" / "images.bin"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DataError, match="images.bin: truncated"):
        load_colmap(dataset)


def test_garbage_points3d_claiming_too_many_points(dataset):
    path = dataset / "sparse" / "0" / "points3D.bin"
    path.write_bytes(struct.pack("<Q", 2**62) + bytes(100))  # no allocation of 2^62 rows
    with pytest.raises(DataError, match=r"points3D.bin: not a COLMAP points3D.bin: it claims 4611686018427387904 points"):
        load_colmap(dataset)


@pytest.mark.parametrize("field", ["qvec", "tvec"])
def test_non_finite_pose(dataset, field):
    model = colmap_io.read_model(dataset / "sparse" / "0")
    getattr(model.images[2], field)[1] = np.inf
    colmap_io.write_model_bin(model, dataset / "sparse" / "0")
    with pytest.raises(DataError, match=r"images.bin: image 'synthetic_00001.jpg' has a non-finite pose"):
        load_colmap(dataset)


def test_non_finite_points(dataset):
    model = colmap_io.read_model(dataset / "sparse" / "0")
    model.points.xyz[[3, 7], 2] = np.nan
    colmap_io.write_model_bin(model, dataset / "sparse" / "0")
    with pytest.raises(DataError, match=r"points3D.bin: 2 of 300 points have non-finite coordinates \(first: point 4"):
        load_colmap(dataset, normalize=True)


def test_empty_sparse_0(dataset):
    for f in (dataset / "sparse" / "0").iterdir():
        f.unlink()
    with pytest.raises(DataError, match=r"sparse/0: missing or empty COLMAP model"):
        load_colmap(dataset)


def test_missing_sparse(dataset):
    shutil.rmtree(dataset / "sparse")
    with pytest.raises(DataError, match=r"no COLMAP model \(expected .*sparse/0"):
        load_colmap(dataset)


def test_model_without_images(dataset):
    model = colmap_io.read_model(dataset / "sparse" / "0")
    model.images.clear()
    colmap_io.write_model_bin(model, dataset / "sparse" / "0")
    with pytest.raises(DataError, match="images.bin: the COLMAP model has no registered images"):
        load_colmap(dataset)


def test_missing_image_folder(dataset):
    shutil.rmtree(dataset / "images")
    with pytest.raises(DataError, match=r"image folder .*images does not exist; there is images_2/: pass the matching --data_factor"):
        load_colmap(dataset, factor=1)
    shutil.rmtree(dataset / "images_2")
    with pytest.raises(DataError, match=r"images_4 does not exist, nor images/ to downscale by 4 on load; put the capture's images in images/"):
        load_colmap(dataset, factor=4)


def test_malformed_cameras_txt(dataset, tmp_path):
    model = colmap_io.read_model(dataset / "sparse" / "0")
    txt = tmp_path / "t" / "sparse" / "0"
    colmap_io.write_model_txt(model, txt)
    (txt / "cameras.txt").write_text("1 PINHOLE 64 forty-eight 1 2 3 4\n")
    (tmp_path / "t" / "images").symlink_to(dataset / "images")
    with pytest.raises(DataError, match=r"cameras.txt:1: malformed camera line"):
        load_colmap(tmp_path / "t")


def test_shard_index_past_end(dataset, tmp_path):
    index = pack_shards(dataset / "images", tmp_path / "shards", shard_size_mb=1)
    names = (index.parent / "index-names.txt").read_text().split()
    table = np.load(index.parent / "index-table.npy")
    table[names.index("synthetic_00005.jpg"), 1] += 10_000_000
    np.save(index.parent / "index-table.npy", table)
    with pytest.raises(DataError, match=r"index.json: image 'synthetic_00005.jpg' at offset \d+ length \d+ points past the end of .*shard-00000.tar"):
        TarShardSource(index)


def test_shard_index_missing_name_and_malformed(dataset, tmp_path):
    index = pack_shards(dataset / "images", tmp_path / "shards", shard_size_mb=1)
    with pytest.raises(DataError, match="'nope.jpg' is not in the shard index"):
        TarShardSource(index, names=["nope.jpg"])
    index.write_text("{]")
    with pytest.raises(DataError, match="index.json: malformed shard index"):
        TarShardSource(index)


def test_missing_transforms(tmp_path):
    with pytest.raises(DataError, match="transforms_train.json does not exist"):
        load_blender(tmp_path)


def test_fast_header_sizes_are_pillows(tmp_path):
    """decode.fast_size (the up-front check's header reader) gives Pillow's size for the
    JPEGs and PNGs cameras and tools write (baseline, progressive, grayscale, RGBA, EXIF and
    ICC blocks before the frame, restart markers), and None (Pillow decides) for what it does
    not know; probe_images agrees with Pillow on every one."""
    import io

    from PIL import Image

    from distsplat.data.decode import FIRST_HEADER_BYTES, _read_header, fast_size, probe_images
    from distsplat.data.sources import FolderSource

    rng = np.random.default_rng(0)
    files = []
    for k, (w, h) in enumerate([(1, 1), (64, 48), (301, 17), (4000, 3), (257, 1025)]):
        rgb = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        variants = {
            "baseline.jpg": dict(format="JPEG", quality=90),
            "progressive.jpg": dict(format="JPEG", progressive=True),
            "restart.jpg": dict(format="JPEG", restart_marker_blocks=1),
            "exif.jpg": dict(format="JPEG", exif=Image.Exif() if k % 2 else b"Exif\0\0" + bytes(3000)),
            "icc.jpg": dict(format="JPEG", icc_profile=bytes(rng.integers(0, 256, 20000, dtype=np.uint8))),
            "rgb.png": dict(format="PNG"),
        }
        for name, kw in variants.items():
            buf = io.BytesIO()
            rgb.save(buf, **kw)
            files.append((f"{k}_{name}", buf.getvalue()))
        for mode, ext in (("L", "gray.jpg"), ("RGBA", "rgba.png"), ("L", "gray.png")):
            buf = io.BytesIO()
            rgb.convert(mode).save(buf, format="JPEG" if ext.endswith("jpg") else "PNG")
            files.append((f"{k}_{ext}", buf.getvalue()))
    for name, data in files:
        (tmp_path / name).write_bytes(data)
        with Image.open(io.BytesIO(data)) as im:
            want = im.size
        got = fast_size(data[:FIRST_HEADER_BYTES])
        assert got in (want, None), name
        assert got is not None or "icc" in name, name  # only a header past the first bytes is left to Pillow
        assert _read_header(data)[0] == want, name
    source = FolderSource([tmp_path / n for n, _ in files])
    sizes = probe_images(source, range(len(files)))
    for (name, data), size in zip(files, sizes):
        with Image.open(io.BytesIO(data)) as im:
            assert size == im.size, name
    assert fast_size(b"GIF89a" + bytes(20)) is None and fast_size(b"\xff\xd8\xff\xda" + bytes(20)) is None
    assert fast_size(b"\xff\xd8") is None and fast_size(b"\x89PNG\r\n\x1a\n" + bytes(8)) is None


def test_fast_header_leaves_damaged_frames_to_pillow():
    """A JPEG whose first segment is random bytes is never given a size by the fast reader
    (so the check's error is Pillow's "not a readable image", whatever the bytes): over many
    random headers, every size it returns is Pillow's."""
    import io

    from PIL import Image

    from distsplat.data.decode import fast_size

    rng = np.random.default_rng(1)
    for _ in range(3000):
        data = b"\xff\xd8\xff" + rng.integers(0, 256, 200, dtype=np.uint8).tobytes() + b"\xff\xd9"
        got = fast_size(data)
        if got is not None:
            with Image.open(io.BytesIO(data)) as im:
                assert im.size == got
    sof = b"\xff\xd8\xff\xc0\x00\x11\x08\x00\x30\x00\x40\x03" + bytes(9)  # a sane 64x48 frame, 3 components
    assert fast_size(sof) == (64, 48)
    assert fast_size(sof[:4] + b"\x00\x11\x0c" + sof[7:]) is None  # 12-bit samples: Pillow's call
    assert fast_size(sof[:4] + b"\x00\x11\x08\x00\x30\x00\x40\x02" + bytes(9)) is None  # 2 components
