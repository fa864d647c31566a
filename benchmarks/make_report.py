"""benchmarks/RESULTS.md and benchmarks/results/scaling.png, generated from the JSON in
benchmarks/results/ (nothing is measured here). Sections whose JSON is absent say so.

A result is a dated snapshot (`<name>_<device>_<date>.json`, benchmarks/results_index.py): each
section shows the newest of its name with its date, device and commit; results/archive/ (superseded
snapshots) is listed, not shown. Whether a number still holds is not judged here: the claims that
must keep holding are tests with golden values (tests/unit/test_claims.py).

    python benchmarks/make_report.py          # needs matplotlib for the plot: pip install -e ".[bench]"
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from benchmarks.results_index import ARCHIVE, parse, snapshots, newest  # noqa: E402

RESULTS = HERE / "results"
REPORT = HERE / "RESULTS.md"
PLOT = RESULTS / "scaling.png"


def load(name: str, device: Optional[str] = None, folder: Path = RESULTS) -> Optional[Dict[str, Any]]:
    """The newest snapshot of `name` (on `device`: a label such as `cpu2`, or `cpu` / `gpu`),
    with its file name under `_file`; None when there is none."""
    path = newest(name, device, folder)
    if path is None:
        return None
    d = json.loads(path.read_text())
    d["_file"] = path.relative_to(RESULTS).as_posix()
    return d


def src(d: Dict[str, Any]) -> str:
    """The snapshot a number comes from, as the report names it."""
    return f"`{d.get('_file') or str(d.get('benchmark', '?')) + '.json'}`"  # a record not read by load()


def md_table(head: List[str], rows: List[List[Any]]) -> str:
    cell = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(out)


def provenance(d: Dict[str, Any]) -> str:
    m = d.get("machine", {})
    load_avg = m.get("load_avg_1_5_15min")
    return (f"_`{d.get('command', '?')}` at commit `{d.get('commit', '?')}`, {d.get('date', '?')}; "
            f"{m.get('host_cpu', '?')}, {m.get('cpu_count', '?')} cores, torch {m.get('torch', '?')}, "
            f"GPU: {m.get('gpu') or 'none'}"
            + (f"; load average at the end {load_avg[0]} / {load_avg[1]} / {load_avg[2]} (1/5/15 min)" if load_avg else "")
            + f"; snapshot {src(d)}._")


def section_smoke(d) -> str:
    if d is None:
        return "## CPU smoke run\n\nNo `cpu_smoke_*.json` yet: `bash benchmarks/cpu_smoke.sh`.\n"
    rows = []
    for r in d["runs"]:
        if not r["ok"]:
            rows.append([r["run"], "missing"] + ["-"] * 6)
            continue
        rows.append([r["run"], r["step"], f"{r['psnr']:.2f}", f"{r['ssim']:.3f}", f"{r['train_s']:.0f}",
                     r["num_GS"], "/".join(str(x) for x in r["num_GS_per_rank"]),
                     "/".join(f"{x:.2f}" for x in r["mem_gb_per_rank"])])
    return ("## CPU smoke run (`cpu_smoke.sh`)\n\n" + d.get("note", "") + "\n\n"
            + md_table(["run", "step", "PSNR", "SSIM", "train s", "num_GS", "GS/rank", "peak RSS GiB/rank"], rows)
            + "\n\n" + provenance(d) + "\n")


def section_step_ops(after, before=None) -> str:
    """What a training step dispatches (step_ops.py); against an older snapshot when given one."""
    if after is None:
        return "## What a training step dispatches\n\nNo `step_ops_*.json` yet: `python benchmarks/studies/steps/step_ops.py`.\n"
    rows = []
    for label, d in (("before", before), ("now", after)):
        if d is None:
            continue
        for scene, res in d["results"].items():
            for W, w in res["by_W"].items():
                r0 = w["ranks"]
                out_ops = lambda ph: max(sum(v for k, v in r["ops"][ph].items() if k != "torch_backend") for r in r0)  # noqa: E731
                sorts = max(sum(v for k, v in r["sorts"].items() if k != "torch_backend") for r in r0)
                f64 = max(sum(v for k, v in r["float64"].items() if k != "torch_backend") for r in r0)
                reads = max(sum(v for k, v in r["host_reads"].items() if "torch_backend.py" not in k) for r in r0)
                added = res.get("added_by_distribution", {}).get(f"W{W}_minus_W1")
                plus = "" if added is None else f"+{added['forward_ops']['total'] + added['backward_ops']['total']:g}"
                rows.append([label, scene, W, f"{out_ops('forward'):g}", f"{out_ops('backward'):g}",
                             f"{out_ops('update'):g}", plus, f"{sorts:g}", f"{f64:g}", f"{reads:g}",
                             f"{w['step_ms_median_max_rank']:.0f}"])
    return ("## What a training step dispatches (`step_ops.py`)" + "\n\n"
            "Aten ops of one `Trainer.train_step` outside the CPU-only torch backend (the projection and "
            "rasterizer a GPU runs as a few gsplat kernels), per phase, on the busiest rank; `added` is what "
            "distribution adds to forward + backward against W = 1 with the same cameras per rank; sorts, "
            "float64 ops and host reads of tensor values outside the torch backend (the image loader's numpy "
            "view of its own pinned host buffer, a third of the steps here, is one: no device is read); the CPU step time "
            "(slowest rank's median, ms; the CPU backend renders, so it says nothing about a GPU)."
            + (f" `before`: {src(before)} (commit `{before['commit']}`)." if before else "") + "\n\n"
            + md_table(["", "scene", "W", "forward", "backward", "update", "added", "sorts", "float64",
                        "host reads", "step ms"], rows) + "\n\n" + provenance(after) + "\n")


def section_gsplat(cpu, gpu) -> str:
    out = ["## distsplat W = 1 vs gsplat (`bench_vs_gsplat.py`)", ""]
    for d in (gpu, cpu):
        if d is None:
            continue
        s = d["scene"]
        out += [f"**{d['device']}** ({s['gaussians']} Gaussians, {s['width']}x{s['height']}, {s['cameras']} camera(s), "
                f"SH {s['sh_degree']}): {d['status']}.", ""]
        out.append(md_table(["run", "fwd ms", "bwd ms", "fwd+bwd ms", "fwd+bwd CPU ms"],
                            [[k, f"{v['fwd_ms']:.1f}", f"{v['bwd_ms']:.1f}", f"{v['fwd_bwd_ms']:.1f}",
                              f"{v['fwd_bwd_cpu_ms']:.1f}" if "fwd_bwd_cpu_ms" in v else "-"]
                             for k, v in d["runs"].items()]))
        out += ["", "Ratios: " + ", ".join(f"`{k}` = {v:.3f}" for k, v in d["ratios"].items()) + ".", "",
                d.get("note", ""), "", provenance(d), ""]
    if gpu is None:
        out += ["GPU comparison (goal: `ours_w1 / gsplat <= 1.00`): **pending**, no GPU run yet "
                "(`python benchmarks/bench_vs_gsplat.py` on a CUDA machine).", ""]
    return "\n".join(out)


def headline(quick, vs_cpu, vs_gpu, gpu_model=None) -> List[str]:
    """The measured numbers people ask for, each with where it comes from. The one model
    prediction headlined is the GPU-timed scaling (scaling_gpu), labelled as such."""
    out = ["## Headline (measured, except the line labelled a prediction)", ""]
    if quick is not None:
        out.append(f"- README quick start ({src(quick)}, {quick['date'][:10]}): 2 CPU ranks, 600 steps, "
                   f"PSNR {quick['psnr']:.2f} dB, SSIM {quick['ssim']:.3f}, {quick['wall_s']:.0f} s launch to exit.")
    cap = []
    for strategy, ours, peer, _ in capture_runs():
        ps = peer["summary"]
        cap.append(f"`{strategy}` PSNR {ours['psnr']:.2f} vs {ps['psnr']:.2f} dB, training "
                   f"{ours['elapsed']:.1f} vs {ps['train_seconds']:.1f} s")
    if cap:
        out.append("- thermos (946x532), 7000 steps on one GPU, distsplat W = 1 vs gsplat's own trainer in the "
                   "same call: " + "; ".join(cap) + ".")
    if vs_gpu is not None:
        out.append("- distsplat W = 1 / gsplat.rasterization (GPU, fwd+bwd): "
                   + ", ".join(f"`{k}` {v:.3f}" for k, v in vs_gpu["ratios"].items()) + ".")
    else:
        out.append("- distsplat W = 1 / gsplat.rasterization on GPU: **pending** (no GPU run yet).")
    if vs_cpu is not None:
        r = vs_cpu["ratios"]
        out.append(f"- CPU: distributed layer at W = 1 vs the one-process render "
                   f"{r['ours_w1_over_ours_render_torch']:.3f}x; our torch projection vs gsplat's pure-torch "
                   f"projection {r['ours_project_over_gsplat_torch_project']:.3f}x (fwd+bwd).")
    if gpu_model is not None and gpu_rows(gpu_model):
        out.append("- " + gpu_headline(gpu_model))
    else:
        out.append("- Multi-GPU speedup: **not measured** (no GPU-timed scaling run yet).")
    return out + [""]


def capture_runs() -> List[Any]:
    """(strategy, ours, gsplat's peer, ours re-run or None) of the thermos 7000-step GPU
    runs, for the strategies where both trainers' records exist."""
    out = []
    for strategy in ("default", "mcmc"):
        run = lambda name: load(name, folder=RESULTS / "runs")  # noqa: E731  (scripts/gpu_validate.sh's records)
        ours, peer = run(f"{strategy}_thermos_7000"), load(f"gsplat_peer_{strategy}")
        if ours is not None and peer is not None:
            out.append((strategy, ours, peer, run(f"{strategy}_thermos_7000_rerun")))
    return out


def section_capture_gpu() -> Optional[str]:
    """distsplat's trainer against gsplat's own on the real capture, one GPU, same call."""
    rows, lines = [], []
    for strategy, ours, peer, rerun in capture_runs():
        ps = peer["summary"]
        rows.append([strategy, "distsplat W=1", f"{ours['psnr']:.2f}", f"{ours['ssim']:.4f}",
                     ours["num_GS"], f"{ours['elapsed']:.1f}", f"{ours['peak_gpu_mem_gib']:.2f}", f"`{ours['commit'][:7]}`"])
        def peer_row(label: str, d: Dict[str, Any]) -> List[Any]:
            q = d["summary"]
            return [strategy, label, f"{q['psnr']:.2f}", f"{q['ssim']:.4f}", q["num_GS"],
                    f"{q['train_seconds']:.1f}", f"{q['peak_mem_allocated_GiB']:.2f}", "(peer)"]

        rows.append(peer_row("gsplat 1.5.3 simple_trainer", peer))
        fixed = load(f"gsplat_peer_{strategy}_reset")  # PEER_RESET=1: gsplat with the opacity reset repaired
        if fixed is not None:
            fs = fixed["summary"]
            rows.append(peer_row("gsplat 1.5.3 simple_trainer, opacity reset repaired (PEER_RESET=1)", fixed))
        if rerun is not None:
            rows.append([strategy, "distsplat W=1, re-run (another machine start)",
                         f"{rerun['psnr']:.2f}", f"{rerun['ssim']:.4f}", rerun["num_GS"], f"{rerun['elapsed']:.1f}",
                         f"{rerun['peak_gpu_mem_gib']:.2f}", f"`{rerun['commit'][:7]}`"])
        lines.append(f"- {strategy}: PSNR {ours['psnr'] - ps['psnr']:+.2f} dB against gsplat's trainer (goal: within "
                     f"0.2 dB), training time {ours['elapsed'] / ps['train_seconds']:.2f}x gsplat's (goal: <= 1.00)."
                     + (f" Against gsplat with the opacity reset repaired (the schedule ours runs): PSNR "
                        f"{ours['psnr'] - fs['psnr']:+.2f} dB, training time {ours['elapsed'] / fs['train_seconds']:.2f}x."
                        if fixed is not None else ""))
    if not rows:
        return None
    m = load("gsplat_peer_default")["machine"]
    out = ["## Training on a real capture, one GPU: distsplat against gsplat's own trainer", "",
           "thermos (`../shared/data/thermos`, 946x532, 88 train / 13 test images, the same split for both), "
           "7000 steps, W = 1, each trainer's defaults, `--cache gpu` for distsplat. gsplat's "
           "`examples/simple_trainer.py` ran as a peer (`benchmarks/gsplat_peer.py`: its own code unchanged, "
           "LPIPS stubbed offline). Training time: distsplat's `elapsed` and gsplat's `ellipse_time`, both "
           "from the first step to the last (no setup, no eval). Peak memory: torch's max allocated. gsplat 1.5.3's "
           "DefaultStrategy never resets opacities (its test `step % reset_every == 0 & step > 0` is never true); "
           "distsplat's does, every 3000 steps as gsplat intends, so a `default` row of gsplat's trainer with "
           "that reset repaired (`PEER_RESET=1`) is the matched comparison when present.", "",
           md_table(["strategy", "trainer", "PSNR", "SSIM", "Gaussians", "train s", "peak GiB", "commit"], rows), "",
           f"GPU: {m.get('gpu')}, torch {m.get('torch')}, CUDA {m.get('cuda')}. Rows of one strategy without "
           "'re-run' come from the same device call (the same machine); the re-run, on another start of a "
           "machine of the same kind, shows the spread between machine starts.", ""] + lines + [""]
    prof = load("profile_gpu_cuda")
    if prof is not None:
        t = prof["trainer"]
        out += [f"Data wait (host time inside the image loader's next() / step time, {prof['trainer'][next(iter(t))]['steps']} "
                f"steps after warm-up, `profile_gpu.py`; goal < 1% with `decoded` or `gpu`): "
                + ", ".join(f"`{c}` {100 * r['data_wait_share']:.1f}% of {r['step_ms']:.1f} ms" for c, r in t.items())
                + f" ({t[next(iter(t))]['gaussians']} Gaussians: early-training scene sizes, where the step is "
                "bound by the host launching kernels).", ""]
    tests = load("tests_cuda")
    if tests is not None:
        sm = tests["summary"]
        out += [f"`tests/cuda` on {tests['machine'].get('gpu')}: {sm['passed']} passed, "
                f"{sm['failed']} failed, {sm['skipped']} skipped (skips forbidden), commit `{tests['commit'][:7]}`.", ""]
    return "\n".join(out)


def gpu_rows(d) -> Dict[Any, Dict[str, Any]]:
    return {(r["W"], r["batch_per_rank"]): r for r in d["results"] if "speedup" in r["predicted"]["ours"]["nvlink_h100"]}


def gpu_headline(d) -> str:
    """One line: the predicted 4-GPU throughput speedups (ours and gsplat's), what they assume."""
    rows = gpu_rows(d)
    W = 4 if any(k[0] == 4 for k in rows) else max(k[0] for k in rows)
    parts = []
    for b in sorted({k[1] for k in rows if k[0] == W}, reverse=True):
        p = rows[(W, b)]["predicted"]
        parts.append(f"batch {b} per rank: **{p['ours']['nvlink_h100']['speedup']:.2f}x with NVLink**, "
                     f"{p['ours']['pcie4']['speedup']:.2f}x over PCIe 4.0 (gsplat's distributed mode, same "
                     f"kernels: {p['gsplat']['nvlink_h100']['speedup']:.2f}x / {p['gsplat']['pcie4']['speedup']:.2f}x)")
    a = d["anchors"]
    return (f"{W}-GPU speedup, **a prediction** (not measured on {W} GPUs; {src(d)}): "
            f"each rank's {'step timed by range' if d.get('stages') else 'stages timed'} on one {d['device']} ({d['scene']['gaussians']:,} Gaussians, "
            f"{d['scene']['width']}x{d['scene']['height']}), exchange priced from stated link figures: "
            + "; ".join(parts) + f". Published: gsplat docs {a['gsplat_docs_4gpu']['speedup']}x (4 GPUs), "
            f"Grendel-GS {a['grendel_4xA100_bs4']['speedup']}x (4xA100, batch 4). Largest uncertainty: "
            + d["largest_uncertainty"].split(". ")[0] + "." + STALE_STAGES * (not d.get("stages"))
            + " Details in the GPU-timed scaling section.")


# What is known against a prediction whose stages were timed by a re-implementation (before
# scaling_gpu.py timed the trainer's own step by range): its loss was the convolution SSIM on every
# virtual rank, per-image work that divides by W, where the trainer runs fused-ssim on a GPU.
STALE_STAGES = (" **Inflated**: that step re-implemented the loss with the convolution SSIM on every virtual "
                "rank, which the trainer no longer runs on a GPU (fused-ssim), so the per-image work that "
                "divides by W was overstated; `scaling_gpu.py` now times the trainer's own step, not re-run yet.")


def section_gpu_model(d) -> str:
    """The GPU-timed scaling prediction: per W and batch, stage times, bytes, predicted speedups."""
    if d is None or not gpu_rows(d):
        return ""
    out = ["## GPU-timed scaling prediction (`scaling_gpu.py`)", "",
           f"A prediction, not a multi-GPU measurement. {d['timing']}. Scene: {d['scene']['source']}. "
           f"Model: `{d['model']['step']}`; {d['model']['exchange']}; speedup {d['model']['speedup']}.", ""]
    rows = []
    for (W, b), r in sorted(gpu_rows(d).items(), key=lambda kv: (kv[0][1], kv[0][0])):
        p = r["predicted"]
        # compute_only_step_ms is the mean of the steps' makespans; the makespan of the ranks' medians
        # and the ratio are recorded since the configurations run shuffled (older results: "-")
        rows.append([W, b, f"{r['compute_only_step_ms']:.1f}",
                     f"{r['makespan_of_medians_ms']:.1f}" if r.get("makespan_of_medians_ms") is not None else "-",
                     f"{r['imbalance']:.3f}" if r.get("imbalance") is not None else "-",
                     f"{p['ours']['nvlink_h100']['step_ms']:.1f}",
                     f"{max(r['bytes_sent']) / 1e6:.1f}", f"{r['speedup_compute_only']:.2f}",
                     f"{p['ours']['nvlink_h100']['speedup']:.2f}", f"{p['ours']['pcie5']['speedup']:.2f}",
                     f"{p['ours']['pcie4']['speedup']:.2f}", f"{p['gsplat']['nvlink_h100']['speedup']:.2f}",
                     f"{p['gsplat']['pcie4']['speedup']:.2f}"])
    out.append(md_table(["W", "batch/rank", "compute ms (mean of step makespans)", "makespan of medians ms",
                         "imbalance", "NVLink step ms", "MB sent (busiest rank)",
                         "compute-only speedup", "ours NVLink", "ours PCIe 5", "ours PCIe 4", "gsplat NVLink",
                         "gsplat PCIe 4"], rows))
    if d["model"].get("makespans"):
        out += ["", f"Makespans: {d['model']['makespans']}."]
    if d.get("order"):
        o = d["order"]
        out += ["", f"Order (seed {o['seed']}): " + ", ".join(f"W={W} b={b}" for W, b in o["ran"])
                + f"; {d['model']['order']}."
                + (f" Speedups not computed: {'; '.join(d['speedups_missing'])}." if d.get("speedups_missing") else "")]
    # scaling_gpu names its stages (the trainer's ranges, step_ranges.py); older ones had these
    stages = d.get("stages") or ["activate", "project", "pack", "exchange_copy_fwd", "unpack", "raster_fwd", "loss_fwd",
                                 "raster_bwd", "exchange_copy_bwd", "project_bwd", "adam", "densify"]
    srows = []
    for (W, b), r in sorted(gpu_rows(d).items(), key=lambda kv: (kv[0][1], kv[0][0])):
        slow = max(r["per_rank_ms"], key=lambda s: s["A"] + s["B"] + s["C"])
        srows.append([W, b] + [f"{slow.get(k, 0.0):.2f}" for k in stages])
    missing = sorted({m for r in gpu_rows(d).values() if r["W"] > 1 for m in r.get("ranges_missing", [])})
    out += ["", "Stage times (ms) of the slowest rank (median over the timed steps):", "",
            md_table(["W", "batch"] + stages, srows), ""]
    if missing:
        out += [f"Ranges the distributed render did not mark in this run (their time is in train/render:other or "
                f"train/backward): {', '.join(missing)}.", ""]
    out += [f"Exchange per step: ours {d['ours']['forward_collectives']} + {d['ours']['backward_collectives']} "
            f"collectives, {gpu_rows(d)[next(iter(gpu_rows(d)))]['bytes_per_pair']} B per pair each way; gsplat "
            f"{d['gsplat']['forward_collectives']} + {d['gsplat']['backward_collectives']} collectives, "
            f"{d['gsplat']['bytes_per_pair_forward']} B per pair forward, {d['gsplat']['bytes_per_pair_backward']} B "
            f"back ({d['gsplat']['source']}).", "", "Published anchors:", ""]
    out += [f"- {v['speedup']}x: {v['source']}" for v in d["anchors"].values()]
    out += ["", "Links (stated figures, not measured here):", ""]
    out += [f"- `{k}`: {v['bandwidth_Bps'] / 1e9:g} GB/s, {1e6 * v['latency_s']:g} us per collective: {v['source']}"
            for k, v in d["links"].items()]
    out += ["", "Assumptions:", ""] + [f"- {a}" for a in d["assumptions"]]
    out += ["", f"Largest uncertainty: {d['largest_uncertainty']}"]
    if d.get("truncated"):
        out += ["", f"Truncated run: {'; '.join(d['truncated'])}."]
    out += ["", provenance(d), ""]
    return "\n".join(out)


def section_batch_quality(d, gpu_model=None) -> str:
    """Quality against the global batch at the same images seen, and the time to quality it
    predicts for 4 GPUs (joined with the GPU-timed step, when there is one)."""
    if d is None:
        return ""
    out = ["## Quality against the global batch (`batch_quality.py`)", "", d["note"], ""]
    rows = []
    for k, v in d["summary"].items():
        scene, strategy, batch = k.split("/")[:3]
        rule = k.split("/")[3] if k.count("/") == 3 else "-"
        run = next(r for r in d["runs"] if r["ok"] and (r["scene"], r["strategy"], f"B{r['global_batch']}") ==
                   (scene, strategy, batch) and (rule == "-" or r.get("lr_batch_scaling") == rule))
        rows.append([scene, strategy, batch[1:], rule, f"{run.get('lr_factor', 1):.3g}", run["steps"],
                     f"{v['psnr']:.2f}", f"{v['psnr_minus_batch1']:+.2f}", f"{v['ssim']:.3f}", v["num_GS"]])
    out += [md_table(["scene", "strategy", "global batch", "--lr_batch_scaling", "lr x", "steps", "PSNR",
                      "vs batch 1", "SSIM", "Gaussians"], rows), "",
            f"![batch quality](results/{Path(d['_file']).with_suffix('.png').as_posix()})", ""]
    rows_gpu = gpu_rows(gpu_model) if gpu_model is not None else {}
    if (1, 1) in rows_gpu and (4, 4) in rows_gpu:
        one = rows_gpu[(1, 1)]["predicted"]["ours"]["nvlink_h100"]["step_ms"]
        lines = []
        for b in (1, 4):
            if (4, b) in rows_gpu:
                step = rows_gpu[(4, b)]["predicted"]["ours"]["nvlink_h100"]["step_ms"]
                lines.append(f"4 GPUs x batch {b} (global {4 * b}): {one:.1f} ms per image on 1 GPU against "
                             f"{step / (4 * b):.2f} ms per image, **{one * 4 * b / step:.2f}x sooner**")
        out += ["**Time to quality, a prediction**: if a global batch reaches batch 1's PSNR at the same images "
                "seen (the table above: where it falls short, more images are needed and the gain shrinks), "
                "4 GPUs reach the 1-GPU 7k-step PSNR in the 1-GPU time divided by the images-per-second gain "
                f"of the GPU-timed step ({src(gpu_model)}, NVLink): " + "; ".join(lines)
                + ". Published: gsplat 3.12x (4 GPUs, `--steps_scaler 0.25`, whole run), Grendel-GS 4.07x "
                "(throughput, 4xA100, batch 4). Assumes the CPU study's batch behaviour carries to thermos at full "
                "size and 7k steps, and the GPU step as last timed." + STALE_STAGES * (not gpu_model.get("stages")), ""]
    out += [provenance(d), ""]
    return "\n".join(out)


def section_files() -> str:
    """The newest snapshot of each name and device, and what else the folder holds."""
    rows = []
    for folder in (RESULTS, RESULTS / "runs"):
        latest = {parse(p)[:2]: p for p in snapshots(folder)}
        for (name, device), path in sorted(latest.items()):
            d = json.loads(path.read_text())
            older = len(snapshots(folder, name, device)) - 1 + len(
                [p for p in snapshots(folder / ARCHIVE, name, device)])
            rows.append([f"`{path.relative_to(RESULTS).as_posix()}`", name, device, str(d.get("date", "?"))[:10],
                         f"`{str(d.get('commit') or d.get('git_commit') or '?')[:12]}`", older or ""])
    archived = sorted(p.name for p in (RESULTS / ARCHIVE).glob("*.json"))
    plain = sorted(p.relative_to(RESULTS).as_posix() for f in (RESULTS, RESULTS / "runs")
                   for p in f.glob("*.json") if parse(p) is None)
    out = ["## Result files", "",
           "Each result is a dated snapshot, `<name>_<device>_<date>.json` (what, where, when; the commit is "
           "inside), never edited: a rerun writes a new file. Shown: the newest of each name and device. "
           "Whether a number still holds is not judged from dates: the claims that must keep holding "
           "(quick-start PSNR, W = 1 equals W = 2, the exchange's collectives, memory per Gaussian) are "
           "tests with golden values, `tests/unit/test_claims.py`.", "",
           md_table(["file", "name", "device", "date", "commit", "older snapshots"], rows), ""]
    if archived:
        out += [f"`results/{ARCHIVE}/` (superseded snapshots and old comparisons, not shown above): "
                + ", ".join(f"`{n}`" for n in archived) + ".", ""]
    if plain:
        out += ["Records not yet filed under a dated name (`python benchmarks/results_index.py file PATH`), not "
                "shown above: " + ", ".join(f"`{n}`" for n in plain) + ".", ""]
    return "\n".join(out)


def plot(gpu_model) -> Optional[Path]:
    """The predicted GPU speedups of the GPU-timed scaling model (scaling_gpu), per link and
    per-rank batch."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("make_report: matplotlib is not installed (pip install -e '.[bench]'): no plot")
        return None
    fig, ax = plt.subplots(figsize=(6, 4.2))
    rows = gpu_rows(gpu_model) if gpu_model is not None else {}
    Ws = sorted({W for W, _ in rows}) or [1, 4]
    ax.plot(Ws, Ws, "k:", label="ideal (W x)")
    for b in sorted({b for _, b in rows}):
        for link, style in (("nvlink_h100", "o-"), ("pcie4", "s--")):
            pts = [(W, rows[(W, b)]["predicted"]["ours"][link]["speedup"]) for W in Ws if (W, b) in rows]
            ax.plot(*zip(*pts), style, label=f"predicted GPUs, {link}, batch {b} per rank")
    ax.set(xlabel="W (ranks)", ylabel="throughput speedup vs W=1", title="Speedup (images/s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_xticks(range(1, 1 + max(4, max(Ws))))
    fig.suptitle("distsplat scaling: GPU predictions (scaling_gpu: each rank's step timed on one GPU)", fontsize=10)
    fig.tight_layout()
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PLOT, dpi=110)
    return PLOT


def main() -> int:
    smoke = load("cpu_smoke")
    vs_cpu, vs_gpu = load("vs_gsplat", "cpu"), load("vs_gsplat", "gpu")
    gpu_model = load("scaling_gpu")
    quick = load("quickstart")
    png = plot(gpu_model)
    parts = [
        "# distsplat benchmark results",
        "",
        "Generated by `python benchmarks/make_report.py` from `benchmarks/results/*.json`; do not edit.",
        "Every number below was measured on the machine named under its table. Unless a table says "
        "GPU, that is a CPU-only machine: ranks are gloo processes sharing its cores and the renderer "
        "is the pure-PyTorch backend, so absolute times say nothing about GPUs. Multi-GPU figures are "
        "model predictions with the assumptions listed: "
        + ("from stages timed on one GPU (`scaling_gpu`). " if gpu_model is not None else "pending a GPU run. ") +
        "Each section shows the newest snapshot of its result, named under it with its date, device and "
        "commit (the result files are listed at the end); the claims that must keep holding are tests "
        "(`tests/unit/test_claims.py`).",
        "",
    ]
    parts += headline(quick, vs_cpu, vs_gpu, gpu_model)
    parts += [section_smoke(smoke), section_step_ops(load("step_ops", "cpu"))]
    parts += [section_gsplat(vs_cpu, vs_gpu)] + [s for s in [section_capture_gpu(), section_gpu_model(gpu_model)] if s]
    if png is not None:
        parts += [f"![scaling]({png.relative_to(HERE).as_posix()})", ""]
    parts += [section_batch_quality(load("batch_quality"), gpu_model)]
    parts += [section_files()]
    REPORT.write_text("\n".join(parts).rstrip() + "\n")
    plain = sorted(p.name for f in (RESULTS, RESULTS / "runs") for p in f.glob("*.json") if parse(p) is None)
    print(f"make_report: {REPORT.relative_to(HERE.parent)}" + (f", {png.relative_to(HERE.parent)}" if png else "")
          + (f"; not filed under a dated name: {', '.join(plain)}" if plain else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
