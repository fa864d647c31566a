"""A million-image capture: does the data path scale with the number of images?

Generates a synthetic COLMAP capture of N small JPEGs (64 x 48, 1000 per sub-folder, a
pool of distinct JPEG bodies, poses on a sphere; never committed, deleted at the end), packs
it with distsplat's tar shards and with plain `tar`, then measures at each world size W in
$WS, with W rank processes at once (as torchrun would start them on one node):

- parse: load_colmap(check=False) (the trainer's --node_local_data path: one image per
  COLMAP camera is touched, not N) and the shard index (TarShardSource), seconds and the
  resident memory (RSS) each adds to a rank;
- ownership: the rank's own cameras (node_data.owned_by_rank, the trainer's rule), RSS;
- check: the trainer's up-front check of the rank's own images (node_data.check_own_images:
  present, header, not cut, size), seconds;
- cache: ImageCache of the rank's own images set up, then (FILL=1) filled with its whole
  share; its bytes against dataset / W (goal <= 1.1) and what the rank holds besides the
  cache (goal <= 200 MB);
- start: the time from launching the CLI (torchrun, --node_local_data) to its first
  training step at each W, with the times of the start-up's log lines: once without the
  model's binary copy (model_cache.py: this start writes it) and once with it (goal <= 60 s
  at a million images, W = 2 and 4);
- epochs: steps/s of each epoch of a short training on the SMALL capture (the first reads
  every image from disk and fills the cache, the later ones read the cache; goal: within 10%);
- training: steps/s of a short CLI training (torchrun, --node_local_data) on the N-image
  capture and on a SMALL-image capture of the same image size (goal: within 10%).

    nice -n 10 python benchmarks/studies/many_images/bench_million.py                 # N=100000
    N=1000000 WS=2,4 nice -n 10 python benchmarks/studies/many_images/bench_million.py

Environment: N (images), SMALL (1000), WS ("2,4"), STEPS (40), CACHE (decoded up to 200k
images, else compressed: the decoded 1M capture is 9.2 GB), WORK (a folder with room for the capture: 5 GB at a million images; default: beside the checkout),
KEEP=1 keeps the generated data (a rerun reuses it and its generation/packing figures),
DATA_ONLY=1 (with KEEP=1) only generates and packs, MEASURE=0 skips the per-rank measures, FILL=0 skips
filling the cache with the whole share in them, EPOCHS (3; 0: none) epochs of the SMALL capture,
REPEAT (2) training runs per capture, START=0 no start measures, MERGE=1 puts this run's parts into an
copy of the newest million_<N> snapshot (listed under "merged"). Writes a new snapshot
benchmarks/results/million_<N>_<device>_<date>.json (results_index.py).
"""

from __future__ import annotations

import io
import json
import multiprocessing as mp
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

WIDTH, HEIGHT = 64, 48
PER_DIR = 1000
POOL = 256
N_TEST = 8
SEED = 42


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def names_of(n: int) -> list:
    return [f"d{i // PER_DIR:04d}/img_{i:07d}.jpg" for i in range(n)]


def jpeg_pool() -> list:
    """POOL distinct 64 x 48 JPEGs (smooth gradients plus noise: ~1.5-2.5 KB each)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:HEIGHT, 0:WIDTH]
    out = []
    for k in range(POOL):
        base = (np.stack([xx * 4, yy * 5, (xx + yy) * 2], -1) + k * 7) % 256
        img = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def write_model(root: Path, n: int) -> None:
    """sparse/0/{cameras,images,points3D}.bin for n cameras on a sphere looking at the
    origin, written with struct in COLMAP's binary layout (what colmap_io reads), and
    test.txt naming N_TEST images, so every capture size evaluates the same few cameras."""
    rng = np.random.default_rng(1)
    d = rng.normal(size=(n, 3))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    eye = 4.0 * d  # [n, 3] camera centres
    fwd = -d
    up = np.array([0.0, 0.0, 1.0])
    right = np.cross(fwd, up)
    bad = np.linalg.norm(right, axis=1) < 1e-6
    right[bad] = [1.0, 0.0, 0.0]
    right /= np.linalg.norm(right, axis=1, keepdims=True)
    down = np.cross(fwd, right)
    R = np.stack([right, down, fwd], 1)  # [n, 3, 3] world -> camera rows
    t = -np.einsum("nij,nj->ni", R, eye)  # [n, 3]
    from scipy.spatial.transform import Rotation

    q = Rotation.from_matrix(R).as_quat()  # [n, 4] (x, y, z, w)
    qvec = np.concatenate([q[:, 3:], q[:, :3]], 1)  # (w, x, y, z)
    model = root / "sparse" / "0"
    model.mkdir(parents=True)
    f = 0.8 * WIDTH
    with open(model / "cameras.bin", "wb") as fh:
        fh.write(struct.pack("<Q", 1) + struct.pack("<iiQQ", 1, 1, WIDTH, HEIGHT) +
                 struct.pack("<4d", f, f, WIDTH / 2, HEIGHT / 2))
    names = names_of(n)
    with open(model / "images.bin", "wb") as fh:
        fh.write(struct.pack("<Q", n))
        rec = struct.Struct("<i7di")
        for i in range(n):
            fh.write(rec.pack(i + 1, *qvec[i], *t[i], 1) + names[i].encode() + b"\0" + struct.pack("<Q", 0))
    pts = rng.normal(scale=0.8, size=(4000, 3))
    with open(model / "points3D.bin", "wb") as fh:
        fh.write(struct.pack("<Q", len(pts)))
        for i, p in enumerate(pts):
            fh.write(struct.pack("<Q3d3BdQ", i + 1, *p, 128, 128, 128, 0.5, 0))
    step = max(1, n // N_TEST)
    (root / "test.txt").write_text("\n".join(names[i * step] for i in range(N_TEST)) + "\n")


def generate(root: Path, n: int) -> dict:
    t0 = time.perf_counter()
    pool = jpeg_pool()
    images = root / "images"
    nbytes = 0
    for i, name in enumerate(names_of(n)):
        if i % PER_DIR == 0:
            (images / name).parent.mkdir(parents=True, exist_ok=True)
        body = pool[i % POOL]
        with open(images / name, "wb") as fh:
            fh.write(body)
        nbytes += len(body)
    t1 = time.perf_counter()
    write_model(root, n)
    t2 = time.perf_counter()
    return {"images": n, "bytes": nbytes, "write_images_s": t1 - t0, "write_model_s": t2 - t1}


def pack(root: Path) -> dict:
    """distsplat's pack_shards (256 MiB shards + index) against plain `tar cf` of the folder."""
    from distsplat.data.shards import pack_shards

    t0 = time.perf_counter()
    pack_shards(root / "images", root / "shards", 256.0)
    t1 = time.perf_counter()
    subprocess.run(["tar", "cf", str(root / "plain.tar"), "-C", str(root / "images"), "."], check=True)
    t2 = time.perf_counter()
    shard_bytes = sum(p.stat().st_size for p in (root / "shards").glob("shard-*.tar"))
    plain = (root / "plain.tar").stat().st_size
    (root / "plain.tar").unlink()
    index = root / "shards" / "index.json"
    idx_files = [p for p in (root / "shards").iterdir() if not p.name.startswith("shard-")]
    return {"pack_shards_s": t1 - t0, "plain_tar_s": t2 - t1, "pack_vs_tar": (t1 - t0) / max(t2 - t1, 1e-9),
            "shard_bytes": shard_bytes, "plain_tar_bytes": plain,
            "index_bytes": sum(p.stat().st_size for p in idx_files), "index": index.name}


def rank_worker(args) -> dict:
    """One rank: parse, open the index, ownership, fill the cache; seconds and RSS (MB)."""
    root, rank, W, cache_mode = args
    os.environ["LOCAL_WORLD_SIZE"] = str(W)
    import gc
    import resource

    import torch  # noqa: F401  (the trainer's imports are in every rank's baseline)

    from distsplat.data import ImageCache, TarShardSource, load_colmap
    from distsplat.train.node_data import check_own_images, owned_by_rank

    gc.collect()
    out = {"rank": rank, "rss_base_mb": rss_mb()}
    t = time.perf_counter()
    scene = load_colmap(root, check=False)
    gc.collect()
    out.update(parse_s=time.perf_counter() - t, rss_after_parse_mb=rss_mb())
    t = time.perf_counter()
    source = TarShardSource(root / "shards" / "index.json", names=scene.names)
    scene.images = source
    gc.collect()
    out.update(index_s=time.perf_counter() - t, rss_after_index_mb=rss_mb())
    t = time.perf_counter()
    own = owned_by_rank(scene, W, SEED)[rank]
    specs = scene.specs()
    gc.collect()
    out.update(ownership_s=time.perf_counter() - t, rss_after_ownership_mb=rss_mb(), own=len(own))
    t = time.perf_counter()
    check_own_images(scene, own.tolist(), f"rank {rank}")  # the trainer's up-front check of a rank's images
    out.update(check_s=time.perf_counter() - t)
    t = time.perf_counter()
    cache = ImageCache(source, specs, own.tolist(), mode=cache_mode, rank=rank)
    out.update(cache_init_s=time.perf_counter() - t)
    if os.environ.get("FILL", "1") == "1":  # the whole share read once (training fills it as it goes)
        t = time.perf_counter()
        buf = np.empty((HEIGHT, WIDTH, 3), np.uint8)
        for c in own.tolist():
            cache.read_into(c, buf)
        out.update(cache_fill_s=time.perf_counter() - t)
    gc.collect()
    out.update(rss_after_cache_mb=rss_mb(), cache_mode=cache.mode,
               cache_bytes=cache.nbytes(), peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return out


def measure_ranks(root: Path, W: int, cache_mode: str, n: int, encoded_total: int) -> dict:
    from distsplat.data import colmap_io

    colmap_io.read_model_table(root / "sparse" / "0")  # the model's binary copy written: the ranks read it, as a later start does
    ctx = mp.get_context("spawn")
    with ctx.Pool(W) as pool:
        ranks = pool.map(rank_worker, [(root, r, W, cache_mode) for r in range(W)])
    dataset = encoded_total if cache_mode == "compressed" else n * WIDTH * HEIGHT * 3
    for r in ranks:
        r["cache_over_share"] = r["cache_bytes"] / (dataset / W)
        r["cache_mb"] = r["cache_bytes"] / 2**20
        r["index_ownership_mb"] = r["rss_after_ownership_mb"] - r["rss_base_mb"]
        r["besides_cache_mb"] = r["rss_after_cache_mb"] - r["rss_base_mb"] - r["cache_mb"]
    return {"W": W, "dataset_bytes": dataset, "ranks": ranks}


MILESTONES = {  # log lines of a start, in order: what the time to the first step is made of
    "scene_loaded": r"distsplat\.data\.(colmap|nerfstudio|blender): ",
    "gaussians_init": r"trainer: init: ",
    "setup_done": r"trainer: scene: ",
    "first_step": r"trainer: step 1/",
}


FROZEN = ["--means_lr", "0", "--scales_lr", "0", "--quats_lr", "0", "--opacities_lr", "0", "--sh0_lr", "0",
          "--shN_lr", "0", "--strategy.refine_start_iter", "1000000000"]  # every step renders the same model


def train_rate(root: Path, W: int, steps: int, work: Path, log_every: int = 0, extra=()) -> dict:
    """One CLI training (torchrun, W ranks): the time from launch to each start-up milestone
    (seconds since the launch, read as the lines arrive), steps/s between step steps/2 and
    steps (past start-up), the rate of each --log_every interval, and wall time."""
    out = work / f"run_{root.name}_{W}"
    shutil.rmtree(out, ignore_errors=True)
    log_every = log_every or steps // 2
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={W}",
           str(REPO / "examples" / "simple_trainer.py"), "default", "--data_dir", str(root), "--data_factor", "1", "--node_local_data",
           "--max_steps", str(steps), "--log_every", str(log_every), "--init_num_pts", "2000",
           "--num_workers", "1", "--prefetch", "2", "--disable_viewer", "--sh_degree", "1",
           "--cache", "compressed", "--result_dir", str(out), *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    seen, lines = {}, []
    for line in p.stderr:
        lines.append(line)
        for key, pattern in MILESTONES.items():
            if key not in seen and re.search(pattern, line):
                seen[key] = time.perf_counter() - t0
    p.wait()
    wall = time.perf_counter() - t0
    text = "".join(lines)
    if p.returncode != 0:
        raise RuntimeError(f"training on {root} failed:\n{text[-3000:]}")
    rates = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"step (\d+)/\d+: loss \S+, ([\d.]+) steps/s", text)}
    # cumulative rates r_k = k / (t_k - t_first): the interval (a, b] took b/r_b - a/r_a
    marks = sorted(k for k in rates if k % log_every == 0 or k == steps)
    intervals = [{"from": a, "to": b, "steps_per_s": (b - a) / (b / rates[b] - a / rates[a])}
                 for a, b in zip(marks, marks[1:])]
    half = steps // 2
    setup = re.search(r"scene: .*", text)
    shutil.rmtree(out, ignore_errors=True)
    return {"W": W, "steps": steps, "steps_per_s": (steps - half) / (steps / rates[steps] - half / rates[half]),
            "time_to_first_step_s": seen.get("first_step"), "milestones_s": seen, "intervals": intervals,
            "first_epoch_steps_per_s": rates.get(log_every),
            "wall_s": wall, "scene_line": setup.group(0) if setup else None}


def epochs_rate(root: Path, images: int, W: int, epochs: int, work: Path, frozen: bool) -> dict:
    """steps/s of each epoch of a short run on `root`: the first reads every image from disk
    (and fills the cache), the later ones read the cache. The trainer's rate at step k is
    k / (time since the steps began), so epoch 1's is the rate logged at its last step and
    epoch e's the interval between the logs at its ends. `frozen`: every learning rate 0 and
    no refinement, so every epoch renders the same work and only the images' path differs
    (a training model's steps get cheaper as its Gaussians shrink, whatever the loader does)."""
    per_epoch = (images - N_TEST) // W  # steps per epoch: each rank trains one own image a step
    r = train_rate(root, W, per_epoch * epochs, work, log_every=per_epoch, extra=FROZEN if frozen else ())
    rates = [r["first_epoch_steps_per_s"]] + [i["steps_per_s"] for i in r["intervals"]]
    return dict(r, images=images, frozen=frozen, steps_per_epoch=per_epoch, epoch_steps_per_s=rates,
                first_over_later=rates[0] / (sum(rates[1:]) / max(len(rates) - 1, 1)))


def main() -> None:
    n = int(os.environ.get("N", "100000"))
    small = int(os.environ.get("SMALL", "1000"))
    ws = [int(w) for w in os.environ.get("WS", "2,4").split(",")]
    steps = int(os.environ.get("STEPS", "40"))
    cache_mode = os.environ.get("CACHE", "decoded" if n <= 200_000 else "compressed")
    work = Path(os.environ.get("WORK", REPO.parent / "tmp_bench_million")) / f"n{n}"  # beside the checkout: GBs
    keep = os.environ.get("KEEP") == "1"
    if work.exists() and not keep:
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": "bench_million", "N": n, "small": small, "image_size": [WIDTH, HEIGHT], "cache": cache_mode,
              "command": f"N={n} WS={','.join(map(str, ws))} STEPS={steps} REPEAT={os.environ.get('REPEAT', '2')} "
                         f"FILL={os.environ.get('FILL', '1')} MEASURE={os.environ.get('MEASURE', '1')} "
                         f"START={os.environ.get('START', '1')} EPOCHS={os.environ.get('EPOCHS', '3')} "
                         f"SMALL={small} MERGE={os.environ.get('MERGE', '0')} "
                         "python benchmarks/studies/many_images/bench_million.py",
              "machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                       cwd=REPO).stdout.strip(),
              "load_before": os.getloadavg()}
    try:
        big, little = work / "big", work / "small"
        for root, count in ((big, n), (little, small)):
            stats = root / "data_stats.json"  # kept with the data: a KEEP=1 rerun still reports them
            if not (root / "shards" / "index.json").exists():
                made = {"generate": generate(root, count), "pack": pack(root),
                        "commit": result["commit"], "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "load": os.getloadavg()}
                stats.write_text(json.dumps(made))
            made = json.loads(stats.read_text()) if stats.exists() else {}
            if made:
                result[f"generate_{root.name}"] = dict(made["generate"], commit=made["commit"], date=made["date"],
                                                       load=made["load"])
                result[f"pack_{root.name}"] = made["pack"]
                print(root.name, result[f"generate_{root.name}"], result[f"pack_{root.name}"], flush=True)
        if os.environ.get("DATA_ONLY") == "1":
            return
        encoded = sum(p.stat().st_size for p in (big / "shards").glob("shard-*.tar"))  # upper bound of the blobs
        encoded = result.get("generate_big", {}).get("bytes", encoded)
        result["ranks"] = []
        for W in ws if os.environ.get("MEASURE", "1") == "1" else []:  # MEASURE=0: training only
            result["ranks"].append(measure_ranks(big, W, cache_mode, n, encoded))
            print(json.dumps(result["ranks"][-1]), flush=True)
        # Launch to the first step at each W (--node_local_data: each rank checks its own images):
        # the first start writes the model's binary copy (model_cache.py), the later ones read it
        result["start"] = []
        for W in ws if os.environ.get("START", "1") == "1" else []:
            for start in ("first", "later"):
                if start == "first":
                    for copy in (big / "sparse" / "0").glob("images.distsplat"):
                        copy.unlink()
                r = dict(train_rate(big, W, steps, work), start=start, images=n)
                result["start"].append(r)
                print(json.dumps(r), flush=True)
        if result["start"]:
            result["time_to_first_step_s"] = {str(W): min(r["time_to_first_step_s"] for r in result["start"]
                                                          if r["W"] == W) for W in ws}
        epochs = int(os.environ.get("EPOCHS", "3"))
        for key, frozen in (("epochs_frozen", True), ("epochs", False)) if epochs > 1 else ():  # EPOCHS=0: none
            result[key] = epochs_rate(little, small, ws[0], epochs, work, frozen)
            print(json.dumps(result[key]), flush=True)
        result["training"] = []
        # Interleaved twice (small, big, small, big), the best of each: the machine is shared.
        for _ in range(int(os.environ.get("REPEAT", "2"))):  # REPEAT=0: none
            for root in (little, big):
                r = train_rate(root, ws[0], steps, work)
                r["images"] = small if root is little else n
                result["training"].append(r)
                print(json.dumps(r), flush=True)
        if result["training"]:
            best = {k: max(r["steps_per_s"] for r in result["training"] if r["images"] == k) for k in (small, n)}
            result["train_steps_per_s_best"] = {str(k): v for k, v in best.items()}
            result["train_big_over_small"] = best[n] / best[small]
        result["load_after"] = os.getloadavg()
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
        if os.environ.get("DATA_ONLY") != "1":
            from benchmarks.results_index import device_label, newest, result_path

            base = newest(f"million_{n}", "cpu") if os.environ.get("MERGE") == "1" else None
            out = result_path(f"million_{n}", device_label(result["machine"]), result["date"])
            if base is not None:  # a partial rerun: its parts replace the newest snapshot's, in a new one
                old = json.loads(base.read_text())
                old["merged_into_from"] = base.name
                fresh = {k: v for k, v in result.items() if v not in ([], None) and not k.startswith(("generate_", "pack_"))}
                old.setdefault("merged", []).append({k: result[k] for k in ("command", "commit", "date", "load_before")})
                old.update({k: v for k, v in fresh.items() if k not in ("command", "commit", "date", "load_before")})
                result = old
            out.write_text(json.dumps(result, indent=2) + "\n")
            print(f"bench_million N={n}: -> {out}")


if __name__ == "__main__":
    main()
