"""The single-process renderer (backend torch) against analytic values, an independent
dense renderer, gsplat's torch projection and finite differences."""

import math

import pytest
import torch
from gsplat.cuda._torch_impl import _fully_fused_projection, _quat_scale_to_covar_preci

from distsplat.render import project, rasterize
from tests.unit.dense_reference import dense_render
from tests.unit.scenes import GAUSSIAN_KEYS, random_scene, render_args, with_grad

pytestmark = pytest.mark.numerics  # rerun under other numeric paths in CI (docs/testing.md)


def one_gaussian_scene(mean_xy=(0.0, 0.0), depth=2.0, scale=0.05, opacity=0.8, color=(1.0, 1.0, 1.0)):
    W, H, f = 33, 25, 40.0
    return dict(
        means=torch.tensor([[mean_xy[0], mean_xy[1], depth]]),
        quats=torch.tensor([[1.0, 0.0, 0.0, 0.0]]),
        scales=torch.full((1, 3), scale),
        opacities=torch.tensor([opacity]),
        colors=torch.tensor([color]),
        viewmats=torch.eye(4)[None],
        Ks=torch.tensor([[[f, 0, W / 2], [0, f, H / 2], [0, 0, 1]]]),
        width=W, height=H, f=f,
    )


def test_single_isotropic_gaussian_renders_analytic_profile():
    s = one_gaussian_scene(scale=0.1)
    colors, alphas, meta = rasterize(*render_args(s))
    # Centre projects to (W/2, H/2); an isotropic world Gaussian on the optical axis has a
    # screen covariance (f*scale/z)^2 I = 4 I, plus the eps2d = 0.3 blur.
    var = (s["f"] * 0.1 / 2.0) ** 2 + 0.3
    cx, cy = s["width"] / 2, s["height"] / 2
    drawn = skipped = 0
    for py in range(s["height"]):
        for px in range(s["width"]):
            r2 = (px + 0.5 - cx) ** 2 + (py + 0.5 - cy) ** 2
            expected = 0.8 * math.exp(-0.5 * r2 / var)
            if expected < 1 / 255:  # below gsplat's alpha threshold: not drawn at all
                expected, skipped = 0.0, skipped + 1
            else:
                drawn += 1
            # float32: ~5 roundings in r^2 / var make the exponent's relative error <= 5 u32,
            # times |exponent| <= ln(255 * 0.8) = 5.3, plus exp and o: ~2e-6 relative; rel 1e-5.
            assert colors[0, py, px, 0].item() == pytest.approx(expected, rel=1e-5, abs=1e-7)
            assert alphas[0, py, px, 0].item() == pytest.approx(expected, rel=1e-5, abs=1e-7)
    assert drawn > 50 and skipped > 50
    assert meta["means2d"][0].tolist() == pytest.approx([cx, cy])
    # Opacity-aware box: extent sqrt(2 ln(255 o)) sigma, sigma = sqrt(4.3).
    extent = math.ceil(math.sqrt(2 * math.log(255 * 0.8)) * math.sqrt(var))
    assert meta["radii"].tolist() == [[extent, extent]]


def test_nearer_gaussian_wins_whatever_the_input_order():
    red = one_gaussian_scene(depth=2.0, opacity=0.9, color=(1.0, 0.0, 0.0))
    blue = one_gaussian_scene(depth=3.0, opacity=0.9, color=(0.0, 0.0, 1.0), scale=0.075)
    both = {k: torch.cat([red[k], blue[k]]) for k in GAUSSIAN_KEYS}
    # Pixel (17, 13): one pixel right and down of the centre, r^2 = 2; both Gaussians have
    # the same screen variance 1 + 0.3 (sizes 0.05/2 and 0.075/3 at f = 40).
    a = 0.9 * math.exp(-0.5 * 2 / 1.3)
    for order in ([0, 1], [1, 0]):
        s = dict(red, **{k: v[order] for k, v in both.items()})
        colors, alphas, _ = rasterize(*render_args(s))
        px = colors[0, 13, 17]
        # float32 alpha within ~2e-6 relative (as above), two composited: rel 1e-5.
        assert px[0].item() == pytest.approx(a, rel=1e-5)
        assert px[2].item() == pytest.approx((1 - a) * a, rel=1e-5)
        assert alphas[0, 13, 17, 0].item() == pytest.approx(1 - (1 - a) ** 2, rel=1e-5)


def test_compositing_stops_before_transmittance_drops_below_threshold():
    # Five Gaussians on the optical axis, alpha 0.95 at the centre pixel: transmittance after
    # each is 0.05, 2.5e-3, 1.25e-4, then 6.25e-6 <= 1e-4, so the fourth and fifth are skipped.
    n, o = 5, 0.95
    s = one_gaussian_scene()
    s.update(
        means=torch.tensor([[0.0, 0.0, 2.0 + i] for i in range(n)]),
        quats=torch.tensor([[1.0, 0, 0, 0]]).repeat(n, 1),
        scales=torch.full((n, 3), 1.0),
        opacities=torch.full((n,), o),
        colors=torch.eye(n),
    )
    s = with_grad(s)
    colors, alphas, _ = rasterize(*render_args(s))
    centre = colors[0, 12, 16]  # pixel centre (16.5, 12.5) is the principal point
    expected = torch.tensor([o, (1 - o) * o, (1 - o) ** 2 * o, 0.0, 0.0])
    torch.testing.assert_close(centre, expected)
    assert alphas[0, 12, 16, 0].item() == pytest.approx(1 - (1 - o) ** 3, rel=1e-6)
    colors[0, 12, 16].sum().backward()
    assert s["colors"].grad[3:].abs().max().item() == 0.0
    assert s["colors"].grad[:3].abs().min().item() > 0.0


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(sh_degree=2),
        dict(channels=5),
        dict(n=200, scale=0.3),  # large, overlapping Gaussians: long per-tile lists
    ],
    ids=["rgb", "sh2", "5ch", "dense-overlap"],
)
@pytest.mark.parametrize("antialiased", [False, True], ids=["classic", "antialiased"])
def test_matches_dense_reference_forward_and_backward(kwargs, antialiased):
    scene = with_grad(random_scene(n_cameras=3, **kwargs))
    ref_scene = with_grad(scene)
    mode = "antialiased" if antialiased else "classic"
    C, D = 3, scene["colors"].shape[-1] if scene["sh_degree"] is None else 3
    bg = torch.rand(C, D, generator=torch.Generator().manual_seed(1))
    colors, alphas, _ = rasterize(
        *render_args(scene), sh_degree=scene["sh_degree"], rasterize_mode=mode, backgrounds=bg
    )
    ref_colors, ref_alphas = dense_render(
        *render_args(ref_scene), sh_degree=scene["sh_degree"], antialiased=antialiased, backgrounds=bg
    )
    assert alphas.amax() > 0.5  # the scene is really visible
    # Both float32 (u32 = 6e-8). Per Gaussian alpha = o exp(-s), s <= ln(255 o) < 5.6: ~10
    # roundings in s make alpha's relative error <= 10 u32 * 5.6 = 3.4e-6; a pixel composites
    # <= 200 Gaussians (dense-overlap), the transmittance product and the sum adding
    # <= 2 * 200 u32 = 2.4e-5 relative: rtol 1e-4 (x4), atol 2e-5 for near-zero pixels.
    torch.testing.assert_close(colors, ref_colors, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(alphas, ref_alphas, atol=2e-5, rtol=1e-4)
    # Each camera and pixel weighted differently, so a swapped image changes the loss.
    w = torch.rand(colors.shape, generator=torch.Generator().manual_seed(2))
    (colors * w).sum().backward()
    (ref_colors * w).sum().backward()
    # A Gaussian's gradient sums over <= 3 cameras x 40 x 30 pixels (n = 3600) in another order
    # (backward re-composites); with partial cancellation the typical error is sqrt(n) u32 = 3.6e-6
    # of the sum of |terms| and the worst case n u32 = 2.2e-4: rtol 1e-3, atol 1e-4 (gradients
    # here are O(1) to O(10)).
    for k in GAUSSIAN_KEYS:
        torch.testing.assert_close(scene[k].grad, ref_scene[k].grad, atol=1e-4, rtol=1e-3, msg=k)


@pytest.mark.parametrize("tile_size", [4, 16])
def test_tile_size_does_not_change_the_image(tile_size):
    scene = random_scene(n=150, n_cameras=2, width=37, height=29, scale=0.25)
    a, _, _ = rasterize(*render_args(scene))
    b, _, _ = rasterize(*render_args(scene), tile_size=tile_size)
    # The same depth-sorted compositing per pixel; only how lists are cut into tiles (and so
    # the vectorized blocks) differs: <= 150 Gaussians per pixel, 150 u32 = 9e-6 relative
    # worst case (rtol 1e-5), atol 1e-6 for near-empty pixels.
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_packed_and_unpacked_give_the_same_images_and_gradients():
    scene = random_scene(n=80, n_cameras=3, sh_degree=1)
    results = {}
    for packed in (True, False):
        s = with_grad(scene)
        colors, alphas, meta = rasterize(*render_args(s), sh_degree=1, packed=packed)
        (colors * torch.linspace(0, 1, colors.numel()).reshape(colors.shape)).sum().backward()
        results[packed] = (colors, alphas, meta, s)
    torch.testing.assert_close(results[True][0], results[False][0])
    torch.testing.assert_close(results[True][1], results[False][1])
    for k in GAUSSIAN_KEYS:
        torch.testing.assert_close(results[True][3][k].grad, results[False][3][k].grad)
    # means2d.grad exists in both layouts and agrees pair by pair.
    mp, md = results[True][2], results[False][2]
    assert md["means2d"].shape == (3, 80, 2) and mp["means2d"].shape == (len(mp["gaussian_ids"]), 2)
    dense_grad = md["means2d"].grad[mp["camera_ids"], mp["gaussian_ids"]]
    torch.testing.assert_close(mp["means2d"].grad, dense_grad)
    assert mp["means2d"].grad.abs().sum() > 0
    assert (md["radii"][mp["camera_ids"], mp["gaussian_ids"]] == mp["radii"]).all()


def test_projection_agrees_with_gsplat_torch_reference():
    scene = random_scene(n=300, n_cameras=3, width=64, height=48, scale=0.6)
    # Spread past the field of view (and behind some cameras): large Gaussians outside the
    # view still reach into the image, where the clamped Jacobian matters.
    scene["means"] = scene["means"] * 3.0
    # gsplat's torch reference has no opacity-aware box: with opacity >= 1 both boxes use
    # the 3.33-sigma extent, so radii must agree too.
    opac = torch.full((300,), 1.01)
    pairs, _ = project(
        scene["means"], scene["quats"], scene["scales"], opac, scene["colors"],
        scene["viewmats"], scene["Ks"], 64, 48, backend="torch",
    )
    covars, _ = _quat_scale_to_covar_preci(scene["quats"], scene["scales"], compute_preci=False)
    radii, means2d, depths, conics, _ = _fully_fused_projection(
        scene["means"], covars, scene["viewmats"], scene["Ks"], 64, 48
    )
    ref_valid = (radii > 0).all(-1)  # [C, N]
    assert len(pairs) == int(ref_valid.sum()) > 100
    c, g = pairs.camera_ids, pairs.gaussian_ids
    assert ref_valid[c, g].all()
    # Worst-case float32 rounding (u32 = 6e-8), on any CPU (an FMA only removes roundings):
    # x_cam = R p + t and z = R_3 p + t_3 sum 4 terms: errors <= 4 u32 (|R| |p| + |t|) ("terms").
    # means2d = f x / z + c (ours) or (f x + 0 y + c z) / z (gsplat, 3 products: 3 u32 (f |x| + |c| z))
    # then adds <= 3 u32 (f |x| / z + |c|), 4 u32 f |x| terms_z / z^2 through z's error and a final
    # u32 |means2d|. With |x| <= terms_x each implementation is off by at most
    # u32 (f terms_x (8 + 4 terms_z / z) / z + 3 |c| + |means2d|); two of them, twice that.
    u32 = 2.0 ** -24
    R, t = scene["viewmats"][:, :3, :3], scene["viewmats"][:, :3, 3]  # [C, 3, 3], [C, 3]
    terms = (torch.einsum("cij,nj->cni", R.abs(), scene["means"].abs()) + t.abs()[:, None])[c, g]  # [M, 3]
    f, cxy = torch.stack([scene["Ks"][:, 0, 0], scene["Ks"][:, 1, 1]], -1)[c], scene["Ks"][c, :2, 2]  # [M, 2]
    z = depths[c, g, None]  # [M, 1]
    bound2d = 2 * u32 * (f * terms[:, :2] * (8 + 4 * terms[:, 2:] / z) / z + 3 * cxy + means2d[c, g].abs())
    assert ((pairs.means2d - means2d[c, g]).abs() <= bound2d).all()
    assert ((pairs.depths - depths[c, g]).abs() <= 2 * 4 * u32 * terms[:, 2]).all()
    # conic = inverse of the 2D covariance J W S S^T W^T J^T + 0.3 I: its relative error is the
    # covariance's (~10 roundings, 6e-7) times the 2x2 inverse's condition number, <= ~1/0.3 per
    # unit of screen variance here (the +0.3 blur floors the small eigenvalue): ~1e-5 relative.
    torch.testing.assert_close(pairs.conics, conics[c, g], rtol=1e-4, atol=1e-6)
    assert torch.equal(pairs.radii, radii[c, g])


def test_gradients_match_finite_differences():
    scene = random_scene(n=6, n_cameras=2, width=14, height=12, scale=0.3, dtype=torch.float64, seed=3)
    _check_fd(scene, sh_degree=None)


def test_sh_gradients_match_finite_differences():
    scene = random_scene(n=5, n_cameras=2, width=14, height=12, scale=0.3, sh_degree=2, dtype=torch.float64, seed=4)
    _check_fd(scene, sh_degree=2, mode="antialiased")


def _check_fd(scene, sh_degree, mode="classic"):
    weights = torch.rand(2, 12, 14, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)

    def loss(s):
        colors, _, _ = rasterize(*render_args(s), sh_degree=sh_degree, rasterize_mode=mode)
        return (colors * weights).sum()

    s = with_grad(scene)
    loss(s).backward()
    h = 1e-6
    for k in GAUSSIAN_KEYS:
        base = scene[k]
        fd = torch.zeros_like(base)
        for i in range(base.numel()):
            plus, minus = dict(scene), dict(scene)
            delta = torch.zeros(base.numel(), dtype=base.dtype)
            delta[i] = h
            plus[k] = base + delta.reshape(base.shape)
            minus[k] = base - delta.reshape(base.shape)
            fd.view(-1)[i] = (loss(plus) - loss(minus)) / (2 * h)
        assert fd.abs().max() > 0, k
        torch.testing.assert_close(s[k].grad, fd, atol=1e-5, rtol=1e-4, msg=k)


@pytest.mark.parametrize("render_mode", ["D", "ED", "RGB+D", "RGB+ED"])
def test_depth_render_modes(render_mode):
    scene = random_scene(n=60, n_cameras=2)
    rgb, alphas, _ = rasterize(*render_args(scene))
    out, alphas2, meta = rasterize(*render_args(scene), render_mode=render_mode)
    torch.testing.assert_close(alphas, alphas2)
    depth = out[..., -1]
    # Reference: the dense renderer with depth as the colour channel.
    depth_colors = scene["means"] @ scene["viewmats"][:, 2, :3].T + scene["viewmats"][:, 2, 3]  # [N, C]
    ref = []
    for c in range(2):
        s = dict(scene, colors=depth_colors[:, c : c + 1].contiguous(), viewmats=scene["viewmats"][c : c + 1], Ks=scene["Ks"][c : c + 1])
        ref.append(dense_render(*render_args(s))[0][0, ..., 0])
    ref = torch.stack(ref)
    if render_mode.endswith("ED"):
        ref = ref / alphas[..., 0].clamp_min(1e-10)
    # Depths ~3-5 composited over <= 60 Gaussians, both float32: <= 2 * 60 u32 = 7e-6 relative
    # (~4e-5 absolute at depth 5); ED divides by alpha, the same float32 alpha on both sides.
    torch.testing.assert_close(depth, ref, atol=1e-4, rtol=1e-4)
    if render_mode.startswith("RGB"):
        torch.testing.assert_close(out[..., :3], rgb)
    else:
        assert out.shape[-1] == 1


def test_camera_with_nothing_in_view_and_empty_scene():
    scene = random_scene(n=20, n_cameras=2)
    away = scene["viewmats"].clone()
    away[1] = torch.diag(torch.tensor([1.0, 1.0, -1.0, 1.0])) @ away[1]  # looks away: z < 0
    bg = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    colors, alphas, meta = rasterize(*render_args(dict(scene, viewmats=away)), backgrounds=bg)
    assert (meta["camera_ids"] == 0).all()
    assert alphas[1].abs().max() == 0
    torch.testing.assert_close(colors[1], bg[1].expand_as(colors[1]))
    empty = {k: v[:0] for k, v in scene.items() if k in GAUSSIAN_KEYS}
    colors, alphas, meta = rasterize(*render_args(dict(scene, **empty)), backgrounds=bg)
    assert colors.shape == (2, 30, 40, 3) and alphas.abs().max() == 0
    torch.testing.assert_close(colors[0], bg[0].expand_as(colors[0]))


def test_real_point_cloud_matches_dense_reference():
    """gsplat's garden test scene (real SfM points), subsampled to what the N x pixels
    reference can afford, at 1/4 resolution."""
    from tests.garden import load_garden

    scene = with_grad(load_garden(max_points=800, downscale=4))
    scene["scales"] = (scene["scales"] * 4).detach().requires_grad_(True)  # fewer points, bigger splats
    ref_scene = with_grad(scene)
    colors, alphas, meta = rasterize(*render_args(scene))
    ref_colors, ref_alphas = dense_render(*render_args(ref_scene))
    assert len(meta["gaussian_ids"]) > 600
    torch.testing.assert_close(colors, ref_colors, atol=5e-5, rtol=1e-4)
    torch.testing.assert_close(alphas, ref_alphas, atol=5e-5, rtol=1e-4)
    w = torch.rand(colors.shape, generator=torch.Generator().manual_seed(0))
    (colors * w).sum().backward()
    (ref_colors * w).sum().backward()
    for k in GAUSSIAN_KEYS:
        torch.testing.assert_close(scene[k].grad, ref_scene[k].grad, atol=1e-3, rtol=1e-3, msg=k)


def test_no_cameras_and_numpy_image_size():
    """C = 0 happens in the distributed render (a rank owns no camera this step)."""
    import numpy as np

    scene = with_grad(random_scene(n=20, n_cameras=2))
    colors, alphas, meta = rasterize(
        *render_args(dict(scene, viewmats=scene["viewmats"][:0], Ks=scene["Ks"][:0]))
    )
    assert colors.shape == (0, 30, 40, 3) and alphas.shape == (0, 30, 40, 1)
    assert meta["n_cameras"] == 0 and len(meta["camera_ids"]) == 0
    (colors.sum() + alphas.sum()).backward()  # connected to the inputs, zero gradient
    a, _, _ = rasterize(*render_args(dict(scene, width=np.int64(40), height=np.int64(30))))
    b, _, _ = rasterize(*render_args(scene))
    torch.testing.assert_close(a, b)


def test_depth_chunks_give_the_same_images_and_gradients(monkeypatch):
    """Long per-tile lists are composited in depth chunks with finished tiles dropped;
    tiny chunks (many carries of transmittance) must not change images or gradients."""
    from distsplat.render import torch_backend

    scene = random_scene(n=250, n_cameras=2, scale=0.3, seed=5)
    scene["opacities"] = scene["opacities"].clamp_min(0.6)  # opaque: many pixels stop early
    results = []
    for chunk in (10_000, 3):
        monkeypatch.setattr(torch_backend, "DEPTH_CHUNK", chunk)
        s = with_grad(scene)
        colors, alphas, _ = rasterize(*render_args(s))
        w = torch.rand(colors.shape, generator=torch.Generator().manual_seed(0))
        ((colors * w).sum() + alphas.sum()).backward()
        results.append((colors, alphas, {k: s[k].grad for k in GAUSSIAN_KEYS}))
    (c1, a1, g1), (c2, a2, g2) = results
    assert (a1 > 0.999).float().mean() > 0.2  # the early stop really happens
    # Pixels composite <= 250 Gaussians; chunks of 3 carry the transmittance as a product
    # between chunks: <= 2 * 250 u32 = 3e-5 relative worst case, rtol 1e-5 and atol 1e-6
    # hold what that leaves in practice (measured ~1e-7 relative).
    torch.testing.assert_close(c2, c1, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(a2, a1, atol=1e-6, rtol=1e-5)
    for k in GAUSSIAN_KEYS:
        # A gradient sums <= 2 x 40 x 30 = 2400 pixel terms grouped another way: worst case
        # 2400 u32 = 1.4e-4 of the terms' size, taken as that parameter's largest gradient.
        atol = 2400 * 2.0 ** -24 * g1[k].abs().max().item()
        torch.testing.assert_close(g2[k], g1[k], atol=atol, rtol=1e-4, msg=k)


# ------------------------------------------------- working memory (issue 34): bounded, exact

def _wide_translucent_pairs():
    """400 large Gaussians of opacity <= 0.05 over one 64x48 image: every tile composites
    hundreds of pairs and none stops early, ~280k (pair, pixel) elements in all (~25 MB of
    autograd state unchunked). Pair fields are leaves, so backward ends at the pairs."""
    from distsplat.render.absgrad import attach_sink

    s = random_scene(n=400, n_cameras=1, width=64, height=48, scale=0.6, seed=3)
    s["opacities"] = s["opacities"] * 0.05
    with torch.no_grad():
        pairs, _ = project(*render_args(s), backend="torch")
    leaves = {k: getattr(pairs, k).clone().requires_grad_() for k in ("means2d", "conics", "opacities", "colors")}
    meta = {"means2d": leaves["means2d"]}
    sink = attach_sink(pairs, None, meta["means2d"])
    return pairs.__class__(**{**pairs.__dict__, **leaves}), leaves, sink, meta


def _composite_with(monkeypatch, working: int, block: int = 1 << 22):
    """rasterize_pairs forward + backward under a WORKING_BYTES / BLOCK_ELEMENTS setting: peak
    bytes of the tensors it made, images, gradients of the pair fields and absgrad."""
    from distsplat.render import rasterize_pairs, torch_backend
    from tests.unit.live_bytes import LiveBytes

    monkeypatch.setattr(torch_backend, "WORKING_BYTES", working)
    monkeypatch.setattr(torch_backend, "BLOCK_ELEMENTS", block)
    pairs, leaves, sink, meta = _wide_translucent_pairs()
    w = torch.rand(1, 48, 64, 3, generator=torch.Generator().manual_seed(0))
    with LiveBytes() as live:
        colors, alphas = rasterize_pairs(pairs, 1, 64, 48, backend="torch", absgrad_sink=sink)
        ((colors * w).sum() + alphas.sum()).backward()
    grads = {k: v.grad for k, v in leaves.items()}
    grads["absgrad"] = meta["means2d"].absgrad
    return live.peak, colors.detach(), alphas.detach(), grads, pairs


def _outside_the_blocks(pairs) -> int:
    """What a call holds besides its compositing units, generously: ~6 int64 arrays per
    (pair, tile) intersection (ids, sort keys, order), ~8 copies of the padded image with its
    alpha channel (per-block outputs, their cat, the scatter into tiles, the image and their
    gradients) and 4 of the padded pair fields (the pairs, their gradients, per unit gathers)."""
    from distsplat.render import torch_backend as tb

    E = len(tb._tile_intersections(pairs, 1, tb.TILE_SIZE, 8, 6)[0])
    image = 8 * 6 * tb.TILE_SIZE ** 2 * (3 + 1) * 4  # [C * TY * TX, P, D + 1] float32, 64x48
    fields = (len(pairs) + 1) * (2 + 3 + 1 + 3 + 2) * 4
    return 6 * 8 * E + 8 * image + 4 * fields


def test_compositing_memory_stays_within_the_budget(monkeypatch):
    """Past WORKING_BYTES each unit is recomputed in backward: the peak of the tensors the
    call makes is WORKING_BYTES + what it holds outside the blocks (_outside_the_blocks),
    whatever the number of (pair, pixel) elements; unbounded, the same call holds them all."""
    from distsplat.render import torch_backend as tb

    budget = 2 << 20
    plain, *_ = _composite_with(monkeypatch, working=1 << 40)
    bounded, _, _, _, pairs = _composite_with(monkeypatch, working=budget)
    margin = _outside_the_blocks(pairs)
    assert margin < budget / 2  # the test's configuration is about the blocks
    assert bounded <= budget + margin, (bounded, budget, margin)
    assert plain > 4 * (budget + margin), plain  # unbounded it holds every element's state
    # The smallest unit (one tile, one depth chunk of 64 pairs) is the floor of any budget.
    floor, *_ = _composite_with(monkeypatch, working=1)
    assert floor <= tb.DEPTH_CHUNK * tb.TILE_SIZE ** 2 * tb.BYTES_PER_ELEMENT + margin, floor


def test_bytes_per_element_bounds_a_block_forward_and_backward():
    """BYTES_PER_ELEMENT, measured: one [T, L, P] block with L at DEPTH_CHUNK (no carry), with
    and without the absgrad sink, through its forward and backward."""
    from distsplat.render import torch_backend as tb
    from tests.unit.live_bytes import LiveBytes

    g = torch.Generator().manual_seed(0)
    T, L, P, M = 32, tb.DEPTH_CHUNK, 64, 500
    px, py = (torch.rand(T, 1, P, generator=g) * 8 for _ in range(2))
    for with_sink in (False, True):
        pad = [(torch.rand(M + 1, 2, generator=g) * 8).requires_grad_(),
               torch.tensor([0.5, 0.0, 0.5]).repeat(M + 1, 1).requires_grad_(),
               (torch.rand(M + 1, generator=g) * 0.1).requires_grad_(),
               torch.rand(M + 1, 3, generator=g).requires_grad_(),
               torch.zeros(M + 1, 2, requires_grad=True) if with_sink else None]
        idx = torch.randint(0, M + 1, (T, L), generator=g)
        with LiveBytes() as live:
            c, a = tb._composite_block(px, py, idx, tuple(pad), recompute=False)
            (c.sum() + a.sum()).backward()
        assert 70 * T * L * P < live.peak <= tb.BYTES_PER_ELEMENT * T * L * P, live.peak / (T * L * P)


def test_recomputed_units_give_the_images_and_gradients_of_autograd(monkeypatch):
    """Recomputing the units in backward gives the images of keeping them bit for bit (the
    same forward ops), and the gradients up to the order of their sums: a recomputed unit
    gathers its own pairs, so a pair's terms are summed per depth chunk and then added, where
    the kept path gathers a block once and sums them in one scatter (the order that keeps
    W = 1 and W = 2 alike). Against the default blocks (bigger units) images are equal too.
    Bound: <= 2 x 400 pairs' terms per sum, 800 u32 ~ 5e-5 of the largest gradient (measured
    ~1e-7)."""
    from distsplat.render import torch_backend as tb

    budget = 2 << 20
    units = budget // tb.BYTES_PER_ELEMENT
    _, c1, a1, g1, _ = _composite_with(monkeypatch, working=budget)  # recomputed
    _, c2, a2, g2, _ = _composite_with(monkeypatch, working=1 << 40, block=units)  # kept, same units
    _, c3, a3, g3, _ = _composite_with(monkeypatch, working=1 << 40)  # kept, default blocks
    assert torch.equal(c1, c2) and torch.equal(a1, a2)
    assert torch.equal(c1, c3) and torch.equal(a1, a3)
    for k in g1:
        for other in (g2, g3):
            atol = 800 * 2.0 ** -24 * other[k].abs().max().item()
            torch.testing.assert_close(g1[k], other[k], atol=atol, rtol=1e-5, msg=k)


def test_tile_groups_keep_blocks_under_the_unit_size():
    """The plan: every block of more than one tile has T x L x P <= max_elements, every tile
    is in exactly one block, in order, and padding stays under 1/3 of a block."""
    from distsplat.render.torch_backend import _tile_groups

    g = torch.Generator().manual_seed(1)
    counts = sorted((torch.randint(1, 3000, (500,), generator=g) ** 1).tolist(), reverse=True)
    for max_elements in (1, 64 * 100, 64 * 5000, 1 << 22):
        groups = _tile_groups(counts, 64, max_elements)
        assert [b for b, _, _ in groups] == [0] + [e for _, e, _ in groups[:-1]] and groups[-1][1] == len(counts)
        for b, e, L in groups:
            assert L == counts[b] and (e - b == 1 or (e - b) * L * 64 <= max_elements)
            assert 3 * sum(counts[b:e]) >= 2 * (e - b) * L  # padding <= 1/3
