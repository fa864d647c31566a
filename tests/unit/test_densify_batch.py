"""The default strategy at any global batch (issue 45.2): what it accumulates per image, and
how many Gaussians it grows at batch 16 against batch 1 at the same images seen.

Measured first (benchmarks/studies/batch_quality/densify_stats.py, 400 images, the whole refine
phase; benchmarks/results/densify_stats_*_cpu2_2026-12-07.json): at batch 16 the same fraction
of the Gaussians passes grow_grad2d at every refine step as at batch 1, and as many are grown
(thermos 10,267 against 10,447; the built-in scene 12,763 against 12,639); the Gaussians batch
16 lacks are pruned ones (thermos 6,066 against 4,352: opacities below prune_opa, docs/training.md)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from distsplat.render import rasterize
from distsplat.train.scoring.losses import photometric_loss
from distsplat.train.model.strategies import DefaultStrategy

W_IMG, H_IMG, C = 12, 9, 4


def scene():
    """40 float64 Gaussians in front of C cameras on an arc (most see most of them), targets."""
    g = torch.Generator().manual_seed(0)
    N, d = 40, torch.float64
    means = torch.randn(N, 3, generator=g, dtype=d) * 0.5
    quats = torch.randn(N, 4, generator=g, dtype=d)
    scales = torch.rand(N, 3, generator=g, dtype=d) * 0.2 + 0.05
    opac = torch.rand(N, generator=g, dtype=d) * 0.8 + 0.1
    cols = torch.rand(N, 3, generator=g, dtype=d)
    viewmats = torch.eye(4, dtype=d).repeat(C, 1, 1)
    for c in range(C):  # cameras at distance 4 around the y axis, looking at the origin
        a = torch.tensor(0.3 * (c - 1.5), dtype=d)
        R = torch.tensor([[torch.cos(a), 0, -torch.sin(a)], [0, 1, 0], [torch.sin(a), 0, torch.cos(a)]], dtype=d)
        viewmats[c, :3, :3] = R
        viewmats[c, :3, 3] = torch.tensor([0, 0, 4.0], dtype=d)
    Ks = torch.tensor([[10.0, 0, W_IMG / 2], [0, 10.0, H_IMG / 2], [0, 0, 1]], dtype=d).repeat(C, 1, 1)
    targets = torch.rand(C, H_IMG, W_IMG, 3, generator=g, dtype=d)
    return [means, quats, scales, opac, cols], viewmats, Ks, targets


def accumulate(cams, packed: bool, good) -> dict:
    """A fresh DefaultStrategy state after cameras `cams` rendered as one batch, the loss the
    trainer's (each image's photometric loss / the batch's size)."""
    params, viewmats, Ks, targets = scene()
    params = [p.clone().requires_grad_() for p in params]
    strategy = DefaultStrategy(verbose=False)
    state = strategy.initialize_state()
    state["grad2d"], state["count"] = torch.zeros(len(params[0]), dtype=torch.float64), torch.zeros(len(params[0]))
    colors, _, meta = rasterize(*params, viewmats[cams], Ks[cams], W_IMG, H_IMG, packed=packed, backend="torch")
    (photometric_loss(colors, targets[cams], 0.2) / len(cams)).backward()
    strategy._good = None if good is None else torch.tensor(good, dtype=torch.float32)
    strategy.update_state({"means": params[0]}, state, meta, packed=packed)
    return state


@pytest.mark.numerics
@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("good", [None, 1.0])
def test_a_batch_accumulates_each_images_2d_gradient_as_that_image_alone(packed, good):
    """One step of C images at the same parameters adds to grad2d and count exactly what C
    one-image steps add: the mean loss's 1/C is undone by gsplat's n_cameras factor, and each
    (camera, Gaussian) pair's norm is its own (a sum of norms, not the norm of a sum). So
    what differs at batch 16 is only where the parameters are (docs/training.md)."""
    batch = accumulate(list(range(C)), packed, good)
    alone = [accumulate([c], packed, good) for c in range(C)]
    assert batch["count"].sum() > 2 * len(batch["count"])  # most Gaussians seen by several images
    torch.testing.assert_close(batch["count"], sum(s["count"] for s in alone), rtol=0, atol=0)
    # float64: x / C * C and the pixels' sums in another order, a few ulp of each norm
    torch.testing.assert_close(batch["grad2d"], sum(s["grad2d"] for s in alone), rtol=1e-12, atol=1e-18)


# Images seen by both runs: refine steps at steps 48 and 96 of batch 1 (after 49 and 97 images),
# 3 and 6 of batch 16 (after 64 and 112: a step s at batch B ends after (s + 1) B images)
IMAGES = 144


def _densify(tmp_path, batch: int) -> dict:
    """Grown, pruned and final Gaussians of the built-in scene after IMAGES images at global batch
    `batch` (one process, --batch_size batch --schedule_in_images, the default --lr_batch_scaling)."""
    from distsplat.cli import run
    from distsplat.train.config import default_config

    events = {"grown": 0, "pruned": 0, "after": 0}

    @dataclasses.dataclass
    class Counting(DefaultStrategy):
        def grow(self, params, optimizers, state, step):
            n_dupli, n_split = super().grow(params, optimizers, state, step)
            events["grown"] += n_dupli + n_split
            return n_dupli, n_split

        def _prune_gs(self, params, optimizers, state, step):
            n = super()._prune_gs(params, optimizers, state, step)
            events["pruned"] += n
            events["after"] = len(params["means"])  # Gaussians after the last refine step
            return n

    cfg = default_config()
    cfg.synthetic.width, cfg.synthetic.height = 48, 36  # a quarter of its pixels: CI time
    cfg.result_dir = str(tmp_path / f"b{batch}")
    cfg.batch_size, cfg.schedule_in_images = batch, True
    cfg.max_steps, cfg.eval_steps, cfg.save_steps, cfg.save_ply = IMAGES, [], [], False
    cfg.sh_degree_interval = 48
    s = cfg.strategy
    cfg.strategy = Counting(**{f.name: getattr(s, f.name) for f in dataclasses.fields(s)})
    cfg.strategy.refine_start_iter, cfg.strategy.refine_every, cfg.strategy.refine_stop_iter = 16, 48, IMAGES
    cfg.num_workers, cfg.log_every, cfg.tb_every = 1, IMAGES, 10**6
    run(cfg)
    return events


@pytest.mark.slow
def test_batch_16_grows_as_many_gaussians_as_batch_1_at_the_same_images_seen(tmp_path):
    """The built-in scene (48 x 36), 144 images, two refine steps, no opacity reset: batch 16
    grows as many Gaussians as batch 1 with gsplat's threshold. Measured here (2 CPU cores,
    about 100 s): batch 1 grew 5,944 and pruned 0, batch 16 grew 5,953 (+0.15%) and pruned 39.
    Over the whole refine phase (400 images, this module's doc) growth differed by -1.7%
    (thermos) and +1.0% (built-in); the margin, 5%, is three times the largest. A threshold 10%
    off moves the count by 5-7% (n_high_at_factor in those files): a rule that scaled
    grow_grad2d with the batch's higher mean gradient (+6-26%) would fail it."""
    one = _densify(tmp_path, 1)
    big = _densify(tmp_path, 16)
    assert one["grown"] > 1000, one  # densification ran
    assert abs(big["grown"] - one["grown"]) <= 0.05 * one["grown"], (one, big)
