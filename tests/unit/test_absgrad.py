"""absgrad (render/absgrad.py) against its definition: the sum over pixels of the absolute
per-pixel gradient of the 2D means, each pixel's gradient taken by its own backward."""

import pytest
import torch

from distsplat.render import rasterize

pytestmark = pytest.mark.numerics  # rerun under other numeric paths in CI (docs/testing.md)

W_IMG, H_IMG = 8, 6


def scene():
    g = torch.Generator().manual_seed(0)
    N, d = 24, torch.float64
    means = torch.randn(N, 3, generator=g, dtype=d) * 0.4 + torch.tensor([0, 0, 3.0], dtype=d)
    quats = torch.randn(N, 4, generator=g, dtype=d)
    scales = torch.rand(N, 3, generator=g, dtype=d) * 0.2 + 0.05
    opac = torch.rand(N, generator=g, dtype=d) * 0.8 + 0.1
    cols = torch.rand(N, 3, generator=g, dtype=d)
    viewmats = torch.eye(4, dtype=d)[None]
    Ks = torch.tensor([[[8.0, 0, 4], [0, 8.0, 3], [0, 0, 1]]], dtype=d)
    target = torch.rand(1, H_IMG, W_IMG, 3, generator=g, dtype=d)
    params = [t.requires_grad_() for t in (means, quats, scales)] + [opac, cols]
    return params, viewmats, Ks, target


def render(params, viewmats, Ks, packed, absgrad=False):
    return rasterize(*params, viewmats, Ks, W_IMG, H_IMG, packed=packed, absgrad=absgrad, backend="torch")


def test_absgrad_is_the_sum_of_absolute_per_pixel_gradients():
    params, viewmats, Ks, target = scene()
    colors, _, meta = render(params, viewmats, Ks, True, absgrad=True)
    ((colors - target) ** 2).sum().backward()
    ref = torch.zeros_like(meta["means2d"])
    for y in range(H_IMG):
        for x in range(W_IMG):
            c, _, m = render(params, viewmats, Ks, True)
            m["means2d"].retain_grad()
            ((c[0, y, x] - target[0, y, x]) ** 2).sum().backward()
            ref += m["means2d"].grad.abs()
    assert ref.sum() > 0 and (ref - meta["means2d"].grad.abs()).max() > 1e-2  # they differ
    # float64 sums of <= 48 terms in another order: 48 u |terms| ~ 1e-14 of ~1.
    torch.testing.assert_close(meta["means2d"].absgrad, ref, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("packed", [True, False])
def test_absgrad_leaves_the_gradients_unchanged(packed):
    params, viewmats, Ks, target = scene()
    grads = {}
    for absgrad in (False, True):
        for p in params[:3]:
            p.grad = None
        colors, _, meta = render(params, viewmats, Ks, packed, absgrad=absgrad)
        ((colors - target) ** 2).sum().backward()
        grads[absgrad] = [p.grad.clone() for p in params[:3]] + [meta["means2d"].grad]
    for a, b in zip(grads[False], grads[True]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    if not packed:
        assert meta["means2d"].absgrad.shape == meta["means2d"].shape  # [C, N, 2], as the grad


def test_absgrad_without_gradients_is_not_attached():
    params, viewmats, Ks, _ = scene()
    with torch.no_grad():
        _, _, meta = render(params, viewmats, Ks, True, absgrad=True)
    assert not hasattr(meta["means2d"], "absgrad")
