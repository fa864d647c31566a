"""What the default strategy sees at its refine steps, at global batch 1 and 16 with the same
images seen (issue 45.2): why does batch 16 grow another model?

Each run is the trainer of batch_quality.py's command line (the real CLI's flags, one process,
`--batch_size B --schedule_in_images`), parsed by distsplat.cli and run in-process with the
parsed DefaultStrategy replaced by a subclass that only records: at every refine step, before
gsplat's growth, the window's statistics (the Gaussians' accumulated grad2d and count: pairs
per window, per image seen, the mean 2D gradient grad2d / count over the Gaussians seen, its
quantiles, how many pass grow_grad2d), then what growth and pruning did (duplicated, split,
pruned by opacity, by size), the opacity distribution, the Gaussians after.

    nice -n 10 python benchmarks/studies/batch_quality/densify_stats.py
    SCENE=thermos IMAGES=400 EVAL_EVERY=400 PARALLEL=1 \
        nice -n 10 python benchmarks/studies/batch_quality/densify_stats.py
    SCENE=thermos BATCHES="1 16" SEEDS="42 43" nice -n 10 python benchmarks/studies/batch_quality/densify_stats.py

Environment (defaults): SCENE (builtin | thermos, at --data_factor FACTOR=16), BATCHES ("1 16"),
SEEDS ("42"), IMAGES (960), EVAL_EVERY (96), EXTRA (flags added to every run, e.g.
"--opacities_lr 0.014"), PARALLEL (2), NAME (densify_stats_<scene>). Every finished run is
written into the JSON at once (a killed study keeps what it measured) and skipped when the
script runs again with RESUME=<that file>."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from threading import Lock

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks.common import write_result  # noqa: E402
from benchmarks.studies.batch_quality.batch_quality import command  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
THRESHOLD_FACTORS = [0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0, 1.1, 1.2, 1.4]


def _window(strategy, params, state, step: int) -> dict:
    """The refine window's statistics, read before growth (host floats)."""
    import torch

    count, grad2d = state["count"], state["grad2d"]
    seen = count > 0
    mean = grad2d[seen] / count[seen]  # [N_seen] mean |2D gradient| per pair, gsplat's grow statistic
    q = torch.tensor([0.1, 0.5, 0.9, 0.99])
    quant = torch.quantile(mean.double(), q.double()).tolist() if len(mean) else [0.0] * 4
    high = grad2d / count.clamp_min(1) > strategy.grow_grad2d
    small = torch.exp(params["scales"]).max(-1).values <= strategy.grow_scale3d * state["scene_scale"]
    opa = torch.sigmoid(params["opacities"].flatten())
    grads = grad2d / count.clamp_min(1)
    # what a threshold grow_grad2d x k would pass: the k at which another batch grows as many
    at = {f"{k:.2f}": int((grads > strategy.grow_grad2d * k).sum()) for k in THRESHOLD_FACTORS}
    return {"step": step, "n": len(count), "n_seen": int(seen.sum()), "pairs": float(count.sum()),
            "pairs_per_seen": float(count[seen].mean()) if seen.any() else 0.0,
            "grad_mean_of_means": float(mean.mean()) if len(mean) else 0.0,
            "grad_per_pair": float(grad2d.sum() / count.sum().clamp_min(1)),
            "grad_q10_50_90_99": quant, "n_high": int(high.sum()), "n_high_small": int((high & small).sum()),
            "n_high_large": int((high & ~small).sum()), "n_high_at_factor": at,
            "opacity_mean": float(opa.mean()), "opacity_below_prune": int((opa < strategy.prune_opa).sum())}


def one_run(argv: list, out_json: Path) -> None:
    """Child process: train argv's run, recording every refine step into out_json."""
    import torch  # noqa: F401

    from distsplat import cli
    from distsplat.train.model.strategies import DefaultStrategy

    log: list = []

    @dataclasses.dataclass
    class Recording(DefaultStrategy):
        def grow(self, params, optimizers, state, step):
            rec = _window(self, params, state, step)
            n_dupli, n_split = super().grow(params, optimizers, state, step)
            log.append({**rec, "dupli": n_dupli, "split": n_split})
            return n_dupli, n_split

        def _prune_gs(self, params, optimizers, state, step):
            n = super()._prune_gs(params, optimizers, state, step)
            log[-1].update(pruned=n, n_after=len(params["means"]))
            return n

    cfg = cli.parse(argv)
    s = cfg.strategy
    cfg.strategy = Recording(**{f.name: getattr(s, f.name) for f in dataclasses.fields(s)})
    cli.run(cfg)
    out_json.write_text(json.dumps(log))


def run(scene: str, batch: int, seed: int, images: int, eval_every: int, tmp: Path) -> dict:
    out = tmp / f"{scene}_b{batch}_s{seed}"
    cmd = command(scene, "default", batch, "visibility", images, eval_every, out)
    # after the subcommand; the trainer's own parser takes no viewer flag
    argv = [a for a in cmd[3:] if a != "--disable_viewer"] + ["--seed", str(seed)] + shlex.split(
        os.environ.get("EXTRA", ""))
    rec = tmp / f"{out.name}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), DISTSPLAT_NO_DOWNLOAD="1")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, __file__, "--one", rec, "default", *argv], cwd=REPO, env=env,
                       capture_output=True, text=True)
    entry = {"scene": scene, "global_batch": batch, "seed": seed, "images": images,
             "wall_s": round(time.perf_counter() - t0, 1), "argv": " ".join(["default", *argv])}
    if p.returncode != 0:
        return {**entry, "ok": False, "stderr_tail": p.stderr[-3000:]}
    curve = []
    for f in sorted((out / "stats").glob("val_step*.json")):
        s = json.loads(f.read_text())
        curve.append({"images": s["step"] * batch, "psnr": s["psnr"], "num_GS": s["num_GS"]})
    refines = json.loads(rec.read_text())
    for r in refines:
        r["images"] = (r["step"] + 1) * batch  # images seen when the refine ran (after the step)
    print(f"{scene} B={batch} seed {seed}: PSNR {curve[-1]['psnr']:.3f}, {curve[-1]['num_GS']} Gaussians, "
          f"grown {sum(r['dupli'] + r['split'] for r in refines)}, pruned {sum(r['pruned'] for r in refines)} "
          f"({entry['wall_s']} s)", flush=True)
    return {**entry, "ok": True, "psnr": curve[-1]["psnr"], "num_GS": curve[-1]["num_GS"], "curve": curve,
            "refines": refines}


def main() -> None:
    scene = os.environ.get("SCENE", "builtin")
    batches = [int(b) for b in os.environ.get("BATCHES", "1 16").split()]
    seeds = [int(s) for s in os.environ.get("SEEDS", "42").split()]
    images, eval_every = int(os.environ.get("IMAGES", "960")), int(os.environ.get("EVAL_EVERY", "96"))
    name = os.environ.get("NAME", f"densify_stats_{scene}")
    runs = []
    if os.environ.get("RESUME"):
        runs = [r for r in json.loads(Path(os.environ["RESUME"]).read_text())["runs"] if r["ok"]]
    done = {(r["global_batch"], r["seed"]) for r in runs}
    jobs = [(b, s) for s in seeds for b in batches if (b, s) not in done]
    lock = Lock()

    def save() -> Path:
        return write_result(name, {
            "command": "python benchmarks/studies/batch_quality/densify_stats.py" + "".join(
                f" {k}={shlex.quote(os.environ[k])}" for k in ("SCENE", "BATCHES", "SEEDS", "IMAGES", "EVAL_EVERY",
                                                               "EXTRA", "FACTOR") if k in os.environ),
            "note": ("CPU, torch backend, one process per run at --batch_size B (the global batch), "
                     "--schedule_in_images, batch_quality.py's schedule in images; every refine step's window "
                     "statistics read before growth (grad2d / count over the Gaussians seen: gsplat's grow "
                     "statistic; pairs: sum of count), then what growth and pruning did. images: seen when the "
                     "refine step ran."),
            "scene": scene, "images": images, "extra_flags": os.environ.get("EXTRA", ""),
            "runs": sorted(runs, key=lambda r: (r["seed"], r["global_batch"]))})

    def job(j):
        r = run(scene, j[0], j[1], images, eval_every, Path(tmp))
        with lock:  # checkpoint: every finished run is in the file
            runs.append(r)
            save()

    with tempfile.TemporaryDirectory(prefix="densify_stats_") as tmp, \
            ThreadPoolExecutor(int(os.environ.get("PARALLEL", "2"))) as pool:
        list(pool.map(job, jobs))
    print(f"densify_stats: wrote {save()}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        one_run(sys.argv[3:], Path(sys.argv[2]))
    else:
        main()
