"""20 Adam steps without densification with W = 2 and 3 gloo ranks reach the same
parameters as one process training all Gaussians on the same global batches (the loss
is the mean over the global batch; each rank adds its own cameras' share)."""

import pytest
import torch

from scenes import train_loop

STEPS, BATCH, LR = 20, 4, 0.01


@pytest.fixture(scope="module")
def one_process():
    return train_loop(0, 1, STEPS, BATCH, LR, reference=True)


def test_parameters_moved(one_process):
    start = train_loop(0, 1, 0, BATCH, LR, reference=True)
    assert all((one_process[k] - start[k]).abs().amax() > 1e-3 for k in start)


def test_w1_distributed_path_matches(one_process):
    got = train_loop(0, 1, STEPS, BATCH, LR)
    for k, v in one_process.items():
        torch.testing.assert_close(got[k], v, rtol=1e-9, atol=1e-10, msg=lambda m: f"{k}: {m}")


@pytest.mark.parametrize("W", [2, 3])
def test_w_ranks_reach_one_process_parameters(run_workers, one_process, W):
    results = run_workers("workers:train", W, STEPS, BATCH, LR)
    for k, v in one_process.items():
        got = torch.cat([r[k] for r in results])
        torch.testing.assert_close(got, v, rtol=1e-9, atol=1e-10, msg=lambda m: f"W={W}, {k}: {m}")
