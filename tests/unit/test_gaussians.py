"""Gaussian initialization and optimizers: chunks of W ranks are the rows of W=1."""

import math

import numpy as np
import pytest
import torch

from distsplat.train.model.gaussians import (
    SH_C0,
    activated,
    create_optimizers,
    init_gaussians,
    knn_mean_distance,
    random_points,
)

pytestmark = pytest.mark.numerics  # rerun under other numeric paths in CI (docs/testing.md)


def test_knn_distance_matches_brute_force():
    pts = np.random.default_rng(0).normal(size=(300, 3))
    d2 = ((pts[:, None] - pts[None]) ** 2).sum(-1)
    np.fill_diagonal(d2, np.inf)
    ref = np.sqrt(np.sort(d2, 1)[:, :3].mean(1))
    # float64 sqrt(mean of 3 squared distances), ~12 roundings each way: <= 24 u = 2.7e-15 relative.
    np.testing.assert_allclose(knn_mean_distance(pts), ref, rtol=1e-12)


def test_chunks_of_any_world_size_reassemble_the_single_rank_model():
    points, rgbs = random_points(101, extent=2.0, seed=3)
    whole = init_gaussians(points, rgbs, sh_degree=2, bounds=(0, 101), seed=7)
    for bounds_list in ([(0, 50), (50, 101)], [(0, 34), (34, 68), (68, 101)]):
        parts = [init_gaussians(points, rgbs, sh_degree=2, bounds=b, seed=7) for b in bounds_list]
        for k in whole:
            torch.testing.assert_close(torch.cat([p[k] for p in parts]), whole[k], rtol=0, atol=0)
    assert whole["shN"].shape == (101, 8, 3)
    act = activated(whole, sh_degree=1)
    assert act["colors"].shape == (101, 4, 3)
    torch.testing.assert_close(act["colors"][:, 0] * SH_C0 + 0.5, rgbs)
    torch.testing.assert_close(act["opacities"], torch.full((101,), 0.1))


def test_optimizers_scale_with_the_global_batch_like_gsplat():
    points, rgbs = random_points(10, extent=1.0)
    params = init_gaussians(points, rgbs, sh_degree=0, bounds=(0, 10))
    opt = create_optimizers(params, global_batch=4, scene_scale=2.0)
    g = opt["means"].param_groups[0]
    assert math.isclose(g["lr"], 1.6e-4 * 2.0 * 2.0)
    assert math.isclose(g["eps"], 1e-15 / 2.0)
    assert g["betas"] == (1 - 4 * (1 - 0.9), 1 - 4 * (1 - 0.999))
    assert math.isclose(opt["shN"].param_groups[0]["lr"], 2.5e-3 / 20 * 2.0)


@pytest.mark.parametrize("B", [9, 10, 16, 64])
def test_large_global_batches_get_valid_betas(B):
    """gsplat's 1 - B (1 - beta) reaches beta1 = 0 at B = 10 (4 GPUs x --batch_size 4 is
    16), where torch's Adam refuses it; from there each beta is beta ** B."""
    points, rgbs = random_points(10, extent=1.0)
    params = init_gaussians(points, rgbs, sh_degree=0, bounds=(0, 10))
    opt = create_optimizers(params, global_batch=B)
    b1, b2 = opt["means"].param_groups[0]["betas"]
    if B < 10:
        assert (b1, b2) == (1 - B * (1 - 0.9), 1 - B * (1 - 0.999))
    else:
        assert math.isclose(b1, 0.9 ** B) and math.isclose(b2, 0.999 ** B)
    assert 0 < b1 < 1 and 0 < b2 < 1
    params["means"].grad = torch.ones_like(params["means"])
    opt["means"].step()  # a valid Adam step


def test_initial_means_do_not_alias_the_points_given():
    """The trainer passes the Scene's SfM points (torch.from_numpy: shared memory); an Adam
    step on the means must not move them (the depth loss and exports read them later)."""
    points, rgbs = random_points(10, extent=1.0)
    before = points.clone()
    params = init_gaussians(points, rgbs, sh_degree=0, bounds=(0, 10))
    with torch.no_grad():
        params["means"].add_(1.0)
    assert torch.equal(points, before)


def test_check_finite_params_names_the_bad_parameters_and_their_source():
    import torch

    from distsplat.train.model.gaussians import check_finite_params

    params = {"means": torch.zeros(4, 3), "scales": torch.zeros(4, 3), "opacities": torch.zeros(4)}
    check_finite_params(params, "the initial Gaussians")
    params["scales"][2, 1] = float("inf")
    params["opacities"][0] = float("nan")
    with pytest.raises(ValueError, match=r"--ckpt ck holds NaN or Inf values in scales, opacities"):
        check_finite_params(params, "--ckpt ck")
