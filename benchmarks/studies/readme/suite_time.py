"""How long README's test command takes (issue 43.4): `python -m pytest tests` as a newcomer runs
it, timed from launch to exit, with the CPU time of the whole process tree and pytest's counts.

    python benchmarks/studies/readme/suite_time.py            # the suite as README gives it
    ARGS="tests -m numerics" python benchmarks/studies/readme/suite_time.py   # other arguments

Run it on an otherwise idle machine: the figure is the wall time, and the ranks of the
distributed tests share the cores with pytest's workers. Writes test_suite_<device>_<date>.json
(machine, command, commit, date; the load averages before and after say whether the machine
was idle) and prints pytest's summary line."""

from __future__ import annotations

import os
import re
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks.common import write_result  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


def main() -> None:
    args = shlex.split(os.environ.get("ARGS", "")) or ["tests"]
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    load_before = os.getloadavg()
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # every process the suite waited for
    lines = proc.stdout.strip().splitlines()
    summary = next((ln for ln in reversed(lines) if re.search(r"\b(passed|failed|error)", ln)), lines[-1] if lines else "")
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", summary)}
    path = write_result("test_suite", {
        "test_command": shlex.join(["python", "-m", "pytest", *args]),
        "exit_code": proc.returncode,
        "wall_s": round(wall, 1),
        "cpu_user_s": round(usage.ru_utime, 1),
        "cpu_sys_s": round(usage.ru_stime, 1),
        "counts": counts,
        "pytest_summary": summary.strip("= "),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "note": "README's test command from launch to exit (pytest-xdist, one worker per core up to 4, "
                "--dist loadfile, from pyproject.toml's addopts); cpu_*_s: every process of the suite, "
                "its ranks included.",
    })
    print("\n".join(ln for ln in lines if ln.startswith(("FAILED", "ERROR"))) or "no test failed")
    print(summary)
    print(f"{wall:.0f} s wall, {usage.ru_utime + usage.ru_stime:.0f} s CPU -> {path}")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
