"""One training step of distsplat's trainer at W = 1 against one step of gsplat's own
trainer, on the same real scene with the same number of steps (issue 14): both as their
users run them, timed the same way.

    ours    `Trainer.train_step` with the trainer's defaults (packed, fused-ssim when it is
            installed on a GPU, torch's fused Adam on CUDA, the divergence check, densification
            bookkeeping, its image loader and cache).
    gsplat  gsplat 1.5.3's examples/simple_trainer.py `default` with its defaults (packed=False,
            fused-ssim, its Adam, DataLoader and per-step loss.item()), in a process of its own
            (gsplat_peer.py's probe mode: its loop is timed from its own iteration; nothing of
            gsplat's is changed).

Steps 0..WARMUP-1 are warm-up; steps WARMUP..WARMUP+REPS-1 are timed one by one, the device
synchronized before and after each (gsplat's loss.item() synchronizes every step anyway); the
next STEP_PROFILE_STEPS run under torch.profiler: ours per range of the step
(benchmarks/step_ranges.py: train/batch ... train/densify and the distributed render's
distsplat/* ranges; CUDA kernel time per range on a GPU, host time on a CPU), gsplat's per step
with its kernels. Both get --sh_degree_interval SH_INTERVAL (1: SH degree 3 from step 3, as most
of a run; gsplat's and our default is 1000), nothing else that differs from the defaults but
the run's length and no eval or save inside the measured steps. The scene: SCENE, a COLMAP
folder (default $DISTSPLAT_DATA/thermos) at DATA_FACTOR (1: 946x532).

    python benchmarks/bench_step_vs_gsplat.py
Environment: SCENE, DATA_FACTOR (1), WARMUP (10), REPS (50), STEP_PROFILE_STEPS (10), SH_INTERVAL (1),
PEER_TIMEOUT_S (140: gsplat's run is cut there and reported failed, our side still written),
GSPLAT_PEER (gsplat's peer folder, default <repo>/.gsplat_peer, scripts/prepare_gsplat_peer.sh),
FAKE_GSPLAT=1 (no GPU: ours on the CPU with the torch backend, gsplat's side a stand-in peer
loop (gsplat_peer.write_standin), to check this script's plumbing; the numbers then mean
nothing; SCENE=builtin then trains the built-in synthetic scene), SCENE_NAME (the scene's name
in the result's: default the SCENE folder's name, `builtin` for the built-in scene). Writes
benchmarks/results/step_vs_gsplat_<cuda|fake>_<scene name>.json (one per scene: thermos,
garden...) and prints one summary line.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import step_ranges as sr  # noqa: E402
from benchmarks.common import gpu_or_plumbing, write_result  # noqa: E402
from benchmarks.paths import data_dir  # noqa: E402

TOP_KERNELS = 5


def scene_label(scene: str, scene_name: Optional[str] = None) -> str:
    """The scene's name in the result's: scene_name (SCENE_NAME), else the scene folder's name
    (`builtin` for the built-in scene), anything but letters, digits, `-` and `_` made `-`."""
    name = scene_name or ("builtin" if scene == "builtin" else Path(scene.rstrip("/")).name)
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")
    if not name:
        raise ValueError(f"no scene name in SCENE={scene!r}, SCENE_NAME={scene_name!r}")
    return name


def result_name(kind: str, label: str) -> str:
    """step_vs_gsplat_<cuda|fake>_<scene label>: each scene its own result."""
    return f"step_vs_gsplat_{kind}_{label}"


def ours_config(data_dir: Optional[str], data_factor: int, max_steps: int, sh_interval: int, result_dir: str):
    """The trainer's default config (what `simple_trainer.py default` parses) on the scene,
    for a run of max_steps with no eval, save or PLY inside it."""
    from benchmarks.procs import trainer_config

    cfg = trainer_config(result_dir, max_steps, data_dir, data_factor)
    cfg.sh_degree_interval = sh_interval
    return cfg


def run_ours(cfg, warmup: int, reps: int, profile: int, device: torch.device,
             keep_params: bool = False) -> Dict[str, Any]:
    """The trainer's own steps: warm-up, `reps` timed one by one, `profile` under the profiler
    (per range); with keep_params, the parameters after the last step."""
    from distsplat.distributed import init_distributed
    from distsplat.train.trainer import Trainer

    cfg.validate()
    trainer = Trainer(cfg, init_distributed(device=device))
    trainer.setup()
    try:
        for s in range(warmup):
            trainer.train_step(s)
        times = sr.timed_steps(trainer.train_step, range(warmup, warmup + reps), device)
        records, _ = sr.profile_steps(trainer.train_step, range(warmup + reps, warmup + reps + profile), device,
                                      kernels=True)
        adam = trainer.optimizers["means"].defaults
        out: Dict[str, Any] = {
            "step_ms": times, "median_step_ms": statistics.median(times) if times else None,
            "gaussians": trainer.n_all, "image": [trainer.width, trainer.height],
            "ssim_impl": trainer.ssim_impl, "packed": cfg.packed,
            "adam": "fused" if adam.get("fused") else ("foreach" if adam.get("foreach") else "default"),
            "backend": cfg.backend,
            "profiled": ranges_table(records, device) if records else {},
            "ranges_missing": sr.missing(records, sr.expected(1)) if records else [],
        }
        if keep_params:
            out["params"] = {k: v.detach().cpu().clone() for k, v in trainer.params.items()}
        return out
    finally:
        trainer.cleanup()


def ranges_table(records: List[Dict[str, Any]], device: torch.device) -> Dict[str, Any]:
    """Medians over the profiled steps: per range and per leaf, the step's time (ms), the host
    time and (CUDA) the kernel time; the top kernels of each leaf."""
    leaves = dict.fromkeys(leaf for r in records for leaf in r.get("kernels", {}))
    kernels = {leaf: mean_kernels([r.get("kernels", {}).get(leaf, {}) for r in records]) for leaf in leaves}
    return {
        "steps": len(records), "step_ms": statistics.median(r["step_ms"] for r in records),
        "ranges_ms": sr.medians(records, "ranges"), "leaves_ms": sr.medians(records, "leaves"),
        "leaves_cpu_ms": sr.medians(records, "cpu_ms"),
        **({"leaves_device_ms": sr.medians(records, "device_ms")} if device.type == "cuda" else {}),
        "top_kernels_ms": {leaf: top(ks, TOP_KERNELS) for leaf, ks in kernels.items()},
    }


def mean_kernels(steps: List[Dict[str, float]]) -> Dict[str, float]:
    """Per kernel, its mean ms per step over `steps` (0 in a step without it)."""
    out: Dict[str, float] = {}
    for ks in steps:
        for k, ms in ks.items():
            out[k] = out.get(k, 0.0) + ms / len(steps)
    return out


def top(ms: Dict[str, float], n: int) -> Dict[str, float]:
    return dict(sorted(ms.items(), key=lambda kv: -kv[1])[:n])


def run_gsplat(scene: str, data_factor: int, warmup: int, reps: int, profile: int, sh_interval: int,
               fake: bool) -> Dict[str, Any]:
    """gsplat's own trainer, `default`, in probe mode (gsplat_peer.run_probe); fake: a stand-in peer."""
    from benchmarks import gsplat_peer

    peer = gsplat_peer.write_standin(Path(tempfile.mkdtemp(prefix="standin_peer_"))) if fake else None
    if not fake and not (gsplat_peer.PEER / "BUILD.json").is_file():
        return {"skipped": f"no gsplat peer at {gsplat_peer.PEER}: make it with scripts/prepare_gsplat_peer.sh and "
                           "carry .gsplat_peer"}
    res = gsplat_peer.run_probe("default", scene, data_factor, tempfile.mkdtemp(prefix="peer_step_"), warmup, reps,
                                profile=profile, extra_args=["--sh_degree_interval", str(sh_interval)], peer=peer,
                                timeout_s=float(os.environ.get("PEER_TIMEOUT_S", 140)))
    if res.get("returncode") != 0:
        return {"failed": res}
    prof = res.get("profiled") or []
    if prof:
        res["profiled_summary"] = {
            "steps": len(prof), "step_ms": statistics.median(p["step_ms"] for p in prof),
            "cpu_ms": statistics.median(p["cpu_ms"] for p in prof),
            "device_ms": statistics.median(p["device_ms"] for p in prof),
            "top_kernels_ms": top(mean_kernels([p["kernels"] for p in prof]), 3 * TOP_KERNELS),
        }
        del res["profiled"]
    return res


def main() -> None:
    device, fake = gpu_or_plumbing("bench_step_vs_gsplat.py", "FAKE_GSPLAT")
    cuda = device.type == "cuda"
    scene = os.environ.get("SCENE", str(data_dir() / "thermos"))
    builtin = scene == "builtin"  # the trainer's synthetic scene: FAKE_GSPLAT's plumbing only
    if builtin and not fake:
        sys.exit("bench_step_vs_gsplat.py: SCENE=builtin is for FAKE_GSPLAT=1 only (gsplat's trainer reads COLMAP)")
    factor = int(os.environ.get("DATA_FACTOR", 1))
    label = scene_label(scene, os.environ.get("SCENE_NAME"))
    warmup, reps = int(os.environ.get("WARMUP", 10)), int(os.environ.get("REPS", 50))
    profile, sh_interval = int(os.environ.get("STEP_PROFILE_STEPS", 10)), int(os.environ.get("SH_INTERVAL", 1))
    n = warmup + reps + profile
    cfg = ours_config(None if builtin else scene, factor, n + 1, sh_interval,
                      tempfile.mkdtemp(prefix="step_vs_gsplat_"))
    if fake:
        cfg.backend = "torch"
    if builtin:
        scene = tempfile.mkdtemp(prefix="standin_scene_")  # the stand-in peer ignores it
    ours = run_ours(cfg, warmup, reps, profile, device)
    print(f"ours: median {ours['median_step_ms']:.2f} ms per step ({ours['gaussians']} Gaussians, "
          f"{ours['image'][0]}x{ours['image'][1]}, SSIM {ours['ssim_impl']}, Adam {ours['adam']})", flush=True)
    if cuda:
        torch.cuda.empty_cache()  # gsplat's process gets the device's memory
    theirs = run_gsplat(scene, factor, warmup, reps, profile, sh_interval, fake)
    ratio = (ours["median_step_ms"] / theirs["median_step_ms"]
             if theirs.get("median_step_ms") and ours["median_step_ms"] else None)
    payload = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu", "fake_gsplat": fake,
        "scene": scene, "scene_name": label, "data_factor": factor, "warmup": warmup, "reps": reps,
        "profile_steps": profile, "sh_degree_interval": sh_interval,
        "ours": ours, "gsplat": theirs, "ratio_ours_over_gsplat": ratio,
        "goal": "ours / gsplat <= 1.00 per training step (issue 14)",
        "note": ("Median of REPS steps (steps WARMUP.. of each run), each timed with the device synchronized before "
                 "and after: ours around Trainer.train_step, gsplat's between the starts of its loop's iterations "
                 "(gsplat_peer.py probe mode). Each trainer as its users run it, on the same scene and steps: ours "
                 "packed with fused-ssim and fused Adam, gsplat's simple_trainer default (packed=False, fused-ssim). "
                 "Per range (ours) and per step (gsplat): torch.profiler over STEP_PROFILE_STEPS further steps."),
    }
    path = write_result(result_name("fake" if fake else device.type, label), payload)
    gs = theirs.get("median_step_ms")
    gs_text = f"{gs:.2f} ms" if gs else f"NOT MEASURED ({theirs.get('skipped') or 'failed'})"
    print("step_vs_gsplat: ours {:.2f} ms, gsplat {} per step ({}){} -> {}".format(
        ours["median_step_ms"], gs_text,
        f"{ratio:.3f}x" if ratio else "no ratio",
        f"; ranges missing: {', '.join(ours['ranges_missing'])}" if ours["ranges_missing"] else "", path))


if __name__ == "__main__":
    main()
