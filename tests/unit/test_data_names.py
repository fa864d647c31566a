"""Compact per-camera tables (issue 20, million-image captures): NameList, TrackTable,
JoinedPaths, COLMAP images.bin read as arrays and the tracks built from them, each against
the plain-Python construction it replaces (the reference)."""

import struct

import numpy as np
import pytest

from distsplat.data import DataError, colmap_io, load_colmap
from distsplat.data.colmap import _point_tracks
from distsplat.data.names import NameList, TrackTable
from distsplat.data.sources import JoinedPaths

from .data_helpers import make_colmap_dataset


def test_namelist_behaves_as_the_list_of_names():
    names = ["a/b.jpg", "a/c.jpg", "z.jpg", "é/ü.png"]  # code point order: é after z
    nl = NameList.from_bytes([n.encode() for n in names])
    assert isinstance(nl, NameList) and len(nl) == 4
    assert [nl[i] for i in range(4)] == names and list(nl) == names and nl[1:3] == names[1:3]
    assert nl[-1] == "é/ü.png" and nl == names and nl != names[::-1]
    assert "é/ü.png" in nl and nl.index("z.jpg") == 2
    assert nl.is_sorted() and not nl.has_duplicates()
    assert nl.positions(["é/ü.png", "nope", "a/b.jpg"]).tolist() == [3, -1, 0]
    unsorted = NameList(np.array([b"b", b"a", b"b"]))
    assert unsorted.has_duplicates() and unsorted.positions(["a", "b", "c"]).tolist()[:2] == [1, 0]
    with pytest.raises(UnicodeDecodeError):
        NameList.from_bytes([b"ok", b"\xff"])
    # one name far longer than the rest: a list, not a C x longest table
    wide = NameList.from_bytes([b"x" * (2 << 20)] + [b"y%d" % i for i in range(40)])
    assert isinstance(wide, list) and wide[1] == "y0"


def test_fixed_width_gathers_and_refuses_one_huge_name():
    from distsplat.data.names import fixed_width

    items = [b"abc", b"", b"de\xc3\xa9", b"x" * 9]
    data = np.frombuffer(b"".join(items), np.uint8)
    lengths = np.array([len(i) for i in items])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    out = fixed_width(data, starts, lengths)
    assert out.dtype == np.dtype("S9") and out.tolist() == items
    many = [b"y%05d" % i for i in range(100)] + [b"z" * (4 << 20)]  # 101 x 4 MiB > 16 x the bytes + 1 MiB
    data = np.frombuffer(b"".join(many), np.uint8)
    lengths = np.array([len(i) for i in many])
    assert fixed_width(data, np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths) is None


def test_tracktable_slices():
    t = TrackTable(np.array([0, 2, 2, 5]), np.array([1, 4, 0, 2, 3]))
    assert len(t) == 3 and t[0].tolist() == [1, 4] and t[1].tolist() == [] and t[-1].tolist() == [0, 2, 3]
    empty = TrackTable(np.zeros(4, np.int64), np.zeros(0, np.int64))
    assert empty.offsets.strides == (0,) and [len(e) for e in empty] == [0, 0, 0]
    with pytest.raises(IndexError):
        t[3]
    with pytest.raises(ValueError):
        TrackTable(np.array([0, 2]), np.array([1]))


def test_joined_paths(tmp_path):
    p = JoinedPaths(str(tmp_path), ["a.jpg", "d/b.jpg", "c.jpg"], {1: "d/b.png"})
    assert list(p) == [str(tmp_path / "a.jpg"), str(tmp_path / "d" / "b.png"), str(tmp_path / "c.jpg")]
    assert p[-1] == str(tmp_path / "c.jpg") and len(p) == 3


def _model(n_images=7, n_points=12, seed=0):
    rng = np.random.default_rng(seed)
    cams = {1: colmap_io.Camera(1, "PINHOLE", 64, 48, np.array([50.0, 51.0, 32.0, 24.0])),
            3: colmap_io.Camera(3, "SIMPLE_PINHOLE", 32, 24, np.array([25.0, 16.0, 12.0]))}
    ids = rng.permutation(np.arange(5, 5 + 3 * n_images, 3))  # not 1..C, not sorted
    images = {}
    for k, iid in enumerate(ids.tolist()):
        q = rng.normal(size=4)
        images[iid] = colmap_io.Image(iid, q / np.linalg.norm(q), rng.normal(size=3), 1 if k % 3 else 3,
                                      f"{'sub/' if k % 2 else ''}img_{(k * 5) % n_images:03d}_é.jpg")
    offsets = np.concatenate([[0], np.cumsum(rng.integers(0, 4, n_points))])
    track_images = rng.choice(np.concatenate([ids, [999]]), offsets[-1])  # 999: an image the model lacks
    points = colmap_io.Points(np.arange(1, n_points + 1), rng.normal(size=(n_points, 3)),
                              rng.integers(0, 255, (n_points, 3)).astype(np.uint8), np.zeros(n_points),
                              offsets.astype(np.int64), track_images.astype(np.int64))
    return colmap_io.Model(cams, images, points)


def test_images_bin_table_matches_the_object_reader(tmp_path):
    model = _model()
    colmap_io.write_model_bin(model, tmp_path)  # writes 2D points: records of varying length
    ref = colmap_io.read_images_bin(tmp_path / "images.bin")
    table = colmap_io.read_images_bin_table(tmp_path / "images.bin")
    assert table.ids.tolist() == list(ref)
    for k, im in enumerate(ref.values()):
        assert np.array_equal(table.qvecs[k], im.qvec) and np.array_equal(table.tvecs[k], im.tvec)
        assert table.camera_ids[k] == im.camera_id and table.names[k].decode() == im.name
    cams, t2, _ = colmap_io.read_model_table(tmp_path)
    assert t2.ids.tolist() == table.ids.tolist() and sorted(cams) == [1, 3]


def test_images_bin_table_refuses_damage(tmp_path):
    colmap_io.write_model_bin(_model(), tmp_path)
    path = tmp_path / "images.bin"
    raw = path.read_bytes()
    for cut in (4, 40, 70, len(raw) - 5):
        path.write_bytes(raw[:cut])
        with pytest.raises(DataError, match="truncated"):
            colmap_io.read_images_bin_table(path)
    bad = bytearray(raw)
    bad[8 + 64] = 0xFF  # first byte of the first name
    path.write_bytes(bytes(bad))
    with pytest.raises(DataError, match="not UTF-8"):
        colmap_io.read_images_bin_table(path)
    huge = struct.pack("<Q", 2**62) + raw[8:]  # claims more images than the file holds
    path.write_bytes(huge)
    with pytest.raises(DataError, match="truncated"):
        colmap_io.read_images_bin_table(path)


def test_point_tracks_match_a_per_image_scan():
    model = _model(n_images=9, n_points=40, seed=3)
    image_ids = np.array(sorted(model.images, key=lambda i: model.images[i].name), dtype=np.int64)
    p = model.points
    point_of = np.repeat(np.arange(len(p.ids)), np.diff(p.track_offsets))
    tracks = _point_tracks(p, image_ids)
    assert len(tracks) == len(image_ids)
    for c, iid in enumerate(image_ids.tolist()):  # the reference: every track scanned per image
        assert tracks[c].tolist() == np.unique(point_of[p.track_images == iid]).tolist()


def test_load_colmap_holds_no_object_per_camera(tmp_path):
    root = make_colmap_dataset(tmp_path / "cap", num_cameras=10)
    scene = load_colmap(root)
    assert isinstance(scene.names, NameList) and list(scene.names) == sorted(scene.names)
    assert isinstance(scene.images.paths, JoinedPaths)
    # one PINHOLE camera: K and size shared by every image as broadcast views
    assert scene.Ks.strides[0] == 0 and scene.widths.strides[0] == 0 and scene.Ks.shape == (10, 3, 3)
    cams = scene.camera_tensors()
    assert cams["Ks"].shape == (10, 3, 3) and cams["Ks"].stride(0) == 0
    assert np.allclose(cams["Ks"][7].numpy(), scene.Ks[7])


def test_shard_index_names_file_damage(tmp_path):
    """Format 2's names file is gathered into a fixed-width table with numpy: every damage
    is a DataError naming the index, never another exception or a silent misread."""
    from distsplat.data import TarShardSource, pack_shards
    from distsplat.data.shards import NAMES_FILE

    folder = tmp_path / "imgs"
    (folder / "d").mkdir(parents=True)
    for name in ("a.jpg", "b.jpg", "d/c.jpg"):
        (folder / name).write_bytes(name.encode() * 10)
    index = pack_shards(folder, tmp_path / "shards")
    src = TarShardSource(index)
    assert isinstance(src.names, NameList) and list(src.names) == ["a.jpg", "b.jpg", "d/c.jpg"]
    assert src.read(2) == b"d/c.jpg" * 10
    names_file = index.parent / NAMES_FILE
    good = names_file.read_bytes()
    for damage, match in ((good[:-1], "newline"),  # last name cut from its newline
                          (good.replace(b"b.jpg", b"b\xff.jpg"), "not UTF-8"),
                          (b"", "malformed"),  # no names for a 3-row table
                          (good.replace(b"a.jpg\n", b""), "malformed")):
        names_file.write_bytes(damage)
        with pytest.raises(DataError, match=match):
            TarShardSource(index)
