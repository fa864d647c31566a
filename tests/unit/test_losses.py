"""Losses and metrics against independent references (scipy's Gaussian filter, closed forms)."""

import numpy as np
import pytest
import torch
from scipy.ndimage import gaussian_filter

from distsplat.train.scoring.losses import photometric_loss, psnr, ssim, ssim_map

pytestmark = pytest.mark.numerics  # rerun under other numeric paths in CI (docs/testing.md)


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


def _fused_stand_in(calls):
    """What fused-ssim's `fused_ssim(img1, img2, padding="same")` computes, on CPU: the mean
    of the zero-padded SSIM map over [B, C, H, W] images (tests/cuda checks the real kernel
    against ssim_map)."""
    def fused_ssim(img1, img2, padding="same", train=True):
        calls.append((tuple(img1.shape), padding))
        return ssim_map(img1.permute(0, 2, 3, 1), img2.permute(0, 2, 3, 1)).mean()
    return fused_ssim


def test_fused_ssim_loss_is_the_torch_loss(monkeypatch):
    """With ssim_impl "fused" the loss hands [B, 3, H, W] images to fused-ssim and turns its
    one mean over the batch into the sum of per-image losses: same value, same gradient."""
    from distsplat.train.scoring import losses

    calls = []
    monkeypatch.setattr(losses, "fused_ssim_fn", lambda: _fused_stand_in(calls))
    g = torch.Generator().manual_seed(2)
    t = torch.rand(3, 13, 17, 3, generator=g, dtype=torch.float64)
    r1 = torch.rand(3, 13, 17, 3, generator=g, dtype=torch.float64).requires_grad_()
    r2 = r1.detach().clone().requires_grad_()
    ref = photometric_loss(r1, t, 0.3)
    fused = photometric_loss(r2, t, 0.3, ssim_impl="fused")
    assert calls == [((3, 3, 13, 17), "same")]
    ref.backward()
    fused.backward()
    # float64, the same terms summed in another order: a few ulps of the O(1) loss
    torch.testing.assert_close(fused, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(r2.grad, r1.grad, rtol=1e-10, atol=1e-14)


def test_resolve_ssim_impl(monkeypatch):
    from distsplat.train.scoring import losses

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)  # a device name only: nothing runs on it
    notes = []
    note = lambda fmt, *a: notes.append(fmt % a)  # noqa: E731
    monkeypatch.setattr(losses, "fused_ssim_fn", lambda: None)  # not installed
    assert losses.resolve_ssim_impl("auto", cpu, note) == "torch" and not notes  # CPU: nothing to say
    assert losses.resolve_ssim_impl("torch", cuda) == "torch"
    assert losses.resolve_ssim_impl("auto", cuda, note) == "torch" and "pip install" in notes[-1]
    with pytest.raises(ValueError, match=r"--ssim_impl fused: fused-ssim is not installed \(pip install"):
        losses.resolve_ssim_impl("fused", cuda)
    with pytest.raises(ValueError, match="--ssim_impl fused: fused-ssim's kernels need a CUDA device"):
        losses.resolve_ssim_impl("fused", cpu)
    with pytest.raises(ValueError, match="--ssim_impl: must be auto, fused or torch"):
        losses.resolve_ssim_impl("fast", cpu)
    monkeypatch.setattr(losses, "fused_ssim_fn", lambda: _fused_stand_in([]))  # installed
    assert losses.resolve_ssim_impl("auto", cuda, note) == "fused" and "fused-ssim" in notes[-1]
    assert losses.resolve_ssim_impl("fused", cuda) == "fused"
    assert losses.resolve_ssim_impl("auto", cpu) == "torch"  # its kernels are CUDA only
    assert losses.resolve_ssim_impl("torch", cuda) == "torch"
