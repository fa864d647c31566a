"""Backend `gsplat` (CUDA kernels) against backend `torch` and against gsplat's own
`rasterization()`, forward and backward, on the real garden point cloud. Needs a GPU."""

import pytest
import torch

from distsplat.render import rasterize
from tests.garden import load_garden
from tests.unit.scenes import GAUSSIAN_KEYS, render_args, with_grad

pytestmark = pytest.mark.cuda


def _render(scene, backend, **kwargs):
    s = with_grad(scene)
    colors, alphas, meta = rasterize(*render_args(s), backend=backend, **kwargs)
    w = torch.rand(colors.shape, generator=torch.Generator().manual_seed(0)).to(colors.device)
    ((colors * w).sum() + alphas.sum()).backward()
    return colors, alphas, meta, s


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("rasterize_mode", ["classic", "antialiased"])
def test_gsplat_backend_matches_torch_backend(packed, rasterize_mode):
    scene = load_garden("cuda")
    kw = dict(packed=packed, rasterize_mode=rasterize_mode)
    c_g, a_g, m_g, s_g = _render(scene, "gsplat", **kw)
    c_t, a_t, m_t, s_t = _render(scene, "torch", **kw)
    assert a_g.mean() > 0.1
    # Kernels use fast float32 maths (__expf, rsqrt): compare with a small tolerance, and
    # require most pixels to agree tightly (a pair near the 1/255 cut may flip).
    assert (c_g - c_t).abs().max() < 2e-2
    assert ((c_g - c_t).abs() < 1e-4).float().mean() > 0.999
    torch.testing.assert_close(a_g, a_t, atol=2e-2, rtol=0)
    for k in GAUSSIAN_KEYS:
        g, t = s_g[k].grad, s_t[k].grad
        cos = torch.nn.functional.cosine_similarity(g.flatten(), t.flatten(), dim=0)
        assert cos > 0.999, (k, cos)
    assert m_g["means2d"].grad is not None and m_t["means2d"].grad is not None
    # The same pairs survive culling, up to boxes that round differently in fast maths.
    n_g, n_t = len(m_g["camera_ids"]), len(m_t["camera_ids"])
    assert abs(n_g - n_t) <= 1e-3 * n_t, (n_g, n_t)


@pytest.mark.parametrize("sh_degree", [None, 3])
def test_gsplat_backend_equals_gsplat_rasterization(sh_degree):
    from gsplat import rasterization

    scene = load_garden("cuda")
    if sh_degree is not None:
        g = torch.Generator(device="cuda").manual_seed(0)
        scene["colors"] = torch.randn(len(scene["means"]), 16, 3, device="cuda", generator=g) * 0.3
    ours, ours_a, _ = rasterize(*render_args(scene), sh_degree=sh_degree, backend="gsplat")
    theirs, theirs_a, _ = rasterization(*render_args(scene), sh_degree=sh_degree, packed=True)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours_a, theirs_a, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", ["no_gaussian", "none_visible"])
def test_empty_inputs_render_like_the_torch_backend(case):
    """An empty chunk (N = 0: a rank that holds no Gaussian; gsplat's projection kernel
    died with SIGFPE on it) and Gaussians that are all behind the camera (zero pairs, SH on
    nothing): an empty image, gradients of the inputs' shapes, as the torch backend gives."""
    scene = load_garden("cuda", max_points=2000)
    if case == "no_gaussian":
        for k in GAUSSIAN_KEYS:
            scene[k] = scene[k][:0]
    else:
        # cameras at the origin looking down +z, every Gaussian at z < 0: nothing projects
        scene["viewmats"] = torch.eye(4, device="cuda").expand_as(scene["viewmats"]).contiguous()
        scene["means"] = scene["means"].clone()
        scene["means"][:, 2] = -5.0 - scene["means"][:, 2].abs()
    g = torch.Generator(device="cuda").manual_seed(0)
    scene["colors"] = torch.randn(len(scene["means"]), 16, 3, device="cuda", generator=g) * 0.3
    out = {}
    for backend in ("gsplat", "torch"):
        s = with_grad(scene)
        colors, alphas, meta = rasterize(*render_args(s), sh_degree=3, backend=backend)
        (colors.sum() + alphas.sum()).backward()
        out[backend] = (colors, alphas, [s[k].grad for k in GAUSSIAN_KEYS])
        assert len(meta["camera_ids"]) == 0
    (c_g, a_g, gr_g), (c_t, a_t, gr_t) = out["gsplat"], out["torch"]
    assert c_g.shape == c_t.shape and not c_g.any() and not a_g.any()
    for k, a, b in zip(GAUSSIAN_KEYS, gr_g, gr_t):  # no gradient, or zeros, on both
        assert a is None or not a.any(), k
        assert b is None or not b.any(), k
