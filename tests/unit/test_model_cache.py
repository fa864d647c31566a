"""The binary copy of a COLMAP image table (data/model_cache.py): a later start reads the
same table the parse gives; a stale, cut or altered copy is never used (rebuilt, said once);
a folder that cannot be written just means no copy."""

import logging
import os

import numpy as np
import pytest

from distsplat.data import colmap_io, load_colmap
from distsplat.data.model_cache import cache_path

from .data_helpers import make_colmap_dataset


@pytest.fixture
def dataset(tmp_path):
    return make_colmap_dataset(tmp_path / "d", num_cameras=9)


def _tables_equal(a, b):
    for f in ("ids", "qvecs", "tvecs", "camera_ids", "names"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and np.array_equal(x, y), f


def _parsed(model):
    os.environ["DISTSPLAT_MODEL_CACHE"] = "0"
    try:
        return colmap_io.read_model_table(model)[1]
    finally:
        del os.environ["DISTSPLAT_MODEL_CACHE"]


def test_the_copy_gives_the_parsed_table(dataset, monkeypatch):
    model = dataset / "sparse" / "0"
    copy = cache_path(model / "images.bin")
    assert not copy.exists()
    first = colmap_io.read_model_table(model)[1]  # parses, writes the copy
    assert copy.is_file()
    calls = []
    with monkeypatch.context() as m:
        m.setattr(colmap_io, "read_images_bin_table", lambda p: calls.append(p))
        second = colmap_io.read_model_table(model)[1]  # from the copy: the parser is not called
    assert calls == []
    _tables_equal(first, second)
    _tables_equal(second, _parsed(model))
    a, b = load_colmap(dataset), load_colmap(dataset)
    assert list(a.names) == list(b.names) and np.array_equal(a.camtoworlds, b.camtoworlds)


def test_a_stale_copy_is_rebuilt(dataset, caplog):
    model = dataset / "sparse" / "0"
    colmap_io.read_model_table(model)
    copy = cache_path(model / "images.bin")
    # the model re-exported: one image moved (same size, new mtime)
    whole = colmap_io.read_model(model)
    first = min(whole.images)
    whole.images[first].tvec = whole.images[first].tvec + 1.0
    colmap_io.write_model_bin(whole, model)
    images = whole.images
    st = (model / "images.bin").stat()
    os.utime(model / "images.bin", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # coarse clocks: later for sure
    with caplog.at_level(logging.INFO, logger="distsplat.data.model_cache"):
        table = colmap_io.read_model_table(model)[1]
    assert "stale" in caplog.text and str(copy) in caplog.text
    _tables_equal(table, _parsed(model))
    assert np.allclose(table.tvecs[table.ids == first], images[first].tvec)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="distsplat.data.model_cache"):
        _tables_equal(colmap_io.read_model_table(model)[1], table)  # the rebuilt copy is current
    assert caplog.text == ""


@pytest.mark.parametrize("damage", ["cut", "flip", "garbage", "empty"])
def test_a_damaged_copy_is_rebuilt(dataset, caplog, damage):
    model = dataset / "sparse" / "0"
    want = colmap_io.read_model_table(model)[1]
    copy = cache_path(model / "images.bin")
    data = bytearray(copy.read_bytes())
    if damage == "cut":
        data = data[:-5]
    elif damage == "flip":
        data[-3] ^= 0x01  # a name's byte: the sizes still match, the digest does not
    elif damage == "garbage":
        data[:16] = b"\x00" * 16
    else:
        data = b""
    copy.write_bytes(bytes(data))
    with caplog.at_level(logging.INFO, logger="distsplat.data.model_cache"):
        got = colmap_io.read_model_table(model)[1]
    _tables_equal(got, want)
    assert "rebuilt it from images.bin" in caplog.text
    assert copy.read_bytes() != bytes(data)  # rewritten whole


def test_no_copy_without_a_writable_folder_or_when_off(dataset, monkeypatch):
    model = dataset / "sparse" / "0"
    monkeypatch.setenv("DISTSPLAT_MODEL_CACHE", "0")
    colmap_io.read_model_table(model)
    assert not cache_path(model / "images.bin").exists()
    monkeypatch.delenv("DISTSPLAT_MODEL_CACHE")
    import distsplat.data.model_cache as mc

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    model.chmod(0o555)  # marked read-only: no copy, even for root (who may write there anyway)
    try:
        _tables_equal(colmap_io.read_model_table(model)[1], _parsed(model))
        assert not cache_path(model / "images.bin").exists()
    finally:
        model.chmod(0o755)
    monkeypatch.setattr(mc.os, "replace", refuse)  # as a read-only folder refuses (root ignores modes)
    _tables_equal(colmap_io.read_model_table(model)[1], _parsed(model))
    assert not cache_path(model / "images.bin").exists()
    assert not [p for p in model.iterdir() if p.name.endswith(".tmp")]


def test_a_text_model_gets_a_copy_too(dataset):
    model = dataset / "sparse" / "0"
    model_txt = dataset / "sparse" / "txt"
    colmap_io.write_model_txt(colmap_io.read_model(model), model_txt)
    first = colmap_io.read_model_table(model_txt)[1]
    assert cache_path(model_txt / "images.txt").is_file()
    _tables_equal(colmap_io.read_model_table(model_txt)[1], first)
    _tables_equal(first, _parsed(model))
