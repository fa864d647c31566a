"""A failing rank never leaves the others hanging, and the job names it.

Setup-time errors on some ranks are agreed (every rank raises the same error, one
all-reduce). Later, a rank that raises, is SIGKILLed or hangs mid-step brings the whole
job down within 60 s, and the surviving ranks' last line names the failing rank: the
real CLI under torchrun with a fault injected by tests/distributed/fault_trainer.py."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from torchrun_cli import TINY_FLAGS, torchrun

FAULT_TRAINER = Path(__file__).resolve().parent / "fault_trainer.py"


@pytest.mark.parametrize("W", [2, 3])
def test_setup_errors_are_agreed_by_every_rank(run_workers, W):
    last = W - 1
    # Bad input on one rank: the same ValueError everywhere, naming that rank.
    out = run_workers("failure_workers:agree", W, {last: ("value", "image x.jpg is corrupt")})
    assert {o["raised"] for o in out} == {"ValueError"}
    assert {o["message"] for o in out} == {f"rank {last}: image x.jpg is corrupt"}
    assert all(o["agreed"] for o in out)
    # Bad input on every rank (a bad flag): the message unprefixed, the lowest rank's.
    out = run_workers("failure_workers:agree", W, {r: ("value", f"bad flag {r}") for r in range(W)})
    assert {o["message"] for o in out} == {"bad flag 0"}
    # A bug on one rank: it keeps its own exception (and traceback); the others name it.
    out = run_workers("failure_workers:agree", W, {1: ("runtime", "boom")})
    assert out[1] == {"raised": "RuntimeError", "message": "boom", "same_object": True}
    for r in set(range(W)) - {1}:
        assert out[r] == {"raised": "PeerFailure", "message": "rank 1 failed during setup: RuntimeError: boom"}
    # Nobody failed: nothing raised.
    assert run_workers("failure_workers:agree", W, {}) == [{"raised": None}] * W


def run_fault(tmp_path, fault: str, nproc: int, timeout_s: float = 30, steps: int = 400):
    t0 = time.monotonic()
    p = torchrun(["default", "--max_steps", str(steps), "--eval_steps", str(steps),
                  "--result_dir", str(tmp_path / "run"), *TINY_FLAGS], nproc, collective_timeout_s=timeout_s,
                 script=FAULT_TRAINER, extra_env={"DISTSPLAT_FAULT": fault})
    return p, time.monotonic() - t0


def our_lines(stderr: str):
    return [line for line in stderr.splitlines() if line.startswith("distsplat:")]


def root_cause_rank(stderr: str) -> int:
    """The rank torchrun's failure summary calls the root cause."""
    block = stderr.split("Root Cause (first observed failure):", 1)[1]
    return int(re.search(r"rank\s*:\s*(\d+)", block).group(1))


@pytest.mark.slow
@pytest.mark.parametrize("nproc, victim", [(2, 1), (3, 0)], ids=["W2-rank1", "W3-rank0"])
def test_an_exception_mid_step_ends_the_job_naming_the_rank(tmp_path, nproc, victim):
    p, seconds = run_fault(tmp_path, f"raise:{victim}:5", nproc)
    assert p.returncode != 0 and seconds < 60, (seconds, p.stderr[-3000:])
    lines = our_lines(p.stderr)
    cause = f"rank {victim} failed at step 5: RuntimeError: injected fault at step 5"
    assert f"distsplat: {cause}" in lines, p.stderr[-3000:]
    assert "Traceback" in p.stderr.split(f"distsplat: {cause}")[0]  # the failing rank's traceback
    # Every surviving rank that printed says which rank it stopped for (torchrun may stop
    # a survivor with SIGTERM before its collective breaks: then it prints nothing).
    for line in lines:
        if line != f"distsplat: {cause}":
            assert "because a peer failed" in line and line.endswith(cause), line
    assert cause in p.stderr.split("Root Cause (first observed failure):", 1)[1]


@pytest.mark.slow
@pytest.mark.parametrize("nproc, victim", [(2, 1), (3, 2)], ids=["W2-rank1", "W3-rank2"])
def test_a_sigkill_mid_step_ends_the_job_naming_the_rank(tmp_path, nproc, victim):
    p, seconds = run_fault(tmp_path, f"kill:{victim}:5", nproc)
    assert p.returncode != 0 and seconds < 60, (seconds, p.stderr[-3000:])
    # No error of its own to tell: torchrun's summary names it (SIGKILL), and so does any
    # survivor whose collective broke before torchrun stopped it.
    assert root_cause_rank(p.stderr) == victim, p.stderr[-3000:]
    assert "Signal 9 (SIGKILL)" in p.stderr
    for line in our_lines(p.stderr):
        assert f"rank {victim} reported no error: killed" in line, line


HUNG_TEST = "test_a_hung_rank_ends_the_job_at_the_collective_timeout_naming_it"


@pytest.fixture(scope="module", autouse=True)
def hung_run(request, tmp_path_factory):
    """The hung-rank job, started in the background when this module starts (if its test
    was selected): it spends most of its time waiting out the collective timeout, with
    the CPU idle, so the other tests' jobs run meanwhile. Its own test waits for it and
    asserts on it alone (its own result dir and rendezvous, as every job here)."""
    from concurrent.futures import ThreadPoolExecutor

    if not any(item.module is request.module and getattr(item, "originalname", "") == HUNG_TEST
               for item in request.session.items):
        yield None
        return
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hung")
    future = pool.submit(run_fault, tmp_path_factory.mktemp("hung"), "hang:1:5", 2, 15)
    try:
        yield future
    finally:
        pool.shutdown(wait=True)


@pytest.mark.slow
def test_a_hung_rank_ends_the_job_at_the_collective_timeout_naming_it(hung_run):
    # Rank 1 stays alive but stops (a deadlock, a stuck file system): the others' collective
    # times out after DISTSPLAT_TIMEOUT_S, they name rank 1, and torchrun stops it.
    p, seconds = hung_run.result()  # run_fault(tmp_path, "hang:1:5", 2, timeout_s=15), begun at the module's start
    assert p.returncode != 0 and 15 < seconds < 60, (seconds, p.stderr[-3000:])
    (line,) = our_lines(p.stderr)
    assert line.startswith("distsplat: rank 0 stopped at step 5 because a peer failed (Timed out"), line
    assert line.endswith("rank 1 reported no error: killed (e.g. out of memory, SIGKILL) or stuck; see its log")


@pytest.mark.slow
def test_bad_input_seen_by_one_rank_at_setup_is_reported_by_every_rank(tmp_path):
    """Every rank agrees on rank 1's error and stops; rank 0 prints it, once (issue 32), and
    torchrun's summary shows it as the root cause."""
    p, seconds = run_fault(tmp_path, "setup:1:0", 2)
    assert p.returncode != 0 and seconds < 60
    line = "distsplat: error: rank 1: injected bad input seen only by rank 1"
    assert our_lines(p.stderr) == [line]
    assert line in p.stderr.split("Root Cause (first observed failure):", 1)[1]
    assert not re.search(r'File ".*/(distsplat|tests)/', p.stderr), p.stderr  # no traceback of ours
    assert not (tmp_path / "run").exists()  # nothing written
