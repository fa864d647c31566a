"""Appearance optimization (train/model/app_opt.py) against its definition, gsplat's
AppearanceOptModule: colour = sigmoid(colors + MLP([embedding, features, SH bases of the
unit direction])), written out here with explicit matrix products and the real SH bases
of degree <= 1 in closed form; a zero embedding for test images and the PLY bake; the
same initial state whatever W splits the images; checkpoints across W."""

import math

import pytest
import torch

from distsplat.train.model.app_opt import FEATURE_DIM, Appearance, check_resume, colour_kwargs, sh_bases
from distsplat.train.model.gaussians import SH_C0, activated, init_gaussians

pytestmark = pytest.mark.numerics  # rerun under other numeric paths in CI (docs/testing.md)

CPU = torch.device("cpu")
Y0 = 0.5 / math.sqrt(math.pi)  # real SH Y_0^0
Y1 = math.sqrt(3.0 / (4.0 * math.pi))  # |Y_1^m| on the unit sphere


def _app(n_train=6, own=None, embed_dim=4, sh_degree=1, seed=0, dtype=torch.float64):
    own = torch.arange(n_train) if own is None else torch.as_tensor(own)
    return Appearance(n_train, own, embed_dim, sh_degree, lr=1e-2, reg=1e-6, global_batch=2, seed=seed,
                      device=CPU, dtype=dtype)


def _reference(app, feats, dirs, embeds, degree):
    """sigmoid(base + MLP(h)) with the layers applied by hand."""
    u = dirs / dirs.norm(dim=-1, keepdim=True)
    x, y, z = u.unbind(-1)
    bases = torch.stack([torch.full_like(x, Y0), -Y1 * y, Y1 * z, -Y1 * x], -1)  # gsplat's order and signs
    bases[:, (degree + 1) ** 2:] = 0
    h = torch.cat([embeds, feats[:, :FEATURE_DIM], bases], -1)
    lins = [m for m in app.mlp if isinstance(m, torch.nn.Linear)]
    for i, lin in enumerate(lins):
        h = h @ lin.weight.T + lin.bias
        if i < len(lins) - 1:
            h = h.clamp_min(0)
    return torch.sigmoid(h + feats[:, FEATURE_DIM:])


def _trained_like(app, seed=1):
    """Non-zero last layer (the initial one is zero by design)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in app.mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)


def test_sh_bases_are_the_real_sh_of_the_unit_direction():
    d = torch.randn(7, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 5
    u = d / d.norm(dim=-1, keepdim=True)
    b = sh_bases(d, 1, 3)
    assert b.shape == (7, 16)
    torch.testing.assert_close(b[:, 0], torch.full((7,), Y0, dtype=torch.float64))
    torch.testing.assert_close(b[:, 1:4], Y1 * torch.stack([-u[:, 1], u[:, 2], -u[:, 0]], -1))
    assert (b[:, 4:] == 0).all()  # past the degree in use: zero, as gsplat's progressive degree
    z = sh_bases(torch.zeros(2, 3, dtype=torch.float64), 1, 1)  # the bake's zero direction
    torch.testing.assert_close(z, torch.tensor([[Y0, 0, 0, 0]] * 2, dtype=torch.float64))


@pytest.mark.parametrize("degree", [0, 1])
def test_pair_colours_follow_the_definition_with_each_cameras_embedding(degree):
    app = _app(own=[1, 4, 5])  # this rank owns training images 1, 4, 5
    _trained_like(app)
    g = torch.Generator().manual_seed(4)
    M = 9
    feats = torch.randn(M, FEATURE_DIM + 3, generator=g, dtype=torch.float64)
    dirs = torch.randn(M, 3, generator=g, dtype=torch.float64)
    cams = torch.randint(0, 2, (M,), generator=g)  # batch positions into the call's cameras
    call = torch.tensor([4, 1])  # training positions of the call's two cameras (both own)
    got = colour_kwargs(app, degree, call)["pair_colors"](feats, dirs, cams)
    table = {1: app.embeds[0], 4: app.embeds[1], 5: app.embeds[2]}
    embeds = torch.stack([table[int(call[c])] for c in cams]).detach()
    torch.testing.assert_close(got, _reference(app, feats, dirs, embeds, degree), rtol=1e-12, atol=1e-12)
    # Test images and paths: a zero embedding.
    zero = colour_kwargs(app, degree)["pair_colors"](feats, dirs, cams)
    torch.testing.assert_close(zero, _reference(app, feats, dirs, torch.zeros_like(embeds), degree),
                               rtol=1e-12, atol=1e-12)
    # The gradient reaches only the embeddings of the cameras rendered.
    got.sum().backward()
    assert app.embeds.grad[2].abs().max() == 0 and app.embeds.grad[:2].abs().min() > 0


def test_initial_colour_is_the_base_colour_and_kwargs_without_app():
    app = _app()
    feats = torch.randn(5, FEATURE_DIM + 3, dtype=torch.float64)
    out = colour_kwargs(app, 1, torch.tensor([0]))["pair_colors"](feats, torch.randn(5, 3, dtype=torch.float64),
                                                                   torch.zeros(5, dtype=torch.long))
    torch.testing.assert_close(out, torch.sigmoid(feats[:, FEATURE_DIM:]))  # gsplat zeroes the last layer
    assert colour_kwargs(None, 2) == {"sh_degree": 2}


def test_bake_gives_the_zero_embedding_colour_at_zero_direction_as_sh_dc():
    app = _app()
    _trained_like(app)
    points, rgbs = torch.randn(10, 3), torch.rand(10, 3)
    rgbs[0] = torch.tensor([0.0, 1.0, 0.5])  # 8-bit extremes: gsplat's logit would be infinite
    params = init_gaussians(points, rgbs, 1, (0, 10), feature_dim=FEATURE_DIM)
    params = {k: v.detach().double() for k, v in params.items()}
    assert torch.isfinite(params["colors"]).all()
    baked = app.baked(params)
    assert baked["shN"].shape == (10, 0, 3) and baked["sh0"].shape == (10, 1, 3)
    feats = torch.cat([params["features"], params["colors"]], 1)
    want = _reference(app, feats, torch.tensor([[1.0, 0, 0]], dtype=torch.float64).expand(10, 3),
                      torch.zeros(10, 4, dtype=torch.float64), 0)  # degree 0: direction unused
    torch.testing.assert_close(SH_C0 * baked["sh0"][:, 0] + 0.5, want)
    assert activated(params)["colors"].shape == (10, FEATURE_DIM + 3)


def test_initial_state_is_the_same_whatever_w_splits_it():
    points, rgbs = torch.randn(11, 3), torch.rand(11, 3)
    whole = init_gaussians(points, rgbs, 1, (0, 11), seed=2, feature_dim=FEATURE_DIM)
    parts = [init_gaussians(points, rgbs, 1, b, seed=2, feature_dim=FEATURE_DIM) for b in ((0, 4), (4, 8), (8, 11))]
    for k in ("features", "colors", "quats"):
        assert torch.equal(torch.cat([p[k] for p in parts]), whole[k]), k
    one = _app(n_train=7, seed=3)
    split = [_app(n_train=7, own=o, seed=3) for o in ([0, 5], [1, 2, 6], [3, 4])]
    table = torch.full((7, 4), float("nan"), dtype=torch.float64)
    for a in split:
        table[a.own] = a.embeds.detach()
        for p, q in zip(a.mlp.parameters(), one.mlp.parameters()):
            assert torch.equal(p, q)
    assert torch.equal(table, one.embeds.detach())


def test_checkpoint_rows_move_to_another_split():
    one = _app(n_train=5)
    feats = torch.randn(6, FEATURE_DIM + 3, dtype=torch.float64)
    for _ in range(2):  # Adam state to carry
        colour_kwargs(one, 1, torch.tensor([0, 3]))["pair_colors"](
            feats, torch.randn(6, 3, dtype=torch.float64), torch.tensor([0, 1, 0, 1, 1, 0])).sum().backward()
        one.step()
    state = one.state_dict()  # W=1: the all-reduce is the identity
    other = _app(n_train=5, own=[3, 1])
    other.load_state_dict(state)
    assert torch.equal(other.embeds.detach(), one.embeds.detach()[[3, 1]])
    st = other.embed_opt.state[other.embeds]
    assert torch.equal(st["exp_avg"], one.embed_opt.state[one.embeds]["exp_avg"][[3, 1]])
    assert float(st["step"]) == 2
    for p, q in zip(other.mlp.parameters(), one.mlp.parameters()):
        assert torch.equal(p, q)
    with pytest.raises(ValueError, match="--app_embed_dim"):
        _app(n_train=5, embed_dim=8).load_state_dict(state)


def test_resume_with_the_other_colour_model_is_refused():
    class Cfg:
        app_opt = False

    with pytest.raises(ValueError, match="add --app_opt"):
        check_resume({"app_opt": True}, Cfg(), "R/ckpts/step_000010")
    Cfg.app_opt = True
    with pytest.raises(ValueError, match="drop --app_opt"):
        check_resume({}, Cfg(), "R/ckpts/step_000010")
    check_resume({"app_opt": True}, Cfg(), "x")
