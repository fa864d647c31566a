"""What a rank reads at setup: from the image folder, from shared tar shards (--data_shards)
and from its node's staged shards (--data_shards --node_local_data).

Generates bench_million.py's synthetic COLMAP capture of N 64 x 48 JPEGs, packs it
(scripts/pack_shards.py's pack_shards), stages node 0 of a W=2 run of one rank per node
(scripts/stage_nodes.py --shards --copy-to), then, for rank 0 in a fresh process each, runs
the trainer's data setup (scene_setup.load_scene, then node_data.check_own_images where the
trainer calls it) and counts the images whose bytes it touched (header peeks and reads of
the ImageSource) and the seconds. The folder run checks every image on every rank; a shard
run only the rank's own (plus one per COLMAP camera for the image size).

    N=20000 nice -n 10 python benchmarks/studies/many_images/bench_shard_setup.py

Environment: N (20000), WORK (tmp_bench_shard_setup beside the repository checkout). Writes benchmarks/results/shard_setup_<N>.json.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_million beside it

W, SEED = 2, 42


def setup_rank0(args) -> dict:
    """Rank 0's data setup under `flags` (Config fields): seconds and images touched."""
    data_dir, flags = args
    from distsplat.data.sources import FolderSource
    from distsplat.data.shards import TarShardSource
    from distsplat.train.config import Config
    from distsplat.train.node_data import check_own_images, owned_by_rank
    from distsplat.train.scene_setup import checks_own_images, load_scene

    touched = set()
    for cls in (FolderSource, TarShardSource):  # count every image whose bytes are read
        for name in ("peek", "read"):
            orig = getattr(cls, name)

            def wrapped(self, index, *a, _orig=orig):
                touched.add(int(index))
                return _orig(self, index, *a)
            setattr(cls, name, wrapped)
    cfg = Config(data_dir=str(data_dir), data_factor=1, seed=SEED, **flags)
    t = time.perf_counter()
    scene = load_scene(cfg)
    t_load = time.perf_counter() - t
    own = owned_by_rank(scene, W, SEED)[0]
    t = time.perf_counter()
    if checks_own_images(cfg):
        check_own_images(scene, own.tolist(), "node 0, rank 0,")
    t_check = time.perf_counter() - t
    return {"flags": flags, "load_s": t_load, "own_check_s": t_check, "images": scene.num_cameras,
            "own": len(own), "images_touched": len(touched), "touched_not_own": len(touched - set(own.tolist()))}


def main() -> None:
    n = int(os.environ.get("N", "20000"))
    work = Path(os.environ.get("WORK", REPO.parent / "tmp_bench_shard_setup")) / f"n{n}"
    from bench_million import generate

    from distsplat.data.shards import pack_shards

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    result = {"machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                       cwd=REPO).stdout.strip(),
              "command": f"N={n} nice -n 10 python benchmarks/studies/many_images/bench_shard_setup.py", "load_before": os.getloadavg(),
              "W": W, "nproc_per_node": 1}
    try:
        root = work / "capture"
        result["generate"] = generate(root, n)
        pack_shards(root / "images", root / "shards", 256.0)
        t = time.perf_counter()
        subprocess.run([sys.executable, str(REPO / "scripts" / "stage_nodes.py"), "--data_dir", str(root),
                        "--data_factor", "1", "--world_size", str(W), "--nproc_per_node", "1", "--seed", str(SEED),
                        "--shards", "shards/index.json", "--node", "0", "--copy-to", str(work / "node0")],
                       check=True, capture_output=True)
        result["stage_node0_s"] = time.perf_counter() - t
        runs = [(root, {}), (root, {"data_shards": "shards/index.json"}),
                (work / "node0", {"data_shards": "shards/index.json", "node_local_data": True})]
        ctx = mp.get_context("spawn")
        result["runs"] = []
        for data_dir, flags in runs:
            with ctx.Pool(1) as pool:
                result["runs"].append(pool.map(setup_rank0, [(data_dir, flags)])[0])
        result["load_after"] = os.getloadavg()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    from benchmarks.results_index import result_path

    out = result_path(f"shard_setup_{n}", f"cpu{os.cpu_count()}", result["date"])
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(" | ".join(f"{r['flags'] or 'folder'}: load {r['load_s']:.1f} s + own check {r['own_check_s']:.1f} s, "
                     f"{r['images_touched']} images touched ({r['touched_not_own']} not own)" for r in result["runs"]))


if __name__ == "__main__":
    main()
