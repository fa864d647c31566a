"""Coverage-guided fuzzing of the parsers of user files (issue 21), with atheris.

    pip install atheris
    nice -n 10 python tests/fuzz/fuzz.py TARGET [SECONDS]      # one target (targets.py)
    nice -n 10 python tests/fuzz/fuzz.py all [SECONDS]         # each in turn, a summary JSON

Starts from the committed seeds (tests/fuzz/corpus/TARGET/), written first from
distsplat's own writers when missing. A finding is any exception other than the target's
documented error, a hang (-timeout) or an allocation past -rss_limit_mb /
-malloc_limit_mb; libFuzzer writes the input to tests/fuzz/crashers/TARGET/, which the
replay test (tests/fuzz/test_replay.py) runs in CI once it is fixed. `all` writes
benchmarks/results/fuzz_parsers_SECONDSs.json (executions and findings per target).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO)]

CORPUS, CRASHERS = HERE / "corpus", HERE / "crashers"
LIMITS = ["-timeout=10", "-rss_limit_mb=3072", "-malloc_limit_mb=1024", "-max_len=4096"]


def write_seeds() -> None:
    import targets

    with tempfile.TemporaryDirectory() as d:
        for name, files in targets.seeds(Path(d)).items():
            (CORPUS / name).mkdir(parents=True, exist_ok=True)
            for seed, data in files.items():
                path = CORPUS / name / seed
                if not path.exists():
                    path.write_bytes(data)


def fuzz_one(name: str, seconds: int) -> None:
    """In this process: atheris over target `name` until `seconds` pass or a finding."""
    import atheris

    import numpy, torch  # noqa: F401,E401  (imported first: instrumenting them takes minutes)

    with atheris.instrument_imports(include=["distsplat", "targets"]):
        import targets  # noqa: F401
        import distsplat.data.colmap_io  # noqa: F401
        import distsplat.data.blender  # noqa: F401
        import distsplat.data.nerfstudio  # noqa: F401
        import distsplat.data.shards  # noqa: F401
        import distsplat.train.files.checkpoint  # noqa: F401
        import distsplat.viewer.model  # noqa: F401
    write_seeds()  # after instrumenting: modules imported earlier would give no coverage
    scratch = Path(tempfile.mkdtemp(prefix=f"fuzz_{name}_"))
    targets.prepare(scratch)
    work = Path(tempfile.mkdtemp(prefix=f"fuzz_{name}_corpus_"))  # new inputs: not committed
    (CRASHERS / name).mkdir(parents=True, exist_ok=True)

    def one(data: bytes) -> None:
        targets.run_one(name, data, scratch)

    atheris.Setup([sys.argv[0], str(work), str(CORPUS / name), f"-max_total_time={seconds}",
                   f"-artifact_prefix={CRASHERS / name}/", "-print_final_stats=1", *LIMITS], one)
    atheris.Fuzz()


def main() -> None:
    name, seconds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 180
    if name != "all":
        fuzz_one(name, seconds)
        return
    write_seeds()
    import targets

    results = {}
    for target in targets.TARGETS:
        before = set((CRASHERS / target).glob("*")) if (CRASHERS / target).exists() else set()
        p = subprocess.run([sys.executable, __file__, target, str(seconds)], capture_output=True, text=True,
                           timeout=seconds + 120)
        log = p.stdout + p.stderr
        execs = re.findall(r"stat::number_of_executed_units: (\d+)", log)
        crashers = sorted(str(c.relative_to(REPO)) for c in set((CRASHERS / target).glob("*")) - before)
        finding = re.findall(r"(?m)^(?:=+ )?(?:Uncaught Python exception: |==\d+== ERROR: libFuzzer: )(.*)$", log)
        exc = re.findall(r"(?m)^(\w+(?:Error|Exception)\b.*)$", log)
        results[target] = {"seconds": seconds, "executions": int(execs[-1]) if execs else None,
                           "returncode": p.returncode, "crashers": crashers,
                           "finding": (finding[:1] + exc[-1:]) if p.returncode else []}
        print(target, results[target], flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    import datetime
    import platform

    from benchmarks.results_index import result_path

    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    out = result_path(f"fuzz_parsers_{seconds}s", f"cpu{os.cpu_count()}", date)
    out.write_text(json.dumps({
        "command": f"nice -n 10 python tests/fuzz/fuzz.py all {seconds}", "commit": commit,
        "date": date,
        "machine": f"{platform.machine()} {os.cpu_count()} cores (shared with other jobs)",
        "load": os.getloadavg(), "limits": LIMITS, "targets": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
