"""Issue 33: how evenly do the ranks share a step's work, in work units no device skews?

A synchronous step lasts as long as its slowest rank. A rank's projection costs its pairs
projected (its Gaussians x the batch cameras that see them), its rasterization the pairs of
its own cameras (docs/design.md; distsplat/train/model/balance.py). Per scene, world size W and per-rank
batch b, W gloo CPU processes run the real `Trainer` (setup, then `Trainer.train_step`, the
loop's body, step after step) and record every step's pairs projected and rasterized per rank
(what `WorkMeter.record` gets from the count exchange). Each entry gives, over the measured
steps, the median over steps of max/mean over the ranks (`projected_max_over_mean`,
`rasterized_max_over_mean`; the issue's goal: <= 1.05 at W = 4, b = 1 and 4), the mean and 90th
percentile of the same ratios, the static part (max/mean of the ranks' totals over the window)
and the Gaussians per rank (memory).

The measured window: whole epochs of the camera batcher, after WARM_EPOCHS epochs (counted
from the first epoch boundary of the run), so that whatever a run learns (the cameras' costs,
agreed --prefetch steps before each epoch: the first balanced epoch still misses the costs of
the previous epoch's last cameras) is in use. The JSON's balanced runs used WARM_EPOCHS=2, the
unbalanced ones 1 (the seeded order is alike in every epoch); each entry says which steps.

Scenes (SCENES, default "thermos,garden"):
  thermos  ../shared/data/thermos (88 train views of a real capture) at --data_factor
           THERMOS_FACTOR (8: 118x66), trained once by this script (TRAIN_STEPS steps on TRAIN_W
           ranks with densification: refine every 50 steps from 100 to 600, opacity reset every 300,
           SH +1 every 100; Trainer.train, saved in $WORK and reused); every configuration resumes
           that checkpoint (on any W) and runs without densification. Each `balanced` mode trains its
           own checkpoint with its own code (what a user gets); BALANCED=1 also measures the
           balanced code resumed from the unbalanced checkpoint (`trained_balanced: false`).
  garden   test_garden.npz's 138766 SfM points x GARDEN_REPLICAS jittered copies (8: the 1.11M
           Gaussians of benchmarks/scaling_gpu.py's scene), 64 cameras (the 3 garden views turned
           by up to 8 degrees), --init_type sfm, at --data_factor GARDEN_FACTOR (8: 162x105). Pair
           counts hardly depend on the resolution (every projected Gaussian has a radius of >= 2 px
           with eps2d 0.3; the frustum is the same), so a lower resolution only saves CPU time.
           The copies of a point are adjacent in the Gaussians' order, so contiguous chunks and
           per-camera pairs of the 1.11M scene have the ratios of the 138766 points (up to the
           jitter); on CPU ranks the torch backend's rasterization of the 1.11M scene takes
           7.4 GB per rank and step (W = 1, batch 1), more than 4 ranks get on a 23 GB machine,
           so the JSON's garden entries use GARDEN_REPLICAS=1 (each entry names its replicas),
           and where even the 138766 points' ~4.7 GB per rank at batch 4 do not fit, a seeded
           random subset of GARDEN_POINTS of them in their order (scaling_gpu's SMALL subset,
           at the full scene's cameras and resolution).

    nice -n 15 python benchmarks/studies/balance/balance_study.py                # today's code: balanced false
    BALANCED=1 nice -n 15 python benchmarks/studies/balance/balance_study.py     # with the balancing of issue 33

Run it from a checkout that nothing edits meanwhile: the rank processes import distsplat when
they start, one configuration after another.

Environment (defaults): SCENES, WS (4,2,8), BATCHES (1,4), BALANCED (0; 1 needs the trainer's
--balance_cameras/--balance_pairs), WARM_EPOCHS (1), MIN_STEPS (8: measured epochs are added
until the window holds this many steps), THERMOS_FACTOR (8), GARDEN_FACTOR (8), GARDEN_REPLICAS (8),
GARDEN_POINTS (all 138766), TRAIN_W (2),
TRAIN_STEPS (800), WORK (/tmp/balance_study: the trained checkpoints and the garden capture,
kept), NAME (balance_study). A run writes a new snapshot of $NAME holding the newest one's entries, merged by (scene, W,
batch, balanced, trained_balanced): a rerun of one configuration replaces only its entry, each
entry keeps its own commit, date and command. REPLICAS_CHECK=1 adds `replicas_check` (see
replicas_check()); MERGE=a.json,b.json merges the entries of runs written elsewhere (BENCH_RESULTS:
runs of both codes at once must not write one file). Prints one summary line.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from benchmarks.common import RESULTS, git_commit, newest, write_result  # noqa: E402
from benchmarks.paths import data_dir  # noqa: E402
from benchmarks.procs import run_ranks  # noqa: E402

SEED = 42
THERMOS = data_dir() / "thermos"


def env_ints(name: str, default: str) -> List[int]:
    return [int(x) for x in os.environ.get(name, default).split(",") if x.strip()]


# ------------------------------------------------------------------------------ configs


def base_config(data_dir: str, factor: int, batch: int, result_dir: str, balanced: Optional[bool]):
    """The trainer's default config on the scene; balanced None: the code has no balancing flags."""
    from distsplat.train.config import default_config

    cfg = default_config()
    cfg.data_dir, cfg.data_factor, cfg.batch_size, cfg.seed = data_dir, factor, batch, SEED
    cfg.result_dir = result_dir
    cfg.save_ply = False
    cfg.num_workers, cfg.cache = 1, "decoded"
    cfg.log_every = cfg.tb_every = 10 ** 9
    if balanced is not None:
        cfg.balance_cameras = cfg.balance_pairs = balanced
    return cfg


def train_config(work: Path, balanced: Optional[bool], steps: int):
    """thermos with densification (a compressed default schedule), saved at the end."""
    cfg = base_config(str(THERMOS), int(os.environ.get("THERMOS_FACTOR", 8)), 1, str(work), balanced)
    cfg.max_steps, cfg.sh_degree_interval, cfg.log_every = steps, 100, 100
    cfg.eval_steps, cfg.save_steps = [steps], [steps]
    s = cfg.strategy
    s.refine_start_iter, s.refine_every, s.refine_stop_iter, s.reset_every = 100, 50, 600, 300
    cfg.validate()
    return cfg


def measure_config(job: Dict[str, Any]):
    """A configuration's run: no densification (a fixed scene), SH degree 3 from step 3."""
    cfg = base_config(job["data_dir"], job["factor"], job["batch"], job["result_dir"], job["balanced"])
    cfg.ckpt = job.get("ckpt")
    cfg.max_steps = job["start_step"] + job["steps"]
    cfg.eval_steps, cfg.save_steps = [], []
    cfg.sh_degree_interval = 100 if cfg.ckpt else 1
    s = cfg.strategy
    s.refine_start_iter = s.refine_stop_iter = s.reset_every = 10 ** 9
    cfg.validate()
    return cfg


# ------------------------------------------------------------------------------ rank jobs


def train_job(ctx, cfg) -> Dict[str, Any]:
    from distsplat.train.trainer import Trainer

    trainer = Trainer(cfg, ctx)
    try:
        trainer.setup()
        metrics = trainer.train()
    finally:
        trainer.cleanup()
    return {"n_local": len(trainer.params["means"]), "psnr": metrics.get("val_psnr"), "num_GS": trainer.n_all}


def measure_job(ctx, job: Dict[str, Any]) -> Dict[str, Any]:
    """One rank: setup, then `steps` calls of Trainer.train_step; per step this rank's
    (pairs projected, pairs rasterized, Gaussians held), as WorkMeter.record sees them."""
    from distsplat.train.trainer import Trainer

    memo = None
    if job.get("memo"):
        from benchmarks.scaling_gpu import SetupMemo

        memo = SetupMemo.load(Path(job["memo"]))
    cfg = measure_config(job)
    trainer = Trainer(cfg, ctx)
    rows: List[List[int]] = []
    try:
        if memo is not None:
            with memo.serving():
                trainer.setup()
        else:
            trainer.setup()
        real = trainer.work.record

        def record(metas) -> None:
            real(metas)
            rows.append([*trainer.work.steps[-1], len(trainer.params["means"])])

        trainer.work.record = record
        t0 = time.perf_counter()
        for step in range(trainer.start_step, cfg.max_steps):
            trainer.train_step(step)
            trainer.divergence.poll(step + 1, flush=False)
        wall = time.perf_counter() - t0
    finally:
        trainer.cleanup()
    return {"rows": rows, "start_step": trainer.start_step, "batch_start": trainer.schedule.batch_start,
            "steps_per_epoch": trainer.batcher.steps_per_epoch, "wall_s": wall}


# ------------------------------------------------------------------------------ scenes


def thermos_checkpoint(work: Path, balanced: Optional[bool]) -> Dict[str, Any]:
    """The trained thermos of this `balanced` mode (trained now unless $WORK holds it)."""
    tag = "balanced" if balanced else "unbalanced"
    folder = work / f"thermos_trained_{tag}"
    info_path = folder / "trained.json"
    if info_path.is_file():
        return json.loads(info_path.read_text())
    if folder.exists():
        shutil.rmtree(folder)
    W, steps = int(os.environ.get("TRAIN_W", 2)), int(os.environ.get("TRAIN_STEPS", 800))
    cfg = train_config(folder, balanced, steps)
    t0 = time.perf_counter()
    out = run_ranks(train_job, W, cfg)
    info = {"ckpt": str(folder / "ckpts"), "step": steps, "train_W": W, "wall_s": round(time.perf_counter() - t0, 1),
            "num_GS": out[0]["num_GS"], "psnr": out[0]["psnr"], "balanced": bool(balanced),
            "commit": git_commit(),
            "schedule": "default strategy, refine every 50 steps from 100 to 600, opacity reset every 300, "
                        "SH degree +1 every 100, batch 1 per rank, seed 42"}
    info_path.write_text(json.dumps(info, indent=1))
    print(f"trained thermos ({tag}): {info}", flush=True)
    return info


def garden_replicas() -> int:
    return int(os.environ.get("GARDEN_REPLICAS", 8))


def garden_points() -> Optional[int]:
    return int(os.environ["GARDEN_POINTS"]) if os.environ.get("GARDEN_POINTS") else None


def garden_scene(work: Path) -> Path:
    reps, points = garden_replicas(), garden_points()
    folder = work / ("garden" if reps == 8 else f"garden_r{reps}")
    if points is not None:
        folder = work / f"garden_p{points}"
    if not (folder / "sparse" / "0" / "points3D.bin").is_file():
        import numpy as np

        from benchmarks.scaling_gpu import garden_path, write_garden_scene

        os.environ.pop("SMALL", None)
        os.environ["REPLICAS"] = str(reps)
        if points is not None:  # scaling_gpu's subset (1 replica) at the full scene's 1296x840 cameras
            d = np.load(garden_path())
            os.environ["SMALL_SIZE"] = f"{points},{2 * int(d['width'])},{2 * int(d['height'])}"
        write_garden_scene(folder, small=points is not None)
    return folder


def garden_memo(work: Path, folder: Path, factor: int, balanced: Optional[bool]) -> Path:
    """The garden's scene and initial Gaussians computed once (k-NN of 1.1M points) and served
    to every rank's setup (scaling_gpu.SetupMemo), per balancing mode."""
    import torch

    from benchmarks.scaling_gpu import SetupMemo
    from distsplat.distributed import init_distributed
    from distsplat.train.trainer import Trainer

    path = folder.parent / f"{folder.name}_memo_{factor}_{'balanced' if balanced else 'unbalanced'}.pt"
    if not path.is_file():
        memo = SetupMemo()
        cfg = measure_config({"data_dir": str(folder), "factor": factor, "batch": 1, "balanced": balanced,
                              "result_dir": str(work / "memo_run"), "start_step": 0, "steps": 1})
        with memo.serving():
            t = Trainer(cfg, init_distributed(device=torch.device("cpu")))
            try:
                t.setup()
            finally:
                t.cleanup()
        memo.save(path)
    return path


def n_train_of(data_dir: str, factor: int) -> int:
    from distsplat.train.scene_setup import load_scene_dir

    return len(load_scene_dir(data_dir, factor, True, 8, check=False).train)


def resume_position(ckpt: Optional[str], W: int, b: int, n_train: int) -> int:
    """The batcher position a run starts at (CameraBatcher.load_state_dict's rule)."""
    from distsplat.distributed import CameraBatcher

    if ckpt is None:
        return 0
    from distsplat.train.files import checkpoint as ck

    state = ck.read_meta(Path(ckpt))["state"]["batcher"]
    b_new = CameraBatcher(n_train, W, b, SEED)
    if (state["world_size"], state["cameras_per_rank"]) == (W, b):
        return state["epoch"] * b_new.steps_per_epoch + state["step"]
    return (state["epoch"] + (1 if state["step"] > 0 else 0)) * b_new.steps_per_epoch


# ------------------------------------------------------------------------------ figures


def ratios(per_rank: np.ndarray) -> np.ndarray:
    """[W, K] -> [K] max/mean over the ranks per step (1.0 for a step without work)."""
    mean = per_rank.mean(0)
    return np.where(mean > 0, per_rank.max(0) / np.maximum(mean, 1e-300), 1.0)


def figures(ranks: List[Dict[str, Any]], skip: int, n: int) -> Dict[str, Any]:
    counts = np.array([r["rows"] for r in ranks], dtype=np.float64)[:, skip:skip + n]  # [W, K, 3]
    out: Dict[str, Any] = {}
    for i, name in ((0, "projected"), (1, "rasterized")):
        r = ratios(counts[..., i])
        tot = counts[..., i].sum(1)
        out[f"{name}_max_over_mean"] = round(float(np.median(r)), 4)
        out[f"{name}_mean_of_steps"] = round(float(r.mean()), 4)
        out[f"{name}_p90"] = round(float(np.percentile(r, 90)), 4)
        out[f"{name}_static"] = round(float(tot.max() / tot.mean()), 4)
        out[f"{name}_pairs_per_rank_mean"] = [int(x) for x in counts[..., i].mean(1)]
    out["gaussians_per_rank"] = [int(x) for x in counts[:, -1, 2]]
    out["gaussians_max_over_mean"] = round(float(counts[:, -1, 2].max() / counts[:, -1, 2].mean()), 4)
    return out


def replicas_check(work: Path) -> Dict[str, Any]:
    """Do the garden's replicated copies keep its imbalance? For 1 and 8 replicas, the SfM
    initial Gaussians (the trainer's load_scene and init_gaussians, in the points' order)
    projected into every training camera (render.project, what each rank's projection runs):
    per W, the max/mean of the contiguous chunks' pairs over all cameras, and the spread of the
    cameras' pairs (their rasterization costs)."""
    import torch

    from distsplat.distributed import chunk_bounds
    from distsplat.render.api import project
    from distsplat.train.model.gaussians import activated, init_gaussians
    from distsplat.train.scene_setup import load_scene_dir

    factor, out = int(os.environ.get("GARDEN_FACTOR", 8)), {}
    for reps in (1, 8):
        os.environ["GARDEN_REPLICAS"] = str(reps)
        scene = load_scene_dir(str(garden_scene(work)), factor, True, 8, check=False)
        pts, rgb = torch.from_numpy(scene.points).float(), torch.from_numpy(scene.points_rgb).float() / 255
        g = activated(init_gaussians(pts, rgb, 0, (0, len(pts))), 0)
        cams, n = scene.camera_tensors(), len(pts)
        per = []  # [C, W] pairs of each contiguous chunk, W = 8 (coarser W: sums of neighbours)
        for c in scene.train:
            with torch.no_grad():
                pairs, _ = project(g["means"], g["quats"], g["scales"], g["opacities"], g["colors"],
                                   scene.viewmats([c]), cams["Ks"][c:c + 1], int(scene.widths[c]),
                                   int(scene.heights[c]), backend="torch", sh_degree=0)
            ids = pairs.gaussian_ids.numpy()
            per.append([int(((ids >= a) & (ids < b)).sum()) for a, b in chunk_bounds(n, 8)])
        per = np.array(per, np.float64)
        cost = per.sum(1)
        out[f"replicas_{reps}"] = {
            "gaussians": n, "pairs_per_camera_mean": round(float(cost.mean())),
            "camera_pairs_cv": round(float(cost.std() / cost.mean()), 4),
            **{f"W{W}_projected_static": round(float(t.max() / t.mean()), 4)
               for W in (2, 4, 8) for t in [per.reshape(len(per), W, 8 // W).sum((0, 2))]}}
    return out


def gpu_prediction(entries: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The step time the balancing saves on the GPU scaling model (benchmarks/scaling_gpu.py:
    T = max_r(A_r + C_r) + max_r(B_r) + X): per W = 4 configuration of scaling_gpu_<device>_<date>.json (H100,
    the 1.11M garden), the pair-proportional stages' mean time per rank -- projection side
    (project, pack, project_bwd: pairs projected) and rasterization side (unpack, raster_fwd,
    raster_bwd: pairs rasterized) -- times the drop of the garden's mean over steps of max/mean
    (each step waits for its busiest rank) from balanced false to true. An estimate: the stages
    are taken as proportional to their pairs, the rest (loss, Adam, exchange) as even."""
    import ast

    path = newest("scaling_gpu", "gpu", RESULTS) or RESULTS / "scaling_gpu_<device>_<date>.json"  # the record, or a call's staging
    if not path.is_file():
        return {}
    gpu = json.loads(path.read_text())
    garden = {(points_of(e), e["W"], e["batch"], e["balanced"]): e for e in entries if e["scene"] == "garden"}
    out: Dict[str, Any] = {"source": f"{path.name} (commit {gpu.get('commit', '?')[:7]}, {gpu.get('device')}); "
                                     "garden entries above", "method": " ".join((gpu_prediction.__doc__ or "").split())}
    for row in gpu.get("results", []):
        W, b = row.get("W"), row.get("batch_per_rank")
        both = sorted((p for p, w, bb, bal in garden if (w, bb, bal) == (W, b, True) and (p, W, b, False) in garden),
                      reverse=True)  # the garden runs with the most points that have both
        if W != 4 or not both:
            continue
        before, after = garden[(both[0], W, b, False)], garden[(both[0], W, b, True)]
        ranks = row["per_rank_ms"]
        ranks = ast.literal_eval(ranks) if isinstance(ranks, str) else ranks
        proj = float(np.mean([r["project"] + r["pack"] + r["project_bwd"] for r in ranks]))
        rast = float(np.mean([r.get("unpack", 0.0) + r["raster_fwd"] + r["raster_bwd"] for r in ranks]))
        saved = {"projection": (before["projected_mean_of_steps"] - after["projected_mean_of_steps"]) * proj,
                 "rasterization": (before["rasterized_mean_of_steps"] - after["rasterized_mean_of_steps"]) * rast}
        step = row["predicted"]
        step = ast.literal_eval(step) if isinstance(step, str) else step
        out[f"W{W}_b{b}"] = {"garden_points": both[0], "pair_stages_ms_per_rank": {"projection": round(proj, 2), "rasterization": round(rast, 2)},
                             "saved_ms_per_step": {k: round(v, 2) for k, v in saved.items()},
                             "saved_ms_total": round(sum(saved.values()), 2),
                             "model_step_ms_nvlink": step["ours"]["nvlink_h100"]["step_ms"]}
    return out


# ------------------------------------------------------------------------------ main


def run_config(scene: str, W: int, b: int, balanced: Optional[bool], work: Path, trained: Dict[str, Any],
               warm_epochs: int, min_steps: int) -> Dict[str, Any]:
    if scene == "thermos":
        data_dir, factor, ckpt, memo = str(THERMOS), int(os.environ.get("THERMOS_FACTOR", 8)), trained["ckpt"], None
    else:
        factor = int(os.environ.get("GARDEN_FACTOR", 8))
        folder = garden_scene(work)
        data_dir, ckpt, memo = str(folder), None, str(garden_memo(work, folder, factor, balanced))
    from distsplat.distributed import CameraBatcher

    n_train = n_train_of(data_dir, factor)
    spe = CameraBatcher(n_train, W, b, SEED).steps_per_epoch
    pos0 = resume_position(ckpt, W, b, n_train)
    first_boundary = math.ceil(pos0 / spe) * spe
    skip = first_boundary - pos0 + warm_epochs * spe
    measured = spe * max(1, math.ceil(min_steps / spe))
    start_step = trained["step"] if ckpt else 0
    job = {"data_dir": data_dir, "factor": factor, "batch": b, "balanced": balanced, "ckpt": ckpt, "memo": memo,
           "start_step": start_step, "steps": skip + measured,
           "result_dir": str(work / f"run_{scene}_W{W}_b{b}_{balanced}")}
    t0 = time.perf_counter()
    ranks = run_ranks(measure_job, W, job)
    assert ranks[0]["steps_per_epoch"] == spe and ranks[0]["batch_start"] == pos0, (ranks[0], spe, pos0)
    entry = {"scene": scene, "W": W, "batch": b, "balanced": bool(balanced),
             **figures(ranks, skip, measured),
             "steps_measured": measured, "steps_skipped": skip, "steps_per_epoch": spe,
             "epochs_measured": f"{(pos0 + skip) // spe}..{(pos0 + skip + measured) // spe - 1}",
             "train_cameras": n_train, "data_factor": factor, "wall_s": round(time.perf_counter() - t0, 1)}
    if scene == "garden":
        entry.update(replicas=1 if garden_points() else garden_replicas(), points=garden_points() or 138766)
    if scene == "thermos":
        entry.update(trained_balanced=bool(trained.get("balanced")), trained_num_GS=trained["num_GS"],
                     trained_psnr=trained["psnr"], trained_step=trained["step"])
    entry.update(commit=git_commit(), date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                 command=" ".join(["python"] + sys.argv) + "  # env: " + " ".join(
                     f"{k}={os.environ[k]}" for k in ("SCENES", "WS", "BATCHES", "BALANCED", "WARM_EPOCHS",
                                                      "MIN_STEPS", "THERMOS_FACTOR", "GARDEN_FACTOR",
                                                      "GARDEN_REPLICAS", "GARDEN_POINTS")
                     if k in os.environ))
    return entry


def points_of(e: Dict[str, Any]) -> Optional[int]:
    """The garden's SfM points of an entry (entries written before GARDEN_POINTS: all 138766)."""
    return e.get("points", 138766) if e["scene"] == "garden" else None


def key(e: Dict[str, Any]) -> tuple:
    return (e["scene"], points_of(e), e.get("replicas"), e["W"], e["batch"], e["balanced"],
            e.get("trained_balanced"))


def main() -> None:
    from distsplat.train.config import Config

    has_flags = "balance_cameras" in Config.__dataclass_fields__
    want = os.environ.get("BALANCED", "0") == "1"
    if want and not has_flags:
        sys.exit("balance_study: BALANCED=1 needs the trainer's --balance_cameras/--balance_pairs")
    balanced: Optional[bool] = want if has_flags else None
    work = Path(os.environ.get("WORK", "/tmp/balance_study"))
    work.mkdir(parents=True, exist_ok=True)
    scenes = [s for s in os.environ.get("SCENES", "thermos,garden").split(",") if s]
    ws, batches = env_ints("WS", "4,2,8"), env_ints("BATCHES", "1,4")
    warm, min_steps = int(os.environ.get("WARM_EPOCHS", 1)), int(os.environ.get("MIN_STEPS", 8))
    name = os.environ.get("NAME", "balance_study")
    path = newest(name, folder=RESULTS) or RESULTS / f"{name}.json"  # a new snapshot starts from the newest's entries
    old = json.loads(path.read_text()) if path.is_file() else {}
    entries: List[Dict[str, Any]] = old.get("entries", [])
    trained: Dict[str, Dict[str, Any]] = old.get("trained", {})

    def write() -> Path:
        entries.sort(key=lambda e: (e["scene"], -(points_of(e) or 0), e.get("replicas") or 0, e["W"], e["batch"],
                                    e["balanced"], bool(e.get("trained_balanced"))))
        return write_result(name, {
            "what": "per scene, W and per-rank batch: median over steps of max/mean over the ranks of pairs "
                    "projected and pairs rasterized (benchmarks/studies/balance/balance_study.py's docstring); goal <= 1.05 at "
                    "W = 4, batch 1 and 4 (issue 33)",
            "device": "CPU, gloo processes, torch backend (work units: pair counts, device independent)",
            "trained": trained, "entries": entries,
            **({"replicas_check": old["replicas_check"]} if "replicas_check" in old else {}),
            "gpu_prediction": gpu_prediction(entries)})

    for other in filter(None, os.environ.get("MERGE", "").split(",")):  # entries written elsewhere
        done = json.loads(Path(other).read_text())
        for e in done.get("entries", []):
            entries[:] = [x for x in entries if key(x) != key(e)] + [e]
        trained.update(done.get("trained", {}))
    if os.environ.get("REPLICAS_CHECK") == "1":
        old["replicas_check"] = {**replicas_check(work), "commit": git_commit(),
                                 "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    for scene in scenes:
        runs = [(balanced, balanced)]
        if scene == "thermos" and balanced:  # the balanced code on the unbalanced run's scene too
            runs.append((balanced, False))
        for mode, trained_mode in runs:
            info = thermos_checkpoint(work, trained_mode) if scene == "thermos" else {}
            if scene == "thermos":
                trained["balanced" if trained_mode else "unbalanced"] = info
            for W in ws:
                for b in batches:
                    e = run_config(scene, W, b, mode, work, info, warm, min_steps)
                    entries[:] = [x for x in entries if key(x) != key(e)] + [e]
                    p = write()
                    print(f"{scene} W={W} b={b} balanced={e['balanced']}"
                          + (f" (trained balanced={e['trained_balanced']})" if scene == "thermos" else "")
                          + f": projected {e['projected_max_over_mean']:.3f} rasterized "
                          f"{e['rasterized_max_over_mean']:.3f} ({e['steps_measured']} steps, {e['wall_s']:.0f} s)",
                          flush=True)
    p = write()
    print(f"balance_study: {len(entries)} entries -> {p}")


if __name__ == "__main__":
    main()
