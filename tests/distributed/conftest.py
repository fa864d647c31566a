"""The `run_workers` fixture: the one way tests in this folder start gloo processes."""

import pytest

from harness import run_workers as _run_workers


@pytest.fixture(scope="session")
def run_workers():
    return _run_workers


@pytest.fixture(scope="session")
def phased(tmp_path_factory):
    """Issue 44's uninterrupted reference run and its phase test (preemption_workers.py), once per
    session: test_preemption.py and test_slurm_example.py compare their runs with the reference."""
    from preemption_workers import run_phases

    return run_phases(tmp_path_factory)
