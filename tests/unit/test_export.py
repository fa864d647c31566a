"""PLY export read back with an independent reader (plyfile)."""

import numpy as np
import pytest
import torch

from distsplat.train.files.export import create_ply, ply_rows, write_ply, write_ply_rows

plyfile = pytest.importorskip("plyfile")


def params(n=7, sh_degree=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = (sh_degree + 1) ** 2
    return {
        "means": torch.randn(n, 3, generator=g),
        "scales": torch.randn(n, 3, generator=g),
        "quats": torch.randn(n, 4, generator=g),
        "opacities": torch.randn(n, generator=g),
        "sh0": torch.randn(n, 1, 3, generator=g),
        "shN": torch.randn(n, k - 1, 3, generator=g),
    }


def test_ply_has_standard_3dgs_properties_and_values(tmp_path):
    p = params()
    path = write_ply(tmp_path / "ply" / "point_cloud_0100.ply", p)
    v = plyfile.PlyData.read(str(path))["vertex"]
    names = [prop.name for prop in v.properties]
    assert names[:9] == ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
    assert names[9:33] == [f"f_rest_{i}" for i in range(24)]
    assert names[33:] == ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
    assert len(v) == 7
    np.testing.assert_array_equal(np.stack([v["x"], v["y"], v["z"]], 1), p["means"].numpy())
    np.testing.assert_array_equal(v["nx"], 0)
    np.testing.assert_array_equal(np.stack([v[f"f_dc_{i}"] for i in range(3)], 1), p["sh0"][:, 0].numpy())
    # f_rest is channel-major: f_rest_{c*(K-1)+k} = shN[:, k, c]
    for c in range(3):
        for k in range(8):
            np.testing.assert_array_equal(v[f"f_rest_{c * 8 + k}"], p["shN"][:, k, c].numpy())
    np.testing.assert_array_equal(v["opacity"], p["opacities"].numpy())
    np.testing.assert_array_equal(np.stack([v[f"rot_{i}"] for i in range(4)], 1), p["quats"].numpy())
    np.testing.assert_array_equal(np.stack([v[f"scale_{i}"] for i in range(3)], 1), p["scales"].numpy())
    assert not (tmp_path / "ply" / "point_cloud_0100.ply.tmp").exists()


def test_chunks_written_by_separate_writers_equal_one_file(tmp_path):
    """What the ranks of a distributed run do: one header, each rank its own rows."""
    p = params(n=11, sh_degree=1)
    whole = write_ply(tmp_path / "whole.ply", p)
    merged = tmp_path / "merged.ply"
    header = create_ply(merged, 11, 3)
    for start, end in [(6, 11), (0, 4), (4, 6)]:  # any order, like ranks finishing
        write_ply_rows(merged, header, start, ply_rows({k: v[start:end] for k, v in p.items()}))
    assert merged.read_bytes() == whole.read_bytes()
