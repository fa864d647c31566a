"""The `run_workers` fixture: the one way tests in this folder start gloo processes."""

import pytest

from harness import run_workers as _run_workers


@pytest.fixture(scope="session")
def run_workers():
    return _run_workers
