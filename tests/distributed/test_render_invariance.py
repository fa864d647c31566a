"""W-invariance (docs/design.md invariant 1): for W in 1..4 gloo ranks, every camera's render
and every Gaussian's gradient (all parameters, plus the means2d gradients and visibility
that densification reads) equal the one-process `rasterize` of the concatenated Gaussians.

The loss weights each camera's pixels with a different random image, so a render
delivered to the wrong camera after the exchange (gsplat issue #871) fails both the image
and the gradient comparisons. One spawn per W runs every case.
"""

from functools import lru_cache

import pytest
import torch

from distsplat.render import rasterize
from scenes import CASES, PARAM_NAMES, case_layout, dense_means2d_grad, weighted_loss

pytestmark = pytest.mark.numerics  # rerun under other numeric paths in CI (docs/testing.md)

SEED = 11
# float64: only summation order may differ. A pixel is composited in the same depth order on
# every W; a gradient sums <= 4 cameras x 32 x 24 = 3072 pixel terms in another order:
# gamma_3072 = 3.4e-13 of the sum of |terms|. rtol 1e-9 leaves x3000 for cancellation;
# atol 1e-11 covers components that cancel to ~0 (terms here are <= ~1e-2).
TOL = dict(rtol=1e-9, atol=1e-11)


@pytest.fixture(scope="module", params=[1, 2, 3, 4], ids=lambda w: f"W{w}")
def world(request, run_workers):
    W = request.param
    return W, run_workers("workers:render_cases", W, list(CASES), SEED)


@lru_cache(maxsize=None)
def reference(name: str, W: int):
    """One process, all Gaussians, all cameras: the independent reference."""
    layout = case_layout(name, W)
    params = [layout["gaussians"][k].clone().requires_grad_() for k in PARAM_NAMES]
    colors, alphas, meta = rasterize(
        *params, layout["viewmats"], layout["Ks"], 32, 24, sh_degree=layout["sh_degree"],
        packed=layout["packed"], backend="torch", **layout["render_kwargs"],
    )
    C = layout["viewmats"].shape[0]
    weighted_loss(colors, alphas, torch.arange(C), SEED).backward()
    n_all = params[0].shape[0]
    visible = (meta["gaussian_ids"] if meta["packed"]
               else (meta["radii"] > 0).all(-1).nonzero()[:, 1])
    return {
        "layout": layout, "colors": colors.detach(), "alphas": alphas.detach(),
        "grads": [p.grad for p in params],
        "means2d_grad": dense_means2d_grad(meta, n_all, 0, C),
        "visible_count": torch.bincount(visible, minlength=n_all),
    }


@pytest.mark.parametrize("name", list(CASES))
def test_each_camera_rendered_once_by_its_owner(world, name):
    W, results = world
    owner = reference(name, W)["layout"]["owner"]
    owned = [r[name]["own"] for r in results]
    for rank, res in enumerate(results):
        assert torch.equal(res[name]["meta_own"], owned[rank])
        assert torch.equal(owner[owned[rank]], torch.full_like(owned[rank], rank))
    assert torch.equal(torch.cat(owned).sort().values, torch.arange(len(owner)))


@pytest.mark.parametrize("name", list(CASES))
def test_renders_equal_one_process(world, name):
    W, results = world
    ref = reference(name, W)
    assert ref["alphas"].amax() > 0.5, "the scene must actually cover pixels"
    for rank, res in enumerate(results):
        own = res[name]["own"]
        assert res[name]["colors"].shape == (len(own), *ref["colors"].shape[1:]), f"rank {rank}"
        torch.testing.assert_close(res[name]["colors"], ref["colors"][own], **TOL,
                                   msg=lambda m: f"rank {rank}, case {name}: {m}")
        torch.testing.assert_close(res[name]["alphas"], ref["alphas"][own], **TOL,
                                   msg=lambda m: f"rank {rank}, case {name}: {m}")


@pytest.mark.parametrize("name", list(CASES))
def test_gradients_equal_one_process(world, name):
    W, results = world
    ref = reference(name, W)
    for i, pname in enumerate(PARAM_NAMES):
        assert ref["grads"][i].abs().amax() > 0, f"{pname}: the loss must reach it"
        got = torch.cat([res[name]["grads"][i] for res in results])
        torch.testing.assert_close(got, ref["grads"][i], **TOL,
                                   msg=lambda m: f"case {name}, grad of {pname}: {m}")


@pytest.mark.parametrize("name", list(CASES))
def test_densification_inputs_equal_one_process(world, name):
    """meta["means2d"].grad (local, pre-exchange) and the visibility of each Gaussian are
    what a densification strategy reads on each rank; n_cameras is the global batch."""
    W, results = world
    ref = reference(name, W)
    got = sum(res[name]["means2d_grad"] for res in results)
    torch.testing.assert_close(got, ref["means2d_grad"], **TOL)
    assert torch.equal(sum(res[name]["visible_count"] for res in results), ref["visible_count"])
    C = ref["layout"]["viewmats"].shape[0]
    assert all(res[name]["n_cameras"] == C for res in results)


def test_edge_cases_are_exercised(world):
    """Guards the fixtures: the edge cases above really happen."""
    W, results = world
    edge = reference("edge", W)
    blind = edge["layout"]["viewmats"].shape[0] // 2
    assert edge["alphas"][blind].amax() == 0, "the blind camera sees nothing"
    assert (edge["visible_count"][-30:] == 0).all(), "the invisible Gaussians are invisible"
    assert (edge["grads"][0][-30:] == 0).all()
    if W > 1:
        assert edge["layout"]["bounds"][0] == (0, 0), "rank 0 holds no Gaussian"
        assert results[0]["edge"]["comm"]["pairs_projected"] == 0
        few = reference("few", W)["layout"]
        assert len(few["owner"]) < W
        assert any(len(res["few"]["own"]) == 0 for res in results), "a rank owns no camera"
    if W == 4:
        assert results[3]["edge"]["comm"]["pairs_projected"] == 0, "rank 3 sees only invisible Gaussians"
        assert results[3]["edge"]["comm"]["pairs_rendered"] > 0
    owners = [reference(n, W)["layout"]["owner"] for n in CASES]
    if W > 1:
        assert any((o.diff() < 0).any() for o in owners), "some batch is not rank-major"


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"W{w}")
def variants(request, run_workers):
    W = request.param
    return W, run_workers("workers:render_owner_variants", W, list(CASES), SEED)


@pytest.mark.parametrize("variant", ["device", "rank_major"])
@pytest.mark.parametrize("name", list(CASES))
def test_owner_variants_equal_one_process(variants, variant, name):
    """The two other owner paths of the exchange: owners whose values come to the host with
    the counts (a device tensor) and rank-major owners (the pairs already grouped by rank,
    what the trainer's batches are). The same renders and gradients as one process."""
    W, results = variants
    ref = reference(name, W)
    for rank, res in enumerate(results):
        r = res[variant][name]
        if variant == "rank_major":
            owner = ref["layout"]["owner"].sort().values
            assert torch.equal(r["own"], (owner == rank).nonzero()[:, 0])
        torch.testing.assert_close(r["colors"], ref["colors"][r["own"]], **TOL,
                                   msg=lambda m: f"rank {rank}, case {name}: {m}")
        torch.testing.assert_close(r["alphas"], ref["alphas"][r["own"]], **TOL)
    for i, pname in enumerate(PARAM_NAMES):
        got = torch.cat([res[variant][name]["grads"][i] for res in results])
        torch.testing.assert_close(got, ref["grads"][i], **TOL, msg=lambda m: f"{variant} {name} {pname}: {m}")
    got = sum(res[variant][name]["means2d_grad"] for res in results)
    torch.testing.assert_close(got, ref["means2d_grad"], **TOL)
