"""Captures as users find them (issue 34), on generated data shaped like each case: an
instant-ngp transforms.json with frames whose image is absent and no points; a two-camera
COLMAP capture whose model sits in colmap_sparse/0 beside a transforms.json, PNGs in
per-camera subfolders; missing images in the other formats (an error naming the file read,
or skipped with --skip_missing_images); --init_type auto; the smaller log and file-name fixes."""

from __future__ import annotations

import json
import logging
import math
import shutil

import numpy as np
import pytest
import torch

from distsplat.data import DataError, load_blender, load_colmap, load_nerfstudio, write_blender
from distsplat.data.decode import draft_note
from distsplat.data.discover import choose, discover
from distsplat.data.synthetic import make_synthetic_scene, splat_points
from distsplat.distributed import DistContext
from distsplat.train.config import Config
from distsplat.train.scoring.metrics import render_stem
from distsplat.train.model.gaussians import init_kind, init_line
from distsplat.train.scene_setup import load_scene_dir
from tests.unit.data_helpers import make_colmap_dataset, make_instant_ngp, make_two_camera_capture


def warnings_of(caplog):
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


# ------------------------------------------------------------------ instant-ngp transforms.json

def test_instant_ngp_skips_absent_frames_with_one_warning(tmp_path, caplog):
    root = make_instant_ngp(tmp_path / "ingp", num_cameras=12, missing=(2, 5, 6, 9))
    with caplog.at_level(logging.INFO, logger="distsplat"):
        scene = load_scene_dir(root)
    assert scene.num_cameras == 8
    assert list(scene.names) == [f"images/{i:04d}.jpg" for i in (0, 1, 3, 4, 7, 8, 10, 11)]
    assert len(scene.points) == 0  # no points file: the trainer's auto init goes random
    assert sorted(scene.train.tolist() + scene.test.tolist()) == list(range(8))
    warned = warnings_of(caplog)
    assert len(warned) == 1, [r.getMessage() for r in warned]
    msg = warned[0].getMessage()
    assert "transforms.json lists 4 images that are absent, training on the other 8" in msg
    assert "instant-ngp skips them too" in msg
    assert "images/0002.jpg, images/0005.jpg, images/0006.jpg, +1 more" in msg
    assert getattr(warned[0], "same_on_every_rank", False)  # printed by rank 0 only
    # the poses are the remaining frames' (OpenGL -> OpenCV), not shifted by the skipped ones
    ref = make_synthetic_scene(num_cameras=12, num_gaussians=300)
    np.testing.assert_allclose(np.asarray(scene.camtoworlds)[2], ref.camtoworlds[3], atol=1e-9)
    assert any("instant-ngp" in r.getMessage() and "8 frames" in r.getMessage() for r in caplog.records)


def test_instant_ngp_intrinsics_from_camera_angles_and_image_size(tmp_path):
    root = make_instant_ngp(tmp_path / "ingp", num_cameras=6, with_size=False, ext=".png")
    meta = json.loads((root / "transforms.json").read_text())
    for k in ("fl_x", "fl_y", "cx", "cy", "camera_angle_y"):
        del meta[k]
    meta["camera_angle_x"] = 1.0
    (root / "transforms.json").write_text(json.dumps(meta))
    scene = load_nerfstudio(root)
    fx = 0.5 * 64 / math.tan(0.5)
    np.testing.assert_allclose(scene.Ks[0], [[fx, 0, 32], [0, fx, 24], [0, 0, 1]])  # fl_y = fl_x, centre
    assert (scene.widths == 64).all() and (scene.heights == 48).all()  # w/h from the images

    # per-frame keys win over the file's; camera_angle_y gives its own fl_y
    meta["frames"][0].update(camera_angle_x=0.8, camera_angle_y=0.7)
    (root / "transforms.json").write_text(json.dumps(meta))
    scene = load_nerfstudio(root)
    i = list(scene.names).index("images/0000.png")
    np.testing.assert_allclose(scene.Ks[i][[0, 1], [0, 1]], [0.5 * 64 / math.tan(0.4), 0.5 * 48 / math.tan(0.35)])
    np.testing.assert_allclose(scene.Ks[i - 1 if i else 1][0, 0], fx)


def test_instant_ngp_distortion_reads_like_nerfstudio_opencv(tmp_path):
    """k1 k2 p1 p2 without camera_model are undistorted on load exactly as the same camera
    written as nerfstudio's OPENCV (the one undistortion path)."""
    ingp = make_instant_ngp(tmp_path / "ingp", num_cameras=6, k1=-0.08, ext=".png")
    ns = tmp_path / "ns"
    shutil.copytree(ingp, ns)
    meta = json.loads((ns / "transforms.json").read_text())
    for k in ("camera_angle_x", "camera_angle_y", "aabb_scale"):
        del meta[k]
    meta["camera_model"] = "OPENCV"
    (ns / "transforms.json").write_text(json.dumps(meta))
    a, b = load_nerfstudio(ingp), load_nerfstudio(ns)
    assert a.undistort is not None and a.undistort[0] is not None
    np.testing.assert_allclose(a.Ks, b.Ks)
    assert (a.widths == b.widths).all() and (a.widths < 64).all()  # the pinhole crop of a distorted camera


def test_instant_ngp_extensionless_paths_are_pngs(tmp_path):
    root = make_instant_ngp(tmp_path / "ingp", num_cameras=4, ext=".png")
    meta = json.loads((root / "transforms.json").read_text())
    for f in meta["frames"]:
        f["file_path"] = f["file_path"][: -len(".png")]
    (root / "transforms.json").write_text(json.dumps(meta))
    assert list(load_nerfstudio(root).names) == [f"images/{i:04d}.png" for i in range(4)]


def test_instant_ngp_without_any_focal_length_names_the_keys(tmp_path):
    root = make_instant_ngp(tmp_path / "ingp", num_cameras=4)
    meta = json.loads((root / "transforms.json").read_text())
    for k in ("fl_x", "fl_y", "camera_angle_x", "camera_angle_y"):
        del meta[k]
    (root / "transforms.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match=r"transforms.json: frame 0 has no focal length: .*'fl_x' or 'camera_angle_x'"):
        load_nerfstudio(root)


def test_instant_ngp_every_image_absent_is_an_error(tmp_path):
    root = make_instant_ngp(tmp_path / "ingp", num_cameras=3, missing=(0, 1, 2))
    with pytest.raises(DataError, match=r"transforms.json: none of its 3 images exists \(the first: .*images/0000.jpg\)"):
        load_nerfstudio(root)


# ------------------------------------------------------------------ missing images, other formats

def nerfstudio_file(root):
    """The instant-ngp file as ns-process-data would write it (a camera_model)."""
    meta = json.loads((root / "transforms.json").read_text())
    for k in ("camera_angle_x", "camera_angle_y", "aabb_scale"):
        del meta[k]
    meta["camera_model"] = "OPENCV"
    (root / "transforms.json").write_text(json.dumps(meta))
    return root


def test_nerfstudio_missing_image_names_transforms_json_or_skips(tmp_path, caplog):
    root = nerfstudio_file(make_instant_ngp(tmp_path / "ns", num_cameras=6, missing=(4,)))
    with pytest.raises(DataError) as e:
        load_scene_dir(root)
    msg = str(e.value)
    assert "images/0004.jpg is missing (1 of 6 images missing)" in msg
    assert f"remove it from {root / 'transforms.json'}, or pass --skip_missing_images" in msg
    assert "transforms_*.json" not in msg and "images.bin" not in msg
    with caplog.at_level(logging.WARNING, logger="distsplat"):
        scene = load_scene_dir(root, skip_missing=True)
    assert scene.num_cameras == 5 and "images/0004.jpg" not in list(scene.names)
    assert "(--skip_missing_images): images/0004.jpg" in warnings_of(caplog)[0].getMessage()


def test_skipped_frames_leave_the_listed_test_split(tmp_path):
    root = nerfstudio_file(make_instant_ngp(tmp_path / "ns", num_cameras=6, missing=(4,)))
    meta = json.loads((root / "transforms.json").read_text())
    meta["test_filenames"] = ["images/0001.jpg", "images/0004.jpg"]
    (root / "transforms.json").write_text(json.dumps(meta))
    scene = load_nerfstudio(root, skip_missing=True)
    assert [scene.names[i] for i in scene.test] == ["images/0001.jpg"] and len(scene.train) == 4


def test_colmap_missing_image_names_images_bin_or_skips(tmp_path):
    root = make_colmap_dataset(tmp_path / "c", num_cameras=10)
    full = load_colmap(root)
    gone = full.names[3]
    (root / "images" / gone).unlink()
    (root / "test.txt").write_text(f"{full.names[0]}\n{gone}\n")
    with pytest.raises(DataError, match=rf"images/{gone} is missing \(1 of 10 .*remove it from .*sparse/0/images.bin, "
                                        r"or pass --skip_missing_images"):
        load_colmap(root)
    scene = load_colmap(root, skip_missing=True)
    assert scene.num_cameras == 9 and gone not in list(scene.names)
    keep = [i for i in range(10) if i != 3]
    np.testing.assert_allclose(np.asarray(scene.camtoworlds), np.asarray(full.camtoworlds)[keep])
    assert scene.test.tolist() == [0]  # test.txt's absent image dropped with it
    assert len(scene.point_tracks) == 9
    for j, i in enumerate(keep):  # each remaining image keeps its own points
        assert list(scene.point_tracks[j]) == list(full.point_tracks[i])


def test_blender_missing_test_image_names_transforms_test_json_or_skips(tmp_path):
    scene = make_synthetic_scene(num_cameras=6, num_gaussians=100, width=32, height=24)
    imgs = [splat_points(scene, i, alpha=True) for i in range(6)]
    root = write_blender(tmp_path / "b", scene.camtoworlds, scene.Ks[0][0, 0], imgs, [0, 1, 2, 3], [4, 5])
    (root / "test" / "r_1.png").unlink()
    with pytest.raises(DataError, match=r"test/r_1.png is missing .*remove it from .*transforms_test.json, or pass"):
        load_blender(root)
    s = load_blender(root, skip_missing=True)
    assert s.train.tolist() == [0, 1, 2, 3] and s.test.tolist() == [4]


# ------------------------------------------------------------------ discovery

def test_colmap_outside_sparse_is_found_and_preferred_over_transforms_json(tmp_path, caplog):
    root = make_two_camera_capture(tmp_path / "two")
    assert [(d.format, d.path.relative_to(root).as_posix()) for d in discover(root)] == [
        ("colmap", "colmap_sparse/0"), ("transforms", "transforms.json")]
    with caplog.at_level(logging.INFO, logger="distsplat"):
        scene = load_scene_dir(root)
    assert scene.kind == "colmap" and len(scene.points) == 300
    assert sorted(set(zip(scene.widths.tolist(), scene.heights.tolist()))) == [(48, 40), (64, 48)]
    line = next(r.getMessage() for r in caplog.records if "reading the" in r.getMessage())
    assert "reading the COLMAP model colmap_sparse/0/ (a COLMAP model comes first: it has the SfM points)" in line
    assert "also holds transforms.json (--data_format transforms reads it)" in line

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="distsplat"):
        ns = load_scene_dir(root, data_format="transforms")
    assert ns.kind == "nerfstudio" and len(ns.points) == 0 and ns.num_cameras == scene.num_cameras
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "COLMAP model colmap_sparse/0/ (--colmap_dir colmap_sparse/0 reads it)" in text
    load_line = next(r.getMessage() for r in caplog.records if "frames" in r.getMessage())
    assert f"{root / 'images' / 'cam_a'}, {root / 'images' / 'cam_b'}" in load_line  # both image folders

    # one render name per image, whichever loader read it
    assert sorted(render_stem(n) for n in ns.names) == sorted(render_stem(n) for n in scene.names)
    assert render_stem(scene.names[0]) == "cam_a_000"


def test_colmap_dir_and_data_format_choose(tmp_path):
    root = make_two_camera_capture(tmp_path / "two")
    assert load_scene_dir(root, colmap_dir="colmap_sparse/0").kind == "colmap"
    assert load_scene_dir(root, colmap_dir=str(root / "colmap_sparse" / "0")).kind == "colmap"
    with pytest.raises(DataError, match=r"--colmap_dir nope: .*nope holds no COLMAP model .*; the folder holds "
                                        r"COLMAP model colmap_sparse/0/, transforms.json"):
        load_scene_dir(root, colmap_dir="nope")
    with pytest.raises(DataError, match=r"--data_format blender: --data_dir .* has no transforms_train.json; "
                                        r"the folder holds COLMAP model colmap_sparse/0/, transforms.json"):
        load_scene_dir(root, data_format="blender")


def test_model_one_folder_down_alone_is_found_and_said(tmp_path, caplog):
    root = make_colmap_dataset(tmp_path / "c", num_cameras=6)
    (root / "colmap").mkdir()
    shutil.move(root / "sparse", root / "colmap" / "sparse")  # colmap/sparse/0
    with caplog.at_level(logging.INFO, logger="distsplat"):
        scene = load_scene_dir(root)
    assert scene.kind == "colmap" and scene.num_cameras == 6
    assert any("reading the COLMAP model colmap/sparse/0/ (found one folder down" in r.getMessage()
               for r in caplog.records)


def test_standard_single_scene_says_nothing_extra(tmp_path, caplog):
    root = make_colmap_dataset(tmp_path / "c", num_cameras=6)
    with caplog.at_level(logging.INFO, logger="distsplat"):
        load_scene_dir(root)
    assert not any("reading the" in r.getMessage() for r in caplog.records)
    assert choose(root)[1] == []


def test_not_a_scene_names_every_format(tmp_path):
    (tmp_path / "images").mkdir()
    with pytest.raises(DataError, match=r"is not a scene: .*colmap_sparse/0/.*transforms_train.json.*"
                                        r"nerfstudio or instant-ngp capture \(transforms.json\)"):
        load_scene_dir(tmp_path)


# ------------------------------------------------------------------ init, flags, smaller items

def test_init_type_auto():
    assert init_kind("auto", 0) == "random" and init_kind("auto", 5) == "sfm"
    assert init_kind("random", 5) == "random" and init_kind("sfm", 5) == "sfm"
    with pytest.raises(ValueError, match=r"--init_type sfm: the scene has no sparse points; use --init_type random"):
        init_kind("sfm", 0)
    assert "no SfM points: 100 random points in a cube of half-size 6.000" in init_line("random", 100, 3.0, 2.0)
    assert Config().init_type == "auto"


def test_flags_need_data_dir_and_agree():
    for kw in ({"data_format": "colmap"}, {"colmap_dir": "x"}, {"skip_missing_images": True}):
        with pytest.raises(ValueError, match="pass --data_dir too"):
            Config(**kw).validate()
    with pytest.raises(ValueError, match="--colmap_dir x reads a COLMAP model, --data_format transforms"):
        Config(data_dir="d", colmap_dir="x", data_format="transforms").validate()


def test_help_names_every_format(capsys):
    from distsplat.cli import parse

    with pytest.raises(SystemExit):
        parse(["default", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    i = out.index("--data-dir") if "--data-dir" in out else out.index("--data_dir")
    text = out[i:i + 600]
    for word in ("COLMAP", "Blender", "nerfstudio", "instant-ngp", "transforms.json", "colmap_sparse/0"):
        assert word in text, (word, text)
    for flag in ("skip-missing-images", "colmap-dir", "data-format"):
        assert flag in out or flag.replace("-", "_") in out


def test_draft_mode_named_for_jpegs_only(tmp_path, caplog):
    assert draft_note(["a.JPG"]) == " (JPEG draft mode)" and draft_note(["robot/0.png"]) == ""
    root = make_two_camera_capture(tmp_path / "two")  # PNGs, no images_2/
    with caplog.at_level(logging.WARNING, logger="distsplat"):
        load_scene_dir(root, factor=2)
    warned = [r.getMessage() for r in warnings_of(caplog)]
    assert any("downscaling" in m for m in warned) and not any("JPEG" in m for m in warned)


def test_render_names_have_one_extension():
    assert render_stem("images/robot/000.jpg") == render_stem("robot/000.jpg") == "robot_000"
    assert render_stem("images_4/x.png") == "x" and render_stem("test/r_0.png") == "test_r_0"
    assert render_stem("synthetic_00001") == "synthetic_00001"


def test_rank_filter_drops_once_records_off_rank_0():
    from distsplat.distributed.context import _RankFilter

    f = _RankFilter(1)
    once = logging.LogRecord("distsplat.data", logging.WARNING, "", 0, "skipped", None, None)
    once.same_on_every_rank = True
    plain = logging.LogRecord("distsplat.data", logging.WARNING, "", 0, "other", None, None)
    assert not f.filter(once) and f.filter(plain) and plain.msg == "[rank 1] other"


# ------------------------------------------------------------------ the trainer on an instant-ngp capture

def test_trainer_on_instant_ngp_capture_with_default_flags(tmp_path, caplog):
    """Default init and flags apart from the data: the absent frames skipped, random points
    with one line saying so, a first log line at step 1, render files with one extension."""
    from distsplat.train.trainer import Trainer

    root = make_instant_ngp(tmp_path / "ingp", num_cameras=10, width=32, height=24, missing=(1, 4))
    cfg = Config(data_dir=str(root), data_factor=1, result_dir=str(tmp_path / "out"), max_steps=3, eval_steps=[],
                 save_steps=[], save_ply=False, sh_degree=0, init_num_pts=300, num_workers=1, prefetch=1,
                 log_every=100)
    cfg.validate()
    ctx = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)
    trainer = Trainer(cfg, ctx)
    try:
        with caplog.at_level(logging.INFO, logger="distsplat"):
            trainer.setup()
            trainer.train()
    finally:
        trainer.cleanup()
    text = [r.getMessage() for r in caplog.records]
    assert trainer.scene.num_cameras == 8 and trainer.n_all == 300
    assert sum("init: the scene has no SfM points: 300 random points" in m for m in text) == 1
    assert any(m.startswith("step 1/3:") for m in text), text
    renders = sorted(p.name for p in (tmp_path / "out" / "renders").iterdir())
    assert renders and all(n.count(".png") == 1 and "images" not in n for n in renders), renders
    assert "val_step0003_0000_gt-vs-render.png" in renders
