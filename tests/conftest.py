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

os.environ["DISTSPLAT_NO_DOWNLOAD"] = "1"  # distsplat.train.lpips.NO_DOWNLOAD_ENV

SHARED_DATA = data_dir()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("DISTSPLAT_FAIL_ON_SKIP") == "1" and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped, and DISTSPLAT_FAIL_ON_SKIP=1 forbids skips: {reason}"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real test data not found at {SHARED_DATA} (set DISTSPLAT_DATA, or run "
                    "scripts/gpu_prepare.sh to fill .gpu_data/)")
    return SHARED_DATA
