"""--ssim_impl fused against the PyTorch SSIM: fused-ssim's kernels (the package gsplat's
trainer uses) give the training loss and its gradient that distsplat.train.scoring.losses defines
(11x11 Gaussian window, sigma 1.5, ZERO padding, per-image means summed). Needs a GPU and
fused-ssim (scripts/gpu_validate.sh puts the one built into .gsplat_peer on the path).

Reference: the torch implementation in float64. Tolerances: the fused kernel sums each
statistic over 11 + 11 taps in float32 (about 22 roundings of 6e-8 relative, so ~1.3e-6 of
E[x^2] <= 1) and divides with fast maths. For these noise images (variance ~ 1/12 per
window) SSIM moves by at most ~6 per unit of a variance, so a pixel's SSIM is off by at most
~1.6e-5 and the loss, lambda * B * (1 - mean SSIM) + L1, by at most 0.2 * 3 * 1.6e-5 = 1e-5:
atol 2e-5. Gradients: the same relative error through the backward's sums, at most ~1e-4 of
the largest gradient: 1e-3 of it. Zero padding versus any other (reflect, valid) moves the
mean SSIM of 61x83 images by ~1e-2 (a quarter of the pixels lie within 5 of a border), far
outside these bounds, so the padding is checked too."""

import pytest
import torch

from distsplat.train.scoring import losses

pytestmark = pytest.mark.cuda


@pytest.fixture
def fused():
    if losses.fused_ssim_fn() is None:
        pytest.skip(f"fused-ssim is not installed ({losses.FUSED_SSIM_INSTALL}; scripts/gpu_validate.sh "
                    "takes it from a carried .gsplat_peer)")


def test_fused_ssim_loss_and_gradient_match_torch(fused):
    g = torch.Generator(device="cuda").manual_seed(0)
    target = torch.rand(3, 61, 83, 3, device="cuda", generator=g)
    render = (target + 0.2 * torch.randn(target.shape, device="cuda", generator=g)).clamp(0, 1)
    r64 = render.double().requires_grad_()
    r32 = render.clone().requires_grad_()
    assert losses.resolve_ssim_impl("auto", r32.device) == "fused"
    ref = losses.photometric_loss(r64, target.double(), 0.2, ssim_impl="torch")
    out = losses.photometric_loss(r32, target, 0.2, ssim_impl="fused")
    ref.backward()
    out.backward()
    assert abs(out.item() - ref.item()) <= 2e-5, (out.item(), ref.item())
    err = (r32.grad.double() - r64.grad).abs().max().item()
    assert err <= 1e-3 * r64.grad.abs().max().item(), err
    # the padding: the same loss with reflect-padded statistics is far from it
    reflect = 0.8 * (render - target).abs().flatten(1).mean(1).sum() + 0.2 * (3 - 3 * losses.ssim_eval(render, target).mean())
    assert abs(reflect.item() - out.item()) > 1e-3


def test_trainer_step_with_fused_ssim_matches_torch_ssim(fused, tmp_path, monkeypatch):
    """The trainer picks fused-ssim on a GPU (auto) and trains with what --ssim_impl says:
    step 0 from the same state gives the same loss either way. Both in float32 (TF32
    convolutions off: they round the blurs' inputs to 11 bits); a smooth first render can
    have window variances near 0, where SSIM moves by up to 1 / C2 ~ 1.1e3 per unit of
    variance, so a pixel may differ by ~1.3e-6 * 1.1e3 = 1.4e-3 and the loss by at most
    0.2 * 1.4e-3 ~ 3e-4, ~1e-3 of a loss ~0.3: 2e-3 of it."""
    from distsplat.distributed import init_distributed
    from distsplat.train.config import Config
    from distsplat.train.trainer import Trainer

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    ctx = init_distributed()
    losses_by_impl = {"auto": None}
    for impl in ("auto", "fused", "torch"):
        cfg = Config(result_dir=str(tmp_path / impl), max_steps=10, eval_steps=[], save_steps=[], save_ply=False,
                     ssim_impl=impl)
        cfg.validate()
        t = Trainer(cfg, ctx)
        t.setup()
        try:
            assert t.ssim_impl == ("fused" if impl == "auto" else impl)
            losses_by_impl[impl] = t.train_step(0).item()
        finally:
            t.cleanup()
    assert losses_by_impl["auto"] == losses_by_impl["fused"], losses_by_impl
    assert abs(losses_by_impl["fused"] - losses_by_impl["torch"]) <= 2e-3 * abs(losses_by_impl["torch"]), losses_by_impl
