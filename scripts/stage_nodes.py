"""Lists or copies exactly the images (or tar shards) each node of a multi-node run reads,
so a cluster without a shared file system stages ~1/nodes of a capture on each node's disk.

Ownership is fixed for the run by the scene's train/test split, --seed and the world size
(distsplat/train/node_data.py); torchrun puts ranks [n*P, (n+1)*P) on node n. The scene is
read as the trainer reads it (COLMAP, Blender or nerfstudio: train/scene_setup.py). Pass
the same values as the training run:

    # what each node needs (one JSON line per node: images, files, bytes)
    python scripts/stage_nodes.py --data_dir data/garden --data_factor 4 --world_size 8 --nproc_per_node 4
    # the files of node 1, one path a line
    python scripts/stage_nodes.py --data_dir data/garden --data_factor 4 --world_size 8 --nproc_per_node 4 --node 1 --list
    # a complete scene folder for node 1 (model, split files, its images), then train with it
    python scripts/stage_nodes.py ... --node 1 --copy-to /local/garden
    torchrun --nnodes 2 --node_rank 1 --nproc_per_node 4 ... examples/simple_trainer.py default \\
        --data_dir /local/garden --data_factor 4 --node_local_data ...

--shards OUT/index.json (as the trainer's --data_shards: relative to --data_dir when
relative) stages tar shards (scripts/pack_shards.py) instead of image files: listed, the
shards holding each node's images (with random ownership, usually all of them); copied, the
node's images re-packed into shards of their own, at the same path under --copy-to as the
index under --data_dir (else DIR/shards/), so the node trains with the same --data_shards
and --node_local_data.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from distsplat.data.shards import write_shards  # noqa: E402
from distsplat.train.node_data import files_of, node_summary, owned_by_node  # noqa: E402
from distsplat.train.scene_setup import check_all_indexed, load_scene_dir, shard_index  # noqa: E402


def model_files(data_dir: Path, kind: str) -> list:
    """What a node needs besides its images, relative to `data_dir`: the files the scene's
    loader reads (distsplat/data/colmap.py, blender.py, nerfstudio.py)."""
    if kind == "colmap":
        return ["sparse", "train.txt", "test.txt"]
    if kind == "blender":
        return ["transforms_train.json", "transforms_test.json"]
    meta = json.loads((data_dir / "transforms.json").read_text())  # nerfstudio: its points' PLY too
    return ["transforms.json"] + ([str(meta["ply_file_path"])] if "ply_file_path" in meta else [])


def copy_scene(data_dir: Path, kind: str, files, dest: Path) -> int:
    """The model files of a `kind` scene and `files` under `dest`, at the same relative
    paths as under `data_dir`. Returns the bytes copied."""
    total = 0
    for rel in model_files(data_dir, kind):
        src = data_dir / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel, dirs_exist_ok=True)
        elif src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    for f in files:
        target = dest / Path(f).resolve().relative_to(data_dir.resolve())
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
        total += os.path.getsize(target)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data_dir", type=Path, required=True,
                    help="the COLMAP, Blender or nerfstudio scene (as the trainer's --data_dir)")
    ap.add_argument("--data_factor", type=int, default=1, help="as the trainer's --data_factor")
    ap.add_argument("--test_every", type=int, default=8, help="as the trainer's --test_every")
    ap.add_argument("--seed", type=int, default=42, help="as the trainer's --seed (default 42, the trainer's)")
    ap.add_argument("--world_size", type=int, required=True, help="W: nnodes x nproc_per_node")
    ap.add_argument("--nproc_per_node", type=int, required=True, help="ranks per node (torchrun --nproc_per_node)")
    ap.add_argument("--shards", "--data_shards", dest="shards",
                    help="a shard index.json (as the trainer's --data_shards): stage tar shards instead of image files")
    ap.add_argument("--shard-size-mb", dest="shard_size_mb", type=float, default=256.0,
                    help="with --shards --copy-to: largest re-packed shard in MiB (default 256)")
    ap.add_argument("--node", type=int, help="only this node (torchrun --node_rank)")
    ap.add_argument("--list", action="store_true", help="print the node's files, one a line (needs --node)")
    ap.add_argument("--copy-to", type=Path, help="copy the node's scene into this folder (needs --node)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if (args.list or args.copy_to) and args.node is None:
        ap.error("--list and --copy-to need --node")
    try:
        shards = shard_index(args.data_dir, args.shards)
        # check=False: one image per camera is read (the sizes); staging reads the rest
        scene = load_scene_dir(args.data_dir, args.data_factor, test_every=args.test_every, check=False, shards=shards)
        if shards is not None:
            check_all_indexed(scene)
        per_node = owned_by_node(scene, args.world_size, args.nproc_per_node, args.seed)
    except ValueError as e:  # DataError is one
        sys.exit(f"stage_nodes: {e}")
    if args.node is not None and not 0 <= args.node < len(per_node):
        ap.error(f"--node {args.node}: the run has nodes 0..{len(per_node) - 1}")
    nodes = range(len(per_node)) if args.node is None else [args.node]
    if args.list:
        for f in files_of(scene, per_node[args.node].tolist()):
            print(f)
    elif args.copy_to and args.shards is not None:
        # Ownership is a random permutation, so every shard holds some of every node's images:
        # the node's images are re-packed into shards of their own (1/nodes of the data).
        own = sorted(per_node[args.node].tolist(), key=lambda i: scene.names[i])
        try:
            rel = shards.resolve().parent.relative_to(args.data_dir.resolve())
        except ValueError:  # shards outside the scene folder: beside the model on the node
            rel = Path("shards")
        copy_scene(args.data_dir, scene.kind, [], args.copy_to)
        index = write_shards([scene.names[i] for i in own], lambda k: scene.images.read(own[k]),
                             args.copy_to / rel, args.shard_size_mb)
        nbytes = sum(p.stat().st_size for p in index.parent.iterdir())
        print(json.dumps({"node": args.node, "images": len(own), "bytes": nbytes, "index": str(index),
                          "data_shards": str(rel / "index.json")}))
    elif args.copy_to:
        files = files_of(scene, per_node[args.node].tolist())
        nbytes = copy_scene(args.data_dir, scene.kind, files, args.copy_to)
        print(json.dumps({"node": args.node, "files": len(files), "bytes": nbytes, "to": str(args.copy_to)}))
    else:
        summary = node_summary(scene, per_node)
        for n in nodes:
            print(json.dumps(summary[n]))


if __name__ == "__main__":
    main()
