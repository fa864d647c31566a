"""faults.py on one process (issue 21): the divergence check and the save guard's decisions,
with no process group (the collectives are the identity at W = 1). The 2-rank behaviour
is tested under torchrun in tests/distributed/test_disk_full.py and test_divergence.py."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest
import torch

from distsplat.distributed import DistContext
from distsplat.train import checkpoint as ck
from distsplat.train.faults import DivergenceGuard, SaveGuard, is_disk_full, payload_bytes

CTX = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)


def params_with_grads(**grads):
    params = {k: torch.nn.Parameter(torch.zeros(4, 3)) for k in ("means", "scales")}
    for k, g in grads.items():
        params[k].grad = g
    return params


@pytest.mark.parametrize("bad", ["nan_loss", "inf_loss", "nan_grad", "inf_grad", "none"])
def test_divergence_guard_flags_any_non_finite_loss_or_gradient(bad):
    loss = torch.tensor({"nan_loss": float("nan"), "inf_loss": float("inf")}.get(bad, 0.5))
    grad = torch.ones(4, 3)
    if bad in ("nan_grad", "inf_grad"):
        grad[2, 1] = float("nan") if bad == "nan_grad" else -float("inf")
    guard = DivergenceGuard(CTX, torch.device("cpu"), max_bad_steps=2)
    assert guard.bad_step(7, loss, params_with_grads(means=grad)) == (bad != "none")
    assert guard.in_a_row == (bad != "none") and not guard.diverged


def test_divergence_guard_counts_in_a_row_and_resets_on_a_good_step():
    guard = DivergenceGuard(CTX, torch.device("cpu"), max_bad_steps=3)
    nan, ok = torch.tensor(float("nan")), torch.tensor(1.0)
    p = params_with_grads(means=torch.ones(4, 3))
    assert [guard.bad_step(s, loss, p) for s, loss in enumerate([nan, nan, ok, nan, nan])] == [1, 1, 0, 1, 1]
    assert guard.in_a_row == 2 and guard.first_bad == 3 and not guard.diverged
    assert guard.bad_step(5, nan, p) and guard.diverged
    msg = str(guard.error(True, Path("/r/ckpts"), 6))
    assert msg.startswith("training diverged: 3 steps in a row (steps 3 to 5)") and "--ckpt /r/ckpts/step_000006" in msg


def test_divergence_guard_off_checks_nothing():
    guard = DivergenceGuard(CTX, torch.device("cpu"), max_bad_steps=0)
    assert not guard.bad_step(0, torch.tensor(float("nan")), params_with_grads())
    assert not guard.diverged


def test_save_guard_skips_a_disk_full_write_and_says_where_and_how_much(tmp_path, caplog):
    guard = SaveGuard(CTX, torch.device("cpu"), tmp_path / "ckpts")

    def full():
        raise OSError(errno.ENOSPC, "No space left on device", "x")

    with caplog.at_level(logging.WARNING, logger="distsplat.train.faults"):
        assert not guard.run("checkpoint of step 3", lambda r: tmp_path / f"f{r}", 12345, full)
    assert "checkpoint of step 3 not saved: rank 0 could not write " + str(tmp_path / "f0") in caplog.text
    assert "(12345 bytes)" in caplog.text and "no checkpoint is complete yet" in caplog.text
    assert guard.run("checkpoint of step 3", lambda r: tmp_path, 0, lambda: None)
    assert guard.failed == ["checkpoint of step 3"]
    metrics = {}
    guard.report_end(metrics)
    assert metrics["failed_saves"] == ["checkpoint of step 3"]


def test_save_guard_lets_other_errors_through(tmp_path):
    guard = SaveGuard(CTX, torch.device("cpu"), tmp_path)

    def denied():
        raise PermissionError(errno.EACCES, "Permission denied", "x")

    with pytest.raises(PermissionError):
        guard.run("PLY of step 1", lambda r: tmp_path, 0, denied)
    assert is_disk_full(OSError(errno.EDQUOT, "quota")) and is_disk_full(OSError(errno.EROFS, "ro"))
    assert not is_disk_full(OSError(errno.EIO, "io")) and not is_disk_full(ValueError())


def test_payload_bytes_counts_every_tensor():
    payload = {"params": {"a": torch.zeros(10, 3)}, "optim": {"a": {"step": torch.tensor(1.0), "lr": 0.1}},
               "rng": [torch.zeros(5, dtype=torch.uint8)]}
    assert payload_bytes(payload) == 10 * 3 * 4 + 4 + 5


def test_initial_gaussians_past_the_whole_memory_limit_end_setup():
    """A GPU too small for the initial Gaussians: ValueError before training (the limit flag
    stands in for the device's memory); one that fits does not raise."""
    from distsplat.train.gaussians import create_optimizers, init_gaussians
    from distsplat.train.memory import MemoryGuard, bytes_per_gaussian

    params = init_gaussians(torch.randn(1000, 3), torch.rand(1000, 3), 1, (0, 1000))
    optimizers = create_optimizers(params, global_batch=1)
    b, _ = bytes_per_gaussian(dict(params), 2)
    small = MemoryGuard(1000 * b - 1, 0.9, rank=3, accumulators=2, measure=lambda: 0, limit_source="--memory_limit_gb x")
    with pytest.raises(ValueError, match=r"rank 3's 1000 initial Gaussians need .* more than its .* \(--memory_limit_gb x\)"):
        small.check_setup(params, optimizers, {})
    enough = MemoryGuard(1000 * b + 1, 0.9, rank=3, accumulators=2, measure=lambda: 0)
    enough.check_setup(params, optimizers, {})  # fits: no error (at most the growth warning)
