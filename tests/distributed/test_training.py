"""20 Adam steps without densification with W = 2 and 3 gloo ranks reach the same
parameters as one process training all Gaussians on the same global batches (the loss
is the mean over the global batch; each rank adds its own cameras' share)."""

import pytest
import torch

from scenes import train_loop

pytestmark = pytest.mark.numerics  # rerun under other numeric paths in CI (docs/testing.md)

STEPS, BATCH, LR = 20, 4, 0.01
# float64 with Adam's default eps 1e-8 (not the trainer's 7e-16): a gradient summed in
# another order differs by <= 4 x 32 x 24 u |terms| ~ 3e-13 |terms|, which moves a step by
# <= LR * that / (sqrt(v_hat) + 1e-8). Random targets give visible Gaussians gradients
# >= ~1e-6 >> eps, so <= LR * 3e-13 * |terms| / |g| ~ 1e-14 per step and ~1e-13 after 20
# steps (more where |terms| >> |g|): rtol 1e-9 / atol 1e-10 leave x1000. A lost or
# mis-routed camera's gradient moves parameters by ~LR = 1e-2.
TOL = dict(rtol=1e-9, atol=1e-10)


@pytest.fixture(scope="module")
def one_process():
    return train_loop(0, 1, STEPS, BATCH, LR, reference=True)


def test_parameters_moved(one_process):
    start = train_loop(0, 1, 0, BATCH, LR, reference=True)
    assert all((one_process[k] - start[k]).abs().amax() > 1e-3 for k in start)


def test_w1_distributed_path_matches(one_process):
    got = train_loop(0, 1, STEPS, BATCH, LR)
    for k, v in one_process.items():
        torch.testing.assert_close(got[k], v, **TOL, msg=lambda m: f"{k}: {m}")


@pytest.mark.parametrize("W", [2, 3])
def test_w_ranks_reach_one_process_parameters(run_workers, one_process, W):
    results = run_workers("workers:train", W, STEPS, BATCH, LR)
    for k, v in one_process.items():
        got = torch.cat([r[k] for r in results])
        torch.testing.assert_close(got, v, **TOL, msg=lambda m: f"W={W}, {k}: {m}")
