"""Scenes whose images are in tar shards (--data_shards) or staged per node, for every scene
format: the loaders read the same cameras and the same bytes as from the image files, the
trainer's flag fails clearly, and scripts/stage_nodes.py stages COLMAP, Blender and
nerfstudio scenes that load on their node with --node_local_data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from distsplat.data import DataError, ImageCache, TarShardSource, pack_shards, write_blender
from distsplat.data.sources import FolderSource
from distsplat.data.synthetic import make_synthetic_scene, splat_points
from distsplat.train.config import Config
from distsplat.train.node_data import check_own_images, owned_by_node, owned_by_rank
from distsplat.train.scene_setup import checks_own_images, load_scene, load_scene_dir

from .data_helpers import colmap_to_nerfstudio, make_colmap_dataset

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    """{kind: scene folder} of a COLMAP capture (images/ only), the nerfstudio capture made
    from it, and a Blender scene; 12 images each."""
    tmp = tmp_path_factory.mktemp("scenes")
    colmap = make_colmap_dataset(tmp / "colmap", num_cameras=12, width=48, height=36, factors=())
    ns = colmap_to_nerfstudio(colmap, tmp / "ns")
    syn = make_synthetic_scene(num_cameras=12, num_gaussians=300, width=40, height=40)
    images = [splat_points(syn, i, alpha=True) for i in range(syn.num_cameras)]
    blender = write_blender(tmp / "blender", syn.camtoworlds, syn.Ks[0, 0, 0], images, syn.train, syn.test)
    return {"colmap": colmap, "nerfstudio": ns, "blender": blender}


def _pixels(scene, i: int) -> np.ndarray:
    out = np.zeros(scene.spec(i).shape, np.uint8)
    ImageCache(scene.images, scene.specs(), [i], mode="none").read_into(i, out)
    return out


def _same_scene(a, b) -> None:
    assert list(a.names) == list(b.names)
    np.testing.assert_array_equal(a.camtoworlds, b.camtoworlds)
    np.testing.assert_array_equal(a.Ks, b.Ks)
    np.testing.assert_array_equal(a.widths, b.widths)
    np.testing.assert_array_equal(a.heights, b.heights)
    np.testing.assert_array_equal(a.train, b.train)
    np.testing.assert_array_equal(a.test, b.test)
    for i in range(a.num_cameras):  # same bytes, same decoder: equal pixels
        np.testing.assert_array_equal(_pixels(a, i), _pixels(b, i))


# COLMAP: shards of the image folder (names as the model's). Blender and nerfstudio: shards of
# the scene folder (names: the frames' file_path). factor 2 from full-size images: both paths
# downscale on load (the folder run has no images_2/).
@pytest.mark.parametrize("kind,factor", [("colmap", 1), ("colmap", 2), ("nerfstudio", 2), ("blender", 1)])
def test_a_scene_from_shards_is_the_scene_from_files(scenes, tmp_path, kind, factor):
    root = scenes[kind]
    index = pack_shards(root / "images" if kind == "colmap" else root, tmp_path / "shards", shard_size_mb=0.01)
    files = load_scene_dir(root, factor)
    for check in (True, False):  # every header read here, or one per camera (the rank checks its own)
        sharded = load_scene_dir(root, factor, check=check, shards=index)
        assert isinstance(sharded.images, TarShardSource)
        _same_scene(files, sharded)
    if factor > 1:
        assert files.widths[0] == sharded.widths[0] == 24  # 48 / 2: downscaled on load


def test_data_shards_flag_errors_name_the_flag_and_the_image(scenes, tmp_path):
    root = scenes["colmap"]
    with pytest.raises(ValueError, match="--data_shards needs --data_dir"):
        Config(data_shards="x/index.json").validate()
    cfg = Config(data_dir=str(root), data_factor=1, data_shards="nope/index.json")
    with pytest.raises(DataError, match=rf"--data_shards nope/index.json: no shard index at {root}/nope/index.json "
                                        r"\(a relative path is taken under --data_dir"):
        load_scene(cfg)
    # shards lacking one image of the model: every rank names it at load (a lookup, no read)
    (tmp_path / "some").mkdir()
    for p in sorted((root / "images").iterdir())[1:]:
        (tmp_path / "some" / p.name).write_bytes(p.read_bytes())
    pack_shards(tmp_path / "some", tmp_path / "shards")
    gone = sorted((root / "images").iterdir())[0].name
    cfg = Config(data_dir=str(root), data_factor=1, data_shards=str(tmp_path / "shards"))  # a folder: its index.json
    with pytest.raises(DataError, match=rf"1 of the scene's 12 images are not in the shards: '{gone}'"):
        load_scene(cfg)
    # node-local shards may lack other nodes' images: loaded, then the owner names it at setup
    scene = load_scene(Config(data_dir=str(root), data_factor=1, data_shards=str(tmp_path / "shards"),
                              node_local_data=True))
    i = list(scene.names).index(gone)
    assert not scene.images.has(i) and scene.images.has(i + 1)
    with pytest.raises(DataError, match=rf"{gone!r} is not in the shard index"):
        scene.images.read(i)
    check_own_images(scene, [i + 1, i + 2], "node 0")
    with pytest.raises(DataError, match=rf"node 1 lacks 1 of the 2 images its ranks own: the shard index .* "
                                        rf"does not hold '{gone}'"):
        check_own_images(scene, [i, i + 1], "node 1")


def _stage(root: Path, node: int, dest: Path, *extra) -> dict:
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "stage_nodes.py"), "--data_dir", str(root),
                        "--data_factor", "1", "--world_size", "4", "--nproc_per_node", "2", "--seed", "7",
                        "--node", str(node), "--copy-to", str(dest), *extra], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("kind", ["blender", "nerfstudio"])
def test_blender_and_nerfstudio_scenes_stage_per_node_and_load_there(scenes, tmp_path, kind):
    root = scenes[kind]
    full = load_scene(Config(data_dir=str(root), data_factor=1))
    per_node = owned_by_node(full, 4, 2, seed=7)
    for node in (0, 1):
        dest = tmp_path / f"n{node}"
        _stage(root, node, dest)
        own = per_node[node].tolist()
        staged = {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.suffix in (".png", ".jpg")}
        assert staged == {full.names[i] for i in own}  # exactly the node's images, at their paths
        local = load_scene(Config(data_dir=str(dest), data_factor=1, node_local_data=True))  # the trainer's load
        _same_scene_cameras(full, local)
        check_own_images(local, own, f"node {node}")
        other = per_node[1 - node][0]
        with pytest.raises(DataError, match=rf"node {node} lacks 1 of the 2 image files its ranks own: .*"
                                            rf"{full.names[other]}"):
            check_own_images(local, [own[0], other], f"node {node}")
    if kind == "nerfstudio":  # the PLY of initial points travels with the model
        assert (tmp_path / "n0" / "sparse_pc.ply").is_file() and len(local.points) == len(full.points)


def _same_scene_cameras(a, b) -> None:
    assert list(a.names) == list(b.names)
    for key in ("camtoworlds", "Ks", "widths", "heights", "train", "test"):
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key))


def test_blender_shards_stage_per_node(scenes, tmp_path):
    root = scenes["blender"]
    index = pack_shards(root, tmp_path / "shards", shard_size_mb=0.01)
    full = load_scene_dir(root, 1, shards=index)
    per_node = owned_by_node(full, 4, 2, seed=7)
    out = _stage(root, 1, tmp_path / "n1", "--shards", str(index))
    assert out["data_shards"] == "shards/index.json"  # shards outside --data_dir: beside the model
    local = load_scene_dir(tmp_path / "n1", 1, check=False, shards=tmp_path / "n1" / "shards" / "index.json")
    _same_scene_cameras(full, local)
    own = per_node[1].tolist()
    assert sorted(local.images.absent(range(full.num_cameras))) == per_node[0].tolist()
    check_own_images(local, own, "node 1")
    for i in own:
        np.testing.assert_array_equal(_pixels(local, i), _pixels(full, i))


def test_a_rank_reads_only_its_own_images_from_shards(scenes, tmp_path, monkeypatch):
    """The trainer's data path from shards (load_scene, check_own_images, the rank's cache
    filled): the images whose bytes it touches are its own, plus one per COLMAP camera that
    the loader reads for the image size. From the folder every rank checks every image."""
    root = scenes["colmap"]
    pack_shards(root / "images", tmp_path / "shards")
    touched = []
    for cls in (TarShardSource, FolderSource):
        for name in ("peek", "read"):
            orig = getattr(cls, name)
            monkeypatch.setattr(cls, name, lambda self, i, *a, _orig=orig: touched.append(int(i)) or _orig(self, i, *a))
    for flags in ({"data_shards": str(tmp_path / "shards")}, {}):  # a folder: its index.json
        touched.clear()
        cfg = Config(data_dir=str(root), data_factor=1, seed=3, **flags)
        scene = load_scene(cfg)
        at_load = set(touched)
        own = owned_by_rank(scene, 3, seed=3)[1].tolist()
        if checks_own_images(cfg):
            check_own_images(scene, own, "rank 1")
        cache = ImageCache(scene.images, scene.specs(), own, mode="compressed")
        out = np.zeros(scene.spec(own[0]).shape, np.uint8)
        for i in own:
            cache.read_into(i, out)
        if flags:
            assert len(at_load) == 1  # one COLMAP camera: one image for its size
            assert set(touched) == set(own) | at_load  # every own image checked and read, no other
        else:
            assert at_load == set(range(scene.num_cameras))


def test_a_camera_per_image_capture_loads_on_a_node_holding_its_images_only(tmp_path):
    """COLMAP without single_camera gives every image its own camera (same sensor): a node
    holds images of only some of them. The loader reads one image per camera SIZE, so the
    node's scene is the full one; its own images are then checked (check_own_images)."""
    from distsplat.data import colmap_io
    from distsplat.train.node_data import files_of

    root = make_colmap_dataset(tmp_path / "full", num_cameras=10, width=40, height=30, factors=(2,))
    model = colmap_io.read_model(root / "sparse" / "0")
    cam = model.cameras[1]
    model.cameras = {i: colmap_io.Camera(i, cam.model, cam.width, cam.height, cam.params) for i in model.images}
    for i, im in model.images.items():
        im.camera_id = i
    colmap_io.write_model_bin(model, root / "sparse" / "0")
    cfg = dict(data_factor=2, seed=1)
    full = load_scene(Config(data_dir=str(root), **cfg))
    own = owned_by_node(full, 4, 2, seed=1)[1].tolist()
    node = tmp_path / "node1"
    (node / "images_2").mkdir(parents=True)
    (node / "sparse").symlink_to(root / "sparse")
    for f in files_of(full, own):
        (node / "images_2" / Path(f).name).write_bytes(Path(f).read_bytes())
    local = load_scene(Config(data_dir=str(node), node_local_data=True, **cfg))
    _same_scene_cameras(full, local)
    check_own_images(local, own, "node 1")
