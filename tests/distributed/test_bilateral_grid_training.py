"""--use_bilateral_grid in the Trainer on gloo CPU ranks (issue 46, point 1): W = 1, 2, 3 on the
same global batches (test_extras_training.py's runs) of the built-in scene with a known per-image
exposure and white-balance change end with the same Gaussians and the same grids (each image's
on its owner) within their rounding bound, report the same colour-corrected scores, and W=2's
checkpoint resumes on W=3 with every grid in its place."""

from __future__ import annotations

import pytest
import torch

from test_extras_training import run_w123, shared_excess
from test_trainer import assert_same_gaussians, densify_config

SHAPE = (4, 4, 4)  # x, y, luminance cells: small, so that the rounding bound's record stays small


def grids(cfg):
    cfg.use_bilateral_grid, cfg.bilateral_grid_shape = True, SHAPE
    cfg.synthetic.exposure, cfg.synthetic.white_balance = 1.5, 0.1


def grid_table(results):
    """Every training image's grid [n_train, 12, L, Y, X], each from its owner rank (exactly one)."""
    rows = torch.stack([r["bilagrid"] for r in results])  # [W, n_train, ...], NaN off the owner
    assert ((~rows.isnan()).flatten(2).all(-1).sum(0) == 1).all()
    return rows.nan_to_num(0.0).sum(0)


@pytest.mark.slow  # 6 processes, 20 float64 steps each (test_trainer's densification test's size)
def test_bilateral_grid_training_is_w_invariant_and_resumes_on_any_w(run_workers, tmp_path):
    from distsplat.train.model.bilateral_grid import LR, identity_grids, lr_factor

    runs = run_w123(run_workers, tmp_path, grids, save_steps=[20])
    assert_same_gaussians(runs)
    one = grid_table(runs[1])
    moved = (one - identity_grids(len(one), SHAPE, one.dtype)).abs().amax(dim=(1, 2, 3, 4))  # [n_train]
    # every image's grid trained: by over a quarter of the farthest Adam's steps (each <= its lr) could take it in
    # these 20 steps of gsplat's schedule (1% warming up over 1000 steps, decaying to 1% over the run)
    reach = sum(LR * 3 ** 0.5 * lr_factor(t, 20, 1000) for t in range(20))
    assert (moved > 0.25 * reach).all(), (moved, reach)
    # A cell's gradient sums its image's pixels and the total variation: within that sum's rounding
    # bound (a grid stepped on the wrong rank, or its loss lost, moves it by whole Adam steps)
    excess = shared_excess(runs, "bilagrid", grid_table)
    assert all(e <= 1.0 for e in excess.values()), excess
    for W in (2, 3):  # gsplat's colour-corrected scores beside the plain ones, the same on every W
        for k in ("val_psnr", "val_cc_psnr", "val_cc_ssim"):
            assert runs[W][0]["metrics"][k] == pytest.approx(runs[1][0]["metrics"][k], abs=1e-5), (W, k)
    m = runs[1][0]["metrics"]
    assert m["val_cc_psnr"] >= m["val_psnr"] - 0.01 and m["val_cc_lpips"] is None  # LPIPS off in tests
    cfg = densify_config(str(tmp_path / "r3"), 1, ckpt=str(tmp_path / "w2" / "ckpts"))
    grids(cfg)
    resumed = run_workers("trainer_workers:resume", 3, cfg)
    assert torch.equal(grid_table(resumed), grid_table(runs[2]))  # W=2's grids, now on W=3's owners, exactly
