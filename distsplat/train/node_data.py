"""Which images each node reads, for clusters without a shared file system.

Camera ownership is fixed for the run (docs/design.md): training cameras by the shared-seed
`CameraBatcher` permutation, test cameras by `test_owners` chunks, both functions of the
scene's split, the seed and W only. torchrun gives node n the global ranks
[n * nproc_per_node, (n + 1) * nproc_per_node), so the images a node needs are known before
training: `scripts/stage_nodes.py` lists or copies exactly them, and `check_own_images`
verifies at setup that a rank has every image it owns (--node_local_data), naming the
missing ones instead of failing on the first read mid-training.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from ..data import DataError, Scene
from ..data.decode import check_images
from ..data.shards import ABSENT, TarShardSource
from ..data.sources import FolderSource
from ..distributed import CameraBatcher
from .scoring.evaluate import test_owners

LISTED = 10  # missing images named in an error; the rest are counted


def owned_by_rank(scene: Scene, world_size: int, seed: int) -> List[np.ndarray]:
    """Per rank, the scene indices (ascending) of the images it reads: its training cameras
    (the trainer's CameraBatcher) and its test cameras (evaluate.test_owners)."""
    train = np.asarray(scene.train, dtype=np.int64)  # [C_train]
    test = np.asarray(scene.test, dtype=np.int64)  # [C_test]
    batcher = CameraBatcher(len(train), world_size, 1, seed)  # ownership ignores the batch size
    bounds = test_owners(len(test), world_size)
    return [np.sort(np.concatenate([train[batcher.own_cameras(r).numpy()], test[t0:t1]]))
            for r, (t0, t1) in enumerate(bounds)]


def owned_by_node(scene: Scene, world_size: int, nproc_per_node: int, seed: int) -> List[np.ndarray]:
    """Per node (torchrun's --node_rank), the scene indices of the images its ranks read."""
    if nproc_per_node < 1 or world_size % nproc_per_node:
        raise ValueError(f"nproc_per_node {nproc_per_node} must divide the world size {world_size} "
                         "(torchrun starts the same number of ranks on every node)")
    per_rank = owned_by_rank(scene, world_size, seed)
    return [np.sort(np.concatenate(per_rank[n * nproc_per_node:(n + 1) * nproc_per_node]))
            for n in range(world_size // nproc_per_node)]


def files_of(scene: Scene, indices: Sequence[int]) -> List[Path]:
    """The files holding these images: image files, or the tar shards (each once, in order;
    none for an image the index lacks)."""
    source = scene.images
    if isinstance(source, FolderSource):
        return [source.paths[i] for i in indices]
    if isinstance(source, TarShardSource):
        shards = sorted({source.shard_of(i) for i in indices} - {ABSENT})
        return [source.shard_paths[s] for s in shards]
    raise ValueError(f"images of a {type(source).__name__} are not files: nothing to stage")


def check_own_images(scene: Scene, own: Sequence[int], where: str) -> None:
    """DataError unless every image in `own` is present and readable here (in the shard
    index when the images are in shards, its header parses, the JPEG is not cut, its size is
    the one the scene expects), naming the missing ones and the node (`where`)."""
    source = scene.images
    stage = ("Stage them on this node (python scripts/stage_nodes.py ... --node N --copy-to DIR, with this run's "
             "--seed, world size and --nproc_per_node) or put the data on a shared file system")
    if isinstance(source, TarShardSource):
        absent = source.absent(own)
        if absent:
            raise DataError(f"{where} lacks {len(absent)} of the {len(own)} images its ranks own: the shard index "
                            f"{source.index_path} does not hold {listed([repr(scene.names[i]) for i in absent[:LISTED]], len(absent))}. "
                            f"{stage}; with shards, pass --data_shards the index stage_nodes.py --shards wrote")
    if isinstance(source, (FolderSource, TarShardSource)):
        if isinstance(source, FolderSource):  # a listing per folder, not a stat per image
            files, missing = own, [source.paths[i] for i in source.missing(own)]
        else:
            files = files_of(scene, own)
            missing = [p for p in files if not os.path.isfile(p)]
        if missing:
            what = "image files" if isinstance(source, FolderSource) else "tar shards"
            raise DataError(f"{where} lacks {len(missing)} of the {len(files)} {what} its ranks own: "
                            f"{listed([str(p) for p in missing])}. {stage}")
    check_images(source, scene.specs(), own)  # headers, truncation and sizes of exactly what this rank reads


def listed(items: Sequence[str], total: Optional[int] = None) -> str:
    """The first LISTED items, comma-separated, and how many more of `total` (default:
    len(items)) there are (for error messages)."""
    total = len(items) if total is None else total
    more = f" and {total - LISTED} more" if total > LISTED else ""
    return ", ".join(items[:LISTED]) + more


def node_summary(scene: Scene, per_node: Sequence[np.ndarray]) -> List[Dict[str, object]]:
    """Per node: images, files and bytes to stage (for the listing command)."""
    out = []
    for n, idx in enumerate(per_node):
        files = files_of(scene, idx.tolist())
        out.append({"node": n, "images": int(len(idx)), "files": len(files),
                    "bytes": int(sum(os.path.getsize(p) for p in files if os.path.isfile(p)))})
    return out
