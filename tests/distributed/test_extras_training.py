"""The training extras of issue 18 in the Trainer on gloo CPU ranks: W = 1, 2, 3 on the
same global batches (W=3's; W=1 and W=2 replay them, trainer_workers.ReplayTrainer) end
with the same Gaussians, as test_trainer.py's densification test checks for plain
training; and each extra changes training the way gsplat's does."""

from __future__ import annotations

import json

import pytest
import torch

from rounding import rounding_bound
from test_trainer import N_ACC_3, assert_same_gaussians, densify_config, densify_runs
from trainer_workers import tiny_config


def run_w123(run_workers, tmp_path, tweak, **overrides):
    """W=1, 2, 3 runs of densify_config(**overrides), changed by tweak(cfg), in float64 on
    W=3's batches from test_trainer's anisotropic start, W=1's Adam steps recorded."""
    return densify_runs(run_workers, tmp_path, tweak, **overrides)


def shared_excess(runs, name: str, value) -> dict:
    """max |W - W=1| / rounding bound (rounding.py) of a module every rank shares (`name`:
    its record in W=1's Adam steps; `value(results)` its final value, rank 0's). Its gradient
    sums every (pixel, Gaussian) pair of the global batch, at most B x H x W x N_all terms."""
    one = runs[1][0]
    n_acc = N_ACC_3 * max(len(u) for u in one["adam"]["uid"])
    ref = value(runs[1])
    bound = rounding_bound(one["adam"][name], ref, n_acc)
    return {W: ((value(rs) - ref).abs() / bound).max().item() for W, rs in runs.items() if W != 1}


@pytest.mark.numerics
@pytest.mark.slow  # 6 processes, 20 float64 steps each (test_trainer's densification test's size)
def test_absgrad_densification_is_w_invariant(run_workers, tmp_path):
    def absgrad(cfg):
        # Absolute gradients are ~4x the summed ones here: a threshold 3x densify_config's
        # keeps the growth near that test's (at 1e-3, 3300 Gaussians: more exact depth ties).
        cfg.strategy.absgrad, cfg.strategy.grow_grad2d = True, 3e-3

    events = assert_same_gaussians(run_w123(run_workers, tmp_path, absgrad))["events"]
    assert events["dupli"] + events["split"] > 50, events


def test_absgrad_densifies_more_at_the_same_threshold(run_workers, tmp_path):
    """gsplat's claim for AbsGS: |per-pixel gradients| summed do not cancel, so more
    Gaussians pass the same grow_grad2d (set after validate(), which would raise it for absgrad)."""
    from distsplat.train.model.strategies import DefaultStrategy

    counts = {}
    for absgrad in (False, True):
        cfg = tiny_config(str(tmp_path / f"a{absgrad}"), max_steps=20, strategy=DefaultStrategy(
            refine_start_iter=5, refine_every=5, refine_stop_iter=1000, reset_every=10_000,
            absgrad=absgrad))
        # after validate(), which would raise absgrad's default; high enough that plain
        # gradients do not pass it everywhere (at 2e-4 both runs grew 400 -> ~5000 in 30 steps)
        cfg.strategy.grow_grad2d = 1e-3
        counts[absgrad] = run_workers("extras_workers:train_count", 2, cfg)[0]["n"]
    assert counts[True] > 1.2 * counts[False] and counts[False] >= 400, counts


def test_absgrad_raises_gsplat_default_threshold():
    from distsplat.train.model.strategies import DefaultStrategy

    cfg = tiny_config("unused", strategy=DefaultStrategy(absgrad=True))
    assert cfg.strategy.grow_grad2d == 0.0008
    cfg = tiny_config("unused", strategy=DefaultStrategy(absgrad=True, grow_grad2d=0.0005))
    assert cfg.strategy.grow_grad2d == 0.0005


@pytest.mark.numerics
@pytest.mark.slow  # 6 processes, 20 float64 steps each (test_trainer's densification test's size)
def test_depth_loss_training_is_w_invariant(run_workers, tmp_path):
    """--depth_loss on the built-in scene (no tracks: every point in the image is a target)."""
    runs = run_w123(run_workers, tmp_path, lambda c: setattr(c, "depth_loss", True))
    assert_same_gaussians(runs)  # a depth term on the wrong camera or rank moves Gaussians by whole steps


@pytest.mark.numerics
@pytest.mark.slow  # 6 processes, 20 float64 steps each (test_trainer's densification test's size)
def test_pose_opt_training_is_w_invariant_and_identical_on_every_rank(run_workers, tmp_path):
    """--pose_opt with --pose_noise: the corrections are bitwise identical on every rank,
    and equal across W (float64; a correction's gradient sums every rank's pairs)."""
    def pose(cfg):
        cfg.pose_opt, cfg.pose_noise, cfg.pose_opt_lr = True, 0.01, 1e-3

    runs = run_w123(run_workers, tmp_path, pose, save_steps=[20])
    assert_same_gaussians(runs)
    for W, rs in runs.items():
        for r in rs[1:]:
            assert torch.equal(r["pose"], rs[0]["pose"]), W  # every rank's copy, bitwise
    moved = runs[1][0]["pose"].abs().max()
    assert moved > 1e-3, moved  # the corrections trained
    # A camera's correction sums every pair of the batch: within that sum's rounding bound
    # (a lost rank's share moves it by ~1 Adam step, orders of magnitude beyond)
    excess = shared_excess(runs, "pose", lambda rs: rs[0]["pose"])
    assert all(e <= 1.0 for e in excess.values()), excess
    # W=2's checkpoint resumes on W=3 with its corrections (and their Adam state: the next
    # step matches; here the values) on every rank.
    cfg = densify_config(str(tmp_path / "r3"), 1, ckpt=str(tmp_path / "w2" / "ckpts"))
    pose(cfg)
    resumed = run_workers("trainer_workers:resume", 3, cfg)
    for r in resumed:
        assert torch.equal(r["pose"], runs[2][0]["pose"])


@pytest.mark.slow
def test_cli_two_ranks_with_every_extra(tmp_path):
    """absgrad, depth loss, pose and appearance optimization together through the real CLI
    under torchrun with 2 CPU ranks, to a checkpoint that resumes with them."""
    from torchrun_cli import TINY_FLAGS, torchrun

    extras = ["--strategy.absgrad", "--depth_loss", "--pose_opt", "--pose_noise", "0.01", "--app_opt",
              "--strategy.refine_start_iter", "10", "--strategy.refine_every", "10"]
    out = tmp_path / "run"
    p = torchrun(["default", "--max_steps", "30", "--eval_steps", "30", "--save_steps", "30",
                  "--result_dir", str(out), *TINY_FLAGS, *extras])
    assert p.returncode == 0, p.stderr[-3000:]
    assert "final: PSNR" in p.stdout
    cfg = json.loads((out / "ckpts" / "step_000030" / "meta.json").read_text())["state"]["config"]  # = cfg.yml's
    assert cfg["strategy"]["grow_grad2d"] == 0.0008 and cfg["depth_loss"] and cfg["pose_opt"] and cfg["app_opt"]
    shard = torch.load(sorted((out / "ckpts" / "step_000030").glob("*.pt"))[0], weights_only=True)  # rank 0's
    assert shard["pose_opt"]["deltas"].abs().max() > 0  # trained corrections in the checkpoint
    assert shard["app_opt"]["embeds"].shape == (10, 16) and shard["app_opt"]["mlp"]["4.bias"].abs().max() > 0
    from distsplat.train.files.export import ply_fields
    from distsplat.viewer.model import read_ply_header

    _, names, _ = read_ply_header(out / "ply" / "point_cloud_0030.ply")
    assert names == ply_fields(0)  # the standard layout, colours baked into the DC term (as gsplat)
    # The viewer shows the checkpoint with the same baked colours as the PLY.
    from distsplat.distributed import DistContext
    from distsplat.viewer.model import load_model, read_ply_chunk

    model = load_model(str(out / "ckpts"), DistContext(rank=0, world_size=1, local_rank=0,
                                                       device=torch.device("cpu"), backend=None))
    ply, _ = read_ply_chunk(out / "ply" / "point_cloud_0030.ply", 0, 1)
    assert model.sh_degree == 0
    # float32 PLY records of the same float32 bake: equal to float32 rounding of sh0 (|sh0| < 2)
    torch.testing.assert_close(model.params["sh0"].float(), ply["sh0"], rtol=0, atol=1e-6)
    p = torchrun(["default", "--max_steps", "40", "--eval_steps", "40", "--save_steps", "40",
                  "--ckpt", str(out / "ckpts"), "--result_dir", str(tmp_path / "resumed"), *TINY_FLAGS, *extras])
    assert p.returncode == 0, p.stderr[-3000:]


def app_opt(cfg):
    # lr 1e-2 (gsplat's 1e-3 x 10): in 20 steps the MLP's zero last layer moves well off zero.
    cfg.app_opt, cfg.app_opt_lr = True, 1e-2


def embed_table(results):
    """Every image's embedding [n_train, D], each from its owner rank (exactly one)."""
    rows = torch.stack([r["app"]["embeds"] for r in results])  # [W, n_train, D], NaN off the owner
    assert ((~rows.isnan()).sum(0) == 1).all()
    return rows.nan_to_num(0.0).sum(0)


def assert_same_appearance(runs):
    """Every rank's MLP bitwise identical (a bug there is caught at once)."""
    for W, rs in runs.items():
        for r in rs[1:]:
            assert torch.equal(r["app"]["mlp"], rs[0]["app"]["mlp"]), W
    assert_appearance_across_w(runs)


def assert_appearance_across_w(runs):
    """The MLP (rank 0's) and every image's embedding (from its owner) equal across W, within
    the rounding bound of their gradients' sums (shared_excess); a rank's share of the
    gradient missing (no all-reduce) moves them by whole Adam steps."""
    mlp1 = runs[1][0]["app"]["mlp"]
    assert mlp1[-3:].abs().max() > 2 * 1e-2 * 3**0.5, mlp1[-3:]  # the last layer's bias: > 2 Adam steps off zero
    excess = {"mlp": shared_excess(runs, "app_mlp", lambda rs: rs[0]["app"]["mlp"]),
              "embeds": shared_excess(runs, "app_embeds", embed_table)}
    assert all(e <= 1.0 for x in excess.values() for e in x.values()), f"max difference / rounding bound: {excess}"


@pytest.fixture(scope="module")
def app_runs(run_workers, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("app")
    return tmp, run_w123(run_workers, tmp, app_opt, save_steps=[20])


@pytest.mark.numerics
@pytest.mark.slow  # 6 processes, 20 float64 steps each (test_trainer's densification test's size)
def test_app_opt_training_is_w_invariant_and_identical_on_every_rank(run_workers, app_runs):
    """--app_opt: W = 1, 2, 3 on the same batches give the same Gaussians (features and
    colours included), the same MLP (bitwise on every rank) and the same embeddings (each
    on its owner); W=2's checkpoint resumes on W=3 with the same embeddings and MLP."""
    tmp_path, runs = app_runs
    assert "features" in runs[1][0]["params"] and "sh0" not in runs[1][0]["params"]
    assert_same_gaussians(runs)
    assert_same_appearance(runs)
    cfg = densify_config(str(tmp_path / "r3"), 1, ckpt=str(tmp_path / "w2" / "ckpts"))
    app_opt(cfg)
    resumed = run_workers("trainer_workers:resume", 3, cfg)
    assert torch.equal(embed_table(resumed), embed_table(runs[2]))  # W=2's rows, now on W=3's owners, exactly
    for r in resumed:
        assert torch.equal(r["app"]["mlp"], runs[2][0]["app"]["mlp"])


@pytest.mark.numerics
@pytest.mark.slow  # 2 processes
def test_app_opt_invariance_check_fails_without_the_mlp_all_reduce(run_workers, app_runs, tmp_path):
    """The mutation check of the test above: W=2 with each rank stepping on its own share
    of the MLP's gradient (the all-reduce replaced by the identity) must fail it."""
    from test_trainer import ANISO

    _, runs = app_runs
    cfg = densify_config(str(tmp_path / "w2"), 1)
    app_opt(cfg)
    bad = run_workers("trainer_workers:train", 2, cfg, 3, True, False, -1, ANISO, True)  # no_app_all_reduce
    assert not torch.equal(bad[0]["app"]["mlp"], bad[1]["app"]["mlp"])  # the copies drift apart
    with pytest.raises(AssertionError, match="rounding bound"):
        assert_appearance_across_w({1: runs[1], 2: bad})  # and rank 0's leaves W=1's
