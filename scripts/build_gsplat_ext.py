"""Ahead-of-time build of gsplat 1.5.3's CUDA extension for one (Python, torch, CUDA, arch).

Called by scripts/build_gsplat_ext.sh, which fetches the torch wheel and gsplat's sources.
It compiles every gsplat .cu / .cpp and ext.cpp (--jobs at once) with the flags that gsplat's
JIT (gsplat/cuda/_backend.py through torch.utils.cpp_extension of the target torch) uses,
records per-file outcomes in a JSON result, links one Python extension module, strips it
and writes it with a build_info.json into the output folder (distsplat's
render/gsplat_ext.py loads it on the GPU machine so ranks never JIT).

Nothing here imports torch: the target torch (a +cuXXX wheel for another Python) is only
read as headers and libraries.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.paths import neutral  # noqa: E402  (no torch import)

# The module name ext.cpp's PYBIND11_MODULE gets; gsplat's JIT uses the same.
EXT_NAME = "gsplat_cuda"

# torch.utils.cpp_extension.COMMON_NVCC_FLAGS (torch 2.11).
COMMON_NVCC_FLAGS = [
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "--expt-relaxed-constexpr",
]

# Edits made to the build folder's copy of gsplat's sources (never to a committed file)
# for what CUDA 13 / CCCL 3 rejects. Each: (relative path, old text, new text, why).
SOURCE_EDITS: list[tuple[str, str, str, str]] = []

# Libraries torch's JIT links a CUDA extension against (cpp_extension._prepare_ldflags).
TORCH_LIBS = ["c10", "c10_cuda", "torch_cpu", "torch_cuda", "torch", "torch_python"]


def sh(cmd: list[str], cwd: Path | None = None) -> tuple[int, str, float]:
    t0 = time.time()
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p.returncode, p.stdout, time.time() - t0


def first_errors(log: str, n: int = 12) -> list[str]:
    lines = log.splitlines()
    idx = [i for i, l in enumerate(lines) if re.search(r"\berror\b", l, re.I)]
    if not idx:
        return lines[-n:]
    start = idx[0]
    return lines[max(0, start - 2): start + n]


def read_torch_version(torch_dir: Path) -> tuple[str, str | None]:
    text = (torch_dir / "version.py").read_text()
    ver = re.search(r"__version__\s*=\s*'([^']+)'", text).group(1)
    cuda = re.search(r"cuda[^=\n]*=\s*'([^']+)'", text)
    return ver, cuda.group(1) if cuda else None


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], stdout=subprocess.PIPE, text=True).stdout
    m = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return m.group(2) if m else out.strip().splitlines()[-1]


def apply_edits(src_root: Path) -> list[dict]:
    done = []
    for rel, old, new, why in SOURCE_EDITS:
        f = src_root / rel
        text = f.read_text()
        if old not in text:
            raise SystemExit(f"build_gsplat_ext: edit for {rel} no longer matches ({why}); "
                             "gsplat's sources changed, update SOURCE_EDITS")
        f.write_text(text.replace(old, new))
        done.append({"file": rel, "why": why})
    return done


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--torch-root", type=Path, required=True, help="folder holding torch/include, torch/lib")
    ap.add_argument("--torch-wheel", required=True, help="wheel file name (recorded)")
    ap.add_argument("--gsplat-src", type=Path, required=True, help="folder holding gsplat/cuda")
    ap.add_argument("--gsplat-origin", required=True, help="where the sources came from (recorded)")
    ap.add_argument("--build-dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True, help="output folder (.gsplat_ext)")
    ap.add_argument("--results", type=Path, required=True, help="per-file JSON result")
    ap.add_argument("--python-include", type=Path, required=True)
    ap.add_argument("--python-tag", default="cpython-312-x86_64-linux-gnu")
    ap.add_argument("--cuda-home", type=Path, default=Path("/usr/local/cuda"))
    ap.add_argument("--arch", default="90", help="compute capability without the dot")
    ap.add_argument("--command", default="", help="the command line that ran the build (recorded)")
    ap.add_argument("--repo", type=Path, default=Path.cwd())
    ap.add_argument("--rpath", default="", help="colon-separated RUNPATH of the module (default none)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="files compiled at once (default: the CPU count; nvcc takes ~1-3 GB each)")
    args = ap.parse_args()
    t_start = time.time()

    torch_dir = args.torch_root / "torch"
    torch_version, torch_cuda = read_torch_version(torch_dir)
    nvcc = str(args.cuda_home / "bin" / "nvcc")
    gs_pkg = args.gsplat_src / "gsplat"
    gs_version = re.search(r'__version__\s*=\s*"([^"]+)"', (gs_pkg / "version.py").read_text()).group(1)

    # A fresh copy of the sources so edits never touch the installed or downloaded package.
    src = args.build_dir / "src"
    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(gs_pkg / "cuda", src / "cuda", ignore=shutil.ignore_patterns("__pycache__", "test", "doc"))
    edits = apply_edits(src)
    cuda_dir = src / "cuda"
    sources = (sorted((cuda_dir / "csrc").glob("*.cu")) + sorted((cuda_dir / "csrc").glob("*.cpp"))
               + [cuda_dir / "ext.cpp"])

    # torch.utils.cpp_extension._write_ninja_file_and_compile_objects, torch 2.11, Linux.
    common = [f"-DTORCH_EXTENSION_NAME={EXT_NAME}", "-DTORCH_API_INCLUDE_EXTENSION_H",
              f"-I{cuda_dir / 'include'}", f"-I{cuda_dir / 'csrc' / 'third_party' / 'glm'}"]
    for inc in [torch_dir / "include", torch_dir / "include/torch/csrc/api/include",
                args.cuda_home / "include", args.python_include]:
        common += ["-isystem", str(inc)]
    # gsplat/cuda/_backend.py: extra_cflags, extra_cuda_cflags (no FAST_COMPILE, fast math on).
    cxx_flags = common + ["-fPIC", "-std=c++17", "-O3", "-Wno-attributes"]
    arch = f"-gencode=arch=compute_{args.arch},code=sm_{args.arch}"
    nvcc_flags = common + COMMON_NVCC_FLAGS + [arch, "--compiler-options", "-fPIC", "-O3",
                                               "-use_fast_math", "-std=c++17"]

    objs_dir = args.build_dir / "obj"
    objs_dir.mkdir(parents=True, exist_ok=True)
    edits_key = json.dumps(SOURCE_EDITS)
    files: list[dict] = []
    objects = []
    todo = []  # (position in files, rel, cmd, obj, stamp, key) of the files to compile
    for s in sources:
        rel = s.relative_to(cuda_dir).as_posix()
        obj = objs_dir / (rel.replace("/", "__") + ".o")
        cmd = ([nvcc] + nvcc_flags if s.suffix == ".cu" else ["c++"] + cxx_flags) + ["-c", str(s), "-o", str(obj)]
        # The stamp lets a re-run skip files whose command and source did not change.
        key = hashlib.sha256((" ".join(cmd) + s.read_text() + edits_key + torch_version).encode()).hexdigest()
        stamp = obj.with_suffix(".stamp.json")
        if obj.exists() and stamp.exists() and json.loads(stamp.read_text()).get("key") == key:
            rec = json.loads(stamp.read_text())["record"]
            rec["cached"] = True
        else:
            rec = {}
            todo.append((len(files), rel, cmd, obj, stamp, key))
        files.append(rec)
        objects.append(obj)

    def compile_one(job: tuple) -> tuple:
        _, rel, cmd, *_ = job
        sys.stdout.write(f"[build_gsplat_ext] compiling {rel} ...\n")  # one write: threads print at once
        sys.stdout.flush()
        return job, sh(cmd)

    # --jobs files at once (each nvcc is one process; the slowest files take minutes alone).
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for (pos, rel, cmd, obj, stamp, key), (rc, log, secs) in pool.map(compile_one, todo):
            rec = {"file": rel, "status": "compiled" if rc == 0 else "failed", "seconds": round(secs, 1)}
            if rc != 0:
                rec["errors"] = first_errors(log)
                obj.unlink(missing_ok=True)
            elif "warning" in log:
                rec["warnings"] = sum(1 for l in log.splitlines() if "warning" in l)
            if rc == 0:
                stamp.write_text(json.dumps({"key": key, "record": rec}))
            print(f"[build_gsplat_ext]   {rel}: {rec['status']} in {secs:.1f} s", flush=True)
            if rc != 0:
                print("\n".join(rec["errors"]), flush=True)
            files[pos] = rec

    failed = [f["file"] for f in files if f["status"] != "compiled"]
    so_name = f"{EXT_NAME}.{args.python_tag}.so"
    link = {"status": "skipped (compile failures)"} if failed else {}
    info: dict = {}
    so_path = args.out / so_name
    if not failed:
        lib_dir = torch_dir / "lib"
        cuda_lib = args.cuda_home / ("lib64" if (args.cuda_home / "lib64").exists() else "lib")
        tmp_so = args.build_dir / so_name
        # --rpath is searched when the .so is loaded without torch imported first (torch's own
        # extensions rely on torch being imported first, as distsplat does): a stray direct load.
        rpath = [f"-Wl,-rpath,{args.rpath}"] if args.rpath else []
        cmd = (["c++"] + [str(o) for o in objects] + ["-shared", f"-L{lib_dir}"]
               + [f"-l{l}" for l in TORCH_LIBS] + [f"-L{cuda_lib}", "-lcudart"] + rpath
               + ["-o", str(tmp_so)])
        rc, log, secs = sh(cmd)
        if rc != 0:
            link = {"status": "failed", "errors": first_errors(log), "seconds": round(secs, 1)}
        else:
            size_unstripped = tmp_so.stat().st_size
            subprocess.run(["strip", "--strip-unneeded", str(tmp_so)], check=True)
            args.out.mkdir(parents=True, exist_ok=True)
            for old in args.out.glob(f"{EXT_NAME}*.so"):
                old.unlink()
            shutil.copy2(tmp_so, so_path)
            dyn = subprocess.run(["readelf", "-d", str(so_path)], stdout=subprocess.PIPE, text=True).stdout
            needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)
            runpath = re.findall(r"\((?:RPATH|RUNPATH)\)\s+Library r\w*path: \[([^\]]+)\]", dyn)
            # The newest glibc / libstdc++ symbol versions it needs: the device's must be as new.
            syms = subprocess.run(["objdump", "-T", str(so_path)], stdout=subprocess.PIPE, text=True).stdout
            newest = {}
            for lib in ("GLIBC", "GLIBCXX", "CXXABI"):
                vers = set(re.findall(rf"\b{lib}_([\d.]+)", syms))
                if vers:
                    newest[lib] = max(vers, key=lambda v: tuple(int(x) for x in v.split(".")))
            link = {"status": "linked", "seconds": round(secs, 1), "command": shlex.join(cmd),
                    "newest_symbol_versions": newest,
                    "bytes_unstripped": size_unstripped, "bytes": so_path.stat().st_size,
                    "needed": needed, "runpath": runpath}
            sha = hashlib.sha256(so_path.read_bytes()).hexdigest()
            info = {
                "module": EXT_NAME, "file": so_name, "sha256": sha,
                "torch_version": torch_version, "torch_cuda": torch_cuda,
                "python_tag": args.python_tag, "python": "cp312" if "312" in args.python_tag else args.python_tag,
                "arch_list": [f"{args.arch[:-1]}.{args.arch[-1]}"],
                "gsplat_version": gs_version, "nvcc": nvcc_version(nvcc),
                "source_edits": edits,
                # gpu_prepare.sh rebuilds when the build scripts changed since.
                "builder_sha256": hashlib.sha256(b"".join(
                    (Path(__file__).parent / n).read_bytes()
                    for n in ("build_gsplat_ext.sh", "build_gsplat_ext.py"))).hexdigest(),
                "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            }
            (args.out / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=args.repo, stdout=subprocess.PIPE,
                                text=True).stdout.strip()
    except OSError:
        commit = None
    result = {
        "what": "ahead-of-time compile of gsplat's CUDA extension, --jobs files at a time",
        "jobs": args.jobs,
        "seconds_note": ("wall seconds of each file's compile (with `jobs` compiles at once), niced, on a build "
                         "machine shared with other jobs; 'cached': true marks a file this run reused (its seconds "
                         "are from the run that compiled it)"),
        "wall_seconds": round(time.time() - t_start, 1),
        "machine": {"host": platform.node(), "cpu": platform.processor() or platform.machine(),
                    "cores": os.cpu_count(), "os": platform.platform(),
                    "load_avg_at_end": list(os.getloadavg())},
        "nvcc": nvcc_version(nvcc), "cxx": subprocess.run(["c++", "--version"], stdout=subprocess.PIPE,
                                                          text=True).stdout.splitlines()[0],
        "torch_wheel": args.torch_wheel, "torch_version": torch_version, "torch_cuda": torch_cuda,
        "gsplat_version": gs_version, "gsplat_sources": args.gsplat_origin,
        "python_tag": args.python_tag, "arch": f"sm_{args.arch}",
        "nvcc_flags": nvcc_flags, "cxx_flags": cxx_flags, "source_edits": edits,
        "command": args.command, "git_commit": commit,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "files": files,
        "summary": {"compiled": len(files) - len(failed), "failed": failed,
                    "compile_seconds": round(sum(f["seconds"] for f in files), 1)},
        "link": link,
    }
    # Keep a load test recorded by an earlier run (load_test_gsplat_ext.py adds it).
    if args.results.exists():
        old = json.loads(args.results.read_text())
        if old.get("load_test", {}).get("sha256") == info.get("sha256") and link.get("status") == "linked":
            result["load_test"] = old["load_test"]
    args.results.parent.mkdir(parents=True, exist_ok=True)
    # The record names this machine's folders as placeholders ($DISTSPLAT_CACHE, $PY312, ...).
    py312 = args.python_include.parent.parent  # <prefix>/include/python3.12
    args.results.write_text(json.dumps(neutral(result, {str(py312): "$PY312"}), indent=2) + "\n")
    print(f"[build_gsplat_ext] {len(files) - len(failed)}/{len(files)} files compiled; link: {link['status']}")
    if link.get("status") == "linked":
        print(f"[build_gsplat_ext] {so_path} ({link['bytes'] / 2**20:.1f} MiB stripped)")
    return 0 if link.get("status") == "linked" else 1


if __name__ == "__main__":
    sys.exit(main())
