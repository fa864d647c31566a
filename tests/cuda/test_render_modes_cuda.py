"""Backend `gsplat` against backend `torch` on the real garden point cloud for what
test_gsplat_backend.py leaves out: backgrounds (3, 5 and 40 channels: 40 spans two of
gsplat_backend's CHANNEL_CHUNK = 32 chunks) and the depth render modes (D, ED, RGB+D),
packed and unpacked, forward and backward. Needs a GPU.

Tolerances are those of test_gsplat_backend.py: the kernels use fast float32 maths
(__expf, rsqrt), so every pixel must agree to 2e-2 and 99.9% of pixels to 1e-4 (a pair
near the 1/255 alpha cut may flip); depth channels are compared in units of the largest
rendered depth, for which the same two bounds hold relatively."""

import pytest
import torch

from distsplat.render import rasterize
from tests.garden import load_garden
from tests.unit.scenes import GAUSSIAN_KEYS, render_args, with_grad

pytestmark = pytest.mark.cuda

MAX_POINTS = 40_000  # the torch backend's memory grows with D; enough to cover the images


def _garden(shared_data, channels=3):
    scene = load_garden("cuda", max_points=MAX_POINTS, downscale=2, path=shared_data / "test_garden.npz")
    if channels != 3:
        g = torch.Generator(device="cuda").manual_seed(channels)
        scene["colors"] = torch.rand(len(scene["means"]), channels, device="cuda", generator=g)
    return scene


def _render(scene, backend, **kwargs):
    s = with_grad(scene)
    colors, alphas, meta = rasterize(*render_args(s), backend=backend, **kwargs)
    w = torch.rand(colors.shape, generator=torch.Generator().manual_seed(0)).to(colors.device)
    if kwargs.get("render_mode") == "ED":
        # d(depth / alpha) / d alpha = -depth / alpha^2 explodes where alpha -> 0 and would
        # amplify the kernels' rounding there: the loss reads mostly covered pixels only.
        w = w * (alphas.detach() > 0.5)
    ((colors * w).sum() + alphas.sum()).backward()
    return colors.detach(), alphas.detach(), s


def _assert_pixels_close(got, want, scale=1.0, what=""):
    diff = (got - want).abs() / scale
    assert diff.max() < 2e-2, f"{what}: max diff {diff.max():.3g} (x {scale:.3g})"
    frac = (diff < 1e-4).float().mean()
    assert frac > 0.999, f"{what}: only {frac:.5f} of the values agree to 1e-4 (x {scale:.3g})"


def _assert_grads_close(s_g, s_t, keys=GAUSSIAN_KEYS):
    for k in keys:
        g, t = s_g[k].grad, s_t[k].grad
        assert t.abs().max() > 0, f"{k}: the loss must reach it"
        cos = torch.nn.functional.cosine_similarity(g.flatten(), t.flatten(), dim=0)
        assert cos > 0.999, (k, cos)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
@pytest.mark.parametrize("channels", [3, 5, 40])
def test_backgrounds_gsplat_matches_torch(shared_data, channels, packed):
    scene = _garden(shared_data, channels)
    # One more camera, moved 10 km back along its axis: every Gaussian is behind it, so its
    # image is exactly its background.
    blind = scene["viewmats"][:1].clone()
    blind[0, 2, 3] -= 1e4
    scene["viewmats"] = torch.cat([scene["viewmats"], blind])
    scene["Ks"] = torch.cat([scene["Ks"], scene["Ks"][:1]])
    C = scene["viewmats"].shape[0]
    g = torch.Generator(device="cuda").manual_seed(100 + channels)
    bg = torch.rand(C, channels, device="cuda", generator=g)  # a different colour per camera
    c_g, a_g, s_g = _render(scene, "gsplat", packed=packed, backgrounds=bg)
    c_t, a_t, s_t = _render(scene, "torch", packed=packed, backgrounds=bg)
    assert c_g.shape == c_t.shape == (C, scene["height"], scene["width"], channels)
    assert 0.1 < a_t[:-1].mean() < 0.999, "the images must show Gaussians (and some background)"
    _assert_pixels_close(c_g, c_t, what=f"colors, D={channels}")
    _assert_pixels_close(a_g, a_t, what="alphas")
    # The background is composited per camera and per channel (also past the first
    # 32-channel chunk): the blind camera's image is its background, exactly.
    assert (a_g[-1] == 0).all() and (a_t[-1] == 0).all()
    for c_x in (c_g, c_t):
        torch.testing.assert_close(c_x[-1], bg[-1].expand_as(c_x[-1]), atol=0, rtol=0)
    # Elsewhere, where nothing is drawn, the image is the background up to
    # alpha * max colour + (1 - T) * max background <= 2e-6 (colours, backgrounds in [0, 1]).
    empty = (a_t[..., 0] < 1e-6) & (a_g[..., 0] < 1e-6)  # [C, H, W]
    for c in range(C - 1):
        if empty[c].any():
            torch.testing.assert_close(c_g[c][empty[c]], bg[c].expand(int(empty[c].sum()), -1),
                                       atol=2e-6, rtol=0)
    _assert_grads_close(s_g, s_t)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
@pytest.mark.parametrize("render_mode", ["D", "ED", "RGB+D"])
def test_depth_render_modes_gsplat_matches_torch(shared_data, render_mode, packed):
    scene = _garden(shared_data)
    c_g, a_g, s_g = _render(scene, "gsplat", packed=packed, render_mode=render_mode)
    c_t, a_t, s_t = _render(scene, "torch", packed=packed, render_mode=render_mode)
    D = {"D": 1, "ED": 1, "RGB+D": 4}[render_mode]
    assert c_g.shape == c_t.shape and c_t.shape[-1] == D
    _assert_pixels_close(a_g, a_t, what="alphas")
    depth_g, depth_t = c_g[..., -1], c_t[..., -1]
    if render_mode == "ED":
        # depth / alpha: where alpha is tiny the quotient amplifies the kernels' rounding;
        # compare where the pixel is mostly covered.
        covered = a_t[..., 0] > 0.5
        assert covered.float().mean() > 0.1
        depth_g, depth_t = depth_g[covered], depth_t[covered]
    scale = float(depth_t.abs().max())
    assert scale > 0
    _assert_pixels_close(depth_g, depth_t, scale, what=f"{render_mode} depth")
    if render_mode == "RGB+D":
        _assert_pixels_close(c_g[..., :3], c_t[..., :3], what="RGB of RGB+D")
        _assert_grads_close(s_g, s_t)
    else:  # depth only: the colours take no part
        assert s_g["colors"].grad is None and s_t["colors"].grad is None
        _assert_grads_close(s_g, s_t, [k for k in GAUSSIAN_KEYS if k != "colors"])
