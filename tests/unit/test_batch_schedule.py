"""--schedule_in_images (issue 30): the 1-GPU schedule, counted in images, on any global batch."""

import pytest
import torch

from distsplat.train.config import default_config, mcmc_config


def _scheduled(cfg, world_size):
    cfg.adjust_steps(cfg.schedule_factor(world_size))
    return cfg


def test_schedule_in_images_divides_every_step_number_by_the_global_batch():
    base = default_config()
    cfg = default_config()
    cfg.batch_size, cfg.schedule_in_images = 4, True
    _scheduled(cfg, 4)  # global batch 16
    s, b = cfg.strategy, base.strategy
    assert cfg.max_steps == base.max_steps // 16 == 1875
    assert cfg.eval_steps == [e // 16 for e in base.eval_steps]
    assert cfg.save_steps == [e // 16 for e in base.save_steps]
    assert cfg.sh_degree_interval == base.sh_degree_interval // 16
    assert (s.refine_start_iter, s.refine_stop_iter, s.refine_every, s.reset_every) == (
        b.refine_start_iter // 16, b.refine_stop_iter // 16, b.refine_every // 16, b.reset_every // 16)
    line = cfg.describe_schedule(4)
    assert "global batch 16 (4 rank(s) x --batch_size 4)" in line and "1875 steps = 30000 images" in line


@pytest.mark.parametrize("world_size,batch", [(1, 1), (2, 1), (4, 4)])
def test_without_the_flag_steps_are_steps_as_in_gsplat(world_size, batch):
    cfg = default_config()
    cfg.batch_size, cfg.steps_scaler = batch, 0.25
    assert cfg.schedule_factor(world_size) == 0.25  # gsplat's --steps_scaler alone, whatever W
    _scheduled(cfg, world_size)
    assert cfg.max_steps == 7500 and cfg.strategy.refine_every == 25
    line = cfg.describe_schedule(world_size)
    assert f"{7500 * batch * world_size} images" in line
    assert ("--schedule_in_images runs" in line) == (batch * world_size > 1)  # the hint where it matters


def test_schedule_in_images_combines_with_steps_scaler_and_mcmc():
    cfg = mcmc_config()
    cfg.batch_size, cfg.schedule_in_images, cfg.steps_scaler = 2, True, 0.5
    _scheduled(cfg, 2)  # global batch 4, half the schedule
    assert cfg.max_steps == 30_000 // 8 and cfg.strategy.refine_every == 100 // 8
    assert "opacity reset" not in cfg.describe_schedule(2)  # MCMC has none


def test_schedule_in_images_with_a_bad_batch_size_leaves_the_error_to_validate():
    cfg = default_config()
    cfg.batch_size, cfg.schedule_in_images = 0, True
    _scheduled(cfg, 2)  # no ZeroDivisionError
    with pytest.raises(ValueError, match="--batch_size"):
        cfg.validate()



# --------------------------------------------------------------------------- the lr rule
from distsplat.train import batch_scaling  # noqa: E402
from distsplat.train.model.gaussians import scaled_betas  # noqa: E402


def test_lr_factor_spans_sqrt_to_linear_with_the_visible_fraction():
    B = 16
    assert batch_scaling.lr_factor("visibility", B, 1.0) == pytest.approx(B)  # every view sees everything
    assert batch_scaling.lr_factor("visibility", B, 0.0) == pytest.approx(B ** 0.5)  # gsplat / Grendel-GS
    ps = [0.0, 0.01, 1 / B, 0.3, 0.9, 1.0]
    fs = [batch_scaling.lr_factor("visibility", B, p) for p in ps]
    assert fs == sorted(fs)
    assert batch_scaling.lr_factor("sqrt", B) == 4.0 and batch_scaling.lr_factor("linear", B) == 16.0
    assert all(batch_scaling.lr_factor(r, 1, 0.5) == 1.0 for r in batch_scaling.RULES)  # batch 1: as ever


def _adam_displacement(batch: int, factor: float, p: float, images: int, n: int = 4096, sigma: float = 0.0) -> float:
    """Mean distance torch's Adam moves n independent parameters in `images` images seen at
    global batch `batch` with lr x factor, each parameter's per-image gradient -1 where an
    image sees it (probability p, drawn per image) and 0 elsewhere: the loss averaged over
    the batch, Adam's betas scaled as the trainer scales them. sigma > 0: views that disagree,
    the gradient where an image sees the parameter -(1 + sigma z), z ~ N(0, 1) per image (its
    mean s = 1, the views' spread sigma)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.zeros(n, requires_grad=True)
    lr = 1e-3
    opt = torch.optim.Adam([x], lr=lr * factor, betas=scaled_betas(batch), eps=1e-15 / batch ** 0.5)
    for _ in range(images // batch):
        seen = (torch.rand(batch, n, generator=gen) < p).float()  # [B, n]
        if sigma > 0:
            seen = (1.0 + sigma * torch.randn(batch, n, generator=gen)) * seen
        x.grad = -seen.mean(0)
        opt.step()
    return float(x.detach().mean()) / lr


@pytest.mark.parametrize("p", [1.0, 0.5, 0.2, 1 / 16, 0.02])
def test_a_batch_step_moves_as_far_as_its_images_one_at_a_time(p):
    """The rule's model (batch_scaling's module doc) checked against torch's Adam itself: at
    global batch 16 with lr x lr_factor, a parameter whose gradient agrees wherever it is
    seen moves as far per image as at batch 1, whatever the fraction p of images that see it;
    sqrt(B) falls short where most images see it, B overshoots where few do."""
    images, B = 16 * 64, 16
    one = _adam_displacement(1, 1.0, p, images)
    ours = _adam_displacement(B, batch_scaling.lr_factor("visibility", B, p), p, images)
    # The rule is the first-order model (mean and variance of the batch gradient, Adam's moments
    # at their steady state); against the real Adam it is off by <= 3% over these p (1.000 at
    # p = 1, 1.026 at 0.02, deterministic draws), sqrt(B) by 0.25-0.9x and B by 1-3.6x.
    assert ours == pytest.approx(one, rel=0.06), (p, one, ours)
    if p >= 0.5:
        assert _adam_displacement(B, B ** 0.5, p, images) < 0.5 * one
    if p <= 1 / 16:
        assert _adam_displacement(B, float(B), p, images) > 1.5 * one


@pytest.mark.parametrize("p", [1.0, 0.5, 0.2])
@pytest.mark.parametrize("sigma", [1.0, 4.0])
def test_where_views_disagree_a_batch_step_moves_further_than_its_images(p, sigma):
    """Issue 45.2 (docs/training.md, densification at any global batch): the rule's model has
    views that agree (sigma = 0). Where they disagree, B one-image Adam steps move lr sqrt(p)
    s / sqrt(s^2 + sigma^2) per image and a batch step at lr_B = lr sqrt(B k), k = 1 + (B - 1) p,
    moves lr sqrt(p) s sqrt(k) / sqrt(k s^2 + sigma^2) per image: sqrt(k) sqrt(s^2 + sigma^2) /
    sqrt(k s^2 + sigma^2) times further, up to sqrt(k) (4x at p = 1, B = 16), why batch 16's
    opacities fall below prune_opa sooner. The visibility rule with p rho in place of p,
    rho = s^2 / (s^2 + sigma^2) (the views' mean gradient squared over their mean squared
    gradient), moves as far as batch 1. Against torch's Adam: the ratio within 2.5% of the
    model (1.28-2.93 here), p rho's within 1.5% of 1."""
    B, s2, k = 16, 1.0, 1 + 15 * p
    one = _adam_displacement(1, 1.0, p, 1024, sigma=sigma)
    ours = _adam_displacement(B, batch_scaling.lr_factor("visibility", B, p), p, 1024, sigma=sigma)
    predicted = (k * (s2 + sigma ** 2) / (k * s2 + sigma ** 2)) ** 0.5
    assert ours / one == pytest.approx(predicted, rel=0.05), (ours / one, predicted)
    rho = s2 / (s2 + sigma ** 2)
    matched = _adam_displacement(B, batch_scaling.lr_factor("visibility", B, p * rho), p, 1024, sigma=sigma)
    assert matched / one == pytest.approx(1.0, rel=0.05), matched / one


def test_visible_fraction_counts_the_pairs_cameras_see():
    """8 Gaussians in front of a camera and 8 behind it (z < near): half of the pairs are
    visible to a camera looking down +z, none to one looking down -z... and half over both."""
    n = 16
    means = torch.zeros(n, 3)
    means[:8, 2], means[8:, 2] = 5.0, -5.0
    means[:, 0] = torch.linspace(-0.5, 0.5, n)
    g = {"means": means, "quats": torch.tensor([[1.0, 0, 0, 0]]).repeat(n, 1), "scales": torch.full((n, 3), 0.05),
         "opacities": torch.full((n,), 0.9)}
    K = torch.tensor([[50.0, 0, 32], [0, 50.0, 24], [0, 0, 1]])
    flip = torch.diag(torch.tensor([-1.0, 1.0, -1.0, 1.0]))  # a camera turned around the y axis
    fraction = lambda V: batch_scaling.visible_fraction(  # noqa: E731
        g, V, K.expand(len(V), 3, 3), [64] * len(V), [48] * len(V), backend="torch", near_plane=0.01,
        far_plane=1e10)
    assert fraction(torch.eye(4)[None]) == 0.5
    assert fraction(torch.stack([torch.eye(4), flip])) == 0.5
    assert fraction(torch.stack([torch.eye(4), torch.eye(4)])) == 0.5


IMAGES = 192  # images seen by every training run below: 192 steps at batch 1, 12 at batch 16


def _psnr_after(tmp_path, batch: int, rule: str) -> float:
    """Test PSNR of the built-in scene after IMAGES images at global batch `batch` (one
    process, --batch_size batch --schedule_in_images --lr_batch_scaling rule), no densification."""
    from distsplat.cli import run

    cfg = default_config()
    cfg.synthetic.width, cfg.synthetic.height = 48, 36  # a quarter of its pixels: CI time
    cfg.result_dir = str(tmp_path / f"b{batch}_{rule}")
    cfg.batch_size, cfg.schedule_in_images, cfg.lr_batch_scaling = batch, True, rule
    cfg.max_steps, cfg.eval_steps, cfg.save_steps, cfg.save_ply = IMAGES, [IMAGES], [], False
    cfg.sh_degree_interval = 48
    cfg.strategy.refine_start_iter = IMAGES  # no densification: the optimizer's scaling alone
    cfg.num_workers, cfg.log_every, cfg.tb_every = 1, IMAGES, 10**6
    return run(cfg)["val_psnr"]


@pytest.mark.slow
def test_batch_16_trains_as_well_as_batch_1_at_the_same_images_seen(tmp_path):
    """On the built-in scene (most views see most Gaussians: lr x ~15.9 at batch 16) the
    default rule reaches batch 1's PSNR at the same images seen; gsplat's lr x sqrt(B)
    falls behind. Measured here (2 CPU cores): batch 1 25.40 dB, batch 16 25.91 (+0.51),
    with sqrt(B) 23.74 (-1.66); the margins keep half of each gap (longer runs:
    benchmarks/studies/batch_quality/batch_quality.py)."""
    one = _psnr_after(tmp_path, 1, "visibility")
    ours = _psnr_after(tmp_path, 16, "visibility")
    sqrt = _psnr_after(tmp_path, 16, "sqrt")
    assert ours > one - 0.25, (one, ours)
    assert sqrt < one - 0.8 and sqrt < ours - 1.0, (one, ours, sqrt)  # the old rule falls behind
