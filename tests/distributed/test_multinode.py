"""Several nodes, simulated on one machine: two torchrun agents (`--nnodes 2 --node_rank
0|1 --nproc_per_node 2`, a static rendezvous on 127.0.0.1) run the real CLI as one W=4 job.
The result must be the one of a single-node W=4 run, and what is per node (LOCAL_RANK,
LOCAL_WORLD_SIZE: the device, the memory budgets) must be taken per node."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from torchrun_cli import TINY_FLAGS, torchrun, torchrun_nodes

STEPS = 30
# Densification runs too (a refine at steps 10 and 20), so the counts of Gaussians per rank
# and the rebalancing that follows must agree across the two launches as well.
FLAGS = ["default", "--max_steps", str(STEPS), "--eval_steps", str(STEPS), "--save_steps", str(STEPS),
         "--log_every", "10", *TINY_FLAGS, "--strategy.refine_start_iter", "10", "--strategy.refine_every", "10"]


def _shards(out: Path) -> list:
    ck = out / "ckpts" / f"step_{STEPS:06d}"
    meta = json.loads((ck / "meta.json").read_text())
    return [torch.load(ck / s["file"], weights_only=True)["params"] for s in meta["shards"]]


@pytest.mark.numerics
@pytest.mark.slow
def test_two_nodes_of_two_ranks_equal_one_node_of_four(tmp_path):
    one = torchrun([*FLAGS, "--result_dir", str(tmp_path / "one")], nproc=4)
    assert one.returncode == 0, one.stderr[-3000:]
    nodes = torchrun_nodes([*FLAGS, "--result_dir", str(tmp_path / "two")], nnodes=2, nproc=2)
    for n, p in enumerate(nodes):
        assert p.returncode == 0, f"node {n}:\n{p.stderr[-3000:]}"
    # Per-node budgets: rank 0 logs its memory limit as the node's RAM over its local ranks.
    assert "/ 4 local rank(s)" in one.stderr
    assert "/ 2 local rank(s)" in nodes[0].stderr
    # Same W, same global rank of every process (node_rank * 2 + local_rank), same global
    # batches and the same gloo algorithms: the same floating-point operations in the same
    # order, so the results are bitwise equal; where a rank took its budget, its device or
    # its rank from the wrong variable, a shard would differ or be missing.
    a, b = _shards(tmp_path / "one"), _shards(tmp_path / "two")
    assert len(a) == len(b) == 4
    for r, (pa, pb) in enumerate(zip(a, b)):
        assert pa.keys() == pb.keys()
        for k in pa:
            assert torch.equal(pa[k], pb[k]), f"rank {r}: {k} differs"
    va = json.loads((tmp_path / "one" / "stats" / f"val_step{STEPS:04d}.json").read_text())
    vb = json.loads((tmp_path / "two" / "stats" / f"val_step{STEPS:04d}.json").read_text())
    assert (va["psnr"], va["ssim"], va["num_GS"]) == (vb["psnr"], vb["ssim"], vb["num_GS"])
    ply = f"point_cloud_{STEPS:04d}.ply"
    assert (tmp_path / "one" / "ply" / ply).read_bytes() == (tmp_path / "two" / "ply" / ply).read_bytes()
    for r in range(4):  # every rank of both nodes wrote its stats into the one result dir
        assert (tmp_path / "two" / "stats" / f"train_step{STEPS:04d}_rank{r}.json").is_file()


def test_a_relative_result_dir_from_different_working_directories_stops_before_training(tmp_path):
    """Each "node" runs in its own working directory with the relative --result_dir run:
    two folders. Every rank must stop at setup with one message naming both paths, and
    leave nothing behind (no marker, no dir)."""
    cwds = [tmp_path / "node0", tmp_path / "node1"]
    for d in cwds:
        d.mkdir()
    nodes = torchrun_nodes(["default", "--max_steps", "5", "--result_dir", "run", *TINY_FLAGS], cwds=cwds,
                           extra_env={"DISTSPLAT_SHARED_DIR_WAIT_S": "1"})
    for n, p in enumerate(nodes):
        assert p.returncode != 0, f"node {n} trained on a result dir the nodes do not share"
        assert re.search(rf"distsplat: error: --result_dir is not the same folder on every rank: ranks 0, 1 on node 0 "
                         rf"\(host [^)]+\): {re.escape(str(cwds[0] / 'run'))} \(typed run\); ranks 2, 3 on node 1 "
                         rf"\(host [^)]+\): {re.escape(str(cwds[1] / 'run'))} \(typed run\)\. ", p.stderr), p.stderr[-3000:]
        assert "step 1/" not in p.stderr  # stopped before training
    assert [list(d.iterdir()) for d in cwds] == [[], []]


def test_nodes_given_different_result_dirs_stop_before_training(tmp_path):
    """Issue 36: a launch script builds --result_dir per node (x-a, x-b; neither exists).
    The marker of the shared-dir check landed in their common parent, both nodes saw it,
    and the run crashed at its first save; now every rank stops at setup naming both
    paths, and nothing is written (no marker in the parent, neither folder)."""
    a, b = tmp_path / "x-a", tmp_path / "x-b"
    nodes = torchrun_nodes(["default", "--max_steps", "40", "--save_steps", "40", *TINY_FLAGS],
                           node_args=[["--result_dir", str(a)], ["--result_dir", str(b)]])
    messages = set()
    for n, p in enumerate(nodes):
        assert p.returncode != 0, f"node {n} trained on two result dirs\n{p.stderr[-3000:]}"
        line = next((x for x in p.stderr.splitlines() if x.startswith("distsplat: error: --result_dir")), "")
        assert re.fullmatch(rf"distsplat: error: --result_dir is not the same folder on every rank: ranks 0, 1 on "
                            rf"node 0 \(host [^)]+\): {re.escape(str(a))}; ranks 2, 3 on node 1 \(host [^)]+\): "
                            rf"{re.escape(str(b))}\. Every rank writes .*", line), p.stderr[-3000:]
        messages.add(line)
        assert "step 1/" not in p.stderr  # stopped before training
    assert len(messages) == 1  # the same words from both nodes
    assert list(tmp_path.iterdir()) == []


def _mount_namespaces() -> str:
    """'' when this process may give a child its own mount of a folder, else why not."""
    import shutil
    import subprocess
    import tempfile

    if shutil.which("unshare") is None:
        return "no unshare(1)"
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.run(["unshare", "--mount", "--propagation", "private", "mount", "-t", "tmpfs", "tmpfs", d],
                           capture_output=True, text=True)
    return "" if p.returncode == 0 else f"cannot mount in a new mount namespace: {p.stderr.strip()[:200]}"


@pytest.mark.skipif(bool(_mount_namespaces()), reason=_mount_namespaces() or "-")
def test_node_local_storage_at_the_same_path_stops_before_training(tmp_path):
    """The same command on both nodes, but node 1 has its own (empty) file system mounted at
    the result dir's parent, as a node-local disk would be: the paths agree, the marker
    rank 0 writes is not seen by node 1's ranks, and every rank stops at setup."""
    local = tmp_path / "local"
    local.mkdir()
    own_mount = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                 f'mount -t tmpfs -o size=1m tmpfs "{local}" && exec "$@"', "sh"]
    nodes = torchrun_nodes(["default", "--max_steps", "5", "--result_dir", str(local / "run"), *TINY_FLAGS],
                           extra_env={"DISTSPLAT_SHARED_DIR_WAIT_S": "1"}, prefixes=[[], own_mount])
    for n, p in enumerate(nodes):
        assert p.returncode != 0, f"node {n} trained on a result dir the nodes do not share"
        assert f"--result_dir {local / 'run'} is not shared by every node" in p.stderr, p.stderr[-3000:]
        assert "ranks 2, 3 on node 1 (host " in p.stderr and f"looked in {local}" in p.stderr
        assert "step 1/" not in p.stderr
    assert list(local.iterdir()) == []  # the marker removed, nothing created


def _stage(full: Path, node: int, dest: Path) -> set:
    """scripts/stage_nodes.py --copy-to for `node` of a W=4 run on 2 nodes; the names copied."""
    import subprocess
    import sys

    from torchrun_cli import REPO

    p = subprocess.run([sys.executable, str(REPO / "scripts" / "stage_nodes.py"), "--data_dir", str(full),
                        "--world_size", "4", "--nproc_per_node", "2", "--seed", "42", "--node", str(node),
                        "--copy-to", str(dest)], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0, p.stderr
    return {f.name for f in (dest / "images").iterdir()}


STAGED = ["default", "--max_steps", "6", "--eval_steps", "6", "--save_steps", "6", "--data_dir", "scene",
          "--node_local_data", "--sh_degree", "1", "--num_workers", "1", "--prefetch", "1", "--disable_viewer",
          "--init_num_pts", "200"]


@pytest.mark.slow
def test_nodes_train_on_their_staged_images_only_and_name_a_missing_one(tmp_path):
    """Each node gets only the images stage_nodes.py lists for it. Training reads every
    image its ranks own (all train cameras within 6 steps: 12 cameras, 4 ranks, batch 1
    per rank), so a wrongly staged set fails the run; a removed image is named at setup."""
    import sys

    sys.path.append(str(Path(__file__).resolve().parents[1] / "unit"))  # appended: its scenes.py must not shadow ours
    from data_helpers import make_colmap_dataset

    full = make_colmap_dataset(tmp_path / "full", num_cameras=14, width=32, height=24, factors=())
    cwds = [tmp_path / "node0", tmp_path / "node1"]
    staged = [_stage(full, n, cwds[n] / "scene") for n in (0, 1)]
    every = {f.name for f in (full / "images").iterdir()}
    assert staged[0] | staged[1] == every and not staged[0] & staged[1]  # each image on one node
    assert {len(s) for s in staged} <= {6, 7, 8}  # 14 images over 2 nodes, near halves
    out = tmp_path / "run"
    nodes = torchrun_nodes([*STAGED, "--result_dir", str(out)], cwds=cwds)
    for n, p in enumerate(nodes):
        assert p.returncode == 0, f"node {n}:\n{p.stderr[-3000:]}"
    assert (out / "stats" / "val_step0006.json").is_file()

    gone = sorted(staged[1])[0]
    (cwds[1] / "scene" / "images" / gone).unlink()
    nodes = torchrun_nodes([*STAGED, "--result_dir", str(tmp_path / "run2")], cwds=cwds)
    assert all(p.returncode != 0 for p in nodes)
    err = nodes[0].stderr
    assert "node 1 (host " in err and "lacks 1 of the " in err and gone in err, err[-3000:]
