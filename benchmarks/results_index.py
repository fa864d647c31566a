"""How a result file is named and found: a result is a dated snapshot, never edited.

    benchmarks/results/<name>_<device>_<date>.json     e.g. quickstart_cpu2_2026-11-26.json

`name` says what was measured (the benchmark, with its variant: `step_ops`, `million_memory_1000000`),
`device` where (`cpu2`: a CPU-only machine with 2 cores; `h100`, `h200`: the GPU), `date` when
(UTC, YYYY-MM-DD; a second snapshot of the same name and device on the same day adds the time,
`2026-11-26T031636`, so names sort by time). The commit is inside the file. A rerun writes a new
file; superseded snapshots move to `results/archive/` (`python benchmarks/results_index.py archive`).
Readers ask for the newest snapshot of a name (`newest`), never a dated file name.

No torch import: make_report.py and the scripts use it without the target torch.

    python benchmarks/results_index.py file PATH... [--name NAME] [--device DEV]   # git mv plain-named
                                                      # records (NAME.json) to their dated names
    python benchmarks/results_index.py archive        # git mv superseded snapshots to results/archive/
    python benchmarks/results_index.py archive PATH... # git mv these (a deleted study's) to results/archive/
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

RESULTS = Path(os.environ.get("BENCH_RESULTS") or Path(__file__).resolve().parent / "results")
ARCHIVE = "archive"
_SNAPSHOT = re.compile(r"^(?P<name>.+)_(?P<device>[a-z][a-z0-9]*)_(?P<date>\d{4}-\d{2}-\d{2}(?:T\d{6}(?:-\d+)?)?)$")


def device_label(machine: Any, device: Optional[str] = None) -> str:
    """Where a record was measured, from its `machine` field: the GPU's model (`h100`, `a100`,
    `rtx4090`) unless the measurement's own `device` says the CPU, else `cpu<cores>`."""
    m = machine if isinstance(machine, dict) else {}
    gpu = m.get("gpu")
    if gpu and not str(device or "").lower().startswith("cpu"):
        words = [w for w in re.split(r"[\s_]+", str(gpu)) if w.lower() not in ("nvidia", "geforce", "tesla", "")]
        slug = words[0].split("-")[0].lower() if words else "gpu"
        if not re.search(r"\d", slug) and len(words) > 1:  # "RTX 4090"
            slug += words[1].split("-")[0].lower()
        return re.sub(r"[^a-z0-9]", "", slug) or "gpu"
    cores = m.get("cpu_count") or m.get("cores")
    if cores is None:  # older records describe the machine in words: "vm x86_64, 2 cores"
        found = re.search(r"(\d+) cores", machine if isinstance(machine, str) else "")
        cores = found.group(1) if found else None
    return f"cpu{cores}" if cores else "cpu"


def snapshot_date(date: Any) -> str:
    """YYYY-MM-DD of a record's ISO `date` (UTC as recorded)."""
    found = re.match(r"\d{4}-\d{2}-\d{2}", str(date or ""))
    if not found:
        raise ValueError(f"not an ISO date: {date!r}")
    return found.group(0)


def parse(path: Path) -> Optional[Tuple[str, str, str]]:
    """(name, device, date) of a snapshot's file name; None for a plain-named record."""
    found = _SNAPSHOT.match(Path(path).stem)
    return (found["name"], found["device"], found["date"]) if found and path.suffix == ".json" else None


def result_path(name: str, device: str, date: str, folder: Optional[Path] = None) -> Path:
    """The file a new snapshot goes to. `date`: ISO (a timestamp: its time names a second
    snapshot of the same day). A name taken, here or in archive/, is never reused."""
    folder = Path(folder or RESULTS)
    day = snapshot_date(date)
    taken = lambda p: p.exists() or (folder / ARCHIVE / p.name).exists()  # noqa: E731
    path = folder / f"{name}_{device}_{day}.json"
    if not taken(path):
        return path
    clock = re.sub(r"\D", "", str(date)[10:19])  # HHMMSS of "2026-11-26T03:16:36+00:00"
    path = folder / f"{name}_{device}_{day}T{clock.ljust(6, '0')}.json"
    n = 2
    while taken(path):  # the same second: a counter keeps it unique
        path = folder / f"{name}_{device}_{day}T{clock.ljust(6, '0')}-{n}.json"
        n += 1
    return path


def _matches(found: str, device: Optional[str]) -> bool:
    """`device`: a label (`cpu2`, `h100`), or `cpu` / `gpu` for any of that kind."""
    if device is None:
        return True
    if device == "cpu":
        return found.startswith("cpu")
    if device == "gpu":
        return not found.startswith("cpu")
    return found == device


def snapshots(folder: Optional[Path] = None, name: Optional[str] = None, device: Optional[str] = None) -> List[Path]:
    """Snapshots in `folder` (not archive/), oldest first; of one name and device kind if given."""
    out = []
    for p in Path(folder or RESULTS).glob("*.json"):
        key = parse(p)
        if key and (name is None or key[0] == name) and _matches(key[1], device):
            out.append(p)
    return sorted(out, key=lambda p: (parse(p)[2], p.name))


def newest(name: str, device: Optional[str] = None, folder: Optional[Path] = None) -> Optional[Path]:
    """The newest snapshot of `name` (on `device`: a label, or `cpu` / `gpu`), or None."""
    found = snapshots(folder, name, device)
    return found[-1] if found else None


def superseded(folder: Optional[Path] = None) -> List[Path]:
    """Every snapshot with a newer one of the same name and device: what archive/ is for."""
    latest: Dict[Tuple[str, str], Path] = {}
    for p in snapshots(folder):
        name, device, _ = parse(p)
        latest[(name, device)] = p
    keep = set(latest.values())
    return [p for p in snapshots(folder) if p not in keep]


def _git_mv(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tracked = subprocess.run(["git", "ls-files", "--error-unmatch", src.name], cwd=src.parent,
                             capture_output=True).returncode == 0
    if tracked:
        subprocess.run(["git", "mv", src.name, os.path.relpath(dst, src.parent)], cwd=src.parent, check=True)
    else:
        src.rename(dst)
    print(f"{src} -> {dst}")


def file_record(path: Path, name: Optional[str] = None, device: Optional[str] = None) -> Path:
    """Moves a plain-named record (NAME.json, as a call's staging folder holds them) to its
    snapshot name, from the device and date inside it; its contents are not touched."""
    path = Path(path)
    d = json.loads(path.read_text())
    device = device or device_label(d.get("machine"), d.get("device"))
    dst = result_path(name or path.stem, device, d["date"], path.parent)
    _git_mv(path, dst)
    return dst


def main(argv: List[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("file", help="git mv plain-named records (NAME.json) to their dated snapshot names")
    f.add_argument("paths", nargs="+", type=Path)
    f.add_argument("--name", help="the snapshot's name (one path only; default: the file's stem)")
    f.add_argument("--device", help="where it was measured (default: from its machine field)")
    a = sub.add_parser("archive", help="git mv superseded snapshots (of FOLDER, default the record), or the "
                                       "snapshots named, to results/archive/")
    a.add_argument("paths", nargs="*", type=Path, help="a results folder, or snapshots (a study's gone)")
    args = ap.parse_args(argv)
    if args.cmd == "file":
        if args.name and len(args.paths) > 1:
            ap.error("--name names one record")
        for p in args.paths:
            file_record(p, args.name, args.device)
    elif len(args.paths) <= 1 and all(p.is_dir() for p in args.paths):
        folder = args.paths[0] if args.paths else RESULTS
        for p in superseded(folder):
            _git_mv(p, folder / ARCHIVE / p.name)
    else:
        for p in args.paths:
            if parse(p) is None or not p.is_file():
                ap.error(f"{p}: not a snapshot (<name>_<device>_<date>.json)")
            _git_mv(p, p.parent / ARCHIVE / p.name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
