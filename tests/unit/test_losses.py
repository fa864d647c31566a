"""Losses and metrics against independent references (scipy's Gaussian filter, closed forms)."""

import numpy as np
import pytest
import torch
from scipy.ndimage import gaussian_filter

from distsplat.train.losses import photometric_loss, psnr, ssim, ssim_map


def scipy_ssim_map(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Wang et al. SSIM with an 11-tap sigma-1.5 window and zero padding, per channel."""
    def blur(x):  # truncate 5/1.5 sigmas -> radius 5 -> 11 taps, zeros outside
        return gaussian_filter(x, sigma=1.5, truncate=5 / 1.5, mode="constant", cval=0.0)

    out = np.zeros_like(a)
    for c in range(a.shape[-1]):
        x, y = a[..., c].astype(np.float64), b[..., c].astype(np.float64)
        mx, my = blur(x), blur(y)
        sxx, syy, sxy = blur(x * x) - mx * mx, blur(y * y) - my * my, blur(x * y) - mx * my
        c1, c2 = 0.01**2, 0.03**2
        out[..., c] = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx**2 + my**2 + c1) * (sxx + syy + c2))
    return out


def test_ssim_matches_scipy_reference():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(2, 23, 31, 3, generator=g, dtype=torch.float64)
    b = (a + 0.2 * torch.randn(2, 23, 31, 3, generator=g, dtype=torch.float64)).clamp(0, 1)
    ours = ssim_map(a, b)
    for i in range(2):
        ref = scipy_ssim_map(a[i].numpy(), b[i].numpy())
        # float64: the blurs sum 11 x 11 window terms (gamma_121 = 1.3e-14 of the sums, <= 1);
        # sxx = blur(x^2) - mx^2 cancels down to ~c2 = 9e-4, so <= 1.3e-14 / 9e-4 = 1.5e-11
        # relative in SSIM: 1e-9 leaves x60 for the ratio's few extra roundings.
        np.testing.assert_allclose(ours[i].numpy(), ref, rtol=1e-9, atol=1e-9)
    assert ssim(a, a).item() == pytest.approx(1.0)
    assert 0.0 < ssim(a, b).item() < 0.9


def test_psnr_closed_form():
    a = torch.zeros(2, 4, 4, 3)
    b = torch.full((2, 4, 4, 3), 0.1)
    b[1] = 0.01
    torch.testing.assert_close(psnr(a, b), torch.tensor([20.0, 40.0]))


def test_photometric_loss_sums_per_image_losses():
    """Splitting a batch across ranks and adding the parts gives the whole batch's loss."""
    g = torch.Generator().manual_seed(1)
    r, t = torch.rand(4, 16, 16, 3, generator=g), torch.rand(4, 16, 16, 3, generator=g)
    whole = photometric_loss(r, t, 0.2)
    parts = photometric_loss(r[:1], t[:1], 0.2) + photometric_loss(r[1:], t[1:], 0.2)
    torch.testing.assert_close(whole, parts)
    expected = sum(
        0.8 * (r[i] - t[i]).abs().mean() + 0.2 * (1 - ssim(r[i : i + 1], t[i : i + 1])) for i in range(4)
    )
    torch.testing.assert_close(whole, expected)
    empty = torch.zeros(0, 16, 16, 3, requires_grad=True)
    loss = photometric_loss(empty, empty.detach(), 0.2)
    loss.backward()  # still in the graph
    assert loss.item() == 0.0
