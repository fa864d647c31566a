"""A colour model evaluated by the rank that renders (distributed_rasterize's pair_colors,
the hook appearance optimization needs): for W in 1..3 gloo ranks, each camera's render and
every Gaussian's gradient (features included, and the means through the directions) equal
an independent one-process reference that evaluates the model for every (camera, Gaussian)
densely and renders each camera alone with `rasterize`."""

from functools import lru_cache

import pytest
import torch

from distsplat.distributed import distributed_rasterize
from distsplat.render import rasterize
from distsplat.render.gsplat_backend import camera_centers
from scenes import FEATURES, PARAM_NAMES, pair_color_setup, weighted_loss

SEED = 23
NAMES = ["base", "edge", "few", "sh_depth", "unpacked"]
# float64, as test_render_invariance.py: only summation order differs (a gradient sums
# <= 7 cameras x 32 x 24 pixel terms in another order: ~1e-12 of their magnitude).
TOL = dict(rtol=1e-9, atol=1e-11)


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda w: f"W{w}")
def world(request, run_workers):
    W = request.param
    return W, run_workers("workers:pair_color_cases", W, NAMES, SEED)


@lru_cache(maxsize=None)
def reference(name: str, W: int):
    layout, colour_model = pair_color_setup(name, W, SEED)
    params = [layout["gaussians"][k].clone().requires_grad_() for k in PARAM_NAMES]
    means = params[0]
    kw = dict(layout["render_kwargs"])
    bg = kw.pop("backgrounds", None)
    centers = camera_centers(layout["viewmats"])
    renders, alphas = [], []
    for c in range(layout["viewmats"].shape[0]):  # dense: every Gaussian's colour for camera c
        colors_c = colour_model(params[4], means - centers[c], torch.full((len(means),), c))
        r, a, _ = rasterize(means, params[1], params[2], params[3], colors_c, layout["viewmats"][c:c + 1],
                            layout["Ks"][c:c + 1], 32, 24, packed=layout["packed"], backend="torch",
                            backgrounds=None if bg is None else bg[c:c + 1], **kw)
        renders.append(r)
        alphas.append(a)
    colors, alphas = torch.cat(renders), torch.cat(alphas)
    C = len(renders)
    weighted_loss(colors, alphas, torch.arange(C), SEED).backward()
    return {"layout": layout, "colors": colors.detach(), "alphas": alphas.detach(),
            "grads": [p.grad for p in params]}


@pytest.mark.parametrize("name", NAMES)
def test_renders_and_gradients_equal_the_dense_reference(world, name):
    W, results = world
    ref = reference(name, W)
    assert ref["alphas"].amax() > 0.1, "the scene must be visible"
    for rank, res in enumerate(results):
        own = res[name]["own"]
        torch.testing.assert_close(res[name]["colors"], ref["colors"][own], **TOL)
        torch.testing.assert_close(res[name]["alphas"], ref["alphas"][own], **TOL)
    for i, k in enumerate(PARAM_NAMES):
        got = torch.cat([r[name]["grads"][i] for r in results])
        assert ref["grads"][i].abs().amax() > 0, f"{k}: the loss must reach it"
        torch.testing.assert_close(got, ref["grads"][i], **TOL, msg=lambda m: f"W={W} {name} {k}: {m}")


def test_payload_carries_features_and_directions(world):
    """float64: means2d 2, conics 3, opacity 1, the features, dirs 3, depth 1, then the camera
    id and the radii as 8 raw bytes each (one float64 column each); W = 1 packs nothing."""
    W, results = world
    comm = results[0]["base"]["comm"]
    assert comm["payload_fields"] == (0 if W == 1 else 7 + FEATURES + 3 + 2)


def test_bad_pair_colors_are_named():
    layout, colour_model = pair_color_setup("base", 1, SEED)
    g = layout["gaussians"]
    args = ([g[k] for k in PARAM_NAMES], layout["viewmats"], layout["Ks"], 32, 24, torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="pair_colors` must be a function"):
        distributed_rasterize(*args[0], *args[1:], pair_colors="mlp")
    with pytest.raises(ValueError, match="pass sh_degree=None"):
        distributed_rasterize(*args[0], *args[1:], pair_colors=colour_model, sh_degree=1)
    with pytest.raises(ValueError, match=r"must return a tensor \[M, D\]"):
        distributed_rasterize(*args[0], *args[1:], pair_colors=lambda f, d, c: f.sum())
