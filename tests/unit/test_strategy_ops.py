"""CPU paths of gsplat's CUDA-only strategy ops, against a literal port of the kernel."""

import math

import pytest
import torch

from distsplat.train.model.strategy_ops import install, relocation_torch

pytestmark = pytest.mark.numerics  # rerun under other numeric paths in CI (docs/testing.md)


def kernel_port(o: float, scale: float, n: int, binoms) -> tuple:
    """gsplat's relocation_kernel, line by line, in Python floats."""
    new_o = 1.0 - (1.0 - o) ** (1.0 / n)
    denom = 0.0
    for i in range(1, n + 1):
        for k in range(i):
            denom += binoms[i - 1][k] * ((-1.0) ** k / math.sqrt(k + 1)) * new_o ** (k + 1)
    return new_o, o / denom * scale


def test_relocation_matches_the_kernel_formula():
    n_max = 51
    binoms = torch.zeros(n_max, n_max)
    for n in range(n_max):
        for k in range(n + 1):
            binoms[n, k] = math.comb(n, k)
    opac = torch.tensor([0.05, 0.3, 0.5, 0.9, 0.99, 0.7])
    scales = torch.rand(6, 3) + 0.1
    ratios = torch.tensor([1, 2, 3, 5, 8, 60])  # 60 is clamped to n_max like the kernel
    new_o, new_s = relocation_torch(opac, scales, ratios, binoms)
    for j in range(6):
        n = min(int(ratios[j]), n_max)
        o_ref, s_ref = kernel_port(float(opac[j]), 1.0, n, binoms.tolist())
        assert abs(new_o[j].item() - o_ref) < 1e-6
        torch.testing.assert_close(new_s[j], scales[j] * s_ref, rtol=1e-5, atol=1e-7)
    # ratio 1: the Gaussian is unchanged
    assert abs(new_o[0].item() - 0.05) < 1e-7
    torch.testing.assert_close(new_s[0], scales[0])


def test_mcmc_strategy_runs_on_cpu():
    """gsplat's MCMCStrategy relocates dead Gaussians, adds new ones and injects noise on
    CPU tensors once the CPU paths are installed."""
    from gsplat.strategy import MCMCStrategy

    install()
    n = 50
    g = torch.Generator().manual_seed(0)
    params = torch.nn.ParameterDict({
        "means": torch.randn(n, 3, generator=g),
        "scales": torch.log(torch.rand(n, 3, generator=g) * 0.1 + 0.01),
        "quats": torch.randn(n, 4, generator=g),
        "opacities": torch.logit(torch.rand(n, generator=g) * 0.9 + 0.05),
        "sh0": torch.randn(n, 1, 3, generator=g),
    })
    params["opacities"].data[:10] = -10.0  # dead: opacity below min_opacity
    optimizers = {k: torch.optim.Adam([p], lr=1e-3) for k, p in params.items()}
    strategy = MCMCStrategy(cap_max=60, refine_start_iter=0, refine_every=1, noise_lr=1.0)
    state = strategy.initialize_state()
    means_before = params["means"].detach().clone()
    strategy.step_post_backward(params, optimizers, state, step=1, info={}, lr=0.01)
    assert params["means"].shape[0] == 52  # grew by 5% (int(1.05 * 50)), under the cap
    assert (torch.sigmoid(params["opacities"][:10]) > 0.005).all()  # relocated
    assert not torch.equal(params["means"][:n].detach(), means_before)  # noise injected


def test_default_strategy_resets_opacities_every_reset_every_steps():
    """gsplat 1.5.3 never resets (an operator-precedence slip); ours does, at reset_every."""
    from distsplat.train.model.strategies import DefaultStrategy

    n = 20
    params = torch.nn.ParameterDict({
        "means": torch.randn(n, 3), "scales": torch.full((n, 3), -3.0),
        "quats": torch.randn(n, 4), "opacities": torch.full((n,), 3.0), "sh0": torch.zeros(n, 1, 3),
    })
    optimizers = {k: torch.optim.Adam([p], lr=1e-3) for k, p in params.items()}
    strategy = DefaultStrategy(refine_start_iter=1000, refine_stop_iter=2000, reset_every=30)
    state = strategy.initialize_state(scene_scale=1.0)
    info = {"means2d": torch.zeros(n, 2, requires_grad=True), "width": 10, "height": 10,
            "n_cameras": 1, "radii": torch.ones(n, 2, dtype=torch.int32),
            "gaussian_ids": torch.arange(n)}
    info["means2d"].grad = torch.zeros(n, 2)
    for step in (29, 30):
        strategy.step_post_backward(params, optimizers, state, step, info, packed=True)
        expected = 3.0 if step == 29 else torch.logit(torch.tensor(strategy.prune_opa * 2.0)).item()
        torch.testing.assert_close(params["opacities"].detach(), torch.full((n,), expected))


def _reset_setup():
    """20 Gaussians at opacity sigmoid(3) with Adam moments (one step taken), and the info
    of a step that saw them all with zero gradient (so nothing grows)."""
    n = 20
    g = torch.Generator().manual_seed(0)
    params = torch.nn.ParameterDict({
        "means": torch.randn(n, 3, generator=g), "scales": torch.full((n, 3), -3.0),
        "quats": torch.randn(n, 4, generator=g), "opacities": torch.full((n,), 3.0), "sh0": torch.zeros(n, 1, 3),
    })
    optimizers = {k: torch.optim.Adam([p], lr=1e-3) for k, p in params.items()}
    for p in params.values():
        p.grad = torch.randn(p.shape, generator=g)
    for opt in optimizers.values():
        opt.step()
    info = {"means2d": torch.zeros(n, 2, requires_grad=True), "width": 10, "height": 10,
            "n_cameras": 1, "radii": torch.ones(n, 2, dtype=torch.int32), "gaussian_ids": torch.arange(n)}
    info["means2d"].grad = torch.zeros(n, 2)
    return params, optimizers, info


def _after_reset_step(strategy_cls):
    params, optimizers, info = _reset_setup()
    strategy = strategy_cls(refine_start_iter=1000, refine_stop_iter=2000, reset_every=30)
    state = strategy.initialize_state(scene_scale=1.0)
    strategy.step_post_backward(params, optimizers, state, 30, info, packed=True)
    moments = {k: {m: optimizers[k].state[p][m].clone() for m in ("exp_avg", "exp_avg_sq")}
               for k, p in params.items()}
    return {k: p.detach().clone() for k, p in params.items()}, moments


def test_gsplat_peer_reset_repair_matches_our_default_strategy(monkeypatch):
    """benchmarks/gsplat_peer.py's PEER_RESET=1 repairs gsplat 1.5.3's DefaultStrategy so
    that its trainer resets opacities on distsplat's schedule: as released gsplat keeps
    its opacities (about sigmoid(3)) at step reset_every (the bug the repair is for; if a gsplat upgrade
    fixes it, this says so), the repaired one lands on exactly our parameters and Adam
    moments (gsplat's reset_opa zeroes the moments of the reset rows)."""
    from gsplat.strategy import DefaultStrategy as GsplatDefault

    from benchmarks import gsplat_peer
    from distsplat.train.model.strategies import DefaultStrategy as Ours

    released, _ = _after_reset_step(GsplatDefault)
    before = _reset_setup()[0]["opacities"].detach()  # about 3.0, after the one Adam step
    assert torch.equal(released["opacities"], before)
    monkeypatch.setattr(GsplatDefault, "step_post_backward", gsplat_peer.reset_repaired(GsplatDefault.step_post_backward))
    repaired, repaired_moments = _after_reset_step(GsplatDefault)
    ours, our_moments = _after_reset_step(Ours)
    torch.testing.assert_close(repaired["opacities"], torch.full((20,), math.log(0.01 / 0.99)))
    for k in ours:
        assert torch.equal(repaired[k], ours[k]), k
        for m in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(repaired_moments[k][m], our_moments[k][m]), (k, m)
    assert (repaired_moments["opacities"]["exp_avg"] == 0).all()  # the reset rows' moments
    assert (repaired_moments["means"]["exp_avg"] != 0).any()  # untouched elsewhere
