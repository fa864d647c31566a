"""Preemption on one process (issue 44): the stop signals' handlers (real signals to this
process), the stop and save requests as every rank reads them back, and what makes a
checkpoint "of this run" (which checkpoints pruning keeps: test_checkpoint.py). The runs are in
tests/distributed/test_preemption.py and test_slurm_example.py."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from pathlib import Path

import pytest
import torch

from distsplat.distributed import DistContext
from distsplat.train import auto_resume
from distsplat.train.config import Config, default_config, mcmc_config
from distsplat.train.guards.faults import DivergenceGuard
from distsplat.train.guards.preemption import EXIT_PREEMPTED, Preemption, StopSignals

CTX = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)


@pytest.fixture
def signals():
    s = StopSignals()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    assert s.install()
    yield s
    for sig, old in before.items():
        signal.signal(sig, old)


def test_a_stop_signal_is_recorded_and_repeats_change_nothing(signals):
    os.kill(os.getpid(), signal.SIGUSR1)
    assert signals.signum == signal.SIGUSR1 and signals.at is not None
    at = signals.at
    os.kill(os.getpid(), signal.SIGTERM)  # srun and torchrun may both deliver one: still running, unchanged
    os.kill(os.getpid(), signal.SIGUSR1)
    assert signals.signum == signal.SIGUSR1 and signals.at == at
    assert signal.getsignal(signal.SIGTERM) == signals._handle  # a repeat never ends the process


def test_a_second_sigint_or_torchruns_sigterm_after_it_ends_the_process_at_once(signals):
    os.kill(os.getpid(), signal.SIGINT)
    assert signals.signum == signal.SIGINT
    # the next SIGINT or SIGTERM takes the default action: the kernel ends the process, even mid-collective
    assert signal.getsignal(signal.SIGINT) == signal.SIG_DFL and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    signals.restore()
    assert signal.getsignal(signal.SIGINT) == signal.default_int_handler  # pytest's process: Python's own
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # stopping: a late duplicate must not kill the exit


def test_restore_without_a_signal_puts_the_handlers_back(signals):
    signals.restore()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL and signal.getsignal(signal.SIGINT) == signal.default_int_handler


def test_a_failing_run_gives_the_signal_back(signals):
    signals.abandon()  # nothing recorded: just the old handlers
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_requests_ride_on_the_divergence_check_and_are_decided_on_steps_every_rank_has_read():
    p = Preemption(is_main=True, save_every_minutes=0)
    guard = DivergenceGuard(CTX, torch.device("cpu"), max_bad_steps=3, requests=p)
    grads = {"means": torch.nn.Parameter(torch.zeros(2, 3))}
    grads["means"].grad = torch.ones(2, 3)
    for step in range(3):
        assert float(guard.check(step, torch.tensor(0.5), grads)) == 0.0
        assert not guard.poll(step + 1, flush=False)
        assert not p.stop_due() and not p.save_due()
    p.signals.signum, p.signals.at = signal.SIGTERM, 0.0  # as the handler records it
    guard.check(3, torch.tensor(0.5), grads)
    assert list(guard.reader._pending[-1][1].shape) == [1 + 2]  # [W + 2]: the flag, stops, saves
    guard.poll(4, flush=False)
    assert p.stop_due()
    metrics = p.stopped(True, 4, Path("/r/ckpts/step_000004"), "no checkpoint is complete yet", {})
    assert metrics["preempted"]["line"].startswith("preempted at step 4 by SIGTERM: checkpoint saved to "
                                                   "/r/ckpts/step_000004 in ")
    assert metrics["preempted"]["line"].endswith(" s; the same command resumes") and EXIT_PREEMPTED == 75


def test_the_save_clock_asks_once_and_a_save_answers_the_requests_before_it():
    p = Preemption(is_main=True, save_every_minutes=1e-9)  # due at once
    guard = DivergenceGuard(CTX, torch.device("cpu"), max_bad_steps=0, requests=p)  # no check: requests still ride
    assert guard.check(0, torch.tensor(0.5), {}) is None
    guard.poll(1, flush=False)
    assert p.save_due() and not p.stop_due()
    p.saved(1)
    assert not p.save_due()
    p.read(0, 0.0, 1.0)  # a request from before that save (read late, as on CUDA): answered already
    assert not p.save_due()
    assert Preemption(is_main=False, save_every_minutes=1e-9).local() == (False, False)  # rank 0's clock only


def test_result_flags_are_the_command_line_as_typed_without_outputs_or_resources():
    cfg = default_config()
    flags = auto_resume.run_flags(cfg)
    assert flags["strategy.type"] == "DefaultStrategy" and flags["strategy.grow_grad2d"] == 0.0002
    assert flags["eval_steps"] == [7000, 30000] and "disable_viewer" not in flags  # the viewer's are not the trainer's
    other = auto_resume.run_flags(dataclasses.replace(cfg, max_steps=5, save_steps=[1], num_workers=9,
                                                      result_dir="x", backend="torch", seed=cfg.seed))
    assert auto_resume.differing(flags, other) == []
    changed = auto_resume.run_flags(dataclasses.replace(cfg, sh_degree=2, seed=7))
    assert auto_resume.describe(auto_resume.differing(flags, changed)) == "--seed 42 there, 7 now; --sh_degree 3 there, 2 now"
    mcmc = auto_resume.run_flags(mcmc_config())
    assert "the subcommand (default | mcmc) DefaultStrategy there, MCMCStrategy now" in \
        auto_resume.describe(auto_resume.differing(flags, mcmc))
    # every name in NOT_RESULT is a flag (a typo there would make a flag count silently)
    names = set(flags) | {f"strategy.{f.name}" for f in dataclasses.fields(type(cfg.strategy))}
    assert auto_resume.NOT_RESULT <= names, auto_resume.NOT_RESULT - names
    assert json.loads(json.dumps(flags)) == flags


def test_no_checkpoint_plans_a_fresh_run_and_no_resume_says_what_it_replaces(tmp_path, caplog):
    cfg = default_config()
    cfg.result_dir = str(tmp_path / "r")
    assert auto_resume.plan(cfg, CTX, auto_resume.run_flags(cfg)) == auto_resume.Plan()
    cfg.ckpt = "somewhere"
    assert auto_resume.plan(cfg, CTX, {}) == auto_resume.Plan(ckpt="somewhere")
    assert isinstance(Config.resume, bool) and Config.save_every_minutes == 30.0
