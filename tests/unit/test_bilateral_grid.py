"""The bilateral grid's pieces (issue 46, point 1; distsplat/train/model/bilateral_grid.py,
color_correct.py) against independent references: the slicing against trilinear interpolation
written out corner by corner, its gradients against finite differences, the total variation
against a loop over neighbouring cells, the learning-rate schedule against torch's own
schedulers (gsplat's ChainedScheduler), the colour correction against a known warp; and the
built-in scene's known exposure change."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from distsplat.train.model.bilateral_grid import identity_grids, lr_factor, slice_grids, total_variation
from distsplat.train.scoring.color_correct import _expansion, color_correct


def trilinear_reference(grids: np.ndarray, rgb: np.ndarray) -> np.ndarray:
    """grids [C, 12, L, Y, X], rgb [C, H, W, 3] -> [C, H, W, 3], pixel by pixel: the pixel centre's
    place in the grid's x and y cells (the grid's ends at the image's edges), the BT.601 luma's
    in its L cells (ends at luma 0 and 1, clamped beyond), the 8 surrounding cells' 3x4 transforms
    blended by their trilinear weights, applied to the colour."""
    C, _, L, Y, X = grids.shape
    _, H, W, _ = rgb.shape
    out = np.zeros_like(rgb)
    for c, i, j in itertools.product(range(C), range(H), range(W)):
        luma = rgb[c, i, j] @ np.array([0.299, 0.587, 0.114])
        at = [min(max((j + 0.5) / W, 0), 1) * (X - 1), min(max((i + 0.5) / H, 0), 1) * (Y - 1),
              min(max(luma, 0), 1) * (L - 1)]
        A = np.zeros(12)
        for corner in itertools.product((0, 1), repeat=3):
            idx, weight = [], 1.0
            for axis, (u, n) in enumerate(zip(at, (X, Y, L))):
                lo = min(int(math.floor(u)), n - 2)
                idx.append(lo + corner[axis])
                weight *= (u - lo) if corner[axis] else (1 - (u - lo))
            A += weight * grids[c, :, idx[2], idx[1], idx[0]]
        A = A.reshape(3, 4)
        out[c, i, j] = A[:, :3] @ rgb[c, i, j] + A[:, 3]
    return out


def test_slicing_is_trilinear_interpolation_of_the_affine_transforms():
    g = torch.Generator().manual_seed(0)
    grids = identity_grids(2, (4, 3, 5), torch.float64) + 0.3 * torch.randn(2, 12, 5, 3, 4, generator=g,
                                                                          dtype=torch.float64)
    rgb = torch.rand(2, 5, 7, 3, generator=g, dtype=torch.float64) * 1.4 - 0.2  # lumas beyond [0, 1] too
    got = slice_grids(grids, rgb)
    want = trilinear_reference(grids.numpy(), rgb.numpy())
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)
    same = slice_grids(identity_grids(2, (4, 3, 5), torch.float64), rgb)  # the identity: no change (weights sum to 1)
    torch.testing.assert_close(same, rgb, atol=1e-15, rtol=0)


def test_slicing_gradients_match_finite_differences():
    g = torch.Generator().manual_seed(1)
    grids = (identity_grids(2, (2, 3, 3), torch.float64)
             + 0.2 * torch.randn(2, 12, 3, 3, 2, generator=g, dtype=torch.float64)).requires_grad_()
    rgb = (torch.rand(2, 3, 2, 3, generator=g, dtype=torch.float64) * 0.8 + 0.1).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: slice_grids(a, b), (grids, rgb), eps=1e-6, atol=1e-7,
                                    fast_mode=True)


def test_total_variation_is_gsplats_and_sums_over_ranks():
    g = torch.Generator().manual_seed(2)
    grids = torch.randn(5, 12, 3, 4, 6, generator=g, dtype=torch.float64)
    ref = 0.0
    for axis in (2, 3, 4):  # per axis: sum of squared neighbour differences / cells of one grid's differences
        total, cells = 0.0, None
        for n in range(5):
            a = grids[n].numpy()
            d = np.diff(a, axis=axis - 1)
            total += (d ** 2).sum()
            cells = d.size
        ref += total / cells
    ref /= 5
    assert float(total_variation(grids, 5)) == pytest.approx(ref, rel=1e-12)
    # each rank's share (its own grids over all n) sums to the whole
    shares = float(total_variation(grids[:2], 5)) + float(total_variation(grids[2:], 5))
    assert shares == pytest.approx(ref, rel=1e-12)
    assert float(total_variation(identity_grids(3, (4, 4, 2)), 3)) == 0.0


def test_learning_rate_schedule_is_gsplats_chained_scheduler():
    """gsplat: ChainedScheduler([LinearLR(start_factor=0.01, total_iters=1000), ExponentialLR(gamma=0.01 **
    (1 / max_steps))]), stepped after each update: the lr of update t is the base times lr_factor(t)."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.Adam([p], lr=2e-3)
    max_steps, warmup = 1500, 1000
    sched = torch.optim.lr_scheduler.ChainedScheduler([
        torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=warmup),
        torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.01 ** (1.0 / max_steps))])
    for t in range(max_steps):
        if t in (0, 1, 500, 999, 1000, 1001, 1499):
            assert opt.param_groups[0]["lr"] == pytest.approx(2e-3 * lr_factor(t, max_steps, warmup), rel=1e-9), t
        opt.step()
        sched.step()


def test_color_correct_recovers_a_known_quadratic_warp_and_ignores_clipped_pixels():
    g = torch.Generator().manual_seed(3)
    img = torch.rand(24, 32, 3, generator=g, dtype=torch.float64) * 0.6 + 0.2
    warp = torch.randn(10, 3, generator=g, dtype=torch.float64) * 0.02
    warp[6:9] += torch.eye(3, dtype=torch.float64) * 0.85  # mostly a per-channel gain, mixed a little
    ref = (_expansion(img.reshape(-1, 3)) @ warp).reshape(img.shape)
    assert 0.0 < ref.min() and ref.max() < 1.0
    torch.testing.assert_close(color_correct(img, ref), ref, atol=1e-10, rtol=0)
    # saturated ground-truth pixels (a blown-out sky) do not pull the fit: the rest is still recovered
    clipped = ref.clone()
    clipped[:6] = 1.0
    out = color_correct(img, clipped)
    torch.testing.assert_close(out[6:], ref[6:], atol=1e-9, rtol=0)
    assert (color_correct(img.float(), ref.float()) - ref.float()).abs().max() < 1e-5  # float32 in, float32 out


def test_the_built_in_scene_with_a_known_exposure_change():
    """--synthetic.exposure / white_balance scale every training image by its known gains (8-bit,
    rounded), and leave the test images as the scene is."""
    from distsplat.data.synthetic import appearance_gains
    from distsplat.train.config import SyntheticConfig, default_config
    from distsplat.train.scene_setup import load_scene, render_ground_truth

    raw = appearance_gains(12, 1.5, 0.1, 1)
    assert raw.shape == (12, 3) and np.array_equal(raw, appearance_gains(12, 1.5, 0.1, 1))
    assert 1 / 1.5 * 0.9 <= raw.min() and raw.max() <= 1.5 * 1.1 and np.ptp(raw) > 0.3
    cfg = default_config()
    cfg.synthetic = SyntheticConfig(kind="ball", num_cameras=12, num_gaussians=200, width=32, height=24, seed=1,
                                    exposure=1.5, white_balance=0.1)
    cfg.validate()
    scene = load_scene(cfg)
    train = scene.train
    gains = appearance_gains(12, 1.5, 0.1, 1, train=train)
    # The training images' gains: the raw draw over its geometric mean per channel, so that
    # they average (in log space) to the scene's own colours, the test images'
    assert np.abs(np.log(raw[train]).mean(0)).max() > 1e-3  # this draw had a global bias
    np.testing.assert_allclose(np.log(gains[train]).mean(0), 0.0, atol=1e-12)
    np.testing.assert_allclose(gains[train] / raw[train], np.broadcast_to(gains[train[0]] / raw[train[0]], (len(train), 3)))
    for i in (0, 1, 2, 8):  # test, train, train, test
        img = scene.images.read(i)
        gt = render_ground_truth(scene, i)
        want = gt if i in set(scene.test.tolist()) else np.clip(np.round(gt * gains[i]), 0, 255).astype(np.uint8)
        assert np.array_equal(img, want), i
    cfg.synthetic.exposure = 0.5
    with pytest.raises(ValueError, match="--synthetic.exposure must be >= 1"):
        cfg.validate()
