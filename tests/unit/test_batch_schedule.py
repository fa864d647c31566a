"""--schedule_in_images (issue 30): the 1-GPU schedule, counted in images, on any global batch."""

import pytest

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
