"""The memory guard (issue 9, part 5): the bytes-per-Gaussian formula against the tensors a
step really holds; the guard's decision and its once-per-transition warnings; both
strategies skip growth (and only growth) when the guard says no; a one-rank trainer stops
growing under a limit below its usage and grows under a generous one. Usage is injected
(`guard.measure`) wherever the outcome must not depend on RSS noise."""

import logging

import pytest
import torch

from distsplat.distributed import DistContext
from distsplat.train.model import strategy_ops
from distsplat.cli import parse
from distsplat.train.config import Config, SyntheticConfig
from distsplat.train.model.gaussians import activated, create_optimizers, init_gaussians
from distsplat.render import torch_backend
from distsplat.train.guards.memory import MemoryGuard, bytes_per_gaussian, held_bytes, render_working_bytes
from distsplat.train.model.strategies import DefaultStrategy, MCMCStrategy

MiB, GiB = 2**20, 2**30


def _params(n: int, sh_degree: int = 3, seed: int = 0) -> torch.nn.ParameterDict:
    g = torch.Generator().manual_seed(seed)
    points, rgbs = torch.randn(n, 3, generator=g), torch.rand(n, 3, generator=g)
    return init_gaussians(points, rgbs, sh_degree, (0, n), init_opacity=0.1, seed=seed)


def test_bytes_per_gaussian_matches_the_tensors_of_a_step():
    """B = 4 bytes x [4 P + 2 (4 + 3K) + A]: float32, SH degree 3 (K = 16, P = 59), A = 2
    (MCMC's per-Gaussian state: the int64 id): 1368 B; the default strategy's A = 4 (id,
    grad2d, count): 1376 B; the widest row (shN) is 180 B."""
    n = 1000
    params = _params(n)
    b, r = bytes_per_gaussian(dict(params), accumulators=2)
    assert (b, r) == (4 * (4 * 59 + 2 * (4 + 3 * 16) + 2), 4 * 45) == (1368, 180)
    assert bytes_per_gaussian(dict(params), accumulators=4)[0] == 1376  # the default strategy
    assert bytes_per_gaussian(dict(params), accumulators=0)[0] == 1360
    assert bytes_per_gaussian(dict(_params(10, sh_degree=0)), 0) == (4 * (4 * 14 + 2 * 7), 16)  # widest: quats

    # The state part, measured: parameters + gradients + Adam moments + accumulators after a
    # real backward and Adam step hold exactly B minus the activation copies.
    optimizers = create_optimizers(params, global_batch=1)
    g = activated(params)
    loss = sum(v.float().pow(2).mean() for v in g.values())
    loss.backward()
    for opt in optimizers.values():
        opt.step()
    state = {"grad2d": torch.zeros(n), "count": torch.zeros(n), "scene_scale": 1.0}
    activations = 2 * 4 * (3 + 1 + 3 * 16)
    assert held_bytes(params, optimizers, state) == n * (b - activations)
    # ...and the activation copies are what activated() builds, with gradients of the same size.
    assert sum(g[k].numel() * 4 for k in ("scales", "opacities", "colors")) * 2 == n * activations


def test_guard_decides_and_warns_once_per_transition(caplog):
    params = _params(100)
    usage = [100 * MiB]
    guard = MemoryGuard(GiB, 0.5, rank=3, accumulators=2, advice="a higher --strategy.grow_grad2d",
                        measure=lambda: usage[0])
    b, r = bytes_per_gaussian(dict(params), 2)
    assert guard.estimate(params, 50) == 50 * b + 100 * r and guard.estimate(params, 0) == 0
    with caplog.at_level(logging.WARNING, logger="distsplat.train.guards.memory"):
        assert guard.allow(params, 50) and not caplog.records  # 100 MiB + 0.08 MiB < 512 MiB
        usage[0] = 600 * MiB
        assert not guard.allow(params, 50) and guard.blocked
        assert not guard.allow(params, 50) and not guard.allow(params, 0)
        assert len(caplog.records) == 1  # once per transition
        msg = caplog.records[0].getMessage()
        for part in ("[rank 3]", "stops growing", "at 100 Gaussians", "600.0 MiB used", "for 50 new Gaussians",
                     f"{b} B each", "50% of its 1.00 GiB limit (512.0 MiB)", "more ranks", "--memory_limit_gb",
                     "a higher --strategy.grow_grad2d"):
            assert part in msg, (part, msg)
        usage[0] = 400 * MiB
        assert guard.allow(params, 50) and not guard.blocked
        assert len(caplog.records) == 2 and "grows again" in caplog.records[1].getMessage()
    assert guard.transitions == 2
    assert guard.fits(params, 10) and not guard.fits(params, 10**6)


def test_setup_check_warns_when_the_initial_gaussians_do_not_fit(caplog):
    params = _params(1000)
    optimizers = create_optimizers(params, global_batch=1)
    guard = MemoryGuard(10 * MiB, 0.9, rank=0, accumulators=2, measure=lambda: 7 * MiB)
    assert guard.check_setup(params, optimizers, {}) is None  # 7 MiB + 1.08 MiB pending < 9 MiB
    guard.measure = lambda: 8 * MiB
    with caplog.at_level(logging.WARNING, logger="distsplat.train.guards.memory"):
        msg = guard.check_setup(params, optimizers, {})
    assert msg is not None and msg in caplog.text
    assert "the 1000 initial Gaussians need 1.3 MiB" in msg and "1368 B each" in msg and "10.0 MiB limit" in msg


def test_guard_counts_the_renderers_working_memory(caplog):
    """On CPU the RSS is read between steps, when the torch backend's compositing memory is
    freed: the guard adds its bound (WORKING_BYTES per render call of a step) to every decision
    and names it. On CUDA the reserved pool already holds a step's peak: nothing is added."""
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert render_working_bytes("torch", cpu, 1) == torch_backend.WORKING_BYTES == 256 * MiB
    assert render_working_bytes("auto", cpu, 3) == 3 * torch_backend.WORKING_BYTES
    assert render_working_bytes("gsplat", gpu, 2) == render_working_bytes("torch", gpu, 2) == 0
    params = _params(100)
    b, r = bytes_per_gaussian(dict(params), 2)
    need = 50 * b + 100 * r
    # 512 MiB allowed: 100 MiB used + the growth fit, + 450 MiB of rendering do not.
    plain = MemoryGuard(GiB, 0.5, rank=1, accumulators=2, measure=lambda: 100 * MiB)
    guard = MemoryGuard(GiB, 0.5, rank=1, accumulators=2, measure=lambda: 100 * MiB, working=450 * MiB)
    assert plain.fits(params, 50) and plain.allow(params, 50)
    assert not guard.fits(params, 50)
    with caplog.at_level(logging.WARNING, logger="distsplat.train.guards.memory"):
        assert not guard.allow(params, 50)
        optimizers = create_optimizers(params, global_batch=1)
        setup = guard.check_setup(params, optimizers, {})
    msg = caplog.records[0].getMessage()
    assert "100.0 MiB used + 450.0 MiB the renderer's working memory per step + " in msg, msg
    assert f"{need / MiB:.1f} MiB for 50 new Gaussians" in msg and "stops growing" in msg
    assert plain.check_setup(params, optimizers, {}) is None  # 100 MiB + 0.1 MiB pending fit
    assert setup is not None and "in use + 450.0 MiB the renderer's working memory per step" in setup, setup


def _refine_state(params, strategy, grads):
    n = len(params["means"])
    state = strategy.initialize_state(scene_scale=1.0)
    state.update(grad2d=grads.clone(), count=torch.ones(n), radii=None)
    return state


def test_default_strategy_grows_only_when_the_check_allows():
    strategy_ops.install()
    n = 60
    params = _params(n, sh_degree=1)
    with torch.no_grad():
        params["scales"][:20] = -5.0  # small: duplicated when their gradient is high
        params["scales"][20:] = 0.0  # large: split when their gradient is high
        params["opacities"][50:] = -10.0  # prunable
    grads = torch.zeros(n)
    grads[:10] = grads[20:28] = 1.0  # 10 duplicates + 8 splits = 18 new Gaussians
    strategy = DefaultStrategy(grow_grad2d=0.5, grow_scale3d=0.01, refine_start_iter=0, refine_every=1)
    asked = []
    for allow in (False, True):
        p = torch.nn.ParameterDict({k: torch.nn.Parameter(v.detach().clone()) for k, v in params.items()})
        optimizers = {k: torch.optim.Adam([v], lr=1e-3) for k, v in p.items()}
        state = _refine_state(p, strategy, grads)
        strategy.growth_check = lambda prm, n_new, allow=allow: asked.append(n_new) or allow
        assert strategy.growth_candidates(p, state, step=10) == 18
        n_dupli, n_split = strategy._grow_gs(p, optimizers, state, step=10)
        grown = len(p["means"])
        n_prune = strategy._prune_gs(p, optimizers, state, step=10)
        if allow:
            assert (n_dupli, n_split) == (10, 8) and grown == n + 18
        else:
            assert (n_dupli, n_split) == (0, 0) and grown == n
        assert n_prune == 10 and len(state["grad2d"]) == len(p["means"])  # pruning goes on
    assert asked == [18, 18]


def test_mcmc_strategy_adds_only_when_the_check_allows():
    strategy_ops.install()
    n = 100
    params = _params(n, sh_degree=1)
    strategy = MCMCStrategy(cap_max=1000, refine_start_iter=0, refine_every=1)
    binoms = strategy.initialize_state()["binoms"]
    optimizers = {k: torch.optim.Adam([v], lr=1e-3) for k, v in params.items()}
    asked = []
    strategy.growth_check = lambda prm, n_new: asked.append(n_new) or False
    assert strategy._add_new_gs(params, optimizers, binoms) == 0 and len(params["means"]) == n
    strategy.growth_check = lambda prm, n_new: asked.append(n_new) or True
    assert strategy._add_new_gs(params, optimizers, binoms) == 5 and len(params["means"]) == n + 5
    assert asked == [5, 5]  # int(1.05 * 100) - 100


# --------------------------------------------------------------- one rank, the real trainer

def _config(tmp_path, strategy, **overrides) -> Config:
    cfg = Config(
        result_dir=str(tmp_path), max_steps=25, eval_steps=[], save_steps=[], save_ply=False,
        sh_degree=1, sh_degree_interval=10, num_workers=1, prefetch=1, log_every=100,
        seed=3, strategy=strategy,
        synthetic=SyntheticConfig(kind="ball", num_cameras=12, num_gaussians=400, width=32, height=24, seed=1),
    )
    for k, v in overrides.items():
        setattr(cfg, k, v)
    cfg.validate()
    return cfg


def _train(cfg, measure=None):
    """Trains one rank (no process group); returns the Gaussian count after every step."""
    from distsplat.train.trainer import Trainer

    ctx = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)
    trainer = Trainer(cfg, ctx)
    counts = []
    trainer.step_hooks.append(lambda t, step: counts.append(len(t.params["means"])))
    try:
        trainer.setup()
        if measure is not None:
            trainer.memory_guard.measure = measure
        trainer.train()
        return counts, trainer.memory_guard
    finally:
        trainer.cleanup()


def _growing(prune_opa: float = 0.005):
    return DefaultStrategy(refine_start_iter=5, refine_every=5, refine_stop_iter=1000, reset_every=10_000,
                           grow_grad2d=1e-5, prune_opa=prune_opa)


@pytest.mark.slow
def test_trainer_stops_growing_below_its_usage_and_keeps_pruning(tmp_path, caplog):
    cfg = _config(tmp_path / "low", _growing(prune_opa=0.1), memory_limit_gb=0.01)  # any process uses more than 10 MiB
    with caplog.at_level(logging.INFO, logger="distsplat"):
        counts, guard = _train(cfg)
    assert max(counts) <= 400 and counts[-1] < 400, counts  # never grew; pruned (opacity < 0.1)
    assert guard.blocked and guard.transitions == 1
    text = caplog.text
    assert "memory guard: growth stops past 90% of 10.2 MiB per rank (--memory_limit_gb 0.01)" in text
    assert guard.working == torch_backend.WORKING_BYTES  # one image size, batch 1: one render call
    assert "+ 256.0 MiB of the renderer's working memory per step" in text
    assert "the 400 initial Gaussians need" in text  # the setup warning
    assert text.count("densification stops growing on this rank at 400 Gaussians") == 1


@pytest.mark.slow
def test_trainer_grows_when_memory_allows_and_says_so_when_it_frees_up(tmp_path, caplog):
    usage = iter([10 * GiB])  # the first refine step (10) is over the limit, later ones are not
    cfg = _config(tmp_path / "high", _growing(), memory_limit_gb=4.0)
    with caplog.at_level(logging.WARNING, logger="distsplat.train.guards.memory"):
        counts, guard = _train(cfg, measure=lambda: next(usage, 100 * MiB))
    assert counts[:15] == [400] * 15 and counts[15] > 400 and counts[-1] > 2 * 400, counts  # refine: 10, 15, 20
    assert not guard.blocked and guard.transitions == 2
    assert "stops growing" in caplog.records[0].getMessage()
    assert "grows again on this rank" in caplog.records[1].getMessage()


@pytest.mark.slow
def test_mcmc_trainer_does_not_add_past_the_guard(tmp_path):
    strategy = MCMCStrategy(cap_max=2000, refine_start_iter=5, refine_every=5, refine_stop_iter=1000)
    cfg = _config(tmp_path / "mcmc", strategy, init_opa=0.5, init_scale=0.1, opacity_reg=0.01,
                  scale_reg=0.01, memory_limit_gb=1.0)
    counts, guard = _train(cfg, measure=lambda: GiB)  # at the limit: every add is refused
    assert counts == [400] * 25 and guard.blocked
    counts, guard = _train(cfg, measure=lambda: 0)
    assert counts[-1] == 463 and not guard.blocked  # refine steps 10, 15, 20: 400 -> 420 -> 441 -> 463


def test_memory_flags_parse_and_validate():
    cfg = parse(["default", "--memory_limit_gb", "2.5", "--memory_fraction", "0.8", "--cache", "decoded",
                 "--cache_budget_gb", "0.5"])
    assert (cfg.memory_limit_gb, cfg.memory_fraction, cfg.cache_budget_gb) == (2.5, 0.8, 0.5)
    assert parse(["mcmc"]).memory_limit_gb is None  # auto: the device's memory
    for field, value, flag in (("memory_fraction", 0.0, "--memory_fraction"), ("memory_fraction", 1.5, "--memory_fraction"),
                               ("memory_limit_gb", -1.0, "--memory_limit_gb"), ("cache_budget_gb", 0.0, "--cache_budget_gb")):
        cfg = Config()
        setattr(cfg, field, value)
        with pytest.raises(ValueError, match=flag):
            cfg.validate()
