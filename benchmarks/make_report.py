"""benchmarks/RESULTS.md and benchmarks/results/scaling.png, generated from the JSON in
benchmarks/results/ (nothing is measured here). Sections whose JSON is absent say so.

    python benchmarks/make_report.py          # needs matplotlib for the plot: pip install -e ".[bench]"
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
REPORT = HERE / "RESULTS.md"
PLOT = RESULTS / "scaling.png"
PHASES = ("data", "project", "count_exchange", "payload_exchange", "rasterize", "loss",
          "backward", "optimizer", "densification", "other")


def load(name: str) -> Optional[Dict[str, Any]]:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


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
            + "._")


def section_smoke(d) -> str:
    if d is None:
        return "## CPU smoke run\n\nNo `cpu_smoke.json` yet: `bash benchmarks/cpu_smoke.sh`.\n"
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


def section_breakdown(d, device: str) -> str:
    if d is None:
        return (f"## Step breakdown ({device})\n\nNo `step_breakdown_{device}.json` yet: "
                f"`{'DEVICE=cuda ' if device == 'cuda' else ''}python benchmarks/step_breakdown.py`.\n")
    rows = []
    for r in d["results"]:
        ph = r["phase_ms_max_rank"]
        rows.append([r["W"], f"{r['plain_step_ms_median_max_rank']:.0f}"]
                    + [f"{ph[p]:.1f}" for p in PHASES]
                    + [f"{r['reverse_exchange_ms_max_rank']:.1f}", r["collectives_per_step"],
                       r["host_reads_per_step"], f"{r['bytes_sent_per_step_all_ranks'] / 1e6:.2f}"])
    scene = d["scene"]
    return (f"## Step breakdown ({device}, `step_breakdown.py`)\n\n"
            f"Scene: {json.dumps(scene)}. Milliseconds per step; per phase the slowest rank's median; "
            "`plain` is the uninstrumented step. `rev. x` is the reverse all-to-all inside backward. "
            "Collectives and host reads are per step on rank 0; MB is sent to other ranks by all ranks.\n\n"
            + d.get("note", "") + "\n\n"
            + md_table(["W", "plain"] + list(PHASES) + ["rev. x", "collectives", "host reads", "MB sent"], rows)
            + "\n\nHost reads per step by call site (rank 0, W = " + str(d["results"][-1]["W"]) + "): "
            + "; ".join(f"`{k}` x{v}" for k, v in d["results"][-1]["ranks"][0]["host_read_sites"].items())
            + ". Adam's `.item()` reads its step counter, a CPU tensor also in GPU runs (not a device "
            "sync); the two in `torch_backend.py` belong to the CPU backend (GPU runs use gsplat's "
            "kernels); `exchange.py` is the step's one designed host sync.\n\n" + provenance(d) + "\n")


def section_model(d) -> str:
    if d is None:
        return "## Scaling model\n\nNo `scaling_model.json` yet: `python benchmarks/scaling_model.py`.\n"
    out = ["## Scaling model (`scaling_model.py`)", "", d["note"], "",
           f"Model: `{d['model']['step']}`, `{d['model']['exchange']}`; {d['model']['makespan']}. "
           f"Batch: {d['batch']}.", "", "Assumptions:", ""]
    out += [f"- {a}" for a in d["assumptions"]]
    val = [r for r in d["results"] if "cpu_validation" in r]
    if val:
        out += ["", "### Validation against real gloo processes on this CPU", ""]
        rows = []
        for r in val:
            v = r["cpu_validation"]
            mb = v["gloo_microbenchmark"]
            rows.append([r["W"], f"{v.get('cores_got', v['cores']):.2f}", f"{v['measured_step_ms']:.0f}",
                         f"{v['predicted_step_ms']:.0f}", f"{v['error_pct']:+.1f}%",
                         f"{v['measured_cpu_ms_all_ranks']:.0f}" if "measured_cpu_ms_all_ranks" in v else "-",
                         f"{v['virtual_cpu_ms_all_ranks']:.0f}" if "virtual_cpu_ms_all_ranks" in v else "-",
                         f"{v['cpu_error_pct']:+.1f}%" if "cpu_error_pct" in v else "-",
                         f"{v['measured_speedup']:.2f}", f"{v['predicted_speedup']:.2f}",
                         f"{1e3 * mb['latency_s']:.2f}" if mb else "-",
                         f"{mb['bandwidth_4MiB_Bps'] / 1e9:.2f}" if mb else "-"])
        out.append(md_table(["W", "cores got", "measured step ms", "predicted step ms", "error",
                             "real CPU ms/step (all ranks)", "virtual CPU ms/step", "CPU work error",
                             "measured speedup", "predicted speedup", "gloo latency ms", "gloo GB/s"], rows))
        e = d["validation_abs_error_pct_W_gt_1"]
        if e["mean"] is not None:
            out += ["", f"Step time: mean |error| over W > 1 {e['mean']:.1f}% (max {e['max']:.1f}%)."]
        c = d.get("compute_validation_abs_error_pct", {})
        if c.get("mean") is not None:
            out += [f"CPU work per step (virtual ranks vs real processes): mean |error| {c['mean']:.1f}% "
                    f"(max {c['max']:.1f}%)."]
        out += ["", "`cores got`: the cores the W processes actually had (a spin in every rank, before "
                "and after the timed steps); the rest went to other users' processes on this shared machine."]
    out += ["", f"### Predicted GPU scaling (compute = CPU-measured / {d['gpu_factor']:g}, assumed)", ""]
    rows = []
    for r in d["results"]:
        g, v = r["gpu_prediction"], r["virtual"]
        rows.append([r["W"], f"{max(a + b + c for a, b, c in zip(v['A_ms'], v['B_ms'], v['C_ms'])):.0f}",
                     f"{sum(v['bytes_sent']) / 1e6:.2f}",
                     f"{g['nvlink']['step_ms']:.2f}", f"{g['nvlink']['exchange_ms']:.3f}", f"{g['speedup']['nvlink']:.2f}",
                     f"{g['pcie4']['step_ms']:.2f}", f"{g['pcie4']['exchange_ms']:.3f}", f"{g['speedup']['pcie4']:.2f}",
                     f"{g['speedup_compute_only']:.2f}"])
    out.append(md_table(["W", "CPU compute ms (slowest rank)", "MB sent/step", "NVLink step ms", "NVLink exch. ms",
                         "NVLink speedup", "PCIe step ms", "PCIe exch. ms", "PCIe speedup", "compute-only speedup"], rows))
    sweep = d.get("predicted_speedup_sweep_by_gpu_factor", {})
    if sweep:
        W = str(d["results"][-1]["W"])
        out += ["", f"Predicted {W}-rank speedup by the assumed GPU_FACTOR (how much faster a GPU runs a "
                "rank's compute than one CPU core runs the torch backend):", ""]
        out.append(md_table(["GPU_FACTOR", "NVLink", "PCIe 4.0"],
                            [[f, f"{s['nvlink'][W]:.2f}", f"{s['pcie4'][W]:.2f}"] for f, s in sweep.items()]))
    out += ["", provenance(d), ""]
    return "\n".join(out)


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


def headline(model, vs_cpu, vs_gpu, bd) -> List[str]:
    """The few numbers people ask for, each with where it comes from."""
    out = ["## Headline", ""]
    if model is not None:
        last = model["results"][-1]
        W, sp = last["W"], last["gpu_prediction"]["speedup"]
        e, c = model["validation_abs_error_pct_W_gt_1"], model.get("compute_validation_abs_error_pct", {})
        out.append(f"- **Predicted {W}-GPU throughput speedup** (model, not measured; 1 camera per rank, "
                   f"GPU_FACTOR {model['gpu_factor']:g} assumed): **{sp['nvlink']:.2f}x with NVLink, "
                   f"{sp['pcie4']:.2f}x over PCIe 4.0**; compute balance alone "
                   f"{last['gpu_prediction']['speedup_compute_only']:.2f}x. Scene: {json.dumps(model['scene'])}.")
        if max(sp.values()) > W:
            out.append(f"- Above the ideal {W}x means the W = 1 baseline's per-camera compute came out higher "
                       "than the W-rank run's (other cameras in its batches, and CPU time that varies with "
                       "other users' load): treat W as the ceiling and the excess as the model's noise here.")
        prev = load("scaling_model_earlier")
        if prev is not None:
            ps = prev["results"][-1]["gpu_prediction"]["speedup"]
            out.append(f"- The same command run earlier ({prev['date']}, `scaling_model_earlier.json`) predicted "
                       f"{ps['nvlink']:.2f}x / {ps['pcie4']:.2f}x: on this shared machine the spread between "
                       "runs (other users' load changes the CPU time of the same work, mostly the W = 1 "
                       "baseline) is larger than the exchange's effect; read the prediction as the range.")
        if e.get("mean") is not None:
            out.append(f"- Model vs real gloo processes on this CPU: step time |error| mean {e['mean']:.1f}% "
                       f"(max {e['max']:.1f}%) for W = 2..{W}"
                       + (f"; CPU work per step |error| mean {c['mean']:.1f}% (max {c['max']:.1f}%)" if c.get("mean") is not None else "")
                       + ".")
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
    if bd is not None and len(bd["results"]) > 1:
        r = bd["results"][-1]
        out.append(f"- Per step at W = {r['W']} (measured): {r['collectives_per_step']} collectives "
                   f"({', '.join(r['collectives_per_step_by_phase'])}), "
                   f"{r['bytes_sent_per_step_all_ranks'] / 1e6:.2f} MB sent by all ranks, "
                   f"{r['host_reads_per_step']} host reads of tensor values (by phase: "
                   f"{', '.join(f'{k} {v}' for k, v in r['host_reads_per_step_by_phase'].items())}).")
    return out + [""]


def plot(breakdown, model) -> Optional[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("make_report: matplotlib is not installed (pip install -e '.[bench]'): no plot")
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    if model is not None:
        val = [r for r in model["results"] if "cpu_validation" in r]
        if val:
            Ws = [r["W"] for r in val]
            ax1.plot(Ws, [r["cpu_validation"]["measured_step_ms"] for r in val], "o-",
                     label="measured: W gloo processes (CPU)")
            ax1.plot(Ws, [r["cpu_validation"]["predicted_step_ms"] for r in val], "s--",
                     label="model with the measured cores + gloo")
        Ws = [r["W"] for r in model["results"]]
        ax1.plot(Ws, [max(a + b + c for a, b, c in zip(r["virtual"]["A_ms"], r["virtual"]["B_ms"], r["virtual"]["C_ms"]))
                      for r in model["results"]], "^:", label="virtual ranks: slowest rank's compute")
        ax2.plot(Ws, Ws, "k:", label="ideal (W x)")
        for link, style in (("nvlink", "o-"), ("pcie4", "s-")):
            ax2.plot(Ws, [r["gpu_prediction"]["speedup"][link] for r in model["results"]], style,
                     label=f"predicted GPUs, {link} (GPU_FACTOR {model['gpu_factor']:g})")
        if val:
            ax2.plot([r["W"] for r in val], [r["cpu_validation"]["measured_speedup"] for r in val], "x--",
                     label=f"measured CPU gloo ({val[0]['cpu_validation']['cores']} cores)")
    elif breakdown is not None:
        rs = breakdown["results"]
        ax1.plot([r["W"] for r in rs], [r["plain_step_ms_median_max_rank"] for r in rs], "o-", label="measured step (CPU)")
    ax1.set(xlabel="W (ranks)", ylabel="step time (ms)", title="Step time vs W (1 camera per rank)")
    ax2.set(xlabel="W (ranks)", ylabel="throughput speedup vs W=1", title="Speedup (images/s)")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_xticks(range(1, 1 + max(4, max((r["W"] for r in (model or breakdown or {"results": []})["results"]), default=4))))
    fig.suptitle("distsplat scaling: CPU measurements (gloo, 2-core machine) and modelled GPUs", fontsize=10)
    fig.tight_layout()
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PLOT, dpi=110)
    return PLOT


def main() -> int:
    smoke, bd_cpu, bd_gpu = load("cpu_smoke"), load("step_breakdown_cpu"), load("step_breakdown_cuda")
    model, vs_cpu, vs_gpu = load("scaling_model"), load("vs_gsplat_cpu"), load("vs_gsplat_cuda")
    png = plot(bd_cpu, model)
    parts = [
        "# distsplat benchmark results",
        "",
        "Generated by `python benchmarks/make_report.py` from `benchmarks/results/*.json`; do not edit.",
        "Every number below was measured on the machine named under its table. Unless a table says "
        "GPU, that is a CPU-only machine: ranks are gloo processes sharing its cores and the renderer "
        "is the pure-PyTorch backend, so absolute times say nothing about GPUs. GPU figures are "
        "model predictions with the assumptions listed, until a GPU run replaces them.",
        "",
    ]
    parts += headline(model, vs_cpu, vs_gpu, bd_cpu)
    if png is not None:
        parts += [f"![scaling]({png.relative_to(HERE).as_posix()})", ""]
    parts += [section_smoke(smoke), section_breakdown(bd_cpu, "cpu")]
    parts += [section_breakdown(bd_gpu, "cuda") if bd_gpu else
              "## Step breakdown (cuda)\n\nPending: no GPU run yet (`python benchmarks/step_breakdown.py` "
              "on a CUDA machine runs W = 1 on the GPU).\n"]
    parts += [section_model(model), section_gsplat(vs_cpu, vs_gpu)]
    REPORT.write_text("\n".join(parts).rstrip() + "\n")
    print(f"make_report: {REPORT.relative_to(HERE.parent)}" + (f", {png.relative_to(HERE.parent)}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
