"""scripts/gpu_validate.sh's bookkeeping (no torch import: it runs between checks).

    python3 scripts/gpu_records.py run RESULT_DIR OUT_JSON WALL_S LOG TRAINER_ARGS
        The record of one training of examples/simple_trainer.py (results/runs/NAME.json, what
        benchmarks/make_report.py reads): the last eval's stats, rank 0's peak GPU memory, the
        launch-to-exit time, and `train_seconds`, the training loop alone (first step to last,
        no save, no eval: --max_steps over the steps/s the trainer logs at its last step, before
        it saves and evaluates), measured as gsplat's `ellipse_time` is. Prints one line.
    python3 scripts/gpu_records.py tests JUNIT_XML OUT_JSON
        tests_cuda.json from pytest's junit XML of tests/cuda: counts, seconds, each test's outcome
        (a skip is a failure there: DISTSPLAT_FAIL_ON_SKIP=1). Prints one line.
    python3 scripts/gpu_records.py compare OURS_JSON PEER_JSON
        Issue 29's goal of that training against gsplat's own trainer (a gsplat_peer_*.json):
        ours <= 0.95x gsplat's training time, PSNR >= gsplat's - 0.1 dB. Prints one line.

The machine's description comes from $GPU_VALIDATE_MACHINE (written by gpu_setup_check.py).
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.paths import neutral  # noqa: E402  (no torch import)

TIME_GOAL, PSNR_GOAL_DB = 0.95, 0.1
# distsplat/train/trainer.py logs this at --log_every steps and at the last one (stderr not a tty)
STEP_LINE = re.compile(r"step (\d+)/(\d+): loss \S+, ([0-9.]+) steps/s")


def train_seconds_from_log(log: Path) -> Optional[float]:
    """--max_steps / the steps per second the trainer logged at its last step, or None."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    last = None
    for m in STEP_LINE.finditer(text):
        if m.group(1) == m.group(2):
            last = m
    if last is None or float(last.group(3)) <= 0:
        return None
    return int(last.group(2)) / float(last.group(3))


def run_record(result_dir: str, out: str, wall: str, log: str, args: str) -> int:
    stats = sorted(glob.glob(os.path.join(result_dir, "stats", "val_step*.json")))
    if not stats:
        print(f"no eval stats in {result_dir}/stats: no record written")
        return 1
    d: Dict[str, Any] = json.loads(Path(stats[-1]).read_text())
    train = sorted(glob.glob(os.path.join(result_dir, "stats", "train_step*_rank0.json")))
    if train:
        d["peak_gpu_mem_gib"] = json.loads(Path(train[-1]).read_text()).get("mem")
    secs = train_seconds_from_log(Path(log))
    if secs is not None:
        d["train_seconds"] = round(secs, 2)
    machine_file = os.environ.get("GPU_VALIDATE_MACHINE")
    info = json.loads(Path(machine_file).read_text()) if machine_file and Path(machine_file).is_file() else {}
    d.update(benchmark=Path(out).stem, date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
             machine=info.get("machine"), launch_to_exit_s=int(wall), trainer_args=args,
             commit=os.environ.get("DISTSPLAT_COMMIT"),
             definitions={"elapsed": "the trainer's clock at its last eval: the loop, and the final checkpoint save",
                          "train_seconds": "--max_steps / steps/s logged at the last step: the loop alone, "
                                           "no save, no eval (as gsplat's ellipse_time)"})
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(neutral(d), indent=2) + "\n")
    keys = ("step", "psnr", "ssim", "num_GS", "train_seconds", "elapsed", "peak_gpu_mem_gib", "launch_to_exit_s")
    print({k: (round(d[k], 3) if isinstance(d[k], float) else d[k]) for k in keys if k in d})
    return 0


def tests_record(xml_path: str, out: str) -> int:
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"no tests_cuda.json: {xml_path} unreadable ({type(e).__name__}: {e})")
        return 1
    tests: Dict[str, str] = {}
    seconds = 0.0
    for suite in root.iter("testsuite"):
        seconds += float(suite.get("time") or 0)
        for case in suite.iter("testcase"):
            outcome = "passed"
            for tag in ("failure", "error", "skipped"):
                if case.find(tag) is not None:
                    outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
            tests[f"{case.get('classname')}::{case.get('name')}"] = outcome
    summary = {k: sum(1 for v in tests.values() if v == k) for k in ("passed", "failed", "error", "skipped")}
    machine_file = os.environ.get("GPU_VALIDATE_MACHINE")
    info = json.loads(Path(machine_file).read_text()) if machine_file and Path(machine_file).is_file() else {}
    record = {"benchmark": "tests_cuda", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "command": "DISTSPLAT_FAIL_ON_SKIP=1 python3 -m pytest tests/cuda -o addopts= -v -rA --timeout 60  "
                         "(scripts/gpu_validate.sh tests)",
              "commit": os.environ.get("DISTSPLAT_COMMIT"), "machine": info.get("machine"),
              "summary": summary, "seconds": round(seconds, 2),
              "note": "DISTSPLAT_FAIL_ON_SKIP=1 turns any skip into a failure", "tests": tests}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"tests_cuda.json: {summary} in {seconds:.1f} s")
    return 0


def compare(ours_path: str, peer_path: str) -> int:
    try:
        ours = json.loads(Path(ours_path).read_text())
        peer = json.loads(Path(peer_path).read_text())["summary"]
    except (OSError, ValueError, KeyError) as e:
        print(f"no comparison ({type(e).__name__}: {e})")
        return 1
    t_ours = ours.get("train_seconds") or ours.get("elapsed")
    t_peer = peer.get("train_seconds")
    parts = []
    if t_ours and t_peer:
        r = t_ours / t_peer
        parts.append(f"time {t_ours:.1f} s / gsplat {t_peer:.1f} s = {r:.3f}x "
                     f"({'met' if r <= TIME_GOAL else 'MISSED'}: goal <= {TIME_GOAL})")
    if ours.get("psnr") is not None and peer.get("psnr") is not None:
        dp = ours["psnr"] - peer["psnr"]
        parts.append(f"PSNR {ours['psnr']:.2f} vs {peer['psnr']:.2f} dB ({dp:+.2f}; "
                     f"{'met' if dp >= -PSNR_GOAL_DB else 'MISSED'}: goal >= -{PSNR_GOAL_DB})")
    print(f"{Path(ours_path).stem} vs {Path(peer_path).stem}: " + ("; ".join(parts) or "nothing to compare"))
    return 0


def main() -> int:
    if len(sys.argv) >= 7 and sys.argv[1] == "run":
        return run_record(*sys.argv[2:7])
    if len(sys.argv) == 4 and sys.argv[1] == "tests":
        return tests_record(sys.argv[2], sys.argv[3])
    if len(sys.argv) == 4 and sys.argv[1] == "compare":
        return compare(sys.argv[2], sys.argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
