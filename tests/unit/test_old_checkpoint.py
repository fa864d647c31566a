"""A checkpoint written before train/ was split into rooms (issue 47: distsplat at 6148d88, W = 2,
40 steps of the built-in scene with --pose_opt --app_opt, 300 random initial Gaussians; the command
is in tests/golden/checkpoint_2026-12-08/README.md) still resumes: every value it holds lands where
the run reads it, compared with the shards as torch.load reads them, and the run trains on from it."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from distsplat.distributed import init_distributed
from distsplat.train.config import Config
from distsplat.train.files.checkpointer import seed_rank_rng
from distsplat.train.trainer import Trainer

GOLDEN = Path(__file__).parents[1] / "golden" / "checkpoint_2026-12-08" / "step_000040"


def _meta():
    return json.loads((GOLDEN / "meta.json").read_text())


def _shards():
    return [torch.load(GOLDEN / s["file"], map_location="cpu", weights_only=False) for s in _meta()["shards"]]


def _trainer(result_dir, max_steps=40, **kw):
    cfg = Config(result_dir=str(result_dir), max_steps=max_steps, init_type="random", init_num_pts=300,
                 pose_opt=True, app_opt=True, ckpt=str(GOLDEN), num_workers=1, disable_video=True, **kw)
    cfg.validate()
    t = Trainer(cfg, init_distributed(device=torch.device("cpu")))
    t.setup()
    return t


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    t = _trainer(tmp_path_factory.mktemp("old_ckpt"))
    yield t
    t.cleanup()


def test_every_row_of_an_old_checkpoint_lands_in_the_run(resumed):
    t, shards, meta = resumed, _shards(), _meta()
    assert (t.start_step, t.n_all, meta["world_size"]) == (40, 300, 2)
    for name, p in t.params.items():  # W = 2's rows, read on W = 1: the shards in order
        want = torch.cat([s["params"][name] for s in shards])
        assert torch.equal(p.detach(), want), name
        state = t.optimizers[name].state[p]
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(state[k], torch.cat([s["optim"][name][k] for s in shards])), (name, k)
        assert float(state["step"]) == float(shards[0]["optim"][name]["step"]) == 40
    for k in ("grad2d", "count", "uid"):
        assert torch.equal(t.strategy_state[k], torch.cat([s["per_gaussian"][k] for s in shards])), k


def test_the_shared_and_per_image_state_of_an_old_checkpoint_is_restored(resumed):
    t, shard0, meta = resumed, _shards()[0], _meta()
    assert torch.equal(t.pose.deltas.detach(), shard0["pose_opt"]["deltas"])
    app = t.app.state_dict()  # W = 1: every image's embedding is this rank's
    for k, v in shard0["app_opt"].items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(app[k], v), k
    assert t.lr_rule.saved == meta["state"]["lr_batch"]
    # Saved on W = 2 mid-epoch: on W = 1 the batch sequence resumes at the next epoch's start
    saved = meta["state"]["batcher"]
    assert (t.batcher.epoch, t.batcher.step) == (saved["epoch"] + (saved["step"] > 0), 0)
    assert t.schedule.position(40) == (t.batcher.epoch, 0)
    # Another W cannot continue the saved random streams: the fresh one of (seed, rank, step)
    now = torch.get_rng_state()
    seed_rank_rng(42, 0, 40)
    assert torch.equal(now, torch.get_rng_state())


def test_a_run_trains_on_from_an_old_checkpoint(tmp_path):
    t = _trainer(tmp_path, max_steps=42)
    try:
        t.train()
    finally:
        t.cleanup()
    meta = json.loads((tmp_path / "ckpts" / "step_000042" / "meta.json").read_text())
    assert meta["num_gaussians"] == 300 and np.isfinite(t.metrics["val_psnr"])
