"""absgrad through the distributed render: for W in 1..3 gloo ranks every pair's absolute
2D-mean gradient (computed by the owner's rasterizer, carried home by the reverse
all-to-all) equals the one-process `rasterize(absgrad=True)`, whose absgrad
tests/unit/test_absgrad.py checks against a per-pixel reference."""

from functools import lru_cache

import pytest
import torch

from distsplat.render import rasterize
from extras_workers import per_gaussian
from scenes import PARAM_NAMES, case_layout, weighted_loss

SEED = 11
# As test_render_invariance.py: float64, only the order of <= 3072 pixel terms per sum
# differs (|x| sums: no cancellation at all for absgrad).
TOL = dict(rtol=1e-9, atol=1e-11)
NAMES = ["base", "edge", "unpacked"]


@lru_cache(maxsize=None)
def reference(name: str, W: int):
    layout = case_layout(name, W)
    params = [layout["gaussians"][k].clone().requires_grad_() for k in PARAM_NAMES]
    colors, alphas, meta = rasterize(
        *params, layout["viewmats"], layout["Ks"], 32, 24, sh_degree=layout["sh_degree"],
        packed=layout["packed"], backend="torch", absgrad=True, **layout["render_kwargs"],
    )
    C = layout["viewmats"].shape[0]
    weighted_loss(colors, alphas, torch.arange(C), SEED).backward()
    n_all = params[0].shape[0]
    return (per_gaussian(meta, meta["means2d"].absgrad, n_all, 0, C),
            per_gaussian(meta, meta["means2d"].grad, n_all, 0, C))


@pytest.mark.parametrize("W", [1, 2, 3])
def test_absgrad_equals_one_process(run_workers, W):
    results = run_workers("extras_workers:absgrad_cases", W, NAMES, SEED)
    for name in NAMES:
        absgrad, grad = reference(name, W)
        assert absgrad.sum() > 0 and (absgrad >= grad.abs() - 1e-12).all()
        # |sum| < sum|.|: the absgrad is not the gradient, so routing it as one would fail
        assert (absgrad - grad.abs()).max() > 1e-3
        got = sum(r[name]["absgrad"] for r in results)
        torch.testing.assert_close(got, absgrad, **TOL, msg=lambda m: f"W={W} {name}: {m}")
        torch.testing.assert_close(sum(r[name]["grad"] for r in results), grad, **TOL)
        assert all(r[name]["fields"] == results[0][name]["fields"] for r in results)
