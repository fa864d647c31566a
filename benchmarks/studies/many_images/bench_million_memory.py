"""Per-rank memory of a million-image capture's setup, everything but the image bytes,
without writing a million images (issue 20; bench_million.py does the full run, ~40 min).

Writes the COLMAP model of N cameras (bench_million.write_model: poses on a sphere, one
PINHOLE camera), ONE real image (the first: load_colmap(check=False) probes one image per
COLMAP camera) and a shard index of N images whose shards are sparse files (no disk used;
their bytes read as zeros). Then, for each rank r of W, in a process of its own (one at a
time: the figures are per rank, not a contention test), the trainer's setup stages with
the resident memory (RSS) each adds: load_colmap(check=False), TarShardSource,
Scene.camera_tensors (the trainer's Ks) and scene_scale, ownership
(node_data.owned_by_rank), the trainer's CameraBatcher, ImageCache(compressed) and its
fill with the rank's blobs (source reads, not decoded: they are zeros). besides_cache_mb =
RSS at the end - RSS before parsing - the blobs' bytes, as in bench_million.py.
gc_full_ms: one full gc.collect() at the end; besides_cache_after_trim_mb: the same after
glibc's malloc_trim (the allocator's free heap taken out; diagnostic only).
What a training step costs at N images is measured on the real trainer: bench_million.py
trains the N-image capture with the CLI (steps/s), and any step can be read by its ranges
(benchmarks/step_ranges.py). The copy of the step's host work this study once timed
(`step_host_us` in million_memory_1000000_cpu2_2026-11-23.json) is no longer run.

    N=1000000 W=2 nice -n 10 python benchmarks/studies/many_images/bench_million_memory.py

Environment: N (1000000), W (2), RANKS (ranks measured, "0"), WORK (tmp_bench_million beside the checkout). Writes
benchmarks/results/million_memory_<N>_<device>_<date>.json; deletes the generated files.
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

import numpy as np

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_million beside it

import bench_million as bm  # noqa: E402

SHARD_IMAGES = 100_000  # images per sparse shard (~280 MB, as pack_shards' 256 MiB shards)
BLOB = 2048  # bytes per image in the index (bench_million's JPEGs are 1.5-2.5 KB)


def write_fake_index(root: Path, n: int) -> None:
    """shards/index.json (format 2) for bench_million's names, sparse shard files."""
    from distsplat.data.shards import INDEX_FORMAT, NAMES_FILE, TABLE_FILE

    out = root / "shards"
    out.mkdir(parents=True)
    names = bm.names_of(n)
    i = np.arange(n, dtype=np.int64)
    table = np.stack([i // SHARD_IMAGES, (i % SHARD_IMAGES) * (BLOB + 512) + 512, np.full(n, BLOB)], 1)
    shards = []
    for s in range(int(table[:, 0].max()) + 1):
        path = out / f"shard-{s:05d}.tar"
        size = SHARD_IMAGES * (BLOB + 512) + 1024
        with open(path, "wb") as fh:
            fh.truncate(size)  # sparse
        shards.append({"file": path.name, "bytes": size})
    (out / NAMES_FILE).write_text("\n".join(names) + "\n", encoding="utf-8")
    np.save(out / TABLE_FILE, table)
    (out / "index.json").write_text(json.dumps({"format": INDEX_FORMAT, "shards": shards, "count": n,
                                                "names": NAMES_FILE, "table": TABLE_FILE}))


def rank_worker(args) -> dict:
    root, rank, W = args
    os.environ["LOCAL_WORLD_SIZE"] = str(W)
    import gc
    import resource

    import torch  # noqa: F401  (the trainer's imports are in every rank's baseline)

    from distsplat.data import ImageCache, TarShardSource, load_colmap
    from distsplat.data.heap import trim_heap
    from distsplat.distributed import CameraBatcher
    from distsplat.train.node_data import owned_by_rank
    from distsplat.train.scene_setup import scene_scale

    gc.collect()
    base = bm.rss_mb()
    out = {"rank": rank, "rss_base_mb": base, "stages": []}

    def stage(name, t0):
        gc.collect()
        out["stages"].append({"stage": name, "s": time.perf_counter() - t0, "rss_mb": bm.rss_mb(),
                              "added_mb": bm.rss_mb() - (out["stages"][-1]["rss_mb"] if out["stages"] else base)})

    t = time.perf_counter()
    scene = load_colmap(root, check=False)
    stage("load_colmap", t)
    t = time.perf_counter()
    source = TarShardSource(root / "shards" / "index.json", names=scene.names)
    scene.images = source
    stage("TarShardSource", t)
    t = time.perf_counter()
    cams = scene.camera_tensors()
    scene_scale(scene)
    stage("camera_tensors", t)
    t = time.perf_counter()
    own = owned_by_rank(scene, W, bm.SEED)[rank]
    batcher = CameraBatcher(len(scene.train), W, 1, bm.SEED)
    batcher.batch(0, 0)  # the epoch's orders, as the first training step makes them
    stage("ownership", t)
    t = time.perf_counter()
    cache = ImageCache(source, scene.specs(), own.tolist(), mode="compressed", rank=rank)
    trim_heap()  # as the trainer does after building its cache (N >= heap.TRIM_FROM)
    stage("cache_init", t)
    t = time.perf_counter()
    for k, c in enumerate(own.tolist()):  # read_into's compressed path without the decode (zeros)
        cache._store(k, c)
    stage("cache_fill", t)
    # A full garbage collection traverses every container the rank holds (a Python list per
    # camera would be walked element by element, each time the trainer's gen-2 collection runs).
    t = time.perf_counter()
    gc.collect()
    out["gc_full_ms"] = (time.perf_counter() - t) * 1e3
    out.update(own=len(own), cache_bytes=cache.nbytes(), cache_mb=cache.nbytes() / 2**20,
               peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               besides_cache_mb=bm.rss_mb() - base - cache.nbytes() / 2**20,
               python_objects=len(gc.get_objects()),
               # what the camera tensors hold of their own: Ks/sizes shared by every camera ~0 (the
               # viewmats are no tensor of the rank's: Scene.viewmats inverts each batch's poses)
               camera_tensor_mb={k: v.untyped_storage().nbytes() / 2**20 for k, v in cams.items()},
               scene_poses_mb=scene.camtoworlds.nbytes / 2**20, scene_poses=type(scene.camtoworlds).__name__)
    # What of besides_cache_mb is free heap the allocator keeps (a diagnostic: the trainer does
    # not trim after setup; load_colmap does after its parse)
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)
    out["besides_cache_after_trim_mb"] = bm.rss_mb() - base - cache.nbytes() / 2**20
    return out


def main() -> None:
    n = int(os.environ.get("N", "1000000"))
    W = int(os.environ.get("W", "2"))
    ranks = [int(r) for r in os.environ.get("RANKS", "0").split(",")]
    work = Path(os.environ.get("WORK", REPO.parent / "tmp_bench_million")) / f"mem{n}"
    if work.exists():
        shutil.rmtree(work)
    result = {"benchmark": "bench_million_memory", "N": n, "W": W,
              "command": f"N={n} W={W} RANKS={','.join(map(str, ranks))} nice -n 10 python benchmarks/studies/many_images/bench_million_memory.py",
              "machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                       cwd=REPO).stdout.strip(),
              "load_before": os.getloadavg(), "goal_besides_cache_mb": 200}
    try:
        t = time.perf_counter()
        bm.write_model(work, n)
        first = work / "images" / bm.names_of(1)[0]
        first.parent.mkdir(parents=True)
        first.write_bytes(bm.jpeg_pool()[0])
        write_fake_index(work, n)
        result["write_s"] = time.perf_counter() - t
        result["ranks"] = []
        ctx = mp.get_context("spawn")
        for r in ranks:
            with ctx.Pool(1) as pool:
                result["ranks"].append(pool.apply(rank_worker, ((work, r, W),)))
            print(json.dumps(result["ranks"][-1]), flush=True)
        result["load_after"] = os.getloadavg()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        from benchmarks.results_index import result_path

        out = result_path(f"million_memory_{n}", f"cpu{os.cpu_count()}", result["date"])
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"bench_million_memory N={n}: -> {out}")


if __name__ == "__main__":
    main()
