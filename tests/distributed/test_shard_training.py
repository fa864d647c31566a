"""Training from tar shards through the CLI (--data_shards), on shared storage and staged per
node (scripts/stage_nodes.py --shards --copy-to, --node_local_data).

The reference is a W=2 run on the COLMAP capture's image folder. The shards hold the same
JPEG bytes (scripts/pack_shards.py packs the files as they are), the decoder gets the same
bytes, and the ranks run the same floating-point operations in the same order: the result
must be bitwise the same, not close. "Two nodes" are two torchrun agents of one rank each
(`--nnodes 2 --nproc_per_node 1`, the two-agent machinery of test_multinode.py), each in a
working directory of its own holding only its node's staged shards, so a rank that read an
image of the other node would fail; global ranks, and so ownership, are those of the
single-node W=2 run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchrun_cli import REPO, torchrun, torchrun_nodes

STEPS = 6
# 14 cameras: 12 train (6 per rank, batch 1: every own image is read within 6 steps), 2 test
FLAGS = ["default", "--max_steps", str(STEPS), "--eval_steps", str(STEPS), "--save_steps", str(STEPS),
         "--data_factor", "2", "--sh_degree", "1", "--num_workers", "1", "--prefetch", "1", "--disable_viewer",
         "--init_num_pts", "200", "--log_every", "2"]


def _params(out: Path) -> list:
    ck = out / "ckpts" / f"step_{STEPS:06d}"
    meta = json.loads((ck / "meta.json").read_text())
    return [torch.load(ck / s["file"], weights_only=True)["params"] for s in meta["shards"]]


def _val(out: Path) -> dict:
    return json.loads((out / "stats" / f"val_step{STEPS:04d}.json").read_text())


def _assert_same_result(a: Path, b: Path) -> None:
    pa, pb = _params(a), _params(b)
    assert len(pa) == len(pb) == 2
    for r, (x, y) in enumerate(zip(pa, pb)):
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k], y[k]), f"rank {r}: {k} differs"
    va, vb = _val(a), _val(b)
    assert (va["psnr"], va["ssim"], va["num_GS"]) == (vb["psnr"], vb["ssim"], vb["num_GS"])


def _script(name: str, *args) -> str:
    p = subprocess.run([sys.executable, str(REPO / "scripts" / name), *map(str, args)],
                       capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    """(the capture with its image folders, the model alone with shards of images_2/ beside
    it, the folder run's result dir)."""
    sys.path.append(str(Path(__file__).resolve().parents[1] / "unit"))  # appended: its scenes.py must not shadow ours
    from data_helpers import make_colmap_dataset

    tmp = tmp_path_factory.mktemp("shard_training")
    full = make_colmap_dataset(tmp / "full", num_cameras=14, width=64, height=48, factors=(2,))
    packed = tmp / "packed"  # no image folder at all: the run can only read the shards
    shutil.copytree(full / "sparse", packed / "sparse")
    _script("pack_shards.py", full / "images_2", packed / "shards", "--shard-size-mb", "0.01")
    assert len(list((packed / "shards").glob("shard-*.tar"))) >= 3  # several shards, mixed owners
    ref = torchrun([*FLAGS, "--data_dir", str(full), "--result_dir", str(tmp / "folder")])
    assert ref.returncode == 0, ref.stderr[-3000:]
    return full, packed, tmp / "folder"


@pytest.mark.slow
def test_training_from_shards_equals_training_from_the_image_folder(capture, tmp_path):
    _, packed, folder_run = capture
    # a relative --data_shards is under --data_dir
    p = torchrun([*FLAGS, "--data_dir", str(packed), "--data_shards", "shards/index.json",
                  "--result_dir", str(tmp_path / "run")])
    assert p.returncode == 0, p.stderr[-3000:]
    _assert_same_result(folder_run, tmp_path / "run")


def _stage(packed: Path, cwds) -> list:
    """scripts/stage_nodes.py --shards --copy-to for both nodes of a W=2 run (one rank each):
    cwds[n]/scene; the number of images staged per node."""
    staged = []
    for n in (0, 1):
        out = _script("stage_nodes.py", "--data_dir", packed, "--data_factor", "2", "--world_size", "2",
                      "--nproc_per_node", "1", "--node", n, "--shards", "shards/index.json",
                      "--copy-to", cwds[n] / "scene")
        assert json.loads(out)["data_shards"] == "shards/index.json"  # the same flag on every node
        staged.append(json.loads(out)["images"])
    return staged


NODE_FLAGS = [*FLAGS, "--data_dir", "scene", "--data_shards", "shards/index.json", "--node_local_data"]


@pytest.mark.slow
def test_nodes_train_on_their_staged_shards_as_on_shared_storage(capture, tmp_path):
    _, packed, folder_run = capture
    cwds = [tmp_path / "node0", tmp_path / "node1"]
    staged = _stage(packed, cwds)
    assert sum(staged) == 14 and min(staged) >= 6  # each image on one node, near halves
    nodes = torchrun_nodes([*NODE_FLAGS, "--result_dir", str(tmp_path / "run")], nproc=1, cwds=cwds)
    for n, p in enumerate(nodes):
        assert p.returncode == 0, f"node {n}:\n{p.stderr[-3000:]}"
    _assert_same_result(folder_run, tmp_path / "run")


@pytest.mark.slow
def test_a_node_whose_shards_lack_an_image_stops_at_setup_naming_it(capture, tmp_path):
    from distsplat.data import TarShardSource
    from distsplat.data.shards import write_shards

    _, packed, _ = capture
    cwds = [tmp_path / "node0", tmp_path / "node1"]
    _stage(packed, cwds)
    # node 1's shards re-packed without one of its images
    index = cwds[1] / "scene" / "shards" / "index.json"
    src = TarShardSource(index)
    data = {n: src.read(i) for i, n in enumerate(src.names)}
    src.close()
    gone, kept = src.names[0], list(src.names)[1:]
    shutil.rmtree(index.parent)
    write_shards(kept, lambda k: data[kept[k]], index.parent)
    nodes = torchrun_nodes([*NODE_FLAGS, "--result_dir", str(tmp_path / "run")], nproc=1, cwds=cwds)
    assert all(p.returncode != 0 for p in nodes)
    err = nodes[0].stderr
    assert "node 1 (host " in err and "lacks 1 of the " in err and repr(gone) in err, err[-3000:]
    assert "step 1/" not in err  # stopped before training
