"""Our evaluation metrics against torchmetrics, what gsplat's simple_trainer reports with:
PSNR and SSIM on real image pairs (thermos, $DISTSPLAT_DATA: tests/conftest.py), and the LPIPS network.

LPIPS: no ImageNet backbone weights exist on CI machines (no internet, and torchvision
does not install beside the CPU torch), so both networks get the same randomly initialised
backbone, saved as torchvision's state dict, and torchmetrics' own linear heads (lpips
v0.1). torchmetrics builds its backbone through torchvision.models; a stand-in module gives
it torchvision's AlexNet / VGG16 `features` layers written out here. What this proves: our
cut points, input scaling, channel normalisation, heads, averaging and the weight files'
key layout are torchmetrics'; what it cannot: the ImageNet weights' values (with them
loaded, the network is the same function of them)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from benchmarks.paths import data_dir
from distsplat.train.scoring.losses import psnr, ssim, ssim_eval
from distsplat.train.scoring.lpips import LPIPS, load_lpips

tm = pytest.importorskip("torchmetrics")
from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure  # noqa: E402

pytestmark = pytest.mark.numerics  # rerun under other numeric paths in CI (docs/testing.md)

THERMOS = data_dir() / "thermos"


def image(folder: str, k: int) -> torch.Tensor:
    """[H, W, 3] float64 in [0, 1]."""
    from PIL import Image

    img = Image.open(THERMOS / folder / f"input_{k:04d}.jpg").convert("RGB")
    return torch.from_numpy(np.asarray(img, dtype=np.float64) / 255.0)


def pairs():
    """Real pairs: a view against its own 2x downscale by PIL (small differences) and
    against the next view (large ones), at images_2's size (473 x 266), cropped to 200 x 150
    (float64 11x11 windows are slow on CI's two cores)."""
    from PIL import Image

    out = []
    for k in (1, 40):
        small = image("images_2", k)
        h, w = small.shape[:2]
        big = Image.open(THERMOS / "images" / f"input_{k:04d}.jpg").convert("RGB").resize((w, h), Image.BICUBIC)
        out.append((small, torch.from_numpy(np.asarray(big, dtype=np.float64) / 255.0)))
        out.append((small, image("images_2", k + 1)))
    return [(a[50:200, 100:300], b[50:200, 100:300]) for a, b in out]


@pytest.mark.skipif(not THERMOS.is_dir(), reason="needs thermos in $DISTSPLAT_DATA (tests/conftest.py)")
def test_psnr_and_ssim_match_torchmetrics_on_real_pairs():
    for a, b in pairs():
        ta, tb = a.permute(2, 0, 1)[None], b.permute(2, 0, 1)[None]  # [1, 3, H, W]
        ref_psnr = peak_signal_noise_ratio(ta, tb, data_range=1.0).item()
        ref_ssim = structural_similarity_index_measure(ta, tb, data_range=1.0).item()
        # torchmetrics' PSNR comes back as float32 (its data_range is a float32 tensor): half
        # an ulp, 2^-24 relative. SSIM: float64 throughout, the same sums in another order
        # (separable vs 2-D window), ~1e-15; torchmetrics clamps variances at 0, which only
        # rounding can reach.
        assert psnr(a[None], b[None]).item() == pytest.approx(ref_psnr, rel=2.0**-24, abs=0)
        assert ssim_eval(a[None], b[None]).item() == pytest.approx(ref_ssim, abs=1e-12)
        # The training loss's zero-padded SSIM is a different number (borders pulled to 0).
        assert abs(ssim(a[None], b[None]).item() - ref_ssim) > 1e-4


# torchvision's AlexNet / VGG16 `features`, written out independently of distsplat.train.scoring.lpips.
def tv_alexnet_features() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2), nn.ReLU(inplace=True),
        nn.MaxPool2d(kernel_size=3, stride=2),
        nn.Conv2d(64, 192, kernel_size=5, padding=2), nn.ReLU(inplace=True),
        nn.MaxPool2d(kernel_size=3, stride=2),
        nn.Conv2d(192, 384, kernel_size=3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(384, 256, kernel_size=3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(256, 256, kernel_size=3, padding=1), nn.ReLU(inplace=True),
        nn.MaxPool2d(kernel_size=3, stride=2),
    )


def tv_vgg16_features() -> nn.Sequential:
    layers, c = [], 3
    for v in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"):
        if v == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
        else:
            layers += [nn.Conv2d(c, v, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
            c = v
    return nn.Sequential(*layers)


def random_backbone(features: nn.Sequential, seed: int) -> dict:
    """He-initialised weights with small positive biases (ReLUs stay alive through 5 cuts)."""
    g = torch.Generator().manual_seed(seed)
    for m in features:
        if isinstance(m, nn.Conv2d):
            fan_in = m.in_channels * m.kernel_size[0] * m.kernel_size[1]
            m.weight.data = torch.randn(m.weight.shape, generator=g) * (2.0 / fan_in) ** 0.5
            m.bias.data = torch.rand(m.bias.shape, generator=g) * 0.1
    # torchvision's file: features.* and a classifier (ignored by LPIPS)
    return {**{f"features.{k}": v.clone() for k, v in features.state_dict().items()},
            "classifier.1.weight": torch.zeros(4, 9216)}


@pytest.mark.parametrize("net", ["alex", "vgg"])
def test_lpips_matches_torchmetrics_with_the_same_weights(net, tmp_path, monkeypatch):
    import torchmetrics.functional.image.lpips as tml

    features = tv_alexnet_features() if net == "alex" else tv_vgg16_features()
    backbone = tmp_path / "backbone.pth"
    torch.save(random_backbone(features, seed=7), backbone)
    stub = types.ModuleType("torchvision")
    stub.models = types.SimpleNamespace(alexnet=lambda weights=None: types.SimpleNamespace(features=features),
                                        vgg16=lambda weights=None: types.SimpleNamespace(features=features))
    monkeypatch.setitem(sys.modules, "torchvision", stub)
    monkeypatch.setattr(tml, "_TORCHVISION_AVAILABLE", True)
    heads = Path(tml.__file__).parent / "lpips_models" / f"{net}.pth"
    ref = tml._NoTrainLpips(net=net, pretrained=True, pnet_rand=True)  # torchmetrics' heads, our backbone

    ours, note = load_lpips(net, weights=str(backbone), heads=str(heads))
    assert ours is not None, note
    torch.manual_seed(0)
    size = (96, 128) if net == "alex" else (64, 80)
    a = torch.rand(3, *size, 3)  # [B, H, W, 3]
    b = (a + 0.2 * torch.randn(3, *size, 3)).clamp(0, 1)
    b[2] = torch.rand(*size, 3)
    got = ours(a, b)
    want = ref(a.permute(0, 3, 1, 2), b.permute(0, 3, 1, 2), normalize=True).flatten()
    # The same float32 operations in the same order (convolutions, normalisation, heads),
    # apart from how the five cuts' terms are summed: a few float32 roundings of a sum of
    # 5 positive terms, ~1e-6 relative.
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-7), (got, want)
    assert (got > 0).all() and got[2] > got[0]  # unrelated images are further apart
    assert ours(a, a).abs().max() < 1e-6


def test_lpips_is_skipped_with_a_reason_and_bad_files_are_named(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    model, note = load_lpips("alex")
    assert model is None and "LPIPS skipped" in note and "alexnet-owt-7be5be79.pth" in note
    bad = tmp_path / "bad.pth"
    torch.save({"features.0.weight": torch.zeros(1)}, bad)
    with pytest.raises(ValueError, match=f"LPIPS alex: {bad}"):
        load_lpips("alex", weights=str(bad), heads=str(bad))
    with pytest.raises(ValueError, match="--lpips_weights .*nope.pth: no such file"):
        load_lpips("alex", weights=str(tmp_path / "nope.pth"))
    model, note = load_lpips("alex", weights=str(bad), heads=str(bad), min_side=24)
    assert model is None and "24 px" in note and "--lpips_net vgg" in note
    assert isinstance(LPIPS("vgg"), nn.Module)
