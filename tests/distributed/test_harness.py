"""The harness itself: results come back in rank order, a failing rank is reported with
its rank, and a hang is killed at the timeout instead of hanging CI."""

import time

import pytest

from harness import WorkerFailure


def test_failure_names_the_rank(run_workers):
    with pytest.raises(WorkerFailure, match=r"\[rank 1\] (.|\n)*boom on purpose"):
        run_workers("workers:fail_or_hang", 2, "raise", timeout_s=60)


def test_hang_fails_at_the_timeout(run_workers):
    t0 = time.monotonic()
    with pytest.raises(WorkerFailure, match=r"still running after 3 s \(a hang\?\)"):
        run_workers("workers:fail_or_hang", 2, "hang", timeout_s=3)
    assert time.monotonic() - t0 < 20
