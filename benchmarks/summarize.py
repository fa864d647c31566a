"""One summary table of finished training runs, read from what the trainer leaves where
gsplat users look for it: R/stats/val_stepNNNN.json (psnr, ssim, num_GS, elapsed) and
R/stats/train_stepNNNN_rankR.json (mem, ellipse_time, num_GS of rank R), plus
R/wall_s.txt when benchmarks/lib.sh wrote it. Called by basic_4gpus.sh, mcmc_4gpus.sh
and cpu_smoke.sh; the last step with a val_stepNNNN.json of each run is reported.

    python benchmarks/summarize.py R1 R2 ... [--title T] [--json NAME] [--note TEXT]

--json NAME also writes benchmarks/results/NAME.json (with machine, command, commit and
date). Exits 1 when a run has no stats (its row says `missing`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

_VAL = re.compile(r"^val_step(\d+)\.json$")
_TRAIN = re.compile(r"^train_step(\d+)_rank(\d+)\.json$")


def read_run(run_dir: Path, label: Optional[str] = None) -> Dict[str, Any]:
    """The row of one run dir: its last evaluated step, metrics and per-rank stats."""
    run_dir = Path(run_dir)
    row: Dict[str, Any] = {"run": label or run_dir.name, "dir": str(run_dir), "ok": False}
    wall = run_dir / "wall_s.txt"
    if wall.is_file():
        try:
            row["wall_s"] = float(wall.read_text().strip())
        except ValueError:
            pass
    stats = run_dir / "stats"
    steps = sorted(int(m.group(1)) for p in stats.glob("val_step*.json") if (m := _VAL.match(p.name))) \
        if stats.is_dir() else []
    if not steps:
        row["error"] = f"no stats/val_stepNNNN.json in {run_dir}"
        return row
    step = steps[-1]
    val = json.loads((stats / f"val_step{step:04d}.json").read_text())
    ranks: Dict[int, Dict[str, Any]] = {}
    for p in stats.glob(f"train_step{step:04d}_rank*.json"):
        m = _TRAIN.match(p.name)
        if m and int(m.group(1)) == step:
            ranks[int(m.group(2))] = json.loads(p.read_text())
    per_rank = [ranks[r] for r in sorted(ranks)]
    row.update(
        ok=True, step=step, psnr=val.get("psnr"), ssim=val.get("ssim"),
        num_GS=val.get("num_GS"), train_s=val.get("elapsed"), eval_s=val.get("eval_time"),
        ranks=len(per_rank),
        num_GS_per_rank=[r.get("num_GS") for r in per_rank],
        mem_gb_per_rank=[r.get("mem") for r in per_rank],
    )
    if len(per_rank) != len(ranks) or sorted(ranks) != list(range(len(ranks))):
        row["warning"] = f"rank files {sorted(ranks)} are not 0..W-1"
    return row


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(rows: Sequence[Dict[str, Any]], title: str = "") -> str:
    """Fixed-width text table (also valid Markdown), with a mean row for >1 finished run."""
    head = ["run", "step", "PSNR", "SSIM", "train s", "wall s", "num_GS", "GS/rank", "mem GiB/rank"]
    body: List[List[str]] = []
    for r in rows:
        if not r["ok"]:
            body.append([r["run"], "missing"] + ["-"] * (len(head) - 2))
            continue
        body.append([
            r["run"], str(r["step"]), _fmt(r["psnr"], ".3f"), _fmt(r["ssim"], ".4f"),
            _fmt(r["train_s"], ".1f"), _fmt(r.get("wall_s"), ".1f"), _fmt(r["num_GS"], "d"),
            "/".join(_fmt(n, "d") for n in r["num_GS_per_rank"]),
            "/".join(_fmt(m, ".2f") for m in r["mem_gb_per_rank"]),
        ])
    done = [r for r in rows if r["ok"] and r["psnr"] is not None]
    if len(done) > 1:
        mean = lambda k: sum(r[k] for r in done) / len(done)  # noqa: E731
        body.append(["mean", "", f"{mean('psnr'):.3f}", f"{mean('ssim'):.4f}",
                     f"{mean('train_s'):.1f}", "", f"{mean('num_GS'):.0f}", "", ""])
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    out = [f"## {title}"] if title else []
    out += [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(b) for b in body]
    return "\n".join(out)


def labels(run_dirs: Sequence[Path]) -> List[str]:
    """Run names: paths relative to the runs' common parent (e.g. default/thermos)."""
    parts = [Path(d).resolve().parts for d in run_dirs]
    if len(parts) == 1:
        return [parts[0][-1]]
    common = 0
    while all(len(p) > common + 1 for p in parts) and len({p[common] for p in parts}) == 1:
        common += 1
    return ["/".join(p[common:]) for p in parts]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="result dirs of finished training runs")
    ap.add_argument("--title", default="")
    ap.add_argument("--json", default=None, help="also write benchmarks/results/NAME.json")
    ap.add_argument("--note", default="", help="recorded in the JSON")
    args = ap.parse_args(argv)
    rows = [read_run(d, name) for d, name in zip(args.runs, labels(args.runs))]
    print(table(rows, args.title))
    if args.json:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from benchmarks.common import write_result

        payload = {"title": args.title, "note": args.note, "runs": rows}
        if os.environ.get("BENCH_COMMAND"):  # the bash script that ran the trainings
            payload["command"] = os.environ["BENCH_COMMAND"]
        path = write_result(args.json, payload)
        print(f"summary -> {path}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
