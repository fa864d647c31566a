"""Shared fixtures: CUDA tests are skipped without a GPU; real data (test_garden.npz, the
thermos capture) is read from the folder DISTSPLAT_DATA names, e.g.

    DISTSPLAT_DATA=/path/to/data python -m pytest tests/unit

else from `shared/data` beside the repository checkout, else the repository's .gpu_data/ (what
scripts/gpu_prepare.sh copies for the GPU machine), and tests skip with a reason when none
exists (benchmarks/paths.py's data_dir, which the benchmarks use too).

DISTSPLAT_FAIL_ON_SKIP=1 turns every skip into a failure: a GPU validation whose tests
skipped (no data, no GPU) must not look green.

distsplat downloads nothing in tests (CI may be offline, and a run would fetch LPIPS' 233 MB
AlexNet): the environment below, which every rank a test starts inherits, turns its downloads
off; tests of the download unset it and serve the files themselves from 127.0.0.1. (The
splat-transform interop test fetches its npm package, once, or skips.)"""

import os
from pathlib import Path

import pytest
import torch

from benchmarks.paths import data_dir

os.environ["DISTSPLAT_NO_DOWNLOAD"] = "1"  # distsplat.train.scoring.lpips.NO_DOWNLOAD_ENV

SHARED_DATA = data_dir()


def cores() -> int:
    """The cores this process may run on (a container's CPU set, not the host's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook; without it (-p no:xdist) nothing calls it
def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject's addopts): one test process per core, at most 4. Most of the
    suite's time is spent starting and waiting for CPU ranks (torchrun, gloo, imports) on
    one core, so two processes use a 2-core machine's second core; each test may start up to
    4 ranks of its own, so more than 4 workers would only crowd them."""
    return max(1, min(cores(), 4))


# The workers share the cores: intra-op threads split between them (ranks set their own).
# DISTSPLAT_TEST_THREADS sets them instead (.ci/run's second pass: 2 threads, another
# reduction order for the numerics tests).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if os.environ.get("DISTSPLAT_TEST_THREADS"):
    torch.set_num_threads(int(os.environ["DISTSPLAT_TEST_THREADS"]))
elif _WORKERS > 1:
    torch.set_num_threads(max(1, cores() // _WORKERS))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("DISTSPLAT_FAIL_ON_SKIP") == "1" and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped, and DISTSPLAT_FAIL_ON_SKIP=1 forbids skips: {reason}"


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        slow_files_first(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def slow_files_first(items) -> None:
    """Under xdist, files whose tests are marked `slow` first, most slow tests first, then the
    others, each file's tests in their order. `--dist loadfile` hands out whole files in this
    order (pyproject's --no-loadscope-reorder keeps xdist from sorting them by test count,
    which sent the files of one or two long tests, test_multinode.py's 85 s, last): a long
    file that starts last leaves the other cores idle until it ends, short ones fill the gaps.
    Every worker sorts alike (xdist checks that their collections agree); `-n 0` keeps the
    file order."""
    slow, first = {}, {}
    for i, item in enumerate(items):
        first.setdefault(item.path, i)
        slow[item.path] = slow.get(item.path, 0) + ("slow" in item.keywords)
    order = {item: i for i, item in enumerate(items)}
    items.sort(key=lambda item: (-slow[item.path], first[item.path], order[item]))


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real test data not found at {SHARED_DATA} (set DISTSPLAT_DATA, or run "
                    "scripts/gpu_prepare.sh to fill .gpu_data/)")
    return SHARED_DATA
