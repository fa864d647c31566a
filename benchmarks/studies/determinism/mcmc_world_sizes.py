"""MCMC at two world sizes, same global batch: does W=4 reach W=1's quality?

MCMC relocates and adds Gaussians within each rank (its multinomial draws come from the
rank's own RNG stream, the cap is split across ranks), so W ranks do not replay W=1
exactly; this measures instead whether they reach the same quality within seed noise.
Each run is the real CLI under torchrun (`examples/simple_trainer.py mcmc`), the global
batch held at GLOBAL_BATCH (per-rank --batch_size GLOBAL_BATCH / W), on the built-in
synthetic scene (or SCENE=thermos: $SCENE_DIR/thermos at --data_factor 4).

    nice -n 10 python benchmarks/studies/determinism/mcmc_world_sizes.py

Environment (defaults): WS ("1 4"), SEEDS ("0 1 2"), STEPS (200), GLOBAL_BATCH (4),
CAP_MAX (4500), SCENE (builtin), SCENE_DIR ($DISTSPLAT_DATA, default ../shared/data), NAME (mcmc_world_sizes),
STRATEGY (mcmc; `default` for the W-invariant strategy as a control: its runs differ only
by the batches the CLI draws on each W).
Writes benchmarks/results/$NAME.json and prints one summary line.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks.common import write_result  # noqa: E402
from benchmarks.paths import data_dir  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


def run(W: int, seed: int, steps: int, global_batch: int, cap: int, scene: str, out: Path,
        strategy: str = "mcmc") -> dict:
    refine = ["--strategy.refine_start_iter", str(steps // 5), "--strategy.refine_stop_iter", str(steps * 4 // 5),
              "--strategy.refine_every", str(max(steps // 10, 1))]
    refine += ["--strategy.cap_max", str(cap)] if strategy == "mcmc" else ["--strategy.reset_every", str(steps // 2)]
    if scene == "builtin":  # the random ball at its size when these results were recorded
        data = ["--synthetic.kind", "ball", "--synthetic.width", "64", "--synthetic.height", "48"]
    else:
        data = ["--data_dir", str(Path(os.environ.get("SCENE_DIR", data_dir())) / scene),
                "--data_factor", "4"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={W}",
           str(REPO / "examples" / "simple_trainer.py"), strategy, "--max_steps", str(steps),
           "--eval_steps", str(steps), "--save_steps", str(steps), "--no-save-ply", "--seed", str(seed),
           "--batch_size", str(global_batch // W), "--result_dir", str(out), "--disable_viewer",
           "--num_workers", "1", "--log_every", str(steps), "--tb_every", "1000000", *refine, *data]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        return {"W": W, "seed": seed, "ok": False, "stderr_tail": p.stderr[-2000:]}
    stats = json.loads((out / "stats" / f"val_step{steps:04d}.json").read_text())
    return {"W": W, "seed": seed, "ok": True, "steps": steps, "batch_size_per_rank": global_batch // W,
            "psnr": stats["psnr"], "ssim": stats["ssim"], "num_GS": stats["num_GS"], "wall_s": round(wall, 1),
            "load_avg_1min_after": round(os.getloadavg()[0], 2)}


def main() -> None:
    Ws = [int(w) for w in os.environ.get("WS", "1 4").split()]
    seeds = [int(s) for s in os.environ.get("SEEDS", "0 1 2").split()]
    steps = int(os.environ.get("STEPS", "200"))
    global_batch = int(os.environ.get("GLOBAL_BATCH", "4"))
    cap = int(os.environ.get("CAP_MAX", "4500"))
    scene = os.environ.get("SCENE", "builtin")
    strategy = os.environ.get("STRATEGY", "mcmc")
    name = os.environ.get("NAME", "mcmc_world_sizes")
    root = REPO / "results" / name
    runs = []
    for seed in seeds:
        for W in Ws:
            r = run(W, seed, steps, global_batch, cap, scene, root / f"W{W}_seed{seed}", strategy)
            print(json.dumps(r), flush=True)
            runs.append(r)
    summary = {}
    for W in Ws:
        ok = [r for r in runs if r["W"] == W and r["ok"]]
        if ok:
            ps = [r["psnr"] for r in ok]
            summary[f"W{W}"] = {"psnr_mean": statistics.mean(ps),
                                "psnr_std": statistics.stdev(ps) if len(ps) > 1 else None,
                                "ssim_mean": statistics.mean(r["ssim"] for r in ok),
                                "num_GS_mean": statistics.mean(r["num_GS"] for r in ok), "n": len(ok)}
    path = write_result(name, {
        "title": f"{strategy}, W in {Ws}, same global batch {global_batch}, {scene} scene, {steps} steps",
        "note": "CPU (gloo, torch backend) on a shared 2-core machine; each W run is a real torchrun of the "
                "CLI. Seeds change the init, batches and MCMC draws. PSNR/SSIM on the scene's test cameras.",
        "strategy": strategy, "scene": scene, "global_batch": global_batch, "cap_max": cap, "seeds": seeds, "runs": runs,
        "summary": summary,
    })
    print(f"{name}: " + "; ".join(f"{k} PSNR {v['psnr_mean']:.3f}±{v['psnr_std'] or 0:.3f} "
                                   f"num_GS {v['num_GS_mean']:.0f}" for k, v in summary.items()) + f" -> {path}")


if __name__ == "__main__":
    main()
