"""Quality against the global batch at the same images seen (issue 30): does a W-times larger
global batch, run for W-times fewer steps, reach batch 1's PSNR?

Each run is the real CLI (`examples/simple_trainer.py default|mcmc`), one process with
`--batch_size B` (the global batch: the W-invariance tests show that the split of a global
batch over ranks does not change `default`'s training; MCMC draws per rank) and
`--schedule_in_images`, so every step number below is in images seen and divided by B:
the same images, the same refine/reset/SH schedule in images, the learning rates scaled by
`--lr_batch_scaling` (train/batch_scaling.py) and Adam's betas by the global batch
(train/gaussians.create_optimizers). The test cameras are scored every EVAL_EVERY images,
giving a PSNR-vs-images-seen curve per batch and rule.

    nice -n 5 python benchmarks/studies/batch_quality/batch_quality.py            # both scenes, both strategies
    SCENES=builtin STRATEGIES=default BATCHES="1 16" python benchmarks/studies/batch_quality/batch_quality.py

Environment (defaults): SCENES ("builtin thermos"), STRATEGIES ("default mcmc"), BATCHES
("1 4 16"), RULES ("visibility sqrt": each batch > 1 runs with each --lr_batch_scaling), IMAGES (960:
images seen by every run), EVAL_EVERY (96), PARALLEL (2 runs at once), FACTOR (16: thermos'
--data_factor), SCENE_DIR ($DISTSPLAT_DATA, default ../shared/data), NAME (batch_quality_cpu), EXTRA (flags added to
every run), REUSE (comma-separated earlier result files whose runs of the same scene, strategy,
batch, rule and IMAGES are taken instead of run again), REUSE_ONLY (1: run nothing, only gather
REUSE's runs into one file and plot). Writes benchmarks/results/$NAME.json
and $NAME.png (matplotlib: pip install -e ".[bench]")."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks.common import write_result  # noqa: E402
from benchmarks.paths import data_dir  # noqa: E402

REPO = Path(__file__).resolve().parents[3]

# The schedule in images seen (a batch-1 run's steps) for IMAGES = 960, every number a multiple
# of 16 so that each batch's steps are whole: gsplat's 30k-step shape (refine in the first half,
# an opacity reset, the SH degree raised 3 times in the first third) shrunk to a CPU-sized run
# whose Gaussians stay few enough for the torch backend at batch 16.
SCHEDULE = {"refine_start_iter": 48, "refine_stop_iter": 480, "refine_every": 96}
RESET_EVERY, SH_INTERVAL = 320, 96
CAP_MAX = {"builtin": 8000, "thermos": 16000}


def command(scene: str, strategy: str, batch: int, rule: str, images: int, eval_every: int, out: Path) -> list:
    evals = [str(i) for i in range(eval_every, images + 1, eval_every)]
    flags = []
    for k, v in SCHEDULE.items():
        flags += [f"--strategy.{k}", str(v)]
    flags += ["--strategy.reset_every", str(RESET_EVERY)] if strategy == "default" else \
             ["--strategy.cap_max", str(CAP_MAX[scene])]
    if scene == "builtin":
        data = []
    else:
        root = Path(os.environ.get("SCENE_DIR", data_dir()))
        data = ["--data_dir", str(root / scene), "--data_factor", os.environ.get("FACTOR", "16")]
    return [sys.executable, str(REPO / "examples" / "simple_trainer.py"), strategy,
            "--batch_size", str(batch), "--schedule_in_images", "--max_steps", str(images),
            "--eval_steps", *evals, "--save_steps", str(images), "--no-save-ply",
            "--sh_degree_interval", str(SH_INTERVAL), "--result_dir", str(out), "--disable_viewer",
            "--num_workers", "1", "--log_every", str(max(images // 4, 1)), "--lr_batch_scaling", rule,
            *flags, *data,
            *shlex.split(os.environ.get("EXTRA", ""))]


def run(scene: str, strategy: str, batch: int, rule: str, images: int, eval_every: int, tmp: Path) -> dict:
    out = tmp / f"{scene}_{strategy}_b{batch}_{rule}"
    cmd = command(scene, strategy, batch, rule, images, eval_every, out)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), DISTSPLAT_NO_DOWNLOAD="1")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = round(time.perf_counter() - t0, 1)
    entry = {"scene": scene, "strategy": strategy, "global_batch": batch, "lr_batch_scaling": rule,
             "images": images, "steps": images // batch, "wall_s": wall}
    if p.returncode != 0:
        return {**entry, "ok": False, "stderr_tail": p.stderr[-3000:]}
    curve = []
    for f in sorted((out / "stats").glob("val_step*.json")):
        s = json.loads(f.read_text())
        curve.append({"images": s["step"] * batch, "psnr": s["psnr"], "ssim": s["ssim"],
                      "lpips": s.get("lpips"), "num_GS": s["num_GS"]})
    curve.sort(key=lambda c: c["images"])
    last = curve[-1]
    lr_line = next((line for line in p.stderr.splitlines() if "learning rates x" in line), "")
    entry["lr_factor"] = float(lr_line.split("learning rates x ")[1].split()[0]) if lr_line else 1.0
    print(f"{scene} {strategy} B={batch} --lr_batch_scaling {rule}: PSNR {last['psnr']:.3f} SSIM {last['ssim']:.4f} "
          f"GS {last['num_GS']} ({wall} s)", flush=True)
    return {**entry, "ok": True, "psnr": last["psnr"], "ssim": last["ssim"], "lpips": last["lpips"],
            "num_GS": last["num_GS"], "curve": curve}


def key(r: dict) -> tuple:
    return r["scene"], r["strategy"], r["global_batch"], r["lr_batch_scaling"] if r["global_batch"] > 1 else None


def plot(runs: list, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("batch_quality: matplotlib is not installed (pip install -e '.[bench]'): no plot")
        return
    panels = sorted({(r["scene"], r["strategy"]) for r in runs if r["ok"]})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 3.6), squeeze=False)
    for ax, (scene, strategy) in zip(axes[0], panels):
        for r in sorted((r for r in runs if r["ok"] and (r["scene"], r["strategy"]) == (scene, strategy)),
                        key=lambda r: (r["global_batch"], r["lr_batch_scaling"] == "sqrt")):
            B, rule = r["global_batch"], r["lr_batch_scaling"]
            label = "batch 1" if B == 1 else f"batch {B}, lr x {r.get('lr_factor', 0):.3g} ({rule})"
            ax.plot([c["images"] for c in r["curve"]], [c["psnr"] for c in r["curve"]], marker=".",
                    linestyle="--" if B > 1 and rule == "sqrt" else "-", label=label)
        ax.set_title(f"{scene}, {strategy}")
        ax.set_xlabel("images seen")
        ax.set_ylabel("test PSNR (dB)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"batch_quality: wrote {path}")


def reused(files: str, images: int) -> dict:
    """Runs of earlier result files (REUSE), by key, that saw the same number of images."""
    out = {}
    for f in filter(None, files.split(",")):
        d = json.loads(Path(f).read_text())
        for r in d["runs"]:
            r = dict(r)
            if "lr_batch_scaling" not in r:  # runs of the rule before this flag: lr x sqrt(B)
                r["lr_batch_scaling"], r["lr_factor"] = "sqrt", r["global_batch"] ** 0.5
            if r["ok"] and r["images"] == images:
                out[key(r)] = r
    return out


def main() -> None:
    scenes = os.environ.get("SCENES", "builtin thermos").split()
    strategies = os.environ.get("STRATEGIES", "default mcmc").split()
    batches = [int(b) for b in os.environ.get("BATCHES", "1 4 16").split()]
    rules = os.environ.get("RULES", "visibility sqrt").split()
    images, eval_every = int(os.environ.get("IMAGES", "960")), int(os.environ.get("EVAL_EVERY", "96"))
    bad = [b for b in batches if images % b or eval_every % b or any(v % b for v in SCHEDULE.values())]
    if bad:
        sys.exit(f"batch_quality: IMAGES, EVAL_EVERY and the schedule must be multiples of every batch; not of {bad}")
    jobs = [(s, st, b, e) for s in scenes for st in strategies for b in batches for e in (rules if b > 1 else ["sqrt"])]
    done = reused(os.environ.get("REUSE", ""), images)
    todo = [j for j in jobs if key(dict(zip(("scene", "strategy", "global_batch", "lr_batch_scaling"), j))) not in done]
    if os.environ.get("REUSE_ONLY") == "1":  # only gather REUSE's runs into one file and plot
        todo = []
    with tempfile.TemporaryDirectory(prefix="batch_quality_") as tmp, \
            ThreadPoolExecutor(int(os.environ.get("PARALLEL", "2"))) as pool:
        runs = list(pool.map(lambda j: run(*j, images, eval_every, Path(tmp)), todo))
    runs = sorted(runs + [r for k, r in done.items() if k[:2] in {(s, st) for s in scenes for st in strategies}
                          and k[2] in batches], key=lambda r: (r["scene"], r["strategy"], r["global_batch"],
                                                              r["lr_batch_scaling"]))
    summary = {}
    for r in runs:
        ref = next((q for q in runs if q["ok"] and q["global_batch"] == 1 and q["scene"] == r["scene"]
                    and q["strategy"] == r["strategy"]), None)
        if r["ok"] and ref is not None:
            e = "" if r["global_batch"] == 1 else f"/{r['lr_batch_scaling']}"
            summary[f"{r['scene']}/{r['strategy']}/B{r['global_batch']}{e}"] = {
                "psnr": round(r["psnr"], 3), "psnr_minus_batch1": round(r["psnr"] - ref["psnr"], 3),
                "ssim": round(r["ssim"], 4), "num_GS": r["num_GS"]}
    name = os.environ.get("NAME", "batch_quality")
    path = write_result(name, {
        "command": "python benchmarks/studies/batch_quality/batch_quality.py" + "".join(
            f" {k}={shlex.quote(os.environ[k])}" for k in ("SCENES", "STRATEGIES", "BATCHES", "RULES", "IMAGES",
                                                           "EXTRA") if k in os.environ),
        "note": ("CPU, torch backend, one process per run at --batch_size B (the global batch) with "
                 "--schedule_in_images: every run sees the same number of images, the schedule in images: "
                 f"{SCHEDULE}, reset_every {RESET_EVERY}, sh_degree_interval {SH_INTERVAL}, cap_max {CAP_MAX}; "
                 "thermos at --data_factor " + os.environ.get("FACTOR", "16") + ". --lr_batch_scaling: visibility "
                 "(the default, lr x sqrt(B (1 + (B - 1) p)), p measured as training starts; lr_factor is what the run logged) "
                 "or sqrt (gsplat's and Grendel-GS's lr x sqrt(B), the rule before); Adam's betas as create_optimizers "
                 "scales them. PSNR/SSIM on the scene's test cameras; one seed per run."),
        "images": images, "eval_every": eval_every, "extra_flags": os.environ.get("EXTRA", ""),
        "summary": summary, "runs": runs,
    })
    plot(runs, path.with_suffix(".png"))  # beside its snapshot
    for k, v in summary.items():
        print(f"{k}: PSNR {v['psnr']:.3f} ({v['psnr_minus_batch1']:+.3f} vs batch 1), {v['num_GS']} Gaussians")


if __name__ == "__main__":
    main()
