"""Other trainers' model files (issue 46, point 2; distsplat/train/files/model_files.py, model_import.py):
PLYs as gsplat's exporter, plyfile (the original 3DGS implementation's writer) and distsplat write
them, gsplat's checkpoint layout as its trainer saves and loads it, and a model moved from the
capture's world into the normalised one renders the same images."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distsplat.train.files.model_files import (KEYS, fit_sh, gsplat_files, is_gsplat_spec, open_model, read_ply_layout,
                                         read_ply_rows, write_gsplat_pt)


def model(n: int, sh_rest: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return {"means": torch.randn(n, 3, generator=g), "scales": torch.randn(n, 3, generator=g) - 3,
            "quats": torch.randn(n, 4, generator=g), "opacities": torch.randn(n, generator=g),
            "sh0": torch.randn(n, 1, 3, generator=g), "shN": torch.randn(n, sh_rest, 3, generator=g)}


def assert_same(got, want):
    for k in KEYS:
        assert torch.equal(got[k], want[k].float()), k


def test_a_ply_of_gsplats_exporter_reads_back(tmp_path):
    """gsplat's export_splats writes no normals (x y z f_dc f_rest opacity scale rot)."""
    from gsplat import export_splats

    m = model(37, 8)  # SH degree 2
    path = tmp_path / "gsplat.ply"
    export_splats(**m, format="ply", save_to=str(path))
    layout = read_ply_layout(path)
    assert layout.n == 37 and layout.sh_rest == 8 and "nx" not in layout.names
    assert_same(read_ply_rows(path, 0, 37), m)
    for W in (2, 3):  # by row range, as each rank reads its chunk
        from distsplat.distributed import chunk_bounds

        parts = [read_ply_rows(path, a, b) for a, b in chunk_bounds(37, W)]
        assert_same({k: torch.cat([p[k] for p in parts]) for k in KEYS}, m)


@pytest.mark.parametrize("byte_order", ["<", ">"])
def test_a_ply_as_the_original_implementation_writes_it_in_any_property_order(tmp_path, byte_order):
    """plyfile (what the original 3DGS implementation writes with): normals, then the same
    properties in another order, one as double, extra colour bytes, and a face element after
    the vertices; little- and big-endian."""
    from plyfile import PlyData, PlyElement

    m = model(20, 3)
    n = 20
    cols = {"x": m["means"][:, 0], "y": m["means"][:, 1], "z": m["means"][:, 2],
            "nx": torch.zeros(n), "ny": torch.zeros(n), "nz": torch.zeros(n),
            **{f"f_dc_{i}": m["sh0"][:, 0, i] for i in range(3)},
            **{f"f_rest_{i}": m["shN"].transpose(1, 2).reshape(n, -1)[:, i] for i in range(9)},  # channel-major
            "opacity": m["opacities"], **{f"scale_{i}": m["scales"][:, i] for i in range(3)},
            **{f"rot_{i}": m["quats"][:, i] for i in range(4)}}
    order = ["rot_3", "x", "opacity", "nx"] + [k for k in cols if k not in ("rot_3", "x", "opacity", "nx")]
    dtype = [(k, "f8" if k == "opacity" else "f4") for k in order] + [("red", "u1")]
    rec = np.empty(n, dtype=dtype)
    for k in order:
        rec[k] = cols[k].numpy()
    rec["red"] = 7
    faces = np.array([([0, 1, 2],)], dtype=[("vertex_indices", "i4", (3,))])
    PlyData([PlyElement.describe(rec, "vertex"), PlyElement.describe(faces, "face")],
            byte_order=byte_order).write(str(tmp_path / "3dgs.ply"))
    assert_same(read_ply_rows(tmp_path / "3dgs.ply", 0, n), m)


def test_bad_plys_name_the_file_and_what_is_wrong(tmp_path):
    from distsplat.train.files.export import write_ply

    path = write_ply(tmp_path / "m.ply", model(5, 0))
    data = path.read_bytes()
    cases = {
        "ascii.ply": (data.replace(b"binary_little_endian", b"ascii"), "PLY format ascii is not read"),
        "cut.ply": (data[:-10], "announces 5 Gaussians .* truncated"),
        "norot.ply": (data.replace(b"property float rot_3\n", b""), "missing rot_3"),
        "text.ply": (b"hello", "not a PLY file"),
        "rest.ply": (data.replace(b"property float opacity", b"property float f_rest_0\nproperty float opacity"),
                     "1 f_rest_"),
    }
    for name, (content, match) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match=f"^--init_ply {tmp_path / name}: .*{match}"):
            read_ply_rows(tmp_path / name, 0, 1, "--init_ply")


def gsplat_save(path, splats, step):
    """What gsplat 1.5.3's trainer does at a save step (its checkpoint layout)."""
    params = torch.nn.ParameterDict({k: torch.nn.Parameter(v) for k, v in splats.items()})
    torch.save({"step": step, "splats": params.state_dict()}, path)


def gsplat_load(files):
    """What gsplat 1.5.3's trainer does with --ckpt files: every tensor concatenated in order."""
    ckpts = [torch.load(f, map_location="cpu", weights_only=True) for f in files]
    return {k: torch.cat([c["splats"][k] for c in ckpts]) for k in KEYS}, ckpts[0]["step"]


def test_gsplats_checkpoint_layout_both_ways(tmp_path):
    m = model(30, 3)
    write_gsplat_pt(tmp_path / "ours.pt", m, 700)
    got, step = gsplat_load([tmp_path / "ours.pt"])  # read back as gsplat's trainer reads it
    assert step == 700
    assert_same(got, m)
    # gsplat's distributed mode: one file per rank; one of them brings its siblings, in rank order
    for r, rows in enumerate((slice(0, 12), slice(12, 21), slice(21, 30))):
        gsplat_save(tmp_path / f"ckpt_6999_rank{r}.pt", {k: v[rows] for k, v in m.items()}, 6999)
    files = gsplat_files(str(tmp_path / "ckpt_6999_rank1.pt"))
    assert [p.name for p in files] == [f"ckpt_6999_rank{r}.pt" for r in range(3)]
    opened = open_model(str(tmp_path / "ckpt_6999_rank2.pt"))
    assert (opened.n_all, opened.step, opened.counts, opened.sh_rest) == (30, 6999, [12, 9, 9], 3)
    assert_same(opened.rows(0, 30), m)
    assert_same({k: torch.cat([opened.rows(a, b)[k] for a, b in ((0, 5), (5, 13), (13, 13), (13, 30))])
                 for k in KEYS}, m)  # row ranges across the files' boundaries
    assert opened.rows(30, 30)["shN"].shape == (0, 3, 3)
    joined = ":".join(str(tmp_path / f"ckpt_6999_rank{r}.pt") for r in (0, 2))
    assert is_gsplat_spec(joined)
    with pytest.raises(ValueError, match="ckpt_6999_rank1.pt is not among the files passed: the model would miss"):
        gsplat_files(joined)


def test_bad_gsplat_checkpoints_are_refused(tmp_path):
    m = model(4, 0)
    torch.save({"step": 3, "splats": {**m, "features": torch.zeros(4, 32)}}, tmp_path / "app.pt")
    torch.save({"weights": 1}, tmp_path / "other.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a pickle")
    torch.save({"step": 3, "splats": {**m, "quats": torch.zeros(4, 3)}}, tmp_path / "shape.pt")
    write_gsplat_pt(tmp_path / "a.pt", m, 1)
    write_gsplat_pt(tmp_path / "b.pt", m, 2)
    for spec, match in ((tmp_path / "app.pt", "a gsplat --app_opt checkpoint"),
                        (tmp_path / "other.pt", "not a gsplat checkpoint .no 'splats'"),
                        (tmp_path / "junk.pt", "not a readable gsplat checkpoint"),
                        (tmp_path / "shape.pt", r"splats\['quats'\] is \[4, 3\], expected \[4, 4\]"),
                        (tmp_path / "none.pt", "no such file"),
                        (f"{tmp_path / 'a.pt'}:{tmp_path / 'b.pt'}", r"different steps \(1, 2\)")):
        with pytest.raises(ValueError, match=match):
            open_model(str(spec))


def test_sh_degrees_are_padded_up_and_refused_down():
    m = model(3, 3)  # degree 1
    padded, note = fit_sh(m, 3, "--ckpt F")
    assert padded["shN"].shape == (3, 15, 3) and torch.equal(padded["shN"][:, :3], m["shN"])
    assert not padded["shN"][:, 3:].any() and "padded to --sh_degree 3" in note
    assert fit_sh(m, 1, "x") == (m, None)
    with pytest.raises(ValueError, match="--ckpt F holds colours of SH degree 1, .* pass --sh_degree 1"):
        fit_sh(m, 0, "--ckpt F")


def test_a_model_in_the_capture_world_moves_into_the_normalised_one():
    """The original implementation's PLY is in COLMAP's world; the run trains in the normalised
    one (normalized = T @ capture): rendered through the cameras of its world, the moved model
    gives the capture-world model's images through the capture's cameras (SH rotated too)."""
    from distsplat.data.normalize import transform_cameras
    from distsplat.data.synthetic import make_synthetic_scene
    from distsplat.train.files.model_import import from_capture
    from tests.unit.test_coords import render, similarity

    scene = make_synthetic_scene(num_cameras=4, num_gaussians=150, width=48, height=36, seed=3)
    g = scene.gaussians
    gen = torch.Generator().manual_seed(1)
    n = len(g["means"])
    capture = {"means": torch.from_numpy(g["means"]).double(), "scales": torch.log(torch.from_numpy(g["scales"])).double(),
               "quats": torch.randn(n, 4, generator=gen, dtype=torch.float64),
               "opacities": torch.logit(torch.from_numpy(g["opacities"]).double().clamp(0.05, 0.95)),
               "sh0": torch.randn(n, 1, 3, generator=gen, dtype=torch.float64) * 0.5,
               "shN": torch.randn(n, 15, 3, generator=gen, dtype=torch.float64) * 0.5}
    T = similarity(4, scale=2.2)
    c2w_capture = np.asarray(scene.camtoworlds, dtype=np.float64)
    want = render(capture, c2w_capture, scene.Ks[0])
    moved = from_capture(capture, T)
    got = render(moved, transform_cameras(T, c2w_capture), scene.Ks[0])
    assert want.abs().max() > 0.1
    torch.testing.assert_close(got, want, atol=1e-9, rtol=0)
    assert (render(capture, transform_cameras(T, c2w_capture), scene.Ks[0]) - want).abs().max() > 0.1  # not moved


def test_model_frame_auto(tmp_path):
    import json

    from distsplat.train.files.model_files import ModelFile
    from distsplat.train.files.model_import import model_frame

    def ply_in(run, **files):
        (run / "ply").mkdir(parents=True)
        for name, text in files.items():
            (run / name.replace("_", ".", 1)).write_text(text)
        return ModelFile("ply", [run / "ply" / "point_cloud_7000.ply"], [1], 0, 0, "--ckpt")

    ours = ply_in(tmp_path / "ours", transform_json=json.dumps({"ply_frame": "capture"}))
    assert model_frame(ours, "auto")[0] == "capture" and "transform.json" in model_frame(ours, "auto")[1]
    assert model_frame(ply_in(tmp_path / "gs", cfg_yml="normalize_world_space: true\n"), "auto")[0] == "normalized"
    assert model_frame(ply_in(tmp_path / "gs2", cfg_yml="normalize_world_space: false\n"), "auto")[0] == "capture"
    assert model_frame(ply_in(tmp_path / "else"), "auto")[0] == "capture"
    assert model_frame(ply_in(tmp_path / "else2"), "normalized") == ("normalized", "--model_frame normalized")
    pt = ModelFile("gsplat", [tmp_path / "ckpt_1_rank0.pt"], [1], 1, 0, "--ckpt")
    assert model_frame(pt, "auto")[0] == "normalized"


def test_model_flags_are_checked():
    from distsplat.train.config import default_config

    for changes, match in (({"init_ply": "m.ply", "init_type": "sfm"}, "--init_ply m.ply is the initial model of"),
                           ({"init_type": "ply"}, "--init_type ply starts from a model file: pass it with"),
                           ({"init_ply": "R/ckpts"}, "--init_ply R/ckpts: expected a 3DGS PLY"),
                           ({"init_ply": "m.ply", "ckpt": "a.pt"}, "both give the model: pass one"),
                           ({"ckpt": "m.ply"}, "--ckpt m.ply: a PLY holds no training step .* --init_type ply "
                                               "--init_ply m.ply")):
        cfg = default_config()
        for k, v in changes.items():
            setattr(cfg, k, v)
        with pytest.raises(ValueError, match=match):
            cfg.validate()
    cfg = default_config()
    cfg.ckpt, cfg.eval_only = "m.ply", True
    cfg.validate()
