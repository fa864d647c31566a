"""Damaged values in a COLMAP model (issue 36): every value is checked where it is read,
and each bad one is a DataError naming the file, the record and the value, never an
exception further down the load (an OverflowError building the size table, a LinAlgError
in the normalisation, a ZeroDivisionError, a scene with NaN intrinsics)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from distsplat.data import DataError, load_colmap
from distsplat.data import colmap_io
from distsplat.data.normalize import normalize

from .data_helpers import make_colmap_dataset


@pytest.fixture
def dataset(tmp_path):
    return make_colmap_dataset(tmp_path / "d", num_cameras=6, factors=())


def _model(dataset):
    return colmap_io.read_model(dataset / "sparse" / "0")


def _write(dataset, model, fmt="bin"):
    folder = dataset / "sparse" / "0"
    for f in folder.iterdir():
        f.unlink()
    (colmap_io.write_model_bin if fmt == "bin" else colmap_io.write_model_txt)(model, folder)


def _camera_bytes(dataset, **fields):
    """cameras.bin with the first camera's fields replaced (raw: any uint64 width)."""
    path = dataset / "sparse" / "0" / "cameras.bin"
    buf = bytearray(path.read_bytes())
    offsets = {"width": (16, "<Q"), "height": (24, "<Q"), "f": (32, "<d"), "cx": (48, "<d")}
    for k, v in fields.items():
        off, fmt = offsets[k]
        struct.pack_into(fmt, buf, off, v)
    path.write_bytes(bytes(buf))


@pytest.mark.parametrize("fields, message", [
    ({"width": 2**64 - 1}, r"has width 18446744073709551615, outside 1\.\.1048576"),
    ({"width": 2**63}, r"has width 9223372036854775808, outside"),  # was an OverflowError in colmap.py
    ({"height": 0}, r"has height 0, outside 1\.\.1048576"),  # was a ZeroDivisionError in decode.py
    ({"f": float("nan")}, r"has non-finite parameters \[nan, "),
    ({"f": 0.0}, r"has focal length 0\.0, outside 0\.001 to 1000 times its larger side 64 \(0\.064 to 64000 pixels\)"),
    ({"f": 5e-324}, r"has focal length 5e-324, outside"),  # a denormal: 0 once scaled
    ({"cx": 1e12}, r"has principal point cx = 1000000000000\.0, more than 10 image sizes outside the 64x48 image"),
])
def test_camera_values(dataset, fields, message):
    _camera_bytes(dataset, **fields)
    with pytest.raises(DataError, match=r"sparse/0/cameras\.bin: camera 1 \(PINHOLE\) " + message + ".*re-export or re-run it"):
        load_colmap(dataset)


def test_camera_txt_values_and_parameter_count(dataset):
    model = _model(dataset)
    model.cameras[1].width = 10**20
    _write(dataset, model, "txt")
    with pytest.raises(DataError, match=r"cameras\.txt: line 2: camera 1 \(PINHOLE\) has width 100000000000000000000"):
        load_colmap(dataset)
    model.cameras[1].width = 64
    model.cameras[1].params = model.cameras[1].params[:3]  # PINHOLE has 4: was an IndexError in split_params
    _write(dataset, model, "txt")
    with pytest.raises(DataError, match=r"cameras\.txt: line 2: camera 1 \(PINHOLE\) has 3 parameters, the model has 4"):
        load_colmap(dataset)


@pytest.mark.parametrize("value, message", [
    (np.inf, r"2 of 300 points have non-finite coordinates \(first: point 4 at \[.*\], record 4\)"),
    (1e200, r"2 of 300 points have coordinates beyond \+-1e\+10 \(first: point 4 at \[.*1e\+200\], record 4\)"),
])
@pytest.mark.parametrize("fmt", ["bin", "txt"])
def test_point_values(dataset, value, message, fmt):
    """1e200 parses and is finite: it used to end the load in numpy's eigh ("Eigenvalues
    did not converge") while normalising."""
    model = _model(dataset)
    model.points.xyz[[3, 7], 2] = value
    _write(dataset, model, fmt)
    with pytest.raises(DataError, match=rf"points3D\.{fmt}: {message}; the reconstruction is damaged"):
        load_colmap(dataset, normalize=True)


def test_point_track_length_past_the_file(dataset):
    path = dataset / "sparse" / "0" / "points3D.bin"
    buf = bytearray(path.read_bytes())
    struct.pack_into("<Q", buf, 8 + 43, 2**61)  # the first point's track length
    path.write_bytes(bytes(buf))
    with pytest.raises(DataError, match=r"points3D\.bin: point 1 \(record 1 of 300\) claims a track of "
                                        r"2305843009213693952 observations, more than the \d+ bytes left"):
        load_colmap(dataset)


@pytest.mark.parametrize("line, message", [
    ("1 0 0 0 1 2 3 0.5 2 x", r"points3D\.txt:2: malformed track of point 1"),  # was a ValueError
    ("1 0 0 0 1 2 3 0.5 2 99999999999999999999", r"points3D\.txt:2: malformed track of point 1"),  # OverflowError
    ("1 0 0 0 1 2 3 0.5 2", r"points3D\.txt:2: malformed point line \(9 fields"),  # half an observation
    ("1 0 0 0 1 300 3 0.5", r"points3D\.txt:2: point 1 has colour \[1, 300, 3\], outside 0\.\.255"),
])
def test_points_txt_lines(tmp_path, line, message):
    path = tmp_path / "points3D.txt"
    path.write_text("# header\n" + line + "\n")
    with pytest.raises(DataError, match=message):
        colmap_io.read_points_txt(path)


@pytest.mark.parametrize("qvec, message", [
    ([0.0, 0.0, 0.0, 0.0], r"rotation quaternion of norm 0 "),
    ([1e-200, 1e-200, 0.0, 0.0], r"rotation quaternion of norm 1\.41e-200 "),  # its squares underflow to 0
    ([1e300, 0.0, 0.0, 0.0], r"rotation quaternion of norm 1e\+300 "),
])
def test_image_rotation_values(dataset, qvec, message):
    model = _model(dataset)
    model.images[2].qvec = np.array(qvec)
    _write(dataset, model)
    with pytest.raises(DataError, match=r"images\.bin: image 'synthetic_00001\.jpg' has a " + message
                       + r".*image id 2, record 2\), outside 0\.001\.\.1000"):
        load_colmap(dataset)


def test_image_translation_and_txt_ids(dataset):
    model = _model(dataset)
    model.images[3].tvec = np.array([0.0, 1e11, 0.0])
    _write(dataset, model, "txt")
    with pytest.raises(DataError, match=r"images\.txt: image 'synthetic_00002\.jpg' has a translation "
                                        r"\[0\.0, 100000000000\.0, 0\.0\] beyond \+-1e\+10 \(image id 3, record 3\)"):
        load_colmap(dataset)
    text = (dataset / "sparse" / "0" / "images.txt").read_text().replace("\n3 ", "\n99999999999999999999 ", 1)
    (dataset / "sparse" / "0" / "images.txt").write_text(text)
    with pytest.raises(DataError, match=r"images\.txt:\d+: image id 99999999999999999999 is outside COLMAP's 0\.\.4294967295"):
        load_colmap(dataset)


def test_normalize_degenerate_cameras_and_points():
    rng = np.random.default_rng(0)
    pts = rng.normal(size=(50, 3)).astype(np.float32)
    one = np.eye(4)[None]  # one camera at the origin: its own focus, nothing to scale by
    c2w, p, T = normalize(one, pts)
    assert np.isfinite(c2w).all() and np.isfinite(p).all() and np.isfinite(T).all()
    assert np.isclose(np.cbrt(np.linalg.det(T[:3, :3])), 1.0)  # not scaled
    flip = np.stack([np.eye(4), np.diag([1.0, -1.0, -1.0, 1.0])])  # up axes cancel: not rotated, still finite
    flip[:, :3, 3] = [[0, 0, -3], [0, 0, 3]]
    assert all(np.isfinite(a).all() for a in normalize(flip, pts))
    same = np.zeros((40, 3), np.float32)  # every point in one place: no principal axes, no error
    assert all(np.isfinite(a).all() for a in normalize(flip, same))
    near = np.tile(np.eye(4), (2, 1, 1))
    near[:, :3, 3] = [[0, 0, 1e-150], [0, 0, -1e-150]]  # cameras a hair apart: a scale of 1e150
    with pytest.raises(DataError, match=r"normalizing the scene scales it by 1e\+150, which puts the cameras or "
                                        r"points outside \+-1e\+30.*--no-normalize-world-space"):
        normalize(near, pts)


def test_degenerate_normalisation_names_the_model(dataset):
    model = _model(dataset)
    for im in model.images.values():
        im.tvec = im.tvec * 1e-150  # every camera a hair from the origin (finite, in range)
    _write(dataset, model)
    with pytest.raises(DataError, match=r"sparse/0: normalizing the scene scales it by"):
        load_colmap(dataset, normalize=True)
