"""The one device call of scripts/gpu_validate.sh, dry-run on the CPU, and gpu_prepare.sh's carry
and source checks.

GPU_VALIDATE_DRY_RUN=1 answers every GPU command of the call with
scripts/gpu_validate_fake_python.sh (it sleeps the check's expected time, scaled by
GPU_VALIDATE_TIME_SCALE, and writes fake results where the real command writes them), so what
the call does around the commands is proven here: the checks' priority order, their limits, a
hung check cut at its limit (and what it left running killed) while the rest still run, the
DEADLINE_S cut-off, setup's fast failure, a JIT attempt failing its check, and $OUT holding at
most 8 plain files (what the device returns) with the logs and results packed. The carry check
(`gpu_prepare.sh --check-carry`) runs on fake carry trees in a throwaway git repository; the
source check (`--check-sources`) against a local stand-in for GitHub.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_validate.sh"
PREPARE = REPO / "scripts" / "gpu_prepare.sh"
STATUS = re.compile(r"^(PASS|FAIL|SKIP) (\w+) \((.*)\)$")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils' timeout")


def budget() -> List[Tuple[str, int, int, int, str]]:
    out = subprocess.run(["bash", str(SCRIPT), "--budget"], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines()[1:]:
        parts = line.split()
        if len(parts) == 5 and parts[1].isdigit():
            rows.append((parts[0], int(parts[1]), int(parts[2]), int(parts[3]), parts[4]))
    return rows


def dry_call(tmp: Path, *args: str, scale: float, **env: str) -> Tuple[int, float, List[str], str]:
    """Runs the call dry; returns (exit code, wall seconds, summary lines, stdout)."""
    full = {**os.environ, "GPU_VALIDATE_DRY_RUN": "1", "GPU_VALIDATE_TIME_SCALE": str(scale),
            "OUT": str(tmp / "out"), "GPU_VALIDATE_WORK": str(tmp / "work"), **env}
    t0 = time.perf_counter()
    p = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=full, timeout=120)
    wall = time.perf_counter() - t0
    summary = (tmp / "out" / "summary.txt").read_text().splitlines() if (tmp / "out" / "summary.txt").exists() else []
    return p.returncode, wall, summary, p.stdout + p.stderr


def statuses(summary: List[str]) -> List[Tuple[str, str, str]]:
    return [m.groups() for m in map(STATUS.match, summary) if m]


def members(tgz: Path) -> Dict[str, bytes]:
    with tarfile.open(tgz) as t:
        return {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}


def killed(summary: List[str]) -> List[int]:
    """The processes the call says it killed after a check (what that check left running)."""
    pids = []
    for line in summary:
        if "killed what this check left running:" in line:
            pids += [int(p) for p in line.rsplit(":", 1)[1].split()]
    return pids


def still_running(pids: List[int]) -> List[int]:
    """Those of `pids` still alive with a gpu_validate token (so started by the call, not a reused pid)."""
    alive = []
    for pid in pids:
        try:
            if b"GPU_VALIDATE_TOKEN=gv" in Path(f"/proc/{pid}/environ").read_bytes():
                alive.append(pid)
        except OSError:
            pass
    return alive


def test_budget_in_the_header_is_the_code_and_the_core_fits_the_deadline():
    rows = budget()
    names = [r[0] for r in rows]
    assert names[:3] == ["setup", "tests", "syncs"]  # issue 29's priority order
    assert names.index("default_7k") < names.index("peer_default") < names.index("scaling") \
        < names.index("step_vs_gsplat") < names.index("peer_default_reset") < names.index("profile")
    header = SCRIPT.read_text().split("set -uo pipefail")[0]
    table = {m.group(1): (int(m.group(2)), int(m.group(3)), int(m.group(4)))
             for m in re.finditer(r"^#   (\w+)\s+(\d+)\s+(\d+)\s+~?(\d+)\s", header, re.M)}
    assert table == {n: (lim, start, exp) for n, lim, start, exp, _ in rows}
    core = [r for r in rows if r[4] == "core"]
    assert sum(r[3] for r in core) <= 540 - 15, "the core checks' expected times must fit DEADLINE_S less RESERVE_S"
    assert all(start <= lim for _, lim, start, _, _ in rows)
    assert f"expected {sum(r[3] for r in core)} s" in header


def test_dry_call_runs_every_check_in_order_cuts_a_hung_one_and_packs_out(tmp_path):
    rows = budget()
    scale = 0.005
    # DEADLINE_S is raised so that this machine's own overheads (Python starts between checks) skip nothing
    rc, wall, summary, out = dry_call(tmp_path, scale=scale, DEADLINE_S="100000",
                                      GPU_VALIDATE_DRY_HANG="syncs", GPU_VALIDATE_DRY_FAIL="vs_gsplat")
    st = statuses(summary)
    assert [n for _, n, _ in st] == [r[0] for r in rows], summary
    by = {n: (s, how) for s, n, how in st}
    assert by["syncs"][0] == "FAIL" and "cut at its limit" in by["syncs"][1]
    assert f"limit {dict((r[0], r[1]) for r in rows)['syncs'] * scale:.2f} s" in by["syncs"][1]
    assert by["vs_gsplat"][0] == "FAIL" and "exit 1" in by["vs_gsplat"][1]
    assert all(s == "PASS" for n, (s, _) in by.items() if n not in ("syncs", "vs_gsplat")), summary
    assert rc == 1
    assert killed(summary) and still_running(killed(summary)) == [], summary
    goal = [line for line in summary if "goal: default_thermos_7000 vs gsplat_peer_default:" in line]
    assert goal and "MISSED: goal <= 0.95" in goal[0] and "met: goal >= -0.1" in goal[0]
    assert summary[-1].startswith("done in ") and "11 passed, 2 failed, 0 skipped" in summary[-1]

    # $OUT: what the device returns (at most 8 plain files, plain names, none in folders)
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["logs.tgz", "results.tgz", "summary.txt"]
    assert all((tmp_path / "out" / f).is_file() and re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files)
    logs = members(tmp_path / "out" / "logs.tgz")
    assert {f"logs/{r[0]}.log" for r in rows} <= set(logs)
    results = members(tmp_path / "out" / "results.tgz")
    assert "benchmarks/results/host_syncs_cuda.json" not in results  # the hung check wrote nothing
    for name in ("tests_cuda", "gsplat_peer_default", "gsplat_peer_default_reset", "scaling_gpu",
                 "step_vs_gsplat_cuda_thermos", "step_vs_gsplat_cuda_garden", "profile_gpu_cuda", "gsplat_peer_mcmc",
                 "runs/default_thermos_7000", "runs/mcmc_thermos_7000"):
        assert f"benchmarks/results/{name}.json" in results, sorted(results)
    # each scene's step comparison under its own name, as bench_step_vs_gsplat.py names it
    assert b"thermos" in results["benchmarks/results/step_vs_gsplat_cuda_thermos.json"]
    assert b"garden" in results["benchmarks/results/step_vs_gsplat_cuda_garden.json"]
    assert not [n for n in results if n.startswith("benchmarks/results/step_vs_gsplat")
                and n.rsplit("_", 1)[-1] not in ("thermos.json", "garden.json")], sorted(results)
    # the commands as the device gets them
    train = logs["logs/default_7k.log"].decode()
    assert "examples/simple_trainer.py default" in train and "--cache gpu" in train and "--ssim_impl fused" in train
    assert "--max_steps 7000" in train and "--data_factor 1" in train
    assert "env CUDA_HOME=" in train and "/nojit" in train  # no toolkit for a JIT build
    scaling = logs["logs/scaling.log"].decode()
    assert "env WS=1,4" in scaling and "env BATCHES=1,4" in scaling and "env SCALING_STEPS=10" in scaling
    assert "env DISTSPLAT_FAIL_ON_SKIP=1" in logs["logs/tests.log"].decode()
    syncs = logs["logs/syncs.log"].decode()  # its W = 2 ranks get what is left of its limit
    assert "env TIME_LIMIT_S=" in syncs and "env PEER_TIMEOUT_S=" in syncs
    assert "env PEER_RESET=1" in logs["logs/peer_default_reset.log"].decode()


def test_a_hung_check_leaves_nothing_running(tmp_path):
    rc, _, summary, _ = dry_call(tmp_path, "tests", scale=0.01, GPU_VALIDATE_DRY_HANG="tests")
    assert [s for s, _, _ in statuses(summary)] == ["PASS", "FAIL"]
    pids = killed(summary)
    assert len(pids) == 1, summary  # the stand-in's child in a session of its own, which `timeout` misses
    time.sleep(0.2)
    left = still_running(pids)
    for pid in left:  # what this test's call started, should the script have missed it
        os.kill(pid, 9)
    assert left == []


def test_deadline_cuts_the_running_check_and_skips_the_rest(tmp_path):
    scale, deadline = 0.02, 100
    rc, wall, summary, _ = dry_call(tmp_path, scale=scale, DEADLINE_S=str(deadline), GPU_VALIDATE_DRY_HANG="tests")
    st = statuses(summary)
    assert [n for _, n, _ in st] == [r[0] for r in budget()]  # every check accounted for, in order
    assert st[0][0] == "PASS" and st[1][:2] == ("FAIL", "tests")
    assert "cut to the deadline" in st[1][2] and "cut at its limit" in st[1][2]
    assert all(s == "SKIP" and "left of DEADLINE_S" in how for s, _, how in st[2:]), summary
    assert rc == 1
    assert wall < deadline * scale + 1.5, f"the call took {wall:.2f} s, past its deadline"


def test_setup_failure_stops_the_call_at_once_with_the_reason(tmp_path):
    rc, wall, summary, _ = dry_call(tmp_path, scale=0.01, GPU_VALIDATE_DRY_FAIL="setup")
    assert [(s, n) for s, n, _ in statuses(summary)] == [("FAIL", "setup")]
    assert any("FAIL gsplat ops: the prebuilt extension cannot be used" in line for line in summary)
    assert any(line.startswith("setup failed: nothing else can run") for line in summary)
    assert rc == 1 and (tmp_path / "out" / "logs.tgz").is_file()


def test_named_checks_rerun_and_a_jit_attempt_fails_its_check(tmp_path):
    rc, _, summary, _ = dry_call(tmp_path, "tests,syncs", scale=0.01, GPU_VALIDATE_DRY_JIT="syncs")
    st = statuses(summary)
    assert [(s, n) for s, n, _ in st] == [("PASS", "setup"), ("PASS", "tests"), ("FAIL", "syncs")]
    assert "JIT build was attempted" in st[2][2]
    assert rc == 1
    rc, _, _, out = dry_call(tmp_path, "tests,nonsense", scale=0.01)
    assert rc == 2 and "unknown check 'nonsense'" in out


# ----------------------------------------------------------------------------- the peer's git sources

SOURCE_VARS = ("GSPLAT_SRC", "PYCOLMAP_SRC", "NERFVIEW_SRC", "FUSED_SSIM_SRC")


def check_sources(tmp: Path, github: str, **env: str) -> Tuple[int, str]:
    """gpu_prepare.sh --check-sources (it runs prepare_gsplat_peer.sh's), GitHub replaced by `github`."""
    full = {k: v for k, v in os.environ.items() if k not in SOURCE_VARS}
    full.update(GITHUB=github, DISTSPLAT_CACHE=str(tmp / "cache"), GIT_TERMINAL_PROMPT="0", **env)
    p = subprocess.run(["bash", str(PREPARE), "--check-sources"], capture_output=True, text=True, env=full,
                       timeout=120)
    return p.returncode, p.stdout + p.stderr


def test_sources_offline_and_unnamed_stop_naming_both_ways(tmp_path):
    rc, out = check_sources(tmp_path, f"file://{tmp_path}/no-such-host")
    assert rc == 1 and "4 of the 4 sources are not available" in out
    for var, name in zip(SOURCE_VARS, ("gsplat", "pycolmap", "nerfview", "fused-ssim")):
        assert f"could not fetch it from file://{tmp_path}/no-such-host/" in out and f"{var}=/path/to/{name}" in out


def test_sources_fetched_by_tag_into_the_cache_or_read_from_a_named_clone(tmp_path):
    # A stand-in for github.com/nerfstudio-project/gsplat with the pinned tag, and a named clone
    # that lacks pycolmap's pinned commit.
    upstream = tmp_path / "hub" / "nerfstudio-project" / "gsplat"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(upstream)]
    upstream.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(upstream)], check=True)
    (upstream / "README").write_text("gsplat\n")
    subprocess.run(git + ["add", "README"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "v"], check=True)
    subprocess.run(git + ["tag", "v1.5.3"], check=True)
    rc, out = check_sources(tmp_path, f"file://{tmp_path}/hub", PYCOLMAP_SRC=str(upstream))
    assert rc == 1 and "3 of the 4 sources are not available" in out, out
    assert "nerfstudio-project/gsplat at v1.5.3" not in out  # fetched
    assert (tmp_path / "cache" / "sources" / "nerfstudio-project+gsplat.git").is_dir()
    assert f"PYCOLMAP_SRC={upstream} is not a git repository holding rmbrualla/pycolmap at cc7ea4b" in out
    assert "NERFVIEW_SRC=/path/to/nerfview" in out and "FUSED_SSIM_SRC=/path/to/fused-ssim" in out


# ----------------------------------------------------------------------------- the carry check

def fake_checkout(tmp: Path) -> Path:
    """A git repository with gpu_prepare.sh and a complete, small fake carry."""
    root = tmp / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(PREPARE, root / "scripts" / "gpu_prepare.sh")
    (root / ".gitignore").write_text("/.whl/\n/.gpu_data/\n/.gsplat_ext/\n/.gsplat_peer/\n")
    names = [f"input_{i:04d}.jpg" for i in range(1, 11)]
    th = root / ".gpu_data" / "thermos"
    for d in ("images", "images_2", "sparse/0"):
        (th / d).mkdir(parents=True)
    for n in names:
        (th / "images" / n).write_bytes(b"x" * 1000)
        (th / "images_2" / n).write_bytes(b"x" * 300)
    (th / "train.txt").write_text("\n".join(names[1:]) + "\n")
    (th / "test.txt").write_text(names[0] + "\n")
    for f in ("cameras.bin", "images.bin", "points3D.bin"):
        (th / "sparse" / "0" / f).write_bytes(b"m")
    for f, data in {".gpu_data/test_garden.npz": b"n", ".gpu_data/COMMIT": b"abc\n",
                    ".gsplat_ext/build_info.json": b"{}", ".gsplat_ext/gsplat_cuda.so": b"so",
                    ".gsplat_peer/BUILD.json": b"{}", ".gsplat_peer/examples/simple_trainer.py": b"#",
                    ".gsplat_peer/site/fused_ssim_cuda.so": b"so", ".whl/gsplat-1.5.3-py3-none-any.whl": b"w"}.items():
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_bytes(data)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "."], check=True)
    return root


def check_carry(root: Path) -> Tuple[int, str]:
    p = subprocess.run(["bash", "scripts/gpu_prepare.sh", "--check-carry"], cwd=root, capture_output=True,
                       text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def test_carry_check_passes_a_complete_carry(tmp_path):
    rc, out = check_carry(fake_checkout(tmp_path))
    assert rc == 0, out
    assert "the carry is ready" in out and "total" in out


def test_carry_check_stops_without_thermos_full_resolution_images(tmp_path):
    root = fake_checkout(tmp_path)
    (root / ".gpu_data" / "thermos" / "images" / "input_0005.jpg").unlink()
    rc, out = check_carry(root)
    assert rc == 1 and "images/ lacks 1 of the 10 images" in out and "input_0005.jpg" in out
    shutil.rmtree(root / ".gpu_data" / "thermos" / "images")
    rc, out = check_carry(root)
    assert rc == 1 and "full-resolution images are not in the carry" in out


def test_carry_check_stops_over_64_mib_instead_of_dropping_images(tmp_path):
    root = fake_checkout(tmp_path)
    with open(root / ".gsplat_peer" / "site" / "big.bin", "wb") as f:  # sparse: no disk used
        f.truncate(64 * 1024 * 1024)
    rc, out = check_carry(root)
    assert rc == 1 and "over 64 MiB" in out and "not dropped to fit" in out
    assert (root / ".gpu_data" / "thermos" / "images" / "input_0001.jpg").is_file()  # nothing was removed


def test_setup_check_fails_fast_with_the_reason_without_a_gpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the check would pass")
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_setup_check.py"), str(tmp_path / "m.json")],
                       capture_output=True, text=True, timeout=120, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 1 and p.stdout.startswith("setup: FAIL GPU: ") and "sees no CUDA device" in p.stdout
    assert not (tmp_path / "m.json").exists()
