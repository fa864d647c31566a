"""Node-local staging (train/node_data.py, scripts/stage_nodes.py): each node gets exactly
the images its ranks own, as files or re-packed shards, and a missing one is named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from distsplat.data import DataError, TarShardSource, load_colmap, pack_shards
from distsplat.train.node_data import check_own_images, owned_by_node, owned_by_rank

from .data_helpers import make_colmap_dataset

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    root = make_colmap_dataset(tmp_path_factory.mktemp("cap") / "d", num_cameras=21, width=32, height=24, factors=())
    pack_shards(root / "images", root / "shards", shard_size_mb=0.005)
    return root


def test_ranks_and_nodes_partition_the_images(capture):
    scene = load_colmap(capture)
    ranks = owned_by_rank(scene, 6, seed=3)
    every = np.sort(np.concatenate(ranks))
    np.testing.assert_array_equal(every, np.arange(scene.num_cameras))  # each image on exactly one rank
    nodes = owned_by_node(scene, 6, 3, seed=3)
    np.testing.assert_array_equal(nodes[1], np.sort(np.concatenate(ranks[3:])))
    with pytest.raises(ValueError, match="nproc_per_node 4 must divide the world size 6"):
        owned_by_node(scene, 6, 4, seed=3)


def test_a_missing_own_image_is_named_and_others_do_not_matter(capture, tmp_path):
    scene = load_colmap(capture)
    own = owned_by_rank(scene, 2, seed=0)
    check_own_images(scene, own[0].tolist(), "node 0")
    gone = Path(scene.images.paths[own[1][0]])
    moved = tmp_path / gone.name
    gone.rename(moved)
    try:
        check_own_images(scene, own[0].tolist(), "node 0")  # rank 1's image: not rank 0's business
        with pytest.raises(DataError, match=rf"node 1 lacks 1 of the {len(own[1])} image files its ranks own: .*{gone.name}"):
            check_own_images(scene, own[1].tolist(), "node 1")
    finally:
        moved.rename(gone)


def test_staged_shards_hold_each_node_s_images_once(capture, tmp_path):
    full = TarShardSource(capture / "shards" / "index.json")
    by_name = {n: full.read(i) for i, n in enumerate(full.names)}
    staged = []
    for node in (0, 1):
        dest = tmp_path / f"n{node}"
        subprocess.run([sys.executable, str(ROOT / "scripts" / "stage_nodes.py"), "--data_dir", str(capture),
                        "--world_size", "4", "--nproc_per_node", "2", "--seed", "5", "--shards",
                        str(capture / "shards" / "index.json"), "--node", str(node), "--copy-to", str(dest)],
                       check=True, capture_output=True)
        src = TarShardSource(dest / "shards" / "index.json")
        assert all(src.read(i) == by_name[n] for i, n in enumerate(src.names))
        staged.append(set(src.names))
    scene = load_colmap(capture)
    expect = [{scene.names[i] for i in idx} for idx in owned_by_node(scene, 4, 2, seed=5)]
    assert staged == expect and not staged[0] & staged[1] and staged[0] | staged[1] == set(by_name)
